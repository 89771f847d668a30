"""A store opened on first use, so that a store down at start is an outage like any other.

``recording()`` opens its store at once; when the store cannot be reached then
(a :class:`~replayable.errors.StoreUnavailableError`) and the recording fails
open, it records through a :class:`LazyStore` instead: the writer spools and
retries, and every call the agent makes on the store itself tries to open it
again. The writer process opens its stores the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["LazyStore", "shown_url"]


def shown_url(url: str) -> str:
    """``url`` as it may be shown: with any password masked."""
    if url.startswith(("postgresql://", "postgresql+psycopg://")):
        from replayable.store.postgres._connect import parse_url

        return parse_url(url).display
    if url.startswith("nats://"):
        head, sep, sink = url.partition("sink=")
        return head + sep + shown_url(sink) if sep else url
    return url


class LazyStore:
    """Stands for the store at ``url`` and opens it on first use.

    ``url`` is the shown URL (password masked), which names the store's spool
    and appears in messages; the credentials stay in :meth:`connect_url`.
    """

    def __init__(
        self,
        url: str,
        opener: Callable[[str], EventStore] | None = None,
        *,
        shown: str | None = None,
    ) -> None:
        self._open_url = url
        self.url = shown or shown_url(url)
        self._opener = opener
        self._store: EventStore | None = None
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        #: The data-key settings the store is opened with (``None``: this process's), so
        #: a writer knows whether it will encrypt before the store is reached.
        self.data_env: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"<store {self.url}{'' if self._store is not None else ' (not open yet)'}>"

    @property
    def opened(self) -> bool:
        """Whether the store has been reached."""
        return self._store is not None

    def _get(self) -> EventStore:
        store = self._store
        if store is None:
            with self._lock:
                if self._store is None:
                    if self._opener is not None:
                        self._store = self._opener(self._open_url)
                    else:
                        from replayable.store import open_store

                        self._store = open_store(self._open_url)
                store = self._store
        return store

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def connect_url(self) -> str:
        return self._open_url

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def interrupt(self) -> None:
        if self._store is not None:
            self._store.interrupt()

    def close(self) -> None:
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()
        if self._store is not None:
            self._store.close()
