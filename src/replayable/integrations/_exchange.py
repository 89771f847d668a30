"""What the HTTP seam records of one request and its buffered response.

This runs on every SDK call, in the agent's thread, so each call costs one
pass over each header list, one JSON parse of each body and dictionary
lookups for the rest: a header name is decoded and classified once per
distinct name, a route (method and path) once per distinct route, and the
call-site walk decides once per module whether its frames belong to the
HTTP and SDK stacks.
"""

from __future__ import annotations

import functools
import sys
from typing import Any
from urllib.parse import parse_qsl

import orjson

from replayable.integrations import _wire

__all__ = [
    "BUFFERED_DROP",
    "DROPPED_HEADERS",
    "STREAM_DROP",
    "Exchange",
    "body_value",
    "buffered",
    "call_site",
    "is_stream",
    "prepare",
    "response_headers",
    "retryable",
]

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
#: Response headers left out of a buffered response (its body is stored decoded).
BUFFERED_DROP = frozenset({"content-encoding", "content-length", "transfer-encoding", "set-cookie"})
#: Response headers left out of a streamed response (its body is stored as received).
STREAM_DROP = frozenset({"set-cookie"})
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
#: Bounds for the per-name caches (a client inventing header names cannot grow them).
_MAX_CACHED = 4096


class Exchange:
    """A request as the seam records it: its boundary, request value and metadata."""

    __slots__ = ("kind", "meta", "name", "request")

    def __init__(self, kind: str, name: str, request: dict[str, Any], meta: dict[str, Any]) -> None:
        self.kind, self.name, self.request, self.meta = kind, name, request, meta


# -- headers --------------------------------------------------------------------

#: Lower-cased header names (as the libraries keep them, bytes) and their text, learnt
#: as they are met: the names a recorded request keeps, those it leaves out, and every
#: name of a response. Most request headers then cost one set lookup.
_KEPT: dict[bytes, str] = {}
_DROPPED: set[bytes] = set()
_NAMES: dict[bytes, str] = {}


def _name(key: bytes) -> str:
    name = _NAMES.get(key)
    if name is None:
        name = key.decode("latin-1").lower()
        if len(_NAMES) < _MAX_CACHED:
            _NAMES[key] = name
    return name


def _kept_name(key: bytes) -> str | None:
    """The text of a request header's name, or ``None`` when the header is left out."""
    name = _name(key)
    if name in DROPPED_HEADERS or name.startswith(_DROPPED_PREFIXES):
        if len(_DROPPED) < _MAX_CACHED:
            _DROPPED.add(key)
        return None
    if len(_KEPT) < _MAX_CACHED:
        _KEPT[key] = name
    return name


def _items(headers: Any) -> list[tuple[bytes, bytes, bytes]]:
    """``(name, lower-cased name, value)`` of each header, as bytes.

    httpx and httpx2 keep exactly that list; reading it spares the copy
    ``headers.raw`` makes (and the re-decoding their other accessors do).
    """
    items = getattr(headers, "_list", None)
    if type(items) is list and (not items or (len(items[0]) == 3 and type(items[0][2]) is bytes)):
        return items
    return [(k, k.lower(), v) for k, v in headers.raw]


def _request_headers(headers: Any) -> dict[str, str]:
    """The headers a recorded request keeps (no secrets, nothing that changes per call)."""
    out: dict[str, str] = {}
    kept, dropped = _KEPT, _DROPPED
    for _, key, raw in _items(headers):
        if key in dropped:
            continue
        name = kept.get(key) or _kept_name(key)
        if name is None:
            continue
        value = raw.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def _anthropic_agent(headers: Any) -> bool:
    """Whether the request's user agent (its last one) names Anthropic."""
    agent = ""
    for _, key, raw in _items(headers):
        if _name(key) == "user-agent":
            agent = raw.decode("latin-1")
    return "anthropic" in agent.lower()


def response_headers(headers: Any) -> list[tuple[str, str]]:
    """``(lower-cased name, value)`` of each response header, in order."""
    names = _NAMES
    return [
        (names.get(key) or _name(key), raw.decode("latin-1")) for _, key, raw in _items(headers)
    ]


# -- requests -------------------------------------------------------------------

_route = functools.lru_cache(maxsize=1024)(_wire.classify)


def body_value(content_type: str, body: bytes) -> tuple[str, Any]:
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


def prepare(request: Any, body: bytes, transport: str) -> Exchange:
    """The recorded form of an outgoing request (auth and volatile headers left out)."""
    url = request.url
    method: str = request.method
    path: str = url.path
    headers = _request_headers(request.headers)
    # Anthropic's wire format is told apart by its headers, and only on a POST to .../messages.
    anthropic = (
        method == "POST"
        and path.endswith("/messages")
        and ("anthropic-version" in headers or _anthropic_agent(request.headers))
    )
    kind, name, provider = _route(method, path, anthropic)
    field, value = body_value(headers.get("content-type", ""), body)
    req: dict[str, Any] = {"method": method, "path": path}
    query: bytes = url.query
    if query:
        req["query"] = sorted(parse_qsl(query.decode(), keep_blank_values=True))
    req["headers"] = headers
    req[field] = value
    meta: dict[str, Any] = {"host": url.host, "transport": transport}
    if kind == "llm":
        meta.update(_wire.describe_request(name, provider, value))
    return Exchange(kind, name, req, meta)


#: Module name -> whether its frames belong to the HTTP, SDK or seam stacks.
_FOREIGN_MODULES: dict[str, bool] = {}


def call_site() -> str | None:
    """``file:line in function`` of the nearest frame outside the HTTP and SDK stacks."""
    foreign = _FOREIGN_MODULES
    f: Any = sys._getframe(1)
    while f is not None:
        module = f.f_globals.get("__name__", "")
        skip = foreign.get(module)
        if skip is None:
            skip = module.startswith(_FOREIGN)
            if len(foreign) < _MAX_CACHED:
                foreign[module] = skip
        if not skip:
            co = f.f_code
            return f"{co.co_filename}:{f.f_lineno} in {co.co_name}"
        f = f.f_back
    return None


# -- responses ------------------------------------------------------------------


def is_stream(headers: dict[str, str]) -> bool:
    """Whether a response is a stream recorded chunk by chunk (server-sent events, JSON lines)."""
    return headers.get("content-type", "").startswith(_STREAM_TYPES)


def retryable(status: int, headers: dict[str, str]) -> bool:
    """Whether an SDK would retry this response (``x-should-retry`` decides when present)."""
    should = headers.get("x-should-retry")
    if should is not None:
        return should == "true"
    return status in _RETRY_STATUS or status >= 500


def buffered(
    ex: Exchange,
    status: int,
    pairs: list[tuple[str, str]],
    headers: dict[str, str],
    body: bytes,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded value of a read response and its metadata (usage, output, status)."""
    kept = [[k, v] for k, v in pairs if k not in BUFFERED_DROP]
    field, parsed = body_value(headers.get("content-type", ""), body)
    value = {"status": status, "headers": kept, field: parsed}
    meta = _wire.describe_response(ex.name, parsed) if field == "body" and ex.kind == "llm" else {}
    meta["status"] = status
    return value, meta
