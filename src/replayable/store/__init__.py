"""Event stores: one contract, several backends, chosen by URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replayable.store.postgres import PostgresStore
    from replayable.store.stream import StreamStore

from replayable.errors import ConfigurationError, StoreError
from replayable.store.base import EventStore, RunFilter
from replayable.store.memory import MemoryStore
from replayable.store.verify import ChainReport, StoreReport, verify_run, verify_store

__all__ = [
    "DEFAULT_STORE_URL",
    "ChainReport",
    "EventStore",
    "MemoryStore",
    "RunFilter",
    "StoreReport",
    "open_store",
    "postgres_store_class",
    "stream_store_class",
    "verify_run",
    "verify_store",
]

DEFAULT_STORE_URL = "sqlite:///./.replayable/runs.db"


def open_store(url: str | EventStore | None = None, *, create: bool = True) -> EventStore:
    """Open a store by URL: ``sqlite:///path``, ``memory://``, ``memory://name`` or
    ``postgresql://user@host:port/db?tenant=…&schema=…``, or
    ``nats://host:port?stream=NAME&sink=<one of those>`` (records go through a
    JetStream stream; ``replayable compactor`` moves them into the sink, see
    :mod:`replayable.store.stream`).

    With no URL, ``$REPLAYABLE_STORE`` is used, else ``sqlite:///./.replayable/runs.db``.
    A relative SQLite path is taken from the current directory. With
    ``create=False`` a store that does not exist yet (no SQLite file, no
    schema in PostgreSQL) raises :class:`StoreError` instead of being made
    empty: what readers want when a path may be mistyped.
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
        if not create and path != ":memory:" and not Path(path).exists():
            raise StoreError(
                f"no store at {Path(path).absolute()}; record a run first or check the path"
            )
        return SQLiteStore(Path(path))
    if scheme in ("postgresql", "postgresql+psycopg"):
        return postgres_store_class()(url, create=create)
    if scheme == "nats":
        return stream_store_class()(url, create=create)
    raise ConfigurationError(
        f"unknown store scheme {scheme!r} in {url!r}; "
        "expected sqlite://, memory://, postgresql:// or nats://"
    )


def postgres_store_class() -> type[PostgresStore]:
    """The PostgreSQL store class; a ConfigurationError naming the extra if psycopg is missing."""
    try:
        from replayable.store.postgres import PostgresStore
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing != "psycopg" and "libpq" not in str(exc) and "pq wrapper" not in str(exc):
            raise
        raise ConfigurationError(
            "postgresql:// stores need psycopg, which is not installed (or cannot load "
            f"libpq: {exc}); install the extra: pip install 'replayable[postgres]'"
        ) from exc
    return PostgresStore


def stream_store_class() -> type[StreamStore]:
    """The JetStream store class; a ConfigurationError naming the extra if nats-py is missing."""
    try:
        import nats  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            "nats:// stores need nats-py, which is not installed; "
            "install the extra: pip install 'replayable[nats]'"
        ) from exc
    from replayable.store.stream import StreamStore

    return StreamStore
