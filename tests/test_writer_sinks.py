"""Writer sinks: each committed batch handed on, a failing sink never touching the store."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import replayable
from replayable.capture.writer.spool import SpoolBatch
from replayable.store.memory import MemoryStore
from tests import agents_policies

SEEN: list[SpoolBatch] = []
CLOSED: list[str] = []


class Collecting:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, batch: SpoolBatch) -> None:
        SEEN.append(batch)

    def close(self) -> None:
        CLOSED.append(self.url)


def collecting(url: str) -> Collecting:
    return Collecting(url)


def raising(url: str) -> Any:
    def sink(batch: SpoolBatch) -> None:
        raise RuntimeError("the sink is broken")

    return sink


def broken_factory(url: str) -> Any:
    raise ImportError("no such exporter")


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> None:
    SEEN.clear()
    CLOSED.clear()
    monkeypatch.setattr(agents_policies, "ASK_FIRST", False)


def test_sinks_get_every_committed_record_and_a_broken_one_changes_nothing(monkeypatch, caplog):
    """A collecting sink sees the run's start, events and end as stored; a sink that
    raises on every batch and a factory that raises are logged, and the run is stored
    whole all the same; the sinks are closed with the writer."""
    monkeypatch.setenv(
        "REPLAYABLE_WRITER_SINKS",
        "tests.test_writer_sinks:raising, tests.test_writer_sinks:broken_factory,"
        "tests.test_writer_sinks:collecting",
    )
    store = MemoryStore()
    with caplog.at_level(logging.ERROR, logger="replayable.writer"):
        with replayable.recording(store) as rec:
            agents_policies.tidy_calendar("ops")
        store.close()
    run_id = rec.run_ids[0]
    stored = store.events(run_id)
    assert [e.seq for e in stored] == [1, 2]
    assert store.get_run(run_id).status == "completed"
    assert [e for b in SEEN for e in b.events] == stored
    assert [s.run_id for b in SEEN for s in b.starts] == [run_id]
    assert [e.run_id for b in SEEN for e in b.ends] == [run_id]
    assert [store.url] == CLOSED
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "broken_factory could not be started" in messages
    assert "a writer sink failed on a batch" in messages
