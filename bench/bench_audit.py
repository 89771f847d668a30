"""The audit layer: anomaly scan throughput, annotation writes, the access log's cost on ``show``.

(a) Anomaly scan, every built-in rule, over runs of 50 events (LLM calls, tool
calls, clock reads; one run in fifty has an empty tool result) on SQLite and on
PostgreSQL: the first scan of the whole store, then the incremental scan of the
10% of runs recorded after it, in runs/s. Sizes: 10,000 runs (500,000 events)
by default, ``--full`` for the issue's 100,000 runs (5,000,000 events; generating
and loading them takes several minutes per store), ``--quick`` for 2,000. Beside
wall-clock runs/s it prints runs per CPU-second of the scanner and, for PostgreSQL,
with the server's CPU added (read from /proc): figures a busy machine moves less.
(b) ``annotate_run`` on one run whose chain grows: median ms per annotation.
(c) ``replayable show`` of a 50-event run through the CLI runner, with the
access-log write and with it stubbed out: the relative cost of logging.

Runnable alone: ``python bench/bench_audit.py [--quick | --full]``; PostgreSQL
from ``$REPLAYABLE_BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``),
in a fresh schema dropped afterwards.
"""

from __future__ import annotations

import gc
import hashlib
import os
import secrets
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Config, Section, Target, temp_dir
from replayable.audit import Actor, AuditReader, Scanner
from replayable.audit.annotations import annotate_run
from replayable.events.canonical import event_hash, genesis_hash, run_seal
from replayable.events.ids import uuid7
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store import EventStore
from replayable.store.sqlite import SQLiteStore

