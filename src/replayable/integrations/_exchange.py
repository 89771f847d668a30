"""What the HTTP seam records of one request and its buffered response.

Two halves. :func:`prepare` and :func:`read_head` run on every SDK call, in
the agent's thread, and take only what must be read from the live objects:
one pass over each header list (a header name is decoded and classified
once per distinct name), a cached route per method and path, and the raw
bytes of each body. :func:`build_request` and :func:`build_buffered` turn
those raw parts into what is recorded (the bodies parsed, an LLM call
described); recording, the writer runs them (see
:mod:`~replayable.integrations._build`), so parsing and describing cost the
agent nothing; replaying, the seam runs them to match the request at once.
"""

from __future__ import annotations

import functools
import sys
from typing import Any
from urllib.parse import parse_qsl, unquote

import orjson

from replayable.events.redaction import REDACTED, query_secret_name
from replayable.integrations import _wire

__all__ = [
    "BUFFERED_DROP",
    "DROPPED_HEADERS",
    "STREAM_DROP",
    "Exchange",
    "RawRequest",
    "body_value",
    "build_buffered",
    "build_request",
    "call_site",
    "is_stream",
    "pairs",
    "prepare",
    "prepare_parts",
    "read_head",
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
_STREAM_TYPES = (b"text/event-stream", b"application/x-ndjson", b"application/jsonl")
_RETRY_STATUS = frozenset({408, 409, 429})
_FOREIGN = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "openai",
    "anthropic",
    "litellm",
    "urllib3",
    "requests",
    "aiohttp",
    "http.client",
    "socket",
    "ssl",
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


# -- requests -------------------------------------------------------------------


def _classify(method: str, raw_path: bytes, anthropic: bool) -> tuple[str, str, str | None, str]:
    """``(kind, name, provider, path)`` of a request, its path percent-decoded as httpx does."""
    path = unquote(raw_path.decode("ascii")) if raw_path else "/"
    return (*_wire.classify(method, path, anthropic), path)


_route = functools.lru_cache(maxsize=1024)(_classify)


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


#: A request as the agent's thread takes it: ``(transport, host, method, path,
#: query, headers, body, provider)``, plain values that cross to the writer as they are.
RawRequest = tuple[str, str, str, str, bytes, dict[str, str], bytes, "str | None"]


class Exchange:
    """One request: its boundary (``kind``, ``name``) and its raw parts.

    What is recorded of it (the request value and its metadata) is built from
    the raw parts by :func:`build_request`: by the writer when recording (the
    hand-off names the ``http`` builder,
    :func:`replayable.integrations._build.expand`), here when replaying or
    forking, where the request must be matched at once.
    """

    __slots__ = ("_built", "kind", "name", "raw")

    #: The writer builds the event with ``replayable.integrations._build.expand``.
    builder = "http"

    def __init__(self, kind: str, name: str, raw: RawRequest) -> None:
        self.kind, self.name, self.raw = kind, name, raw
        self._built: tuple[dict[str, Any], dict[str, Any]] | None = None

    def _build(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._built is None:
            self._built = build_request(self.kind, self.name, self.raw)
        return self._built

    @property
    def request(self) -> dict[str, Any]:
        """The recorded request: method, path, query, kept headers and the body."""
        return self._build()[0]

    @property
    def meta(self) -> dict[str, Any]:
        """The request's metadata: host, transport, and for an LLM call its model and messages."""
        return dict(self._build()[1])


def prepare(request: Any, body: bytes, transport: str) -> Exchange:
    """An outgoing request as the seam records it (auth and volatile headers left out).

    Only what must be read from the live request is taken here: parsing the
    body and describing an LLM call wait for :func:`build_request`.
    """
    url = request.url
    raw_path, _, query = url.raw_path.partition(b"?")
    return prepare_parts(
        transport, url.host, request.method, raw_path, query, request.headers, body
    )


def prepare_parts(
    transport: str, host: str, method: str, raw_path: bytes, query: bytes, headers: Any, body: bytes
) -> Exchange:
    """:func:`prepare` from a request's parts; ``headers`` is an httpx header list or
    anything with ``raw`` ``(name, value)`` byte pairs."""
    kept = _request_headers(headers)
    # Anthropic's wire format is told apart by its headers, and only on a POST to .../messages.
    anthropic = (
        method == "POST"
        and raw_path.endswith(b"/messages")
        and ("anthropic-version" in kept or _anthropic_agent(headers))
    )
    kind, name, provider, path = _route(method, raw_path, anthropic)
    return Exchange(kind, name, (transport, host, method, path, query, kept, body, provider))


def build_request(kind: str, name: str, raw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded request value and its metadata, from :attr:`Exchange.raw`."""
    transport, host, method, path, query, headers, body, provider = raw
    field, value = body_value(headers.get("content-type", ""), body)
    req: dict[str, Any] = {"method": method, "path": path}
    if query:
        # A credential in the URL (``?key=…``, a signed URL's ``sig``) under a name that
        # only a query gives it away by.
        req["query"] = sorted(
            (k, REDACTED if v and query_secret_name(k) else v)
            for k, v in parse_qsl(query.decode(), keep_blank_values=True)
        )
    req["headers"] = headers
    req[field] = value
    meta: dict[str, Any] = {"host": host, "transport": transport}
    if kind == "llm":
        meta.update(_wire.describe_request(name, provider, value))
    return req, meta


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


def read_head(headers: Any) -> tuple[list[tuple[bytes, bytes, bytes]], bytes, bytes | None]:
    """A live response's headers as the library keeps them (copied: the record is built
    later), with the two the agent's thread needs now: the content type, which tells a
    stream, and ``x-should-retry``, which tells a retry (the last of each, as ``dict``
    would keep)."""
    items = list(_items(headers))
    ctype = b""
    should = None
    for _, key, value in items:
        if key == b"content-type":
            ctype = value
        elif key == b"x-should-retry":
            should = value
    return items, ctype, should


def is_stream(content_type: bytes) -> bool:
    """Whether a response is a stream recorded chunk by chunk (server-sent events, JSON lines)."""
    return content_type.startswith(_STREAM_TYPES)


def retryable(status: int, should_retry: bytes | None) -> bool:
    """Whether an SDK would retry this response (``x-should-retry`` decides when present)."""
    if should_retry is not None:
        return should_retry == b"true"
    return status in _RETRY_STATUS or status >= 500


def pairs(items: Any) -> list[tuple[str, str]]:
    """``(lower-cased name, value)`` of each header in a :func:`read_head` list, in order."""
    names = _NAMES
    return [(names.get(key) or _name(key), raw.decode("latin-1")) for _, key, raw in items]


def build_buffered(kind: str, name: str, raw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded value of a read response and its metadata (usage, output, status).

    ``raw`` is ``("b", status, header items, body)``.
    """
    _, status, items, body = raw
    got = pairs(items)
    kept = [[k, v] for k, v in got if k not in BUFFERED_DROP]
    field, parsed = body_value(dict(got).get("content-type", ""), body)
    value = {"status": status, "headers": kept, field: parsed}
    meta = _wire.describe_response(name, parsed) if field == "body" and kind == "llm" else {}
    meta["status"] = status
    return value, meta
