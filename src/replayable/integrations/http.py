"""Record and replay HTTP calls made with ``httpx``, ``httpx2`` or ``urllib3`` — and so every
SDK built on them, and ``requests``.

Two ways in:

- **Zero change.** Inside ``replayable.recording()`` (and during a replay)
  the default transports of ``httpx2`` and ``httpx`` are intercepted, the
  way vcrpy does it: :func:`install` patches
  ``HTTPTransport.handle_request`` and
  ``AsyncHTTPTransport.handle_async_request`` (and urllib3's
  ``HTTPConnectionPool.urlopen``, see :mod:`~replayable.integrations._urllib3`)
  once, whenever the library is imported, and the patch acts only while a
  run is active. Outside a run nothing changes. The OpenAI and Anthropic
  SDKs are also taught to collapse their retries into one event.
- **Explicit.** ``client()`` / ``async_client()`` return a client whose
  transport records and replays; pass it to an SDK as ``http_client=`` (see
  :mod:`replayable.integrations.openai`).

Each request is one event: ``llm`` for a model call (named by its wire
format, ``openai.chat.completions``, ``openai.responses``,
``anthropic.messages``; metadata carries the provider, model, sampling
parameters, normalized messages, usage and output) and ``http`` otherwise
(named ``METHOD /path``). Requests match on method, path and query,
canonical body and the headers that are not volatile; authorization headers
are never stored.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from replayable.capture.context import active_state
from replayable.capture.imports import when_imported
from replayable.integrations._exchange import call_site
from replayable.integrations._seam import SCOPE, RetryScope, flavor

__all__ = [
    "AsyncRecordingTransport",
    "RecordingTransport",
    "async_client",
    "client",
    "install",
    "installed",
    "uninstall",
]

_ORIGINAL = "__replayable_original__"
_patched: list[tuple[type, str, Any]] = []


#: Set while an explicit transport calls its inner one, so a patched inner
#: transport does not record the same request twice.
_BYPASS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "replayable_http_bypass", default=False
)


class RecordingTransport:
    """A sync transport that records (or replays) through ``inner`` while a run is active.

    ``inner`` defaults to the library's ``HTTPTransport()``; ``library`` is
    ``"httpx2"`` (the default) or ``"httpx"``.
    """

    def __init__(self, inner: Any = None, *, library: str = "httpx2") -> None:
        hx = importlib.import_module(library)
        self._seam = flavor(hx)
        self.inner = inner if inner is not None else hx.HTTPTransport()

    def _send(self, request: Any) -> Any:
        token = _BYPASS.set(True)
        try:
            return self.inner.handle_request(request)
        finally:
            _BYPASS.reset(token)

    def handle_request(self, request: Any) -> Any:
        st = active_state()
        if st is None:
            return self.inner.handle_request(request)
        return self._seam.handle(st, request, self._send)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> RecordingTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRecordingTransport:
    """The async counterpart of :class:`RecordingTransport`."""

    def __init__(self, inner: Any = None, *, library: str = "httpx2") -> None:
        hx = importlib.import_module(library)
        self._seam = flavor(hx)
        self.inner = inner if inner is not None else hx.AsyncHTTPTransport()

    async def _send(self, request: Any) -> Any:
        token = _BYPASS.set(True)
        try:
            return await self.inner.handle_async_request(request)
        finally:
            _BYPASS.reset(token)

    async def handle_async_request(self, request: Any) -> Any:
        st = active_state()
        if st is None:
            return await self.inner.handle_async_request(request)
        return await self._seam.ahandle(st, request, self._send)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> AsyncRecordingTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def client(*, library: str = "httpx2", **kwargs: Any) -> Any:
    """An ``httpx2.Client`` (or ``httpx.Client``) whose transport records and replays.

    Keyword arguments go to the client; a ``transport=`` given is wrapped.
    """
    hx = importlib.import_module(library)
    inner = kwargs.pop("transport", None)
    return hx.Client(transport=RecordingTransport(inner, library=library), **kwargs)


def async_client(*, library: str = "httpx2", **kwargs: Any) -> Any:
    """An ``httpx2.AsyncClient`` (or ``httpx.AsyncClient``) whose transport records and replays."""
    hx = importlib.import_module(library)
    inner = kwargs.pop("transport", None)
    return hx.AsyncClient(transport=AsyncRecordingTransport(inner, library=library), **kwargs)


# -- zero-change interception -------------------------------------------------------


def _patch(cls: type, attr: str, make: Callable[[Any], Any]) -> None:
    current = cls.__dict__.get(attr)
    if current is None or hasattr(current, _ORIGINAL):
        return
    replacement = make(current)
    setattr(replacement, _ORIGINAL, current)
    setattr(cls, attr, replacement)
    _patched.append((cls, attr, current))


def _patch_transports(hx: Any) -> None:
    seam = flavor(hx)

    def sync(orig: Any) -> Any:
        @functools.wraps(orig)
        def handle_request(self: Any, request: Any) -> Any:
            st = active_state()
            if st is None or _BYPASS.get():
                return orig(self, request)
            return seam.handle(st, request, functools.partial(orig, self))

        return handle_request

    def asynchronous(orig: Any) -> Any:
        @functools.wraps(orig)
        async def handle_async_request(self: Any, request: Any) -> Any:
            st = active_state()
            if st is None or _BYPASS.get():
                return await orig(self, request)
            return await seam.ahandle(st, request, functools.partial(orig, self))

        return handle_async_request

    _patch(hx.HTTPTransport, "handle_request", sync)
    _patch(hx.AsyncHTTPTransport, "handle_async_request", asynchronous)


def _patch_stainless(base_client: Any) -> None:
    """Give an SDK's retry loop a :class:`RetryScope` (one event per logical request)."""

    def sync_request(orig: Any) -> Any:
        @functools.wraps(orig)
        def request(self: Any, *args: Any, **kwargs: Any) -> Any:
            if active_state() is None:
                return orig(self, *args, **kwargs)
            scope = RetryScope(call_site())
            token = SCOPE.set(scope)
            try:
                return orig(self, *args, **kwargs)
            finally:
                SCOPE.reset(token)
                scope.close()

        return request

    def async_request(orig: Any) -> Any:
        @functools.wraps(orig)
        async def request(self: Any, *args: Any, **kwargs: Any) -> Any:
            if active_state() is None:
                return await orig(self, *args, **kwargs)
            scope = RetryScope(call_site())
            token = SCOPE.set(scope)
            try:
                return await orig(self, *args, **kwargs)
            finally:
                SCOPE.reset(token)
                scope.close()

        return request

    def sync_sleep(orig: Any) -> Any:
        @functools.wraps(orig)
        def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
            scope = SCOPE.get()
            if scope is not None and scope.served:
                return None
            return orig(self, *args, **kwargs)

        return _sleep_for_retry

    def async_sleep(orig: Any) -> Any:
        @functools.wraps(orig)
        async def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
            scope = SCOPE.get()
            if scope is not None and scope.served:
                return None
            return await orig(self, *args, **kwargs)

        return _sleep_for_retry

    _patch(base_client.SyncAPIClient, "request", sync_request)
    _patch(base_client.AsyncAPIClient, "request", async_request)
    _patch(base_client.SyncAPIClient, "_sleep_for_retry", sync_sleep)
    _patch(base_client.AsyncAPIClient, "_sleep_for_retry", async_sleep)


