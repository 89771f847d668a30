"""The recording and replaying HTTP seam, shared by the ``httpx`` and ``httpx2`` transports.

One request is one boundary call, opened with :meth:`RunContext.begin`:

- recording, the real transport sends it; a buffered response is read and
  recorded at once, a server-sent event stream is recorded chunk by chunk
  (raw bytes and the time of each chunk) and the event is finished when the
  response is closed, complete or not;
- replaying, the recorded response is rebuilt (the same status, headers and
  chunks) and handed to the SDK, which parses it as it did live.

Inside an SDK's retry loop (see :class:`RetryScope`) the attempts of one
logical call are collapsed into one event holding the final outcome.
"""

from __future__ import annotations

import contextvars
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl

import orjson

from replayable.capture.context import State
from replayable.capture.runtime import OpenCall
from replayable.errors import ReplayError
from replayable.events.codec import decode_error, encode_error
from replayable.integrations import _wire

__all__ = ["SCOPE", "Exchange", "Flavor", "RetryScope", "flavor"]

#: Request headers left out of the recorded request: secrets (never stored) and
#: values that change on every call (never part of the fingerprint).
DROPPED_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "user-agent",
        "idempotency-key",
        "x-idempotency-key",
        "traceparent",
        "tracestate",
        "baggage",
        "content-length",
        "host",
        "accept-encoding",
        "connection",
        "x-request-id",
        "request-id",
    }
)
_DROPPED_PREFIXES = ("x-stainless-", "x-datadog-", "sentry-")
_BUFFERED_DROP = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "set-cookie"}
)
_STREAM_DROP = frozenset({"set-cookie"})
_STREAM_TYPES = ("text/event-stream", "application/x-ndjson", "application/jsonl")
_RETRY_STATUS = frozenset({408, 409, 429})
_FOREIGN = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "openai",
    "anthropic",
    "litellm",
    "replayable.integrations",
    "asyncio",
    "anyio",
    "contextlib",
    "concurrent",
    "threading",
    "functools",
)


# -- requests -------------------------------------------------------------------


class Exchange:
    """A request as the seam records it: its boundary, request value and metadata."""

    __slots__ = ("kind", "meta", "name", "request")

    def __init__(self, kind: str, name: str, request: dict[str, Any], meta: dict[str, Any]) -> None:
        self.kind, self.name, self.request, self.meta = kind, name, request, meta


def _body_value(content_type: str, body: bytes) -> tuple[str, Any]:
    """``(field, value)`` for a body: parsed JSON, text, or raw bytes."""
    if not body:
        return "text", ""
    if "json" in content_type:
        try:
            return "body", orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return "text", body.decode()
    except UnicodeDecodeError:
        return "content", body


def _pairs(headers: Any) -> list[tuple[str, str]]:
    # One pass over the raw bytes: the libraries' own accessors re-decode every
    # header on each lookup.
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in headers.raw]


def prepare(request: Any, body: bytes, transport: str) -> Exchange:
    """The recorded form of an outgoing request (auth and volatile headers left out)."""
    url = request.url
    method: str = request.method
    path: str = url.path
    headers: dict[str, str] = {}
    every: dict[str, str] = {}
    for k, v in _pairs(request.headers):
        every[k] = v
        if k in DROPPED_HEADERS or k.startswith(_DROPPED_PREFIXES):
            continue
        headers[k] = f"{headers[k]}, {v}" if k in headers else v
    kind, name, provider = _wire.classify(method, path, every)
    field, value = _body_value(headers.get("content-type", ""), body)
    req: dict[str, Any] = {"method": method, "path": path}
    if url.query:
        req["query"] = sorted(parse_qsl(url.query.decode(), keep_blank_values=True))
    req["headers"] = headers
    req[field] = value
    meta: dict[str, Any] = {"host": url.host, "transport": transport}
    if kind == "llm":
        meta.update(_wire.describe_request(name, provider, value))
    return Exchange(kind, name, req, meta)


def call_site() -> str | None:
    """``file:line in function`` of the nearest frame outside the HTTP and SDK stacks."""
    f: Any = sys._getframe(2)
    while f is not None:
        module = f.f_globals.get("__name__", "")
        if not module.startswith(_FOREIGN):
            co = f.f_code
            return f"{co.co_filename}:{f.f_lineno} in {co.co_name}"
        f = f.f_back
    return None


def begin(st: State, ex: Exchange) -> OpenCall:
    assert st.run is not None
    return st.run.begin(st, ex.kind, ex.name, ex.request, False, ex.meta, call_site())