SERVER = os.environ.get("REPLAYABLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_RUNS_PER_S = 2_000
TARGET_ANNOTATE_MS = 5.0
TARGET_SHOW_OVERHEAD = 0.10
EVENTS_PER_RUN = 50
FULL = "--full" in sys.argv


def _shape() -> list[tuple[str, str, str, str]]:
    """(kind, name, request, response) of one run's 50 events."""
    out = [("tool", "read_contract", '{"id":"C-1"}', '{"text":"' + "x" * 200 + '"}')]
    for i in range(EVENTS_PER_RUN - 1):
        if i % 7 == 0:
            out.append(("llm", "chat", f'{{"messages":["step {i}"]}}', '{"choices":[]}'))
        elif i % 5 == 0:
            out.append(("clock", "time", "{}", "1700000000.5"))
        else:
            out.append(("tool", f"lookup_{i % 4}", f'{{"q":{i}}}', f'[{{"row":{i}}}]'))
    return out


SHAPE = _shape()


def make_run(n: int, base: float) -> tuple[RunStart, list[Event], RunEnd]:
    """Run ``n``: chained and sealed as the writer does; every 50th has an empty lookup."""
    run_id = uuid7(int((base + n) * 1000), hashlib.sha256(str(n).encode()).digest()[:10])
    start = RunStart(
        run_id=run_id,
        workflow=f"wf_{n % 3}",
        entrypoint="bench:agent",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata={"n": n},
        code={},
        env_hash=None,
        lineage={},
        started_at=base + n,
    )
    events: list[Event] = []
    prev = genesis_hash(run_id)
    for i, (kind, name, request, response) in enumerate(SHAPE):
        if n % 50 == 0 and i == 2:
            name, response = "compliance_rules", "[]"
        draft = Event(
            run_id=run_id,
            seq=i + 1,
            kind=kind,
            name=name,
            key=f"r:{i}",
            parent=None,
            call_site=None,
            request=request,
            fingerprint=hashlib.sha256(f"{name}{request}".encode()).hexdigest(),
            response=response,
            encoding="json",
            error=None,
            side_effect=False,
            started_at=base + n + i * 0.01,
            duration_ns=1_000_000,
            metadata={},
            chain_index=i,
            prev_hash=prev,
            hash="",
        )
        event = msgspec.structs.replace(draft, hash=event_hash(draft))
        events.append(event)
        prev = event.hash
    ended = base + n + 2.0 + (n % 7) * 0.1
    out = '"done"'
    end = RunEnd(
        run_id=run_id,
        status="completed",
        output=out,
        error=None,
        ended_at=ended,
        event_count=len(events),
        last_hash=run_seal(prev, start, "completed", out, None, ended, len(events)),
    )
    return start, events, end


def fill(store: EventStore, first: int, count: int, base: float = 1.7e9) -> None:
    """Append runs ``first`` … ``first + count - 1`` in batches of 200 runs."""
    for lo in range(first, first + count, 200):
        made = [make_run(n, base) for n in range(lo, min(lo + 200, first + count))]
        store.append([m[0] for m in made], [e for m in made for e in m[1]], [m[2] for m in made])


def server_cpu(store: EventStore) -> float:
    """CPU seconds the PostgreSQL backends of ``store``'s connections have used (read
    from /proc: the server runs on this machine), 0 for an in-process store."""
    pids = getattr(store, "_bench_pids", None)
    if pids is None:
        conns = [getattr(store, "_read_conn", None), getattr(store, "_write_conn", None)]
        pids = [c.info.backend_pid for c in conns if c is not None]
        store._bench_pids = pids  # type: ignore[attr-defined]
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def scan_rates(store: EventStore, runs: int) -> dict[str, float]:
    """Runs/s of the first scan of ``runs`` runs, then of the incremental scan of 10% more."""
    fill(store, 0, runs)
    gc.collect()
    first = Scanner(store).scan()
    extra = max(runs // 10, 1)
    fill(store, runs, extra)
    gc.collect()
    cpu, db = time.process_time(), server_cpu(store)
    second = Scanner(store).scan()
    second_cpu = time.process_time() - cpu
    second_db = server_cpu(store) - db
    assert first.runs == runs, first.runs
    assert second.runs == extra, second.runs
    return {
        "runs": runs,
        "first_runs_per_s": first.runs_per_s,
        "incremental_runs_per_s": second.runs_per_s,
        # Runs per second of this process's own CPU: what the scan costs, whatever else
        # the machine is doing (the wall figures move with its load).
        "incremental_runs_per_cpu_s": extra / second_cpu if second_cpu > 0 else 0.0,
        # The same with the database server's CPU added (PostgreSQL does the counting).
        "incremental_runs_per_total_cpu_s": extra / (second_cpu + second_db)
        if second_cpu + second_db > 0
        else 0.0,
        "flags": len(first.flags) + len(second.flags),
    }


def annotate_ms(store: EventStore, n: int) -> float:
    """Median ms per ``annotate_run`` on one run, ``n`` annotations in a row."""
    fill(store, 10_000_000, 1)
    run_id = store.list_runs()[0].run_id
    actor = Actor("bench", "analyst", "bench")
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        annotate_run(store, actor, run_id, step=3, verdict="concern", note=f"note {i}")
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def show_overhead(path: Path, repeats: int) -> tuple[float, float]:
    """Median seconds of ``replayable show`` with and without the access-log write."""
    from typer.testing import CliRunner

    from replayable.cli import app

    store = SQLiteStore(path)
    fill(store, 20_000_000, 1)
    run_id = store.list_runs()[0].run_id
    store.close()
    runner = CliRunner()
    args = ["--store", f"sqlite:///{path}", "show", run_id]
    env = {"COLUMNS": "160"}

    def once() -> float:
        t0 = time.perf_counter()
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
        return time.perf_counter() - t0

    logged: list[float] = []
    bare: list[float] = []
    real = AuditReader._log
    for _ in range(3):
        once()  # warm imports and caches
    for _ in range(repeats):  # interleaved, so drift on a busy machine hits both
        logged.append(once())
        AuditReader._log = lambda self, *a, **k: None  # type: ignore[method-assign]
        try:
            bare.append(once())
        finally:
            AuditReader._log = real  # type: ignore[method-assign]
    return statistics.median(logged), statistics.median(bare)


@contextmanager
def pg_store() -> Iterator[Any]:
    import psycopg
    from psycopg import sql

    from replayable.store.postgres import PostgresStore

    schema = f"bench_audit_{secrets.token_hex(4)}"
    store = PostgresStore(f"{SERVER}?schema={schema}")
    try:
        yield store
    finally:
        store.close()
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def run(cfg: Config) -> Section:
    sec = Section("audit", "audit: anomaly scan, annotation writes, access log on show")
    runs = 100_000 if FULL else cfg.pick(10_000, 2_000)
    figures: dict[str, Any] = {}
    with temp_dir("audit") as tmp:
        lite = SQLiteStore(tmp / "scan.db")
        try:
            figures["sqlite"] = scan_rates(lite, runs)
        finally:
            lite.close()
        lite = SQLiteStore(tmp / "notes.db")
        try:
            figures["sqlite_annotate_ms"] = annotate_ms(lite, cfg.pick(200, 50))
        finally:
            lite.close()
        logged, bare = show_overhead(tmp / "show.db", cfg.pick(40, 10))
        figures["show_s"] = {"logged": logged, "bare": bare}
    try:
        with pg_store() as pg:
            figures["postgres"] = scan_rates(pg, runs)
        with pg_store() as pg:
            figures["postgres_annotate_ms"] = annotate_ms(pg, cfg.pick(200, 50))
    except Exception as exc:  # no server: report the SQLite half
        sec.notes.append(f"PostgreSQL half did not run: {type(exc).__name__}: {exc}"[:200])
    size = f"{runs:,} runs × {EVENTS_PER_RUN} events"
    for backend in ("sqlite", "postgres"):
        f = figures.get(backend)
        if f is None:
            continue
        sec.row(
            f"{backend}: scan, first / incremental",
            f"{f['first_runs_per_s']:,.0f} / {f['incremental_runs_per_s']:,.0f} runs/s",
            f"{size}; {f['flags']} flags; "
            f"{f['incremental_runs_per_cpu_s']:,.0f} runs per CPU-second of the scanner, "
            f"{f['incremental_runs_per_total_cpu_s']:,.0f} with the database's",
        )
        sec.targets.append(
            Target(
                f"{backend} incremental scan",
                f["incremental_runs_per_s"],
                TARGET_RUNS_PER_S,
                "runs/s",
                op=">=",
            )
        )
    for backend in ("sqlite", "postgres"):
        ms = figures.get(f"{backend}_annotate_ms")
        if ms is None:
            continue
        sec.row(f"{backend}: write an annotation", f"{ms:.2f} ms", "median, chain growing")
        sec.targets.append(Target(f"{backend} annotation write", ms, TARGET_ANNOTATE_MS, "ms"))
    show = figures["show_s"]
    overhead = show["logged"] / show["bare"] - 1
    sec.row(
        "show with / without the access log",
        f"{show['logged'] * 1000:.1f} / {show['bare'] * 1000:.1f} ms",
        f"+{overhead * 100:.1f}%",
    )
    sec.targets.append(
        Target("access log on show", overhead * 100, TARGET_SHOW_OVERHEAD * 100, "%")
    )
    if not FULL:
        sec.notes.append(
            f"scan sized at {runs:,} runs; `python bench/run.py --only audit --full` runs "
            "the 100,000-run (5M-event) size"
        )
    sec.data = orjson.loads(orjson.dumps(figures))
    return sec


if __name__ == "__main__":
    from harness import format_section

    print(format_section(run(Config(quick="--quick" in sys.argv))))
