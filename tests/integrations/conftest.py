"""Fixtures for the integration tests: a local fake provider and a store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    """A fake OpenAI/Anthropic server on 127.0.0.1, stopped after the test."""
    with FakeProvider() as p:
        yield p


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    """A fresh in-memory store."""
    s = MemoryStore()
    yield s
    s.close()
