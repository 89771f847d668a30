"""Kill trials: SIGKILL of the agent, of its writer process, or of both, at random points.

Run ``python -m tests.kill_trials MODE TRIALS [PARALLEL] [warm]`` (MODE ``buffered`` or
``durable``); it prints one JSON object of figures per kind of kill. Each trial
forks a fresh agent (from this already-imported process, so a trial costs
milliseconds) that records into its own SQLite file through the writer
process, and reports each boundary that returned (acknowledged) to a file.
The driver kills at a random moment, reaps everything (it is a child
subreaper, so the orphaned writer process comes back to it), then reads the
store: acknowledged events missing (``lost``), seqs stored twice
(``duplicated``), events whose run is missing (``orphans``), runs missing
while their events are stored, runs missing at all once their first boundary
had returned (``runs_lost``), chains that do not verify, and the longest a
boundary took (``worst_block_ms``).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import replayable
from replayable.capture.config import settings

KINDS = tuple(os.environ.get("KILL_TRIALS_KINDS", "agent,writer,group").split(","))
CALLS = 4000  # the most calls an agent makes before it ends its run by itself


@replayable.tool
def step(i: int) -> int:
    return i * 3


def _agent(folder: Path, durability: str, report: int, warm: bool) -> None:
    """The forked agent: record one run, reporting each acknowledged boundary."""

    @replayable.workflow
    def killed_agent(n: int) -> int:
        from replayable.capture.context import active_state
        from replayable.capture.writer import channel

        nonlocal report

        total = 0
        worst = 0.0
        for i in range(n):
            t0 = time.perf_counter()
            total += step(i)
            took = time.perf_counter() - t0
            worst = max(worst, took)
            line = f"ack {i + 1} {took:.6f} {time.monotonic():.6f}\n"
            if i == 0:
                proc = channel._channel.proc if channel._channel is not None else None
                st = active_state()
                run_id = st.run.run_id if st is not None and st.run is not None else ""
                line = f"child {proc.pid if proc else 0}\nrun {run_id}\n" + line
                line += (
                    f"start {_start_stored_by(st.run.writer if st and st.run else None, run_id)}\n"
                )
            if report >= 0:
                os.write(report, line.encode())
            if durability == "buffered" and i % 16 == 0:
                time.sleep(0.001)  # a little work now and then, as an agent does
        return total

    settings.writer = "process"
    store = replayable.open_store(f"sqlite:///{folder}/runs.db")
    if warm:
        # A first run, committed, so the one measured runs beside a writer process
        # that has started up (its start-up is a loss window of its own).
        with replayable.recording(store, spool_dir=folder / "spool"):
            silent = report
            report = -1
            killed_agent(2)
            report = silent
    with replayable.recording(
        store,
        durability=durability,  # type: ignore[arg-type]
        spool_dir=folder / "spool",
        max_block_s=10.0,
    ):
        killed_agent(CALLS if durability == "buffered" else CALLS // 10)
    store.close()


def _start_stored_by(writer: Any, run_id: str) -> str:
    """Who stores the run's start: ``agent`` (before its first boundary returned, as it
    does while the writer process is still starting, and for a durable run), or
    ``writer`` (the writer process was up at the run's start: a buffered record in
    flight, which a kill of both may lose)."""
    from replayable.capture.writer.handoff import decode

    held = getattr(writer, "_open_runs", {}).get(run_id)
    if held is None:
        return "agent" if getattr(writer, "_lane", None) is not None else "writer"
    return "agent" if decode(held)[0] == "S" else "writer"


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _ended(pid: int, deadline: float) -> bool:
    """Whether ``pid`` (ours, or an orphan handed to this subreaper) has ended; past
    ``deadline`` it is killed."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not ours (its parent reaped it) or gone already
    if not done and time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
    return bool(done)


