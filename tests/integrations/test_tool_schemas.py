"""The tools offered in each LLM turn: names and schema hashes in the event, named by diff."""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import openai
import pytest

import replayable
from replayable.store import MemoryStore
from tests.integrations.agent_checks import record
from tests.integrations.servers import FakeProvider

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
TOOLS: list[Any] = [WEATHER, TIME]


@replayable.workflow("schemas.chat")
def chat(base_url: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key=KEY) as client:
        reply = client.chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": "hi"}], tools=TOOLS
        )
        return reply.choices[0].finish_reason


@replayable.workflow("schemas.anthropic")
def messages(base_url: str) -> str:
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]
    with anthropic.Anthropic(base_url=base_url, api_key=KEY) as client:
        reply = client.messages.create(
            model="claude-x",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            tools=tools,
        )
        return str(reply.stop_reason)


@pytest.mark.parametrize("agent", [chat, messages], ids=["openai", "anthropic"])
def test_each_llm_turn_names_its_tools_and_hashes_their_schemas(
    agent: Any, provider: FakeProvider, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed parameter schema changes one hash, and diff says which tool changed."""
    first, _ = record(store, agent, provider.url + ("/v1" if agent is chat else ""))
    (event,) = store.events(first)
    schemas = event.metadata["tool_schemas"]
    assert list(schemas) == ["get_weather", "get_time"]
    assert all(h.startswith("sha256:") and len(h) == 23 for h in schemas.values())
    assert event.metadata["tools"] == ["get_weather", "get_time"]

    again, _ = record(store, agent, provider.url + ("/v1" if agent is chat else ""))
    assert store.events(again)[0].metadata["tool_schemas"] == schemas

    changed = copy.deepcopy(WEATHER)
    changed["function"]["parameters"]["properties"]["units"] = {"type": "string"}
    monkeypatch.setattr("tests.integrations.test_tool_schemas.TOOLS", [changed, TIME])
    second, _ = record(store, agent, provider.url + ("/v1" if agent is chat else ""))
    new = store.events(second)[0].metadata["tool_schemas"]
    assert new["get_time"] == schemas["get_time"]
    assert new["get_weather"] != schemas["get_weather"]
    d = replayable.diff(first, second, store=store)
    assert d.first is not None
    assert d.first.describe().endswith("the schema of tool get_weather changed"), d.first

    provider.stop()
    result = replayable.replay(first, store=store, fn=agent)
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", 1)
    assert div.changed_tools == ["get_weather"]
    assert "  the schema of tool get_weather changed" in div.message.splitlines()
