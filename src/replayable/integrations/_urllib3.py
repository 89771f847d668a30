"""The HTTP seam on ``urllib3`` (and so ``requests``): one ``urlopen`` is one ``http`` event.

:func:`wrap_urlopen` patches ``HTTPConnectionPool.urlopen``, which every
``urllib3`` request and every ``requests`` call goes through. While a run
is active the request is recorded as the ``httpx`` seam records one (the
same request value, matched the same way; an LLM wire format is recognised
as an ``llm`` event); urllib3's own retries and redirects happen beneath the
boundary, so the event holds the final outcome. The response handed back is
rebuilt from what was read, live and on replay alike: its body decoded (no
``content-encoding``), a server-sent event stream recorded chunk by chunk as
the caller reads it.
"""

from __future__ import annotations

import functools
import inspect
import io
import time
from collections.abc import Callable, Iterator
from typing import Any

from replayable.capture.context import _STATE, State, active_state
from replayable.integrations._build import finish
from replayable.integrations._exchange import (
    call_site,
    is_stream,
    prepare_parts,
)
from replayable.integrations._seam import begin
from replayable.integrations._streams import StreamRecord, replay_chunks

__all__ = ["wrap_urlopen"]

#: Headers of a rebuilt response that described the bytes on the wire, not the body kept.
_WIRE = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})


class _Raw:
    """Header pairs in the form the exchange reads (``raw``: ``(name, value)`` bytes)."""

    __slots__ = ("raw",)

    def __init__(self, headers: Any) -> None:
        items = headers.items() if headers is not None else ()
        self.raw = [(str(k).encode("latin-1"), str(v).encode("latin-1")) for k, v in items]


def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    if hasattr(body, "read"):
        data = body.read()
        return data.encode() if isinstance(data, str) else bytes(data)
    return b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in body)


def _split(url: str) -> tuple[bytes, bytes]:
    from urllib3.util import parse_url

    parsed = parse_url(url)
    return (parsed.path or "/").encode(), (parsed.query or "").encode()


def wrap_urlopen(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The patched ``HTTPConnectionPool.urlopen``: records or replays while a run is active."""
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def urlopen(self: Any, *args: Any, **kwargs: Any) -> Any:
        st = active_state()
        if st is None:
            return orig(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        return _handle(st, orig, bound)

    return urlopen


def _handle(st: State, orig: Callable[..., Any], bound: inspect.BoundArguments) -> Any:
    pool = bound.arguments["self"]
    method: str = bound.arguments["method"]
    url: str = bound.arguments["url"]
    body = _body_bytes(bound.arguments.get("body"))
    headers = bound.arguments.get("headers")
    if headers is None:
        headers = pool.headers
    preload = bound.arguments.get("preload_content", True)
    raw_path, query = _split(url)
    ex = prepare_parts("urllib3", pool.host, method, raw_path, query, _Raw(headers), body)
    call = begin(st, ex, call_site())
    if not call.live:
        return _served(call.value(), preload, method, url)
    bound.arguments["body"] = body or None
    bound.arguments["preload_content"] = False
    bound.arguments["decode_content"] = True
    # The pool and its retries run as no run's: their connections are this boundary's.
    token = _STATE.set(None)
    try:
        resp = orig(*bound.args, **bound.kwargs)
    except BaseException as exc:
        finish(call, ex, None, exc, {})
        raise
    finally:
        _STATE.reset(token)
    status: int = resp.status
    items = [
        (k.encode("latin-1"), k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in resp.headers.items()
    ]
    kept = [i for i in items if i[1] not in _WIRE]
    ctype = next((v for _, k, v in items if k == b"content-type"), b"")
    if is_stream(ctype):
        record = StreamRecord(call, None, ex, status, kept)
        return _response(
            _RecordingBody(resp, record), status, kept, False, method, url, resp.reason
        )
    try:
        content = resp.read(decode_content=True)
    except BaseException as exc:
        finish(call, ex, None, exc, {})
        raise
    finally:
        resp.release_conn()
    finish(call, ex, ("b", status, items, content), None, {})
    return _response(io.BytesIO(content), status, kept, preload, method, url, resp.reason)


def _response(
    body: Any,
    status: int,
    items: list[tuple[bytes, bytes, bytes]],
    preload: bool,
    method: str,
    url: str,
    reason: str | None,
) -> Any:
    from urllib3 import HTTPHeaderDict, HTTPResponse

    headers = HTTPHeaderDict()
    for key, _, value in items:
        headers.add(key.decode("latin-1"), value.decode("latin-1"))
    return HTTPResponse(
        body=body,
        headers=headers,
        status=status,
        reason=reason,
        preload_content=preload,
        decode_content=False,
        request_method=method,
        request_url=url,
        enforce_content_length=False,
    )


def _served(value: Any, preload: bool, method: str, url: str) -> Any:
    from http import HTTPStatus

    status: int = value["status"]
    items = [
        (k.encode("latin-1"), k.encode("latin-1"), v.encode("latin-1"))
        for k, v in value["headers"]
        if k.encode("latin-1") not in _WIRE
    ]
    try:
        reason: str | None = HTTPStatus(status).phrase
    except ValueError:
        reason = None
    body: Any
    if "stream" in value:
        body = _ReplayBody(replay_chunks(value["stream"]))
        preload = False
    else:
        from replayable.integrations._seam import _content

        body = io.BytesIO(_content(value))
    return _response(body, status, items, preload, method, url, reason)


class _RecordingBody(io.RawIOBase):
    """A live streamed body read through urllib3, recording each read as a chunk."""

    def __init__(self, inner: Any, record: StreamRecord) -> None:
        self.inner, self.record = inner, record

    def readable(self) -> bool:
        return True

    def read(self, amt: int | None = -1) -> bytes:
        rec = self.record
        try:
            data: bytes = self.inner.read(None if amt is None or amt < 0 else amt)
        except Exception as exc:
            rec.error = exc
            self.close()
            raise
        if data:
            rec.parts.append(data)
            rec.marks.append(time.perf_counter_ns())
        else:
            rec.complete = True
            self.close()
        return data

    def read1(self, amt: int = -1) -> bytes:
        return self.read(amt)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self.inner.release_conn()
            finally:
                self.record.finish()
        super().close()


class _ReplayBody(io.RawIOBase):
    """A recorded streamed body, read back chunk by chunk."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, amt: int | None = -1) -> bytes:
        if amt is None or amt < 0:
            out = self._buffer + b"".join(self._chunks)
            self._buffer = b""
            return out
        if not self._buffer:
            self._buffer = next(self._chunks, b"")
        out, self._buffer = self._buffer[:amt], self._buffer[amt:]
        return out

    def read1(self, amt: int = -1) -> bytes:
        return self.read(amt)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
