"""The Anthropic SDK's tool-use loop, with messages.create and with messages.stream():
recorded, replayed, edited and forked."""

from __future__ import annotations

import pytest

from replayable.store import MemoryStore
from tests.integrations.agent_checks import check_agent, load_example
from tests.integrations.servers import FakeProvider
from tests.integrations.wire import answered

example = load_example("anthropic_agent")


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream-helper"])
def test_tool_use_loop(streamed: bool, provider: FakeProvider, store: MemoryStore) -> None:
    """The loop runs until stop_reason != "tool_use"; every check holds."""
    run_id = check_agent(
        example,
        example.ask_streamed if streamed else example.ask,
        (provider.url, "What is the weather in Dublin"),
        provider=provider,
        store=store,
        tool_step=2,
        arg_step=2,
        override="snow, -2 degrees",
        forked_text="Dublin: snow, -2 degrees",
    )
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [
        ("llm", "anthropic.messages"),
        ("tool", "lookup_forecast"),
        ("llm", "anthropic.messages"),
    ]
    assert answered(events[0])["tool_calls"][0]["name"] == "get_weather"
