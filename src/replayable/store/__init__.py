"""Event stores: one contract, several backends, chosen by URL."""

from __future__ import annotations

import os
from pathlib import Path

from replayable.errors import ConfigurationError
from replayable.store.base import EventStore, RunFilter
from replayable.store.memory import MemoryStore
from replayable.store.verify import ChainReport, verify_run

__all__ = [
    "DEFAULT_STORE_URL",
    "ChainReport",
    "EventStore",
    "MemoryStore",
    "RunFilter",
    "open_store",
    "verify_run",
]

DEFAULT_STORE_URL = "sqlite:///./.replayable/runs.db"


def open_store(url: str | EventStore | None = None) -> EventStore:
    """Open a store by URL: ``sqlite:///path``, ``memory://``, ``memory://name`` or
    ``postgresql://user@host:port/db?tenant=…&schema=…``.

    With no URL, ``$REPLAYABLE_STORE`` is used, else ``sqlite:///./.replayable/runs.db``.
    A relative SQLite path is taken from the current directory.
    """
    if isinstance(url, EventStore):
        return url
    url = url or os.environ.get("REPLAYABLE_STORE") or DEFAULT_STORE_URL
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"store URL {url!r} has no scheme; use sqlite:///path/to/runs.db or memory://"
        )
    if scheme == "memory":
        return MemoryStore.named(rest) if rest else MemoryStore()
    if scheme == "sqlite":
        from replayable.store.sqlite import SQLiteStore

        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise ConfigurationError(f"store URL {url!r} names no database file")
        return SQLiteStore(Path(path))
    if scheme in ("postgresql", "postgresql+psycopg"):
        from replayable.store.postgres import PostgresStore

        return PostgresStore(url)
    raise ConfigurationError(
        f"unknown store scheme {scheme!r} in {url!r}; "
        "expected sqlite://, memory:// or postgresql://"
    )
