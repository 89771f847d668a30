"""Building an HTTP call's recorded request, response and metadata from its raw parts.

Recording, the seam hands the writer the raw parts of an exchange (the
request's method, path, kept headers and body bytes; the response's status,
header list and body bytes, or a stream's chunks and their times) as a
deferred event, and :func:`expand` builds the event there: bodies parsed,
streams assembled, the LLM call described, values encoded. The agent's
thread pays for none of it. Replaying (and in a fork's live steps), the same
functions build the values in the agent's thread, so both paths record the
same thing.
"""

from __future__ import annotations

from typing import Any

import orjson

from replayable.capture.runtime import OpenCall
from replayable.events.codec import encode_request, encode_value
from replayable.integrations import _wire
from replayable.integrations._exchange import (
    STREAM_DROP,
    Exchange,
    build_buffered,
    build_request,
    pairs,
)
from replayable.integrations._sse import read_sse

__all__ = ["build_response", "build_stream", "expand", "finish"]


def build_stream(kind: str, name: str, raw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded value of a streamed response and its metadata.

    ``raw`` is ``("s", status, header items, chunks, clock marks, start mark,
    exhausted, error)``: the chunks as received, the ``perf_counter_ns`` at
    which each arrived, whether the body was read to its end, and the
    encoded error that cut it, if one did.
    """
    _, status, items, parts, marks, t0, exhausted, error = raw
    headers = [[k, v] for k, v in pairs(items) if k not in STREAM_DROP]
    body = b"".join(parts)
    encoded = any(k == "content-encoding" for k, _ in headers)
    data: str | bytes = body
    if not encoded:
        try:
            data = body.decode()
        except UnicodeDecodeError:
            pass
    chunks = [[len(p), (m - t0) // 1000] for p, m in zip(parts, marks, strict=True)]
    assembled, finished = (None, False) if encoded or kind != "llm" else read_sse(name, body)
    # Complete: the provider's final event arrived (SDKs close right after it)
    # or the body ended. ``exhausted``: the body itself was read to its end.
    complete = exhausted or finished
    stream: dict[str, Any] = {
        "data": data,
        "chunks": chunks,
        "complete": complete,
        "exhausted": exhausted,
    }
    if error is not None:
        stream["error"] = orjson.loads(error)
    value = {"status": status, "headers": headers, "stream": stream, "assembled": assembled}
    meta = _wire.describe_response(name, assembled) if kind == "llm" else {}
    meta.update(status=status, stream=True, chunks=len(chunks), complete=complete)
    return value, meta


def build_response(kind: str, name: str, raw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded value and metadata of a buffered (``"b"``) or streamed (``"s"``) response."""
    if raw[0] == "s":
        return build_stream(kind, name, raw)
    return build_buffered(kind, name, raw)


def expand(
    kind: str, name: str, raw_request: Any, raw_response: Any, meta: dict[str, Any] | None
) -> tuple[bytes, bytes | None, bool, dict[str, Any]]:
    """A deferred HTTP event's request bytes, response bytes, encoding flag and metadata.

    ``meta`` is what the agent's thread added (the attempts of a retried
    call); it is applied last, as it was when the event was built in place.
    """
    request, built = build_request(kind, name, raw_request)
    req = encode_request(request)
    resp: bytes | None = None
    tagged = False
    if raw_response is not None:
        value, response_meta = build_response(kind, name, raw_response)
        built.update(response_meta)
        resp, tagged = encode_value(value)
    if meta:
        built.update(meta)
    return req, resp, tagged, built


def finish(
    call: OpenCall, ex: Exchange, raw: Any, exc: BaseException | None, meta: dict[str, Any]
) -> None:
    """End ``call`` with a raw response (or ``exc``): handed off as it is when the
    writer builds the event, else built here."""
    if exc is not None:
        call.fail(exc, meta)
    elif call.deferred:
        call.finish_deferred(raw, meta)
    else:
        value, built = build_response(ex.kind, ex.name, raw)
        built.update(meta)
        call.finish(value, built)
