"""A recording process killed with SIGKILL loses at most what its durability mode allows,
and the run it leaves behind is listed as incomplete and replays up to its last event."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import replayable
from replayable.capture.writer import writer_for
from replayable.errors import StoreError
from replayable.store import MemoryStore, RunFilter
from replayable.store.sqlite import SQLiteStore
from tests.agents_durability import long_agent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

ROOT = Path(__file__).resolve().parent.parent
CHILD = "from tests.agents_durability import main; main()"
DEADLINE_S = 10.0


class Child:
    """The recording child process and the lines it has printed so far."""

    def __init__(self, proc: subprocess.Popen[str], stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"the child printed nothing in time; stderr:\n{self.errors()}")
        if line is None:
            pytest.fail(f"the child exited early ({self.proc.poll()}); stderr:\n{self.errors()}")
        return line

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        self._reader.join(timeout=DEADLINE_S)

    def errors(self) -> str:
        return self.stderr.read_text() if self.stderr.exists() else ""


@contextmanager
def recording_child(db: Path, durability: str, n: int) -> Iterator[Child]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAYABLE_")}
    stderr = db.with_suffix(".stderr")
    with (
        stderr.open("w") as err,
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(db), durability, str(n)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            bufsize=1,
        ) as proc,
    ):
        child = Child(proc, stderr)
        try:
            yield child
        finally:
            if proc.poll() is None:
                child.kill()


def only_run(store: SQLiteStore) -> str:
    """The one run in the store, once the writer process (which outlives the killed
    agent and commits what it had received) has stopped adding to it."""
    deadline = time.monotonic() + DEADLINE_S
    last = -1
    while time.monotonic() < deadline:
        ids = list(store.iter_run_ids())
        count = len(store.events(ids[0])) if len(ids) == 1 else -1
        if count >= 0 and count == last:
            return ids[0]
        last = count
        time.sleep(0.3)
    (run_id,) = list(store.iter_run_ids())
    return run_id


def test_durable_mode_keeps_every_acknowledged_call(sqlite_path: Path) -> None:
    """In durable mode every call that returned before SIGKILL is in the store."""
    acked: list[int] = []
    with recording_child(sqlite_path, "durable", 100_000) as child:
        deadline = time.monotonic() + DEADLINE_S
        while len(acked) < 20:
            line = child.next_line(deadline)
            assert line.startswith("ACK "), line
            acked.append(int(line.split()[1]))
        child.kill()
    assert acked == list(range(1, 21))

    store = SQLiteStore(sqlite_path)
    try:
        run_id = only_run(store)
        seqs = [e.seq for e in store.events(run_id)]
        assert set(acked) <= set(seqs)
        assert seqs == list(range(1, len(seqs) + 1))
        assert [e.chain_index for e in store.events(run_id)] == list(range(len(seqs)))

        run = store.get_run(run_id)
        assert run.status == "incomplete"
        assert ids(store.list_runs(RunFilter(status="incomplete"))) == [run_id]
        # The chain holds; a run cut short is named unsealed, not intact.
        assert replayable.verify_run(store, run_id).status == "unsealed"

        result = replayable.replay(run_id, store=store, fn=long_agent)
        assert result.status == "incomplete"
        assert result.events_served == len(seqs)
        assert result.divergence is None
    finally:
        store.close()


def test_buffered_mode_leaves_a_valid_prefix(sqlite_path: Path) -> None:
    """In buffered mode a killed run keeps a contiguous, verifiable prefix of its calls."""
    n = 200
    with recording_child(sqlite_path, "buffered", n) as child:
        deadline = time.monotonic() + DEADLINE_S
        acked = 0
        while child.next_line(deadline) != "DONE":
            acked += 1
        child.kill()
    assert acked == n

    store = SQLiteStore(sqlite_path)
    try:
        run_id = only_run(store)
        events = store.events(run_id)
        stored = len(events)
        assert stored <= n
        assert [e.seq for e in events] == list(range(1, stored + 1))
        assert [e.chain_index for e in events] == list(range(stored))
        assert replayable.verify_run(store, run_id).status in ("intact", "unsealed")

        run = store.get_run(run_id)
        assert run.status == "incomplete"
        assert run.workflow == "long_agent"
        assert ids(store.list_runs(RunFilter(status="incomplete"))) == [run_id]

        result = replayable.replay(run_id, store=store, fn=long_agent)
        assert result.status == "incomplete"
        assert result.events_served == stored
    finally:
        store.close()


def ids(runs: list[replayable.Run]) -> list[str]:
    return [r.run_id for r in runs]


class FlakyStore(MemoryStore):
    """A memory store whose first ``failures`` appends fail, as a locked database does."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def append(self, *args: Any, **kwargs: Any) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("database is locked")
        super().append(*args, **kwargs)


@replayable.tool
def quick(i: int) -> int:
    return i + 1


@replayable.workflow
def short_agent(n: int) -> int:
    return sum(quick(i) for i in range(n))


@pytest.mark.parametrize("durability", ["buffered", "durable"])
def test_transient_store_failure_is_retried(durability: str) -> None:
    """A batch the store refuses for a moment is retried until it is written, intact."""
    store = FlakyStore(failures=2)
    writer_for(store).durable_timeout = 5.0
    try:
        with replayable.recording(store, durability=durability) as rec:  # type: ignore[arg-type]
            assert short_agent(3) == 6
        run_id = rec.run_ids[0]
        assert store.failures == 0
        assert store.get_run(run_id).status == "completed"
        assert [e.seq for e in store.events(run_id)] == [1, 2, 3]
        assert replayable.verify_run(store, run_id).ok
    finally:
        store.close()
