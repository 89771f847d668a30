"""The recording and replaying HTTP seam, shared by the ``httpx`` and ``httpx2`` transports.

One request is one boundary call, opened with :meth:`RunContext.begin`:

- recording, the real transport sends it; a buffered response is read and
  recorded at once, a server-sent event stream is recorded chunk by chunk
  (raw bytes and the time of each chunk) and the event is finished when the
  response is closed, complete or not;
- replaying, the recorded response is rebuilt (the same status, headers and
  chunks) and handed to the SDK, which parses it as it did live.

Inside an SDK's retry loop (see :class:`RetryScope`) the attempts of one
logical call are collapsed into one event holding the final outcome. What is
recorded of a request and a response is described in
:mod:`~replayable.integrations._exchange`; streamed bodies are in
:mod:`~replayable.integrations._streams`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import orjson

from replayable.capture.context import _STATE, State
from replayable.capture.runtime import OpenCall
from replayable.integrations._build import finish
from replayable.integrations._exchange import (
    Exchange,
    call_site,
    is_stream,
    prepare,
    read_head,
    retryable,
)
from replayable.integrations._streams import StreamRecord, recording_streams, replay_streams

__all__ = ["SCOPE", "Exchange", "Flavor", "RetryScope", "flavor"]


def begin(st: State, ex: Exchange, site: str | None = None) -> OpenCall:
    assert st.run is not None
    return st.run.begin_deferred(st, ex, site if site is not None else call_site())


# -- retries --------------------------------------------------------------------


class RetryScope:
    """One logical SDK request (its retry loop): attempts share one boundary call.

    Recording, a retryable outcome (a transport error, 408/409/429, 5xx or
    ``x-should-retry: true``) is held until the SDK either retries (the next
    attempt replaces it) or gives up (the scope closes and the held outcome is
    recorded). Replaying, every attempt is served the recorded final outcome
    and the SDK's backoff does not sleep.
    """

    __slots__ = ("attempts", "call", "earlier", "ex", "held", "site")

    def __init__(self, site: str | None = None) -> None:
        # The caller of the SDK, found from the SDK's entry (a few frames up, not
        # the dozens between the caller and the transport).
        self.site = site
        self.call: OpenCall | None = None
        self.ex: Exchange | None = None
        self.attempts = 0
        self.held: tuple[Any, BaseException | None, dict[str, Any]] | None = None
        self.earlier: list[Any] = []

    @property
    def served(self) -> bool:
        """Whether this scope's call is answered from a tape (so retries need no backoff)."""
        return self.call is not None and not self.call.live

    def attach(self, st: State, ex: Exchange) -> OpenCall:
        """The call for this attempt: the scope's own when it repeats the same request."""
        if self.call is not None and self.ex is not None and self.ex.raw == ex.raw:
            self.attempts += 1
            if self.held is not None:
                value, exc, _ = self.held
                self.earlier.append(_summary(value, exc))
                self.held = None
            return self.call
        self.close()
        self.call, self.ex, self.attempts, self.earlier = begin(st, ex, self.site), ex, 1, []
        return self.call

    def annotate(self, meta: dict[str, Any]) -> dict[str, Any]:
        if self.attempts > 1:
            meta["attempts"] = self.attempts
            meta["retried"] = list(self.earlier)
        return meta

    def close(self) -> None:
        """Record the held outcome, if any (the SDK did not retry it)."""
        held, self.held = self.held, None
        if held is None or self.call is None or self.ex is None:
            return
        raw, exc, meta = held
        finish(self.call, self.ex, raw, exc, self.annotate(meta))


def _summary(raw: Any, exc: BaseException | None) -> Any:
    if exc is not None:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"status": raw[1]}


SCOPE: contextvars.ContextVar[RetryScope | None] = contextvars.ContextVar(
    "replayable_http_retry_scope", default=None
)


def _settle(
    call: OpenCall,
    scope: RetryScope | None,
    ex: Exchange,
    raw: Any,
    exc: BaseException | None,
    held: bool,
) -> None:
    """End ``call`` with a raw response or an error, unless the SDK may retry it."""
    meta: dict[str, Any] = {}
    if scope is not None and held:
        scope.held = (raw, exc, meta)
        return
    if scope is not None:
        scope.annotate(meta)
    finish(call, ex, raw, exc, meta)


def _error_request(exc: BaseException, request: Any) -> BaseException:
    # Rebuilt httpx errors lack the request the SDK may read from them.
    if hasattr(type(exc), "request"):
        try:
            exc.request = request  # type: ignore[attr-defined]
        except Exception:
            pass
    return exc


# -- one flavor per HTTP library ------------------------------------------------------


class Flavor:
    """The seam bound to one HTTP library (``httpx`` or ``httpx2``)."""

    def __init__(self, hx: ModuleType) -> None:
        self.hx = hx
        self.name = hx.__name__
        self.transport_error: type[BaseException] = hx.TransportError
        self.recording_stream, self.async_recording_stream = recording_streams(hx)
        self.replay_stream, self.async_replay_stream = replay_streams(hx)

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
        # The transport beneath runs as no run's: its connections are this boundary's
        # (not gaps), and tasks it starts (happy eyeballs) take no ordinal of the agent's.
        token = _STATE.set(None)
        try:
            resp = send(request)
        except BaseException as exc:
            _settle(call, scope, ex, None, exc, isinstance(exc, self.transport_error))
            raise
        finally:
            _STATE.reset(token)
        items, content_type, should_retry = read_head(resp.headers)
        status: int = resp.status_code
        if is_stream(content_type):
            resp.stream = self.recording_stream(
                resp.stream, StreamRecord(call, scope, ex, status, items)
            )
            return resp
        try:
            content = resp.read()
        except BaseException as exc:
            _settle(call, scope, ex, None, exc, isinstance(exc, self.transport_error))
            raise
        raw = ("b", status, items, content)
        _settle(call, scope, ex, raw, None, retryable(status, should_retry))
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
        token = _STATE.set(None)
        try:
            resp = await send(request)
        except BaseException as exc:
            _settle(call, scope, ex, None, exc, isinstance(exc, self.transport_error))
            raise
        finally:
            _STATE.reset(token)
        items, content_type, should_retry = read_head(resp.headers)
        status: int = resp.status_code
        if is_stream(content_type):
            resp.stream = self.async_recording_stream(
                resp.stream, StreamRecord(call, scope, ex, status, items)
            )
            return resp
        try:
            content = await resp.aread()
        except BaseException as exc:
            _settle(call, scope, ex, None, exc, isinstance(exc, self.transport_error))
            raise
        raw = ("b", status, items, content)
        _settle(call, scope, ex, raw, None, retryable(status, should_retry))
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


_FLAVORS: dict[str, Flavor] = {}


def flavor(hx: ModuleType) -> Flavor:
    """The seam for ``hx`` (built once per library)."""
    found = _FLAVORS.get(hx.__name__)
    if found is None:
        found = _FLAVORS[hx.__name__] = Flavor(hx)
    return found
