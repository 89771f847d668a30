"""The Anthropic SDK recorded and replayed through the HTTP seam, against a local fake server."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import orjson

import replayable
from replayable.integrations import anthropic as ra
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider
from tests.integrations.wire import answered, said

KEY = "sk-ant-test-abcdefghijklmnopqrstuvwxyz0123"
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@replayable.tool
def get_weather(city: str) -> str:
    return f"sunny in {city}"


def _loop(client: anthropic.Anthropic, prompt: str) -> str:
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(3):
        r = client.messages.create(
            model="claude-fake",
            max_tokens=64,
            system="be brief",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "auto"},
            stop_sequences=["END"],
        )
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in r.content if b.type == "text")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in r.content]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": get_weather(**u.input)}
                    for u in uses
                ],
            }
        )
    return "gave up"


@replayable.workflow
def messages_agent(base_url: str, prompt: str) -> str:
    with anthropic.Anthropic(base_url=base_url, api_key=KEY) as client:
        return _loop(client, prompt)


@replayable.workflow
def stream_agent(base_url: str, prompt: str) -> dict[str, Any]:
    with ra.client(base_url=base_url, api_key=KEY) as client:
        with client.messages.stream(
            model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": prompt}]
        ) as s:
            pieces = list(s.text_stream)
            final = s.get_final_message()
        raw = client.messages.create(
            model="claude-fake",
            max_tokens=64,
            stream=True,
            tools=TOOLS,
            messages=[{"role": "user", "content": "weather in Bern"}],
        )
        kinds = [event.type for event in raw]
        return {"pieces": pieces, "usage": final.usage.output_tokens, "kinds": kinds}


@replayable.workflow
async def async_agent(base_url: str, prompt: str) -> dict[str, Any]:
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key=KEY) as client:
        one = await client.messages.create(
            model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": prompt}]
        )
        async with client.messages.stream(
            model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": prompt}]
        ) as s:
            pieces = [t async for t in s.text_stream]
        return {"one": one.content[0].text, "pieces": pieces}  # type: ignore[union-attr]


def _record(store: MemoryStore, fn: Any, *args: Any) -> tuple[str, Any]:
    with replayable.recording(store) as rec:
        out = asyncio.run(fn(*args)) if asyncio.iscoroutinefunction(fn.__wrapped__) else fn(*args)
    return rec.run_ids[0], out


def test_messages_tool_loop_replays_with_server_stopped(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A messages agent with tool use replays identically once the server is gone."""
    run_id, out = _record(store, messages_agent, provider.url, "weather in Kyoto")
    assert out == "Answer: sunny in Kyoto"
    provider.stop()
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [
        ("llm", "anthropic.messages"),
        ("tool", "get_weather"),
        ("llm", "anthropic.messages"),
    ]
    meta = events[0].metadata
    assert meta["provider"] == "anthropic"
    assert meta["model"] == "claude-fake"
    assert meta["max_tokens"] == 64
    assert meta["stop_sequences"] == ["END"]
    assert meta["tool_choice"] == {"type": "auto"}
    assert said(events[0])[0] == {"role": "system", "content": "be brief"}
    assert answered(events[0])["tool_calls"] == [
        {"id": "toolu_1", "name": "get_weather", "arguments": {"city": "Kyoto"}}
    ]
    assert said(events[2])[-1]["tool_results"][0]["content"] == "sunny in Kyoto"
    assert meta["usage"]["output_tokens"] == 4
    for e in events:
        assert KEY not in (e.request or "") + (e.response or "")
    result = replayable.replay(run_id, store=store, fn=messages_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_changed_prompt_diverges_on_message_content(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A different user message is a request_changed divergence whose diff names the content."""
    run_id, _ = _record(store, messages_agent, provider.url, "weather in Kyoto")
    provider.stop()

    @replayable.workflow(messages_agent.__replayable_workflow__.name)  # type: ignore[attr-defined]
    def edited(base_url: str, prompt: str) -> str:
        with anthropic.Anthropic(base_url=base_url, api_key=KEY) as client:
            return _loop(client, "weather in Osaka")

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert div.reason == "request_changed"
    assert [d.path for d in div.diff] == ["body.messages[0].content"]
    assert (div.diff[0].expected, div.diff[0].actual) == ("weather in Kyoto", "weather in Osaka")


def test_stream_helper_and_raw_stream_replay(provider: FakeProvider, store: MemoryStore) -> None:
    """messages.stream() and stream=True replay event for event; the stream is assembled."""
    run_id, out = _record(store, stream_agent, provider.url, "stream it")
    assert "".join(out["pieces"]) == "Answer: stream it"
    assert out["usage"] == 3
    assert out["kinds"][0] == "message_start"
    assert out["kinds"][-1] == "message_stop"
    provider.stop()
    first, second = store.events(run_id)
    assert first.metadata["complete"] is True
    assert answered(first)["content"] == "Answer: stream it"
    assembled = orjson.loads(second.response or b"null")["assembled"]
    assert assembled["content"][0]["input"] == {"city": "Bern"}
    assert answered(second)["tool_calls"][0]["name"] == "get_weather"
    result = replayable.replay(run_id, store=store, fn=stream_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_async_messages_and_stream(provider: FakeProvider, store: MemoryStore) -> None:
    """AsyncAnthropic: a message and an async stream replay with the server stopped."""
    run_id, out = _record(store, async_agent, provider.url, "async hi")
    assert out["one"] == "Answer: async hi"
    assert "".join(out["pieces"]) == "Answer: async hi"
    provider.stop()
    result = replayable.replay(run_id, store=store, fn=async_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_fork_at_tool_step_runs_the_model_live(provider: FakeProvider, store: MemoryStore) -> None:
    """Forking at the tool step sends the overriding tool result to the live server."""
    run_id, _ = _record(store, messages_agent, provider.url, "weather in Kyoto")
    result = replayable.replay(
        run_id, store=store, fn=messages_agent, fork_at=2, overrides={2: "snow in Kyoto"}
    )
    assert result.output == "Answer: snow in Kyoto"
    assert result.new_run_id is not None
    assert len(provider.requests) == 3
