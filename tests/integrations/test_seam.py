"""The HTTP seam's description of requests and streams, against straightforward references.

The seam's hot path parses server-sent events in one pass and caches header
names, routes and call-site decisions; these tests pin that the results are
those of the plain implementations below, on edge cases and on random input.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any
from urllib.parse import parse_qsl

import httpx
import httpx2
import openai
import orjson
import pytest

import replayable
from replayable.capture.writer import deferred
from replayable.events.codec import decode_value
from replayable.integrations import _exchange, _sse
from replayable.store import MemoryStore
from replayable.store.verify import verify_run
from tests.integrations.servers import FakeProvider
from tests.integrations.wire import answered, said

# -- references -------------------------------------------------------------------


def reference_parse_sse(data: bytes) -> list[tuple[str | None, Any]]:
    events: list[tuple[str | None, Any]] = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        event: str | None = None
        lines: list[bytes] = []
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                lines.append(line[5:].lstrip(b" "))
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode()
        if not lines:
            continue
        raw = b"\n".join(lines)
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw.decode(errors="replace")
        events.append((event, value))
    return events


def reference_assemble_chat(events: list[tuple[str | None, Any]]) -> Any:
    out: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for _, chunk in events:
        if not isinstance(chunk, dict):
            continue
        for key in ("id", "model", "created", "system_fingerprint"):
            if chunk.get(key) is not None:
                out[key] = chunk[key]
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for c in chunk.get("choices") or ():
            choice = choices.setdefault(
                c.get("index", 0),
                {
                    "index": c.get("index", 0),
                    "finish_reason": None,
                    "message": {"role": "assistant", "content": None},
                },
            )
            delta = c.get("delta") or {}
            msg = choice["message"]
            if delta.get("content"):
                msg["content"] = (msg["content"] or "") + delta["content"]
            for tc in delta.get("tool_calls") or ():
                calls = msg.setdefault("tool_calls", [])
                i = tc.get("index", 0)
                while len(calls) <= i:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                if tc.get("id"):
                    calls[i]["id"] = tc["id"]
                fn = tc.get("function") or {}
                calls[i]["function"]["name"] += fn.get("name") or ""
                calls[i]["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                choice["finish_reason"] = c["finish_reason"]
    out["object"] = "chat.completion"
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


# -- server-sent events -------------------------------------------------------------

STREAMS = [
    b"",
    b"data: [DONE]\n\n",
    b'data: {"a": 1}\n\ndata:{"b": 2}\n\ndata:    3\n\ndata: [DONE]\n\n',
    b'data: {"a": 1}',  # no final blank line
    b'data: {"a": 1}\r\n\r\ndata: {"b": 2}\r\n\r\n',
    b'event: message_start\ndata: {"type": "message_start"}\n\n: keep-alive\n\nevent: ping\n\n',
    b'data: {"a":\ndata: 1}\n\ndata: not json\n\ndata:\n\n',
    b"data: x\rdata: y\n\nretry: 10\n\nid: 4\ndata: z\n\n\n\n\ndata: w\n\n",
    b"event:  spaced  \ndata: \xff\xfe\n\n",
]


@pytest.mark.parametrize("data", STREAMS)
def test_iter_sse_matches_the_reference(data: bytes) -> None:
    assert list(_sse.iter_sse(data)) == reference_parse_sse(data)


def test_iter_sse_matches_the_reference_on_random_streams() -> None:
    rng = random.Random(7)
    pieces = [
        b"data: ",
        b"data:",
        b"event: e",
        b": c",
        b'{"x": 1}',
        b"[DONE]",
        b"\n",
        b"\n\n",
        b"\r\n",
        b"\r",
        b" ",
        b"1",
        b"id: 3",
    ]
    for _ in range(2000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        assert list(_sse.iter_sse(data)) == reference_parse_sse(data), data


def _chat_stream(rng: random.Random) -> bytes:
    events = []
    for _ in range(rng.randrange(8)):
        chunk: dict[str, Any] = {"id": rng.choice(["a", None]), "model": rng.choice(["m", None])}
        if rng.random() < 0.3:
            chunk["system_fingerprint"] = "fp"
        if rng.random() < 0.2:
            chunk["usage"] = rng.choice([None, {}, {"prompt_tokens": 3}])
        choices = []
        for _ in range(rng.randrange(3)):
            delta: dict[str, Any] = {}
            if rng.random() < 0.7:
                delta["content"] = rng.choice(["", "x", "yz", None])
            if rng.random() < 0.3:
                delta["tool_calls"] = [
                    {
                        "index": rng.randrange(2),
                        "id": rng.choice([None, "t"]),
                        "function": {"name": rng.choice(["", "f", None]), "arguments": "{"},
                    }
                ]
            choice: dict[str, Any] = {"delta": delta}
            if rng.random() < 0.8:
                choice["index"] = rng.randrange(2)
            if rng.random() < 0.3:
                choice["finish_reason"] = rng.choice([None, "stop"])
            choices.append(choice)
        chunk["choices"] = choices
        events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if rng.random() < 0.5:
        events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def test_chat_streams_assemble_as_the_reference() -> None:
    rng = random.Random(11)
    for _ in range(1000):
        data = _chat_stream(rng)
        events = reference_parse_sse(data)
        assembled, finished = _sse.read_sse("openai.chat.completions", data)
        if events:
            assert assembled == reference_assemble_chat(events), data
        else:
            assert assembled is None
        assert finished == (bool(events) and events[-1][1] == "[DONE]")


def test_read_sse_of_empty_unknown_and_other_streams() -> None:
    assert _sse.read_sse("openai.chat.completions", b"") == (None, False)
    assert _sse.read_sse("openai.chat.completions", b": ping\n\n") == (None, False)
    assert _sse.read_sse("openai.embeddings", b"data: [DONE]\n\n") == (None, True)
    assert _sse.read_sse("openai.embeddings", b"data: {}\n\n") == (None, False)
    anthropic = (
        b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m"}}\n\n'
        b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
        b'"delta": {"type": "text_delta", "text": "hi"}}\n\n'
        b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    )
    assembled, finished = _sse.read_sse("anthropic.messages", anthropic)
    assert finished
    assert assembled == {"id": "m", "content": [{"type": "text", "text": "hi"}]}


# -- requests -----------------------------------------------------------------------


def _headers() -> list[tuple[str, str]]:
    return [
        ("Authorization", "Bearer sk-secret-abcdefghijklmnopqrstuvwxyz"),
        ("X-Stainless-OS", "Linux"),
        ("Content-Type", "application/json"),
        ("X-Dup", "a"),
        ("x-dup", "b"),
        ("User-Agent", "Anthropic/Python 1.0"),
        ("Accept", "application/json"),
    ]


@pytest.mark.parametrize("hx", [httpx, httpx2])
def test_prepare_keeps_the_same_headers_and_route(hx: Any) -> None:
    request = hx.Request(
        "POST", "https://api.example.com/v1/messages?b=2&a=", headers=_headers(), json={"m": 1}
    )
    for _ in range(2):  # the second time, from the caches
        ex = _exchange.prepare(request, request.content, hx.__name__)
        assert (ex.kind, ex.name) == ("llm", "anthropic.messages")
        assert ex.request == {
            "method": "POST",
            "path": "/v1/messages",
            "query": [("a", ""), ("b", "2")],
            "headers": {
                "content-type": "application/json",
                "x-dup": "a, b",
                "accept": "application/json",
            },
            "body": {"m": 1},
        }
        assert ex.meta["provider"] == "anthropic"
    plain = hx.Request("POST", "https://api.example.com/v1/messages", json={"m": 1})
    assert _exchange.prepare(plain, plain.content, hx.__name__).name == "POST /v1/messages"
    versioned = hx.Request(
        "POST", "https://h/v1/messages", headers={"anthropic-version": "1"}, json={"m": 1}
    )
    assert _exchange.prepare(versioned, versioned.content, hx.__name__).kind == "llm"


@pytest.mark.parametrize("hx", [httpx, httpx2])
@pytest.mark.parametrize(
    "url",
    ["https://h/v1/pa%20th/x?q=a%20b&r=", "https://h", "https://h/?", "https://h/a%3Fb?c=1"],
)
def test_prepare_reads_path_and_query_as_the_library_does(hx: Any, url: str) -> None:
    """The path is decoded from the raw target (as ``url.path`` is) and the query kept raw."""
    request = hx.Request("GET", url)
    ex = _exchange.prepare(request, b"", hx.__name__)
    assert ex.request["path"] == request.url.path
    assert ex.request.get("query", []) == sorted(
        parse_qsl(request.url.query.decode(), keep_blank_values=True)
    )
    assert ex.name == f"GET {request.url.path}"


def test_headers_without_the_internal_list_are_read_the_same() -> None:
    class Plain:
        def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
            self.raw = pairs

    request = httpx2.Request("GET", "https://h/x", headers=_headers())
    plain = Plain(request.headers.raw)
    assert _exchange._request_headers(plain) == _exchange._request_headers(request.headers)
    assert _exchange.read_head(plain) == _exchange.read_head(request.headers)
    items, content_type, should_retry = _exchange.read_head(request.headers)
    assert ("content-type", "application/json") in _exchange.pairs(items)
    assert (content_type, should_retry) == (b"application/json", None)
    assert _exchange._anthropic_agent(plain) is _exchange._anthropic_agent(request.headers) is True


def test_call_site_skips_sdk_frames_and_names_the_caller() -> None:
    sdk: dict[str, Any] = {"__name__": "openai._fake", "call_site": _exchange.call_site}
    exec("def request():\n    return call_site()\n", sdk)
    for _ in range(2):  # the second time, the module's verdict comes from the cache
        site, line = sdk["request"](), sys._getframe().f_lineno
        assert site == f"{__file__}:{line} in test_call_site_skips_sdk_frames_and_names_the_caller"


# -- events built by the writer ---------------------------------------------------


@replayable.workflow
def _one_chat(base_url: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key="sk-test-abcdefghijklmnopqrstuvwxyz0123") as c:
        r = c.chat.completions.create(model="fake-1", messages=[{"role": "user", "content": "hi"}])
        return r.choices[0].message.content or ""


def test_http_events_are_built_by_the_writer_not_the_agent_thread(
    provider: FakeProvider, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing bodies and describing the LLM call happen in the writer, once per event."""
    threads: list[int] = []
    build = deferred._load("http")

    def counted(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return build(*args)

    monkeypatch.setitem(deferred._LOADED, "http", counted)
    with replayable.recording(store) as rec:
        assert _one_chat(provider.url + "/v1") == "Answer: hi"
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()
    (event,) = store.events(rec.run_ids[0])
    assert answered(event)["content"] == "Answer: hi"
    assert said(event) == [{"role": "user", "content": "hi"}]


def test_a_failing_builder_still_records_the_event(
    provider: FakeProvider, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a builder loses nothing: the raw parts are stored and the chain holds."""

    def broken(*args: Any) -> Any:
        raise ValueError("no such field")

    monkeypatch.setitem(deferred._LOADED, "http", broken)
    with replayable.recording(store) as rec:
        assert _one_chat(provider.url + "/v1") == "Answer: hi"
    run_id = rec.run_ids[0]
    (event,) = store.events(run_id)
    assert event.metadata["build_error"] == "http: ValueError: no such field"
    assert (event.kind, event.name) == ("llm", "openai.chat.completions")
    raw = decode_value(event.request, "tagged")["raw"]
    assert raw[2:4] == ["POST", "/v1/chat/completions"]
    assert "authorization" not in raw[5]  # secrets were dropped before the hand-off
    assert b'"content":"hi"' in raw[6]
    assert verify_run(store, run_id).ok
    assert store.get_run(run_id).status == "completed"