# -- retries --------------------------------------------------------------------


class RetryScope:
    """One logical SDK request (its retry loop): attempts share one boundary call.

    Recording, a retryable outcome (a transport error, 408/409/429, 5xx or
    ``x-should-retry: true``) is held until the SDK either retries (the next
    attempt replaces it) or gives up (the scope closes and the held outcome is
    recorded). Replaying, every attempt is served the recorded final outcome
    and the SDK's backoff does not sleep.
    """

    __slots__ = ("attempts", "call", "earlier", "held", "request")

    def __init__(self) -> None:
        self.call: OpenCall | None = None
        self.request: dict[str, Any] | None = None
        self.attempts = 0
        self.held: tuple[Any, BaseException | None, dict[str, Any]] | None = None
        self.earlier: list[Any] = []

    @property
    def served(self) -> bool:
        """Whether this scope's call is answered from a tape (so retries need no backoff)."""
        return self.call is not None and not self.call.live

    def attach(self, st: State, ex: Exchange) -> OpenCall:
        """The call for this attempt: the scope's own when it repeats the same request."""
        if self.call is not None and self.request == ex.request:
            self.attempts += 1
            if self.held is not None:
                value, exc, _ = self.held
                self.earlier.append(_summary(value, exc))
                self.held = None
            return self.call
        self.close()
        self.call, self.request, self.attempts, self.earlier = begin(st, ex), ex.request, 1, []
        return self.call

    def annotate(self, meta: dict[str, Any]) -> dict[str, Any]:
        if self.attempts > 1:
            meta["attempts"] = self.attempts
            meta["retried"] = list(self.earlier)
        return meta

    def close(self) -> None:
        """Record the held outcome, if any (the SDK did not retry it)."""
        held, self.held = self.held, None
        if held is None or self.call is None:
            return
        value, exc, meta = held
        if exc is not None:
            self.call.fail(exc, self.annotate(meta))
        else:
            self.call.finish(value, self.annotate(meta))


def _summary(value: Any, exc: BaseException | None) -> Any:
    if exc is not None:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"status": value["status"]}


SCOPE: contextvars.ContextVar[RetryScope | None] = contextvars.ContextVar(
    "replayable_http_retry_scope", default=None
)


def _retryable(status: int, headers: dict[str, str]) -> bool:
    should = headers.get("x-should-retry")
    if should is not None:
        return should == "true"
    return status in _RETRY_STATUS or status >= 500


def _settle(
    call: OpenCall,
    scope: RetryScope | None,
    value: Any,
    exc: BaseException | None,
    meta: dict[str, Any],
    retryable: bool,
) -> None:
    if scope is not None and retryable:
        scope.held = (value, exc, meta)
        return
    if scope is not None:
        scope.annotate(meta)
    if exc is not None:
        call.fail(exc, meta)
    else:
        call.finish(value, meta)


def _response_meta(name: str, kind: str, body: Any) -> dict[str, Any]:
    return _wire.describe_response(name, body) if kind == "llm" else {}


def _buffered(
    ex: Exchange, resp: Any, pairs: list[tuple[str, str]], body: bytes
) -> tuple[dict[str, Any], dict[str, Any]]:
    headers = [[k, v] for k, v in pairs if k not in _BUFFERED_DROP]
    field, parsed = _body_value(dict(pairs).get("content-type", ""), body)
    value = {"status": resp.status_code, "headers": headers, field: parsed}
    meta = _response_meta(ex.name, ex.kind, parsed) if field == "body" else {}
    meta["status"] = resp.status_code
    return value, meta


