"""The OpenAI SDK recorded and replayed through the HTTP seam, against a local fake server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import orjson
import pytest

import replayable
from replayable.integrations import http
from replayable.integrations import openai as ro
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider
from tests.integrations.wire import answered, said

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@replayable.tool
def get_weather(city: str) -> str:
    return f"sunny in {city}"


def _chat_loop(client: openai.OpenAI, prompt: str) -> str:
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(3):
        r = client.chat.completions.create(
            model="fake-1", messages=messages, tools=TOOLS, temperature=0.3, seed=7, max_tokens=50
        )
        msg = r.choices[0].message
        if not msg.tool_calls:
            return msg.content or ""
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            args = orjson.loads(call.function.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)}
            )
    return "gave up"


@replayable.workflow
def chat_agent(base_url: str, prompt: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key=KEY) as client:
        return _chat_loop(client, prompt)


@replayable.workflow
def stream_agent(base_url: str, prompt: str) -> dict[str, Any]:
    with openai.OpenAI(base_url=base_url, api_key=KEY) as client:
        stream = client.chat.completions.create(
            model="fake-1",
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        with client.chat.completions.stream(
            model="fake-1", messages=[{"role": "user", "content": prompt}], tools=TOOLS
        ) as helper:
            final = helper.get_final_completion()
        with client.chat.completions.with_streaming_response.create(
            model="fake-1", messages=[{"role": "user", "content": "raw"}], stream=True
        ) as raw:
            lines = [line for line in raw.iter_lines() if line]
        return {
            "pieces": pieces,
            "tool": final.choices[0].message.tool_calls[0].function.name,  # type: ignore[index]
            "raw_lines": len(lines),
        }


@replayable.workflow
def early_close_agent(base_url: str, prompt: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key=KEY) as client:
        stream = client.chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": prompt}], stream=True
        )
        first = ""
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = chunk.choices[0].delta.content
                break
        stream.close()
        return first


@replayable.workflow
def responses_agent(base_url: str, prompt: str) -> dict[str, Any]:
    with ro.client(base_url=base_url, api_key=KEY) as client:
        first = client.responses.create(
            model="fake-1",
            input=prompt,
            instructions="be brief",
            tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        )
        call = first.output[0]
        result = get_weather(**orjson.loads(call.arguments))  # type: ignore[union-attr]
        with client.responses.stream(
            model="fake-1",
            input=[
                {"role": "user", "content": prompt},
                {
                    "type": "function_call",
                    "call_id": call.call_id,  # type: ignore[union-attr]
                    "name": "get_weather",
                    "arguments": call.arguments,
                },  # type: ignore[union-attr]
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,  # type: ignore[union-attr]
                    "output": result,
                },
            ],
        ) as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        return {"deltas": deltas, "text": final.output_text}


@replayable.workflow
async def async_agent(base_url: str, prompt: str) -> dict[str, Any]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY) as client:
        one, two = await asyncio.gather(
            client.chat.completions.create(
                model="fake-1", messages=[{"role": "user", "content": prompt}]
            ),
            client.chat.completions.create(
                model="fake-1", messages=[{"role": "user", "content": "second"}]
            ),
        )
        stream = await client.chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": prompt}], stream=True
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return {
            "one": one.choices[0].message.content,
            "two": two.choices[0].message.content,
            "pieces": pieces,
        }


def _record(store: MemoryStore, fn: Any, *args: Any) -> tuple[str, Any]:
    with replayable.recording(store) as rec:
        out = asyncio.run(fn(*args)) if asyncio.iscoroutinefunction(fn.__wrapped__) else fn(*args)
    return rec.run_ids[0], out


def test_chat_tool_loop_replays_with_server_stopped(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A sync chat agent with a tool call replays identically once the server is gone."""
    run_id, out = _record(store, chat_agent, provider.url + "/v1", "weather in Paris")
    assert out == "Answer: sunny in Paris"
    provider.stop()
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [
        ("llm", "openai.chat.completions"),
        ("tool", "get_weather"),
        ("llm", "openai.chat.completions"),
    ]
    meta = events[0].metadata
    assert meta["provider"] == "openai"
    assert meta["model"] == "fake-1"
    assert (meta["temperature"], meta["seed"], meta["max_tokens"]) == (0.3, 7, 50)
    assert said(events[0]) == [{"role": "user", "content": "weather in Paris"}]
    assert answered(events[0])["tool_calls"][0]["name"] == "get_weather"
    assert meta["usage"]["input_tokens"] > 0
    assert said(events[2])[-1]["role"] == "tool"
    result = replayable.replay(run_id, store=store, fn=chat_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert result.events_served == 3


def test_changed_prompt_is_a_request_changed_divergence(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """Replaying with another prompt diverges at the first model call, naming the content."""
    run_id, _ = _record(store, chat_agent, provider.url + "/v1", "weather in Paris")
    provider.stop()

    @replayable.workflow(chat_agent.__replayable_workflow__.name)  # type: ignore[attr-defined]
    def edited(base_url: str, prompt: str) -> str:
        with openai.OpenAI(base_url=base_url, api_key=KEY) as client:
            return _chat_loop(client, prompt + " please")

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert div.reason == "request_changed"
    assert div.step == 1
    paths = [d.path for d in div.diff]
    assert any("messages" in p and p.endswith("content") for p in paths), paths
    assert "weather in Paris please" in div.message


def test_streams_helpers_and_raw_streaming_replay(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """SSE streams, the .stream() helper and with_streaming_response replay chunk for chunk."""
    run_id, out = _record(store, stream_agent, provider.url + "/v1", "tell me more")
    assert "".join(out["pieces"]) == "Answer: tell me more"
    assert out["tool"] == "get_weather"
    provider.stop()
    first = store.events(run_id)[0]
    value = orjson.loads(first.response or b"null")
    stream = value["stream"]
    assert stream["complete"]
    assert len(stream["chunks"]) == first.metadata["chunks"] > 4
    assert sum(size for size, _ in stream["chunks"]) == len(stream["data"].encode())
    assert value["assembled"]["choices"][0]["message"]["content"] == "Answer: tell me more"
    assert first.metadata["usage"]["output_tokens"] == 4
    result = replayable.replay(run_id, store=store, fn=stream_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_early_closed_stream_is_recorded_partial(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A stream closed after its first token is recorded as partial and replays the same."""
    provider.chunks = 50
    run_id, out = _record(store, early_close_agent, provider.url + "/v1", "hi")
    assert out == "w0 "
    provider.stop()
    (event,) = store.events(run_id)
    assert event.metadata["complete"] is False
    assert event.metadata["chunks"] < 50
    result = replayable.replay(run_id, store=store, fn=early_close_agent)
    assert result.status == "identical", result.divergence


def test_responses_api_with_tool_and_stream_helper(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """The responses API (plain and streamed) through the explicit client factory."""
    http.uninstall()  # the explicit transport alone must record
    try:
        with replayable.recording(store) as rec:
            http.uninstall()
            out = responses_agent(provider.url + "/v1", "weather in Oslo")
    finally:
        http.install()
    assert out["text"] == "Answer: sunny in Oslo"
    assert len(out["deltas"]) == 4
    provider.stop()
    events = store.events(rec.run_ids[0])
    assert [e.name for e in events] == ["openai.responses", "get_weather", "openai.responses"]
    assert said(events[0])[0] == {"role": "system", "content": "be brief"}
    assert answered(events[2])["content"] == "Answer: sunny in Oslo"
    result = replayable.replay(rec.run_ids[0], store=store, fn=responses_agent)
    assert result.status == "identical", result.divergence


def test_async_client_parallel_calls_and_stream(provider: FakeProvider, store: MemoryStore) -> None:
    """AsyncOpenAI: gathered calls and an async stream replay deterministically."""
    run_id, out = _record(store, async_agent, provider.url + "/v1", "async hello")
    assert out["one"] == "Answer: async hello"
    assert out["two"] == "Answer: second"
    provider.stop()
    assert len(store.events(run_id)) == 3
    result = replayable.replay(run_id, store=store, fn=async_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_secrets_and_volatile_headers_are_not_stored(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """The API key and x-stainless-* headers never reach the store; the request matches on body."""
    run_id, _ = _record(store, chat_agent, provider.url + "/v1", "weather in Rome")
    assert provider.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
    for e in store.events(run_id):
        stored = (e.request or "") + (e.response or "") + orjson.dumps(e.metadata).decode()
        assert KEY not in stored
        assert "x-stainless" not in stored.lower()
        assert "authorization" not in stored.lower()
    request = orjson.loads(store.events(run_id)[0].request)
    assert set(request) == {"method", "path", "headers", "body"}
    assert request["path"] == "/v1/chat/completions"


def test_a_secret_typed_into_a_prompt_is_redacted_everywhere_it_is_stored(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """The prompt reaches the request body (its metadata holds no message text): a key
    pasted into it is redacted there and in what is read from it, and the call still
    replays."""
    secret = "sk-proj-Pasted0Into1The2Prompt3"
    run_id, _ = _record(store, chat_agent, provider.url + "/v1", f"is {secret} valid?")
    assert any(secret in str(r["body"]) for r in provider.requests), "the model saw it"
    (event, *_) = [e for e in store.events(run_id) if e.kind == "llm"]
    for e in store.events(run_id):
        stored = (e.request or "") + (e.response or "") + orjson.dumps(e.metadata).decode()
        assert secret not in stored
    assert "[REDACTED]" in said(event)[0]["content"]
    result = replayable.replay(run_id, store=store, fn=chat_agent)
    assert result.status == "identical", result.divergence


def test_retries_collapse_into_one_event_and_replay_without_backoff(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A 500 then a success is one event with attempts=2; replay serves it with no sleep."""
    provider.fail_next = [500]
    run_id, out = _record(store, chat_agent, provider.url + "/v1", "weather in Lima")
    assert out == "Answer: sunny in Lima"
    assert len(provider.requests) == 3
    provider.stop()
    events = store.events(run_id)
    assert len(events) == 3
    assert events[0].metadata["attempts"] == 2
    assert events[0].metadata["retried"] == [{"status": 500}]
    assert events[0].metadata["status"] == 200


def test_exhausted_retries_and_connect_errors_replay_the_same_exception(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A final 503 and a refused connection are recorded and re-raised, without backoff."""
    dead = FakeProvider().start()
    dead_url = dead.url + "/v1"
    dead.stop()

    @replayable.workflow
    def failing(base_url: str, dead_url: str) -> list[str]:
        seen = []
        with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=1) as client:
            try:
                client.chat.completions.create(
                    model="fake-1", messages=[{"role": "user", "content": "x"}]
                )
            except openai.APIStatusError as exc:
                seen.append(f"{type(exc).__name__}:{exc.status_code}")
        with openai.OpenAI(base_url=dead_url, api_key=KEY, max_retries=1) as client:
            try:
                client.models.list()
            except openai.APIConnectionError as exc:
                seen.append(f"{type(exc).__name__}:{type(exc.__cause__).__name__}")
        return seen

    provider.fail_next = [503, 503]
    recorded_at = time.perf_counter()
    run_id, out = _record(store, failing, provider.url + "/v1", dead_url)
    recording_s = time.perf_counter() - recorded_at
    assert out == ["InternalServerError:503", "APIConnectionError:ConnectError"]
    provider.stop()
    first, second = store.events(run_id)
    assert first.metadata["attempts"] == 2
    assert first.metadata["status"] == 503
    assert second.kind == "http"
    assert second.name == "GET /v1/models"
    assert second.error is not None
    assert "ConnectError" in second.error
    started = time.perf_counter()
    result = replayable.replay(run_id, store=store, fn=failing)
    assert result.status == "identical", result.divergence
    assert result.output == out
    # The SDK backs off 0.5 s or more per retry while recording; replay skips it.
    assert time.perf_counter() - started < recording_s - 0.4


def test_no_run_no_recording(provider: FakeProvider, store: MemoryStore) -> None:
    """With the patches installed, calls outside a run go straight to the server."""
    http.install(force_import=True)
    assert any("httpx2" in name for name in http.installed())
    with openai.OpenAI(base_url=provider.url + "/v1", api_key=KEY) as client:
        r = client.chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": "plain"}]
        )
    assert r.choices[0].message.content == "Answer: plain"
    assert store.list_runs() == []


def test_fork_at_tool_step_runs_the_rest_live(provider: FakeProvider, store: MemoryStore) -> None:
    """Forking at the tool step with an override sends the changed result to the live model."""
    run_id, _ = _record(store, chat_agent, provider.url + "/v1", "weather in Paris")
    result = replayable.replay(
        run_id, store=store, fn=chat_agent, fork_at=2, overrides={2: "raining in Paris"}
    )
    assert result.output == "Answer: raining in Paris"
    assert result.new_run_id is not None
    forked = store.events(result.new_run_id)
    assert forked[-1].name == "openai.chat.completions"
    assert said(forked[-1])[-1]["content"] == "raining in Paris"
    assert len(provider.requests) == 3  # the first model call came from the tape


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
def test_plain_http_clients_record_http_events(
    provider: FakeProvider, store: MemoryStore, library: str
) -> None:
    """Non-LLM requests through httpx and httpx2, sync and async, are ``http`` events."""

    @replayable.workflow
    def fetch(url: str) -> list[Any]:
        with http.client(library=library) as c:
            sync = c.get(url + "/v1/models", params={"b": "2", "a": "1"}).json()

        async def both() -> Any:
            async with http.async_client(library=library) as ac:
                return (await ac.get(url + "/v1/models")).json()

        return [sync, asyncio.run(both())]

    run_id, out = _record(store, fetch, provider.url)
    assert out[0]["data"][0]["id"] == "fake-1"
    assert out[1] == out[0]
    provider.stop()
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [("http", "GET /v1/models")] * 2
    assert orjson.loads(events[0].request)["query"] == [["a", "1"], ["b", "2"]]
    result = replayable.replay(run_id, store=store, fn=fetch)
    assert result.status == "identical", result.divergence
