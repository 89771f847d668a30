"""Fixtures shared across the test suite."""

from __future__ import annotations

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
