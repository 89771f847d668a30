"""LangGraph's prebuilt ReAct agent with ChatOpenAI, with and without ``instrument()``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replayable.integrations import langgraph as rlg
from replayable.store import MemoryStore
from tests.integrations.agent_checks import check_agent, load_example
from tests.integrations.servers import FakeProvider

example = load_example("langgraph_react")
QUESTION = "What is the weather in Lisbon"


@pytest.fixture(params=[False, True], ids=["http-seam", "instrumented"])
def instrumented(request: pytest.FixtureRequest) -> Iterator[bool]:
    """The zero-change path (the HTTP seam alone) or LangGraph's integration."""
    was = rlg.instrumented()
    if request.param:
        rlg.instrument()
    else:
        rlg.uninstrument()
    yield request.param
    if was:
        rlg.instrument()
    else:
        rlg.uninstrument()


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream-messages"])
def test_react_agent(
    streamed: bool,
    instrumented: bool,
    provider: FakeProvider,
    store: MemoryStore,
) -> None:
    """Records, replays three times, names an edited prompt and tool argument, and forks
    at the forecast call, whichever way the agent is recorded and whether it streams."""
    # Instrumented, the LangChain tool is step 2 and the forecast it asks step 3.
    forecast = 3 if instrumented else 2
    run_id = check_agent(
        example,
        example.ask_streamed if streamed else example.ask,
        (provider.url + "/v1", QUESTION),
        provider=provider,
        store=store,
        tool_step=forecast,
        arg_step=forecast,
        override="storm warning",
        forked_text="Lisbon: storm warning",
    )
    events = store.events(run_id)
    if instrumented:
        assert [(e.kind, e.name, e.parent) for e in events] == [
            ("llm", "langchain.ChatOpenAI", None),
            ("tool", "get_weather", None),
            ("tool", "lookup_forecast", 2),
            ("llm", "langchain.ChatOpenAI", None),
        ]
        assert events[1].metadata["nested"] == 1
        assert list(events[0].metadata["tool_schemas"]) == ["get_weather"]
    else:
        assert [(e.kind, e.name) for e in events] == [
            ("llm", "openai.chat.completions"),
            ("tool", "lookup_forecast"),
            ("llm", "openai.chat.completions"),
        ]
        assert list(events[0].metadata["tool_schemas"]) == ["get_weather"]
