"""Exactly once through the compactor pool: two compactor processes are killed with
SIGKILL at random moments (20 trials) and started again while runs are being
published; the sink ends with every record once, every chain intact and
``verify --all`` clean. ``REPLAYABLE_KILL_TRIALS`` sets the number of trials (the
bench runs more)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import replayable
from replayable.archive.stream import Compactor, stream_state
from replayable.cli import app
from replayable.store import open_store
from replayable.store.postgres import PostgresStore
from tests.nats_helpers import SERVER, stream_name
from tests.pg_helpers import PgServer, pg

__all__ = ["pg", "stream_name"]

pytestmark = pytest.mark.slow

TRIALS = int(os.environ.get("REPLAYABLE_KILL_TRIALS", "20"))
RUNS = 60
EVENTS = 150


@replayable.tool
def measure(i: int) -> int:
    return i + 1


@replayable.workflow
def fed_agent(n: int) -> int:
    return sum(measure(i) for i in range(n))


def _work(source: str, sink: str, name: str, until_idle: float | None) -> None:
    logging.disable(logging.WARNING)  # a killed peer's batches coming again are expected
    # Two messages a fetch (frames of a run's records each): many batches in flight
    # over the trials, so that a kill lands while one is held.
    Compactor(source, sink, name=name, batch=2, fetch_bytes=1, ack_wait=1.5).run(
        until_idle=until_idle
    )


def _compactor(
    source: str, sink: str, name: str, until_idle: float | None = None
) -> multiprocessing.process.BaseProcess:
    """A compactor process forked from this one (started in milliseconds, so a kill
    lands while it works, not while it imports)."""
    proc = multiprocessing.get_context("fork").Process(
        target=_work, args=(source, sink, name, until_idle), daemon=True
    )
    proc.start()
    return proc


def _wait_for_sink(check: PostgresStore, done: float, seed: int, timeout: float = 60.0) -> None:
    """Wait until the sink holds at least ``done`` events (the compactors progressed)."""
    deadline = time.monotonic() + timeout
    while (got := check.query("SELECT count(*) FROM agent_execution_events")[0][0]) < done:
        assert time.monotonic() < deadline, (
            f"the compactors stalled at {got} events, waiting for {done:.0f} (seed {seed})"
        )
        time.sleep(0.01)


def test_killed_compactors_store_every_record_once(
    stream_name: str, pg: PgServer, tmp_path: Path
) -> None:
    seed = int(os.environ.get("REPLAYABLE_KILL_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    sink = pg.url(pg.new_schema("kill"))
    PostgresStore(sink).close()  # the schema exists before two compactors race to make it
    source = f"nats://{SERVER}?stream={stream_name}"
    url = f"{source}&sink={sink}"
    store = open_store(url)
    try:
        # A backlog first, so that the kills land while the compactors are busy.
        with replayable.recording(store, spool_dir=tmp_path) as rec:
            for _ in range(RUNS):
                fed_agent(EVENTS)
    finally:
        store.close()
    # Frames of a run's records: more than one message a run, far fewer than records.
    backlog = stream_state(url)["depth"]
    assert RUNS <= backlog < RUNS * EVENTS, backlog
    procs = {name: _compactor(source, sink, name) for name in ("a", "b")}
    kills = 0
    busy: dict[str, int] = {}
    progress = PostgresStore(sink)
    try:
        for trial in range(TRIALS):
            # Kills are paced by the compactors' progress, not by the clock, so they land
            # while there is work however fast or slow the machine is: the i-th kill comes
            # once the sink holds (i+1)/(2 TRIALS+2) of the events (the last at half of
            # them: in frames, compactors drain a fifth of this backlog in tens of
            # milliseconds), at a random moment of a batch.
            _wait_for_sink(progress, RUNS * EVENTS * (trial + 1) / (2 * TRIALS + 2), seed)
            time.sleep(rng.uniform(0.0, 0.01))
            if trial == TRIALS - 1:
                # Read before the last kill, not after it (the restarted pool may finish
                # the rest before a read after it).
                busy = stream_state(url)
            name = rng.choice(sorted(procs))
            procs[name].kill()  # SIGKILL
            procs[name].join()
            kills += 1
            procs[name] = _compactor(source, sink, name)
        for proc in procs.values():
            proc.kill()
            proc.join()
        # The pool finishes: two more compactors, until the stream is empty.
        finishers = [_compactor(source, sink, f"end{i}", until_idle=2.0) for i in range(2)]
        for proc in finishers:
            proc.join(120)
            assert proc.exitcode == 0
        state = stream_state(url)
    finally:
        progress.close()
        for proc in procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert kills == TRIALS
    assert busy.get("depth", 0) > 0, f"the backlog ran out before the last kill (seed {seed})"
    assert state["depth"] == 0, state
    check = PostgresStore(sink)
    try:
        (total,) = check.query("SELECT count(*) FROM agent_execution_events")[0]
        assert total == RUNS * EVENTS, f"seed {seed}"
        (ended,) = check.query("SELECT count(*) FROM run_ends")[0]
        assert ended == RUNS
        for run_id in rec.run_ids:
            assert [e.seq for e in check.events(run_id)] == list(range(1, EVENTS + 1))
    finally:
        check.close()
    verified = CliRunner().invoke(app, ["--store", sink, "verify", "--all"])
    assert verified.exit_code == 0, verified.output
    assert f"{RUNS} runs checked" in verified.output
    # Messages were delivered more than once: the batches the killed compactors held.
    assert state["deliveries"] > state["published"], f"seed {seed}"
