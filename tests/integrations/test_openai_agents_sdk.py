"""The OpenAI Agents SDK as its docs write it: recorded, replayed, edited and forked."""

from __future__ import annotations

import os

import pytest
from agents import set_default_openai_client
from openai import AsyncOpenAI

from replayable.store import MemoryStore
from tests.integrations.agent_checks import check_agent, load_example
from tests.integrations.servers import FakeProvider

# Runner.run_sync runs the agent on an event loop of its own and closes it, leaving the
# SDK's pooled connection to be collected unclosed; that is the SDK's doing, not a leak
# of the recording (the async tests close their loop's transports the same way).
pytestmark = [
    pytest.mark.usefixtures("sdk_leftovers"),
    pytest.mark.filterwarnings(
        "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
    ),
]
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
example = load_example("openai_agents_sdk")


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_run_sync(api: str, provider: FakeProvider, store: MemoryStore) -> None:
    """Runner.run_sync on the Responses API and on chat completions."""
    run_id = check_agent(
        example,
        example.ask,
        (provider.url + "/v1", "What is the weather in Lisbon", api),
        provider=provider,
        store=store,
        tool_step=2,
        arg_step=2,
        override="storm warning",
        forked_text="Lisbon: storm warning",
    )
    events = store.events(run_id)
    name = "openai.responses" if api == "responses" else "openai.chat.completions"
    assert [(e.kind, e.name) for e in events] == [
        ("llm", name),
        ("tool", "lookup_forecast"),
        ("llm", name),
    ]
    assert events[1].request_value() == {"city": "Lisbon", "units": "metric"}


def test_runner_run(provider: FakeProvider, store: MemoryStore) -> None:
    """await Runner.run(...)."""
    check_agent(
        example,
        example.aask,
        (provider.url + "/v1", "What is the weather in Lisbon"),
        provider=provider,
        store=store,
        tool_step=2,
        arg_step=2,
        override="storm warning",
        forked_text="Lisbon: storm warning",
    )


def test_run_streamed(provider: FakeProvider, store: MemoryStore) -> None:
    """Runner.run_streamed: the SSE stream of the Responses API, tool call included."""
    check_agent(
        example,
        example.ask_streamed,
        (provider.url + "/v1", "What is the weather in Lisbon"),
        provider=provider,
        store=store,
        tool_step=2,
        arg_step=2,
        override="storm warning",
        forked_text="Lisbon: storm warning",
    )


def test_the_sdks_default_model_and_client(
    provider: FakeProvider, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model named: the SDK's default Responses model on the default client."""
    from agents.models import _openai_shared

    monkeypatch.setattr(_openai_shared, "_default_openai_client", None)
    set_default_openai_client(AsyncOpenAI(base_url=provider.url + "/v1", api_key="sk-example"))
    run_id = check_agent(
        example,
        example.ask_default,
        ("What is the weather in Lisbon",),
        provider=provider,
        store=store,
        tool_step=2,
        arg_step=2,
        override="storm warning",
        forked_text="Lisbon: storm warning",
    )
    assert [e.name for e in store.events(run_id)] == [
        "openai.responses",
        "lookup_forecast",
        "openai.responses",
    ]
