"""pydantic-ai as its docs write it, on an OpenAI-compatible model: recorded, replayed,
edited and forked."""

from __future__ import annotations

import pytest

from replayable.store import MemoryStore
from tests.integrations.agent_checks import check_agent, load_example
from tests.integrations.servers import FakeProvider
from tests.integrations.wire import said

# run_sync runs the agent on an event loop of its own; the provider's pooled connection
# outlives that loop and is collected unclosed (pydantic-ai's doing, not the recording's).
pytestmark = [
    pytest.mark.usefixtures("sdk_leftovers"),
    pytest.mark.filterwarnings(
        "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
    ),
]
example = load_example("pydantic_ai_agent")
QUESTION = "What is the weather in Lisbon"


def _check(fn: object, provider: FakeProvider, store: MemoryStore) -> str:
    return check_agent(
        example,
        fn,  # type: ignore[arg-type]
        (provider.url + "/v1", QUESTION),
        provider=provider,
        store=store,
        tool_step=2,
        arg_step=2,
        override="storm warning",
        forked_text="Lisbon: storm warning",
    )


def test_run_sync(provider: FakeProvider, store: MemoryStore) -> None:
    """agent.run_sync with a tool."""
    run_id = _check(example.ask, provider, store)
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [
        ("llm", "openai.chat.completions"),
        ("tool", "lookup_forecast"),
        ("llm", "openai.chat.completions"),
    ]
    assert said(events[0])[0]["role"] == "system"


def test_run_async(provider: FakeProvider, store: MemoryStore) -> None:
    """await agent.run(...)."""
    _check(example.aask, provider, store)


def test_run_stream(provider: FakeProvider, store: MemoryStore) -> None:
    """agent.run_stream: the chat-completions SSE stream with a tool call."""
    _check(example.ask_streamed, provider, store)
