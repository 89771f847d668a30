"""Fixtures for the integration tests: a local fake provider and a store."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest

from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    """A fake OpenAI/Anthropic server on 127.0.0.1, stopped after the test.

    Nothing may reach it during a pure replay: the test fails if anything did.
    """
    with FakeProvider() as p:
        yield p
    assert p.replay_hits == [], f"pure replays reached the model server: {p.replay_hits}"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    """A fresh in-memory store."""
    s = MemoryStore()
    yield s
    s.close()


@pytest.fixture
def sdk_leftovers() -> Iterator[None]:
    """Collect, at teardown, the connections an SDK leaves to the garbage collector.

    ``Runner.run_sync`` and pydantic-ai's ``run_sync`` drive the agent on an event loop
    they keep (or drop) themselves, so the pooled connections of a client nobody closed
    are finalized whenever the collector runs; collected here, the warnings they raise
    are theirs alone and do not land in a later test.
    """
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