def _launch(folder: Path, durability: str, warm: bool) -> tuple[int, int]:
    folder.mkdir(parents=True, exist_ok=True)
    report = os.open(folder / "acks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pid = os.fork()
    if pid == 0:  # the agent, in a process group of its own with its writer process
        os.setpgid(0, 0)
        code = 0
        try:
            _agent(folder, durability, report, warm)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(report)
    return pid, time.monotonic()


def _read_report(folder: Path) -> tuple[int, str, dict[int, float], float, str]:
    """The writer process's pid, the run id, each acknowledged seq's time, the longest
    boundary, and who stored the run's start (see :func:`_start_stored_by`)."""
    child, run_id, worst, stored_by = 0, "", 0.0, ""
    acked: dict[int, float] = {}
    try:
        text = (folder / "acks").read_text()
    except OSError:
        return child, run_id, acked, worst, stored_by
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "child":
            child = int(parts[1])
        elif len(parts) == 2 and parts[0] == "run":
            run_id = parts[1]
        elif len(parts) == 2 and parts[0] == "start":
            stored_by = parts[1]
        elif len(parts) == 4 and parts[0] == "ack":
            acked[int(parts[1])] = float(parts[3])
            worst = max(worst, float(parts[2]))
    return child, run_id, acked, worst, stored_by


def _nothing_stored(acked: dict[int, float]) -> dict[str, Any]:
    return {
        "lost_since": min(acked.values(), default=0.0),
        "lost": len(acked),
        "duplicated": 0,
        "orphans": 0,
        "runs_missing": 0,
        "run_lost": int(bool(acked)),
        "broken": 0,
        "stored": 0,
    }


def _check(folder: Path, run_id: str, acked: dict[int, float]) -> dict[str, Any]:
    db = folder / "runs.db"
    if not db.exists():
        return _nothing_stored(acked)
    conn = sqlite3.connect(db)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
            conn.close()
            return _nothing_stored(acked)
        seqs = [s for (s,) in conn.execute("SELECT seq FROM events WHERE run_id = ?", (run_id,))]
        runs = [r for (r,) in conn.execute("SELECT run_id FROM runs")]
        orphans = conn.execute(
            "SELECT count(*) FROM events WHERE run_id NOT IN (SELECT run_id FROM runs)"
        ).fetchone()[0]
        event_runs = {r for (r,) in conn.execute("SELECT DISTINCT run_id FROM events")}
    finally:
        conn.close()
    broken = 0
    if runs:
        store = replayable.open_store(f"sqlite:///{db}")
        try:
            # A killed run has no end record (unsealed) and, buffered, may miss the
            # events in flight (gapped); anything worse is a broken chain.
            reports = [replayable.verify_run(store, r) for r in runs]
            bad = [r for r in reports if r.status not in ("intact", "unsealed", "gapped")]
            broken = len(bad)
            if bad and os.environ.get("KILL_TRIALS_DEBUG"):
                print(folder, bad[0].message, file=sys.stderr)
        finally:
            store.close()
    stored = set(seqs)
    # The run itself: once its first boundary has returned, it must be listed whatever
    # else was in flight (a first run of the process too, beside a writer still starting).
    run_lost = int(bool(acked) and bool(run_id) and run_id not in runs)
    if event_runs - set(runs) and os.environ.get("KILL_TRIALS_DEBUG"):
        import shutil

        shutil.copytree(folder, f"/tmp/kept-{folder.name}", dirs_exist_ok=True)
        print("run missing:", folder, file=sys.stderr)
    return {
        "lost_since": min((t for s, t in acked.items() if s not in stored), default=0.0),
        "lost": sum(1 for s in acked if s not in stored),
        "duplicated": len(seqs) - len(stored),
        "orphans": orphans,
        "runs_missing": len(event_runs - set(runs)),
        "run_lost": run_lost,
        "broken": broken,
        "stored": len(seqs),
    }


def _trial(
    root: Path, durability: str, warm: bool, kind: str, n: int, pause: float
) -> Generator[None, None, dict[str, Any]]:
    """One trial, as steps: it yields wherever it waits, so that one thread drives many
    trials at once (a fork from a threaded driver can inherit a held lock)."""
    folder = root / f"{kind}-{n}"
    t_start = time.monotonic()
    pid, _ = _launch(folder, durability, warm)
    # Wait for the first acknowledged boundary, then kill at a random moment after it.
    deadline = time.monotonic() + 20
    child = 0
    while time.monotonic() < deadline:
        child, _, acked, _, _ = _read_report(folder)
        if acked:
            break
        yield
    kill_at = time.monotonic() + pause
    while time.monotonic() < kill_at:
        yield
    killed_at = time.monotonic()
    if kind == "agent":
        os.kill(pid, signal.SIGKILL)
    elif kind == "writer":
        if child:
            os.kill(child, signal.SIGKILL)
    else:
        os.killpg(pid, signal.SIGKILL)
    # The agent (after a writer kill) finishes its run in-process; the writer process
    # (after an agent kill) commits what it received and exits.
    deadline = time.monotonic() + 60
    while not _ended(pid, deadline):
        yield
    child, run_id, acked, worst, stored_by = _read_report(folder)
    while child and not _ended(child, deadline):
        yield
    figures = _check(folder, run_id, acked)
    lost_since = figures.pop("lost_since")
    figures["window_ms"] = round((killed_at - lost_since) * 1000, 1) if lost_since else 0.0
    figures["acked"] = len(acked)
    figures["worst_block_ms"] = round(worst * 1000, 1)
    figures["start_by_agent"] = int(stored_by == "agent")
    if os.environ.get("KILL_TRIALS_DEBUG"):
        print(kind, n, round(time.monotonic() - t_start, 2), figures, file=sys.stderr)
    return figures


def _drive(trials: list[Generator[None, None, dict[str, Any]]], width: int) -> list[Any]:
    """Run the trials' steps, ``width`` trials at a time, from this one thread."""
    results: list[Any] = [None] * len(trials)
    waiting = list(enumerate(trials))
    active: list[tuple[int, Generator[None, None, dict[str, Any]]]] = []
    while waiting or active:
        while waiting and len(active) < width:
            active.append(waiting.pop(0))
        for item in list(active):
            index, steps = item
            try:
                next(steps)
            except StopIteration as done:
                results[index] = done.value
                active.remove(item)
        time.sleep(0.002)
    return results


def run(
    durability: str, trials: int, parallel: int = 4, warm: bool = False, seed: int = 12
) -> dict[str, dict[str, Any]]:
    """``trials`` kills of each kind, ``parallel`` at a time; figures per kind."""
    _become_subreaper()
    rng = random.Random(seed)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="replayable-kill-") as tmp:
        root = Path(tmp)
        for kind in KINDS:
            steps = [
                _trial(root, durability, warm, kind, n, rng.uniform(0.0, 0.3))
                for n in range(trials)
            ]
            rows = _drive(steps, parallel)
            out[kind] = {
                "trials": trials,
                "acked": sum(r["acked"] for r in rows),
                "lost": sum(r["lost"] for r in rows),
                "worst_loss": max(r["lost"] for r in rows),
                "trials_with_loss": sum(1 for r in rows if r["lost"]),
                "duplicated": sum(r["duplicated"] for r in rows),
                "orphans": sum(r["orphans"] for r in rows),
                "runs_missing": sum(r["runs_missing"] for r in rows),
                "runs_lost": sum(r["run_lost"] for r in rows),
                # Trials whose run's start the agent stored before its first boundary
                # returned, and runs lost among them (none may be).
                "starts_by_agent": sum(r["start_by_agent"] for r in rows if r["acked"]),
                "runs_lost_started_by_agent": sum(
                    r["run_lost"] for r in rows if r["start_by_agent"]
                ),
                "broken_chains": sum(r["broken"] for r in rows),
                "worst_block_ms": max(r["worst_block_ms"] for r in rows),
                # An agent that never got going (a fork of this threaded driver can
                # inherit a lock another thread held) is no trial of the writer.
                "not_started": sum(1 for r in rows if not r["acked"]),
                "worst_window_ms": max(r["window_ms"] for r in rows),
            }
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    t0 = time.monotonic()
    result = run(mode, count, width, warm="warm" in sys.argv[4:])
    result["seconds"] = round(time.monotonic() - t0, 1)  # type: ignore[assignment]
    print(json.dumps(result))