def _on_httpx(hx: Any) -> None:
    if hasattr(hx, "HTTPTransport") and hasattr(hx, "AsyncHTTPTransport"):
        _patch_transports(hx)


def _on_stainless(base_client: Any) -> None:
    if hasattr(base_client, "SyncAPIClient"):
        _patch_stainless(base_client)


def _on_urllib3(connectionpool: Any) -> None:
    from replayable.integrations import _urllib3

    _patch(connectionpool.HTTPConnectionPool, "urlopen", _urllib3.wrap_urlopen)


#: Each module patched when it is imported (or at once, when it already is).
_WATCHED: tuple[tuple[str, Callable[[Any], None]], ...] = (
    ("httpx2", _on_httpx),
    ("httpx", _on_httpx),
    ("openai._base_client", _on_stainless),
    ("anthropic._base_client", _on_stainless),
    ("urllib3.connectionpool", _on_urllib3),
)


def install(*, force_import: bool = False) -> None:
    """Intercept the HTTP libraries and SDKs, now or whenever they are imported.

    Idempotent and cheap; recordings and replays call it when they start, and
    so does the first ``@workflow``. A library imported later (inside the
    workflow, in a thread) is patched the moment its module is loaded (see
    :mod:`replayable.capture.imports`): ``httpx2``, ``httpx``, the OpenAI and
    Anthropic SDKs and ``urllib3`` (and so ``requests``). ``force_import``
    imports ``httpx2``/``httpx`` (when installed) at once.
    """
    if force_import:
        for name in ("httpx2", "httpx"):
            try:
                importlib.import_module(name)
            except ImportError:
                continue
    for name, patch in _WATCHED:
        when_imported(name, patch)
        # Applied again to a loaded module after :func:`uninstall` (patching twice is a no-op).
        module = sys.modules.get(name)
        if module is not None and not getattr(module.__spec__, "_initializing", False):
            patch(module)


def uninstall() -> None:
    """Remove every patch :func:`install` applied."""
    while _patched:
        cls, attr, original = _patched.pop()
        setattr(cls, attr, original)


def installed() -> list[str]:
    """``Class.method`` names currently patched."""
    return [f"{cls.__module__}.{cls.__qualname__}.{attr}" for cls, attr, _ in _patched]
