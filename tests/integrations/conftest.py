"""Fixtures for the integration tests: a local fake provider and a store."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from typing import Any

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
    """Close, at teardown, the event loop an SDK's ``run_sync`` leaves behind.

    The Agents SDK's ``Runner.run_sync`` and pydantic-ai's ``run_sync`` set a default
    event loop on the main thread and leave it open on purpose (``agents/run.py``: "We
    intentionally leave the default loop open"), with the pooled connections of the
    clients nobody closed still registered on it. Left there, the next ``asyncio.run``
    of any later test drops that loop, and its sockets are finalized unclosed whenever
    the collector next runs: a ResourceWarning that fails whichever test is running.
    Here the connections are closed, then the loop, while the test that made them ends.
    """
    yield
    # What an async test's clients dropped unclosed (pydantic-ai's async runs) is
    # finalized now, inside the test that made it, not in whichever later test the
    # collector next runs in (a report's PDF rendering, say).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    policy = asyncio.get_event_loop_policy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = policy.get_event_loop()
    except RuntimeError:  # no default loop is set: nothing was left
        return
    if loop.is_closed() or loop.is_running():
        return
    policy.set_event_loop(None)
    # The selector loops keep their open transports by file descriptor; closing them
    # closes the connections the SDK's pools still hold (connection_lost runs below).
    transports: Any = getattr(loop, "_transports", {})
    for transport in list(transports.values()):
        transport.close()
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