def _is_stream(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").startswith(_STREAM_TYPES)


def _error_request(exc: BaseException, request: Any) -> BaseException:
    # Rebuilt httpx errors lack the request the SDK may read from them.
    if hasattr(type(exc), "request"):
        try:
            exc.request = request  # type: ignore[attr-defined]
        except Exception:
            pass
    return exc


# -- streams --------------------------------------------------------------------


class StreamRecord:
    """The chunks of a live stream, finished into its event when the response closes."""

    __slots__ = (
        "call",
        "complete",
        "done",
        "error",
        "ex",
        "headers",
        "marks",
        "parts",
        "scope",
        "status",
        "t0",
    )

    def __init__(
        self,
        call: OpenCall,
        scope: RetryScope | None,
        ex: Exchange,
        resp: Any,
        pairs: list[tuple[str, str]],
    ) -> None:
        self.call, self.scope, self.ex = call, scope, ex
        self.status: int = resp.status_code
        self.headers = [[k, v] for k, v in pairs if k not in _STREAM_DROP]
        self.parts: list[bytes] = []
        self.marks: list[int] = []
        self.error: BaseException | None = None
        self.complete = False
        self.done = False
        self.t0 = time.perf_counter_ns()

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        raw = b"".join(self.parts)
        encoded = any(k == "content-encoding" for k, _ in self.headers)
        data: str | bytes = raw
        if not encoded:
            try:
                data = raw.decode()
            except UnicodeDecodeError:
                pass
        t0 = self.t0
        chunks = [[len(p), (m - t0) // 1000] for p, m in zip(self.parts, self.marks, strict=True)]
        events = [] if encoded or self.ex.kind != "llm" else _wire.parse_sse(raw)
        assembled = _wire.assemble_sse(self.ex.name, events) if events else None
        # Complete: the provider's final event arrived (SDKs close right after it)
        # or the body ended. ``exhausted``: the body itself was read to its end.
        complete = self.complete or _wire.stream_finished(events)
        stream: dict[str, Any] = {
            "data": data,
            "chunks": chunks,
            "complete": complete,
            "exhausted": self.complete,
        }
        if self.error is not None:
            stream["error"] = orjson.loads(encode_error(self.error))
        value = {
            "status": self.status,
            "headers": self.headers,
            "stream": stream,
            "assembled": assembled,
        }
        meta = _response_meta(self.ex.name, self.ex.kind, assembled)
        meta.update(status=self.status, stream=True, chunks=len(chunks), complete=complete)
        if self.scope is not None:
            self.scope.annotate(meta)
        self.call.finish(value, meta)


def _replay_chunks(stream: dict[str, Any]) -> Iterator[bytes]:
    data = stream["data"]
    raw: bytes = data.encode() if isinstance(data, str) else data
    offset = 0
    for size, _ in stream["chunks"]:
        yield raw[offset : offset + size]
        offset += size
    if "error" in stream:
        raise decode_error(orjson.dumps(stream["error"]))
    if not stream["exhausted"]:
        raise ReplayError(
            f"the recorded stream was closed after {len(stream['chunks'])} chunks; "
            "the replayed code reads further than the recorded run did"
        )


# -- one flavor per HTTP library ------------------------------------------------------


class Flavor:
    """The seam bound to one HTTP library (``httpx`` or ``httpx2``)."""

    def __init__(self, hx: ModuleType) -> None:
        self.hx = hx
        self.name = hx.__name__
        self.transport_error: type[BaseException] = hx.TransportError
        self.recording_stream, self.async_recording_stream = _recording_streams(hx)
        self.replay_stream, self.async_replay_stream = _replay_streams(hx)

    # -- sync ---------------------------------------------------------------------

    def handle(self, st: State, request: Any, send: Callable[[Any], Any]) -> Any:
        """Record or replay one request; ``send`` is the real transport."""
        try:
            body = request.content
        except self.hx.RequestNotRead:
            body = request.read()
        ex = prepare(request, body, self.name)
        scope = SCOPE.get()
        call = scope.attach(st, ex) if scope is not None else begin(st, ex)
        if not call.live:
            return self.served(call, request)
        try:
            resp = send(request)
        except BaseException as exc:
            _settle(call, scope, None, exc, {}, isinstance(exc, self.transport_error))
            raise
        pairs = _pairs(resp.headers)
        headers = dict(pairs)
        if _is_stream(headers):
            resp.stream = self.recording_stream(
                resp.stream, StreamRecord(call, scope, ex, resp, pairs)
            )
            return resp
        try:
            content = resp.read()
        except BaseException as exc:
            _settle(call, scope, None, exc, {}, isinstance(exc, self.transport_error))
            raise
        value, meta = _buffered(ex, resp, pairs, content)
        _settle(call, scope, value, None, meta, _retryable(resp.status_code, headers))
        return resp

    def served(self, call: OpenCall, request: Any) -> Any:
        """The recorded response of ``call``, rebuilt (or its recorded error, raised)."""
        try:
            value = call.value()
        except Exception as exc:
            raise _error_request(exc, request) from None
        status, headers = value["status"], value["headers"]
        if "stream" in value:
            return self.hx.Response(
                status, headers=headers, request=request, stream=self.replay_stream(value["stream"])
            )
        return self.hx.Response(status, headers=headers, request=request, content=_content(value))

    # -- async --------------------------------------------------------------------

    async def ahandle(self, st: State, request: Any, send: Callable[[Any], Awaitable[Any]]) -> Any:
        """Record or replay one request on an async transport."""
        try:
            body = request.content
        except self.hx.RequestNotRead:
            body = await request.aread()
        ex = prepare(request, body, self.name)
        scope = SCOPE.get()
        call = scope.attach(st, ex) if scope is not None else begin(st, ex)
        if not call.live:
            return self.aserved(call, request)
        try:
            resp = await send(request)
        except BaseException as exc:
            _settle(call, scope, None, exc, {}, isinstance(exc, self.transport_error))
            raise
        pairs = _pairs(resp.headers)
        headers = dict(pairs)
        if _is_stream(headers):
            resp.stream = self.async_recording_stream(
                resp.stream, StreamRecord(call, scope, ex, resp, pairs)
            )
            return resp
        try:
            content = await resp.aread()
        except BaseException as exc:
            _settle(call, scope, None, exc, {}, isinstance(exc, self.transport_error))
            raise
        value, meta = _buffered(ex, resp, pairs, content)
        _settle(call, scope, value, None, meta, _retryable(resp.status_code, headers))
        return resp

    def aserved(self, call: OpenCall, request: Any) -> Any:
        try:
            value = call.value()
        except Exception as exc:
            raise _error_request(exc, request) from None
        status, headers = value["status"], value["headers"]
        if "stream" in value:
            return self.hx.Response(
                status,
                headers=headers,
                request=request,
                stream=self.async_replay_stream(value["stream"]),
            )
        return self.hx.Response(status, headers=headers, request=request, content=_content(value))


def _content(value: dict[str, Any]) -> bytes:
    if "body" in value:
        return orjson.dumps(value["body"])
    if "text" in value:
        text: str = value["text"]
        return text.encode()
    content: bytes = value["content"]
    return content


def _recording_streams(hx: ModuleType) -> tuple[type, type]:
    class RecordingStream(hx.SyncByteStream):  # type: ignore[misc,name-defined]
        """A live response body that records each chunk as it passes."""

        def __init__(self, inner: Any, record: StreamRecord) -> None:
            self.inner, self.record = inner, record

        def __iter__(self) -> Iterator[bytes]:
            rec = self.record
            parts, marks, clock = rec.parts, rec.marks, time.perf_counter_ns
            try:
                for chunk in self.inner:
                    parts.append(chunk)
                    marks.append(clock())
                    yield chunk
            except Exception as exc:
                rec.error = exc
                raise
            rec.complete = True

        def close(self) -> None:
            try:
                self.inner.close()
            finally:
                self.record.finish()

    class AsyncRecordingStream(hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        """A live async response body that records each chunk as it passes."""

        def __init__(self, inner: Any, record: StreamRecord) -> None:
            self.inner, self.record = inner, record

        async def __aiter__(self) -> AsyncIterator[bytes]:
            rec = self.record
            parts, marks, clock = rec.parts, rec.marks, time.perf_counter_ns
            try:
                async for chunk in self.inner:
                    parts.append(chunk)
                    marks.append(clock())
                    yield chunk
            except Exception as exc:
                rec.error = exc
                raise
            rec.complete = True

        async def aclose(self) -> None:
            try:
                await self.inner.aclose()
            finally:
                self.record.finish()

    return RecordingStream, AsyncRecordingStream


def _replay_streams(hx: ModuleType) -> tuple[type, type]:
    class ReplayStream(hx.SyncByteStream):  # type: ignore[misc,name-defined]
        """A recorded response body, yielded chunk by chunk."""

        def __init__(self, stream: dict[str, Any]) -> None:
            self.stream = stream

        def __iter__(self) -> Iterator[bytes]:
            yield from _replay_chunks(self.stream)

        def close(self) -> None:
            pass

    class AsyncReplayStream(hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        """A recorded response body, yielded chunk by chunk to an async reader."""

        def __init__(self, stream: dict[str, Any]) -> None:
            self.stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in _replay_chunks(self.stream):
                yield chunk

        async def aclose(self) -> None:
            pass

    return ReplayStream, AsyncReplayStream


_FLAVORS: dict[str, Flavor] = {}


def flavor(hx: ModuleType) -> Flavor:
    """The seam for ``hx`` (built once per library)."""
    found = _FLAVORS.get(hx.__name__)
    if found is None:
        found = _FLAVORS[hx.__name__] = Flavor(hx)
    return found
