"""Fixtures shared across the test suite."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayable.store import MemoryStore
from replayable.store.sqlite import SQLiteStore


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """Where a test's SQLite database lives (not created yet)."""
    return tmp_path / "runs.db"


@pytest.fixture
def sqlite_store(sqlite_path: Path) -> Iterator[SQLiteStore]:
    """A fresh SQLite store, closed (and its writer flushed) after the test."""
    store = SQLiteStore(sqlite_path)
    yield store
    store.close()


@pytest.fixture
def memory_store() -> Iterator[MemoryStore]:
    """A fresh in-memory store, closed after the test."""
    store = MemoryStore()
    yield store
    store.close()


@pytest.fixture(autouse=True)
def _no_event_loop_left_open() -> Iterator[None]:
    """Fail the test that leaves an open event loop as the main thread's default.

    Such a loop holds whatever connections are still registered on it; whichever later
    test replaces it (any ``asyncio.run``) drops it, and its sockets are finalized
    unclosed at the collector's next pass, failing an unrelated test. Caught here, the
    leak is named where it was made.
    """
    yield
    # Read without creating one: ``get_event_loop()`` makes a loop when none was ever set.
    loop = getattr(getattr(asyncio.get_event_loop_policy(), "_local", None), "_loop", None)
    if loop is not None and not loop.is_closed():
        pytest.fail(f"the test left an open event loop as the default: {loop!r}")
