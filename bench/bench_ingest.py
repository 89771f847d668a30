"""Sustained ingest into SQLite from one process.

(a) end-to-end: a workflow making N tool calls inside a recording, timed from
entering the ``with`` block to leaving it (leaving waits for the final flush),
with the default writer process and, for reference, the in-process writer.
(b) store-level: ``SQLiteStore.append`` of prebuilt events (built by the real
writer: redacted, fingerprinted, hash-chained) in batches of the writer's size.
(c) a short recording: 2,000 trivial tool calls, the whole ``with`` block
(final flush included) against the calls alone, median of several runs in a
store the writer process has open already.
(d) bytes on disk: a fresh store holding one recorded run of 10,000 trivial tool
calls (``ping(i) -> i``), its file size after a checkpoint divided by the events.
Baseline: raw ``sqlite3`` ``executemany`` of the same rows, one transaction
per batch, into a plain table with the same columns.
"""

from __future__ import annotations

import gc
import inspect
import sqlite3
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

import replayable
from harness import Config, Section, Target, payload_1kb, rate, temp_dir, warm_writer
from replayable.capture.config import settings
from replayable.capture.writer import Writer
from replayable.events.canonical import event_hash, fingerprint
from replayable.events.model import Event, RunStart
from replayable.store import MemoryStore
from replayable.store.rows import event_to_row
from replayable.store.sqlite import SQLiteStore

TARGET_EVENTS_PER_S = 50_000
TARGET_BYTES_PER_EVENT = 300

_COLUMNS = (
    "run_id",
    "seq",
    "kind",
    "name",
    "key",
    "parent",
    "call_site",
    "request",
    "fingerprint",
    "response",
    "encoding",
    "error",
    "side_effect",
    "started_at",
    "duration_ns",
    "metadata",
    "chain_index",
    "prev_hash",
    "hash",
    "schema_version",
)
_INSERT = f"INSERT INTO {{table}} ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"


@replayable.tool
def search(query: str, k: int) -> dict[str, Any]:
    return {"ok": True, "n": 3}


@replayable.workflow("bench.ingest")
def ingest_agent(n: int) -> int:
    for i in range(n):
        search("weather in paris tomorrow", i)
    return n


def writer_batch_size() -> int:
    """The background writer's batch size (its default), so batches match the real path."""
    default = inspect.signature(Writer.__init__).parameters["batch_size"].default
    return int(default) if isinstance(default, int) else 2048


def record(store: Any, n: int) -> tuple[str, float, float]:
    """Record one run of ``n`` tool calls: (run id, seconds calling, seconds flushing)."""
    gc.collect()
    rec = replayable.recording(store, durability="buffered")
    t0 = time.perf_counter()
    with rec:
        ingest_agent(n)
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    return rec.run_ids[0], t1 - t0, t2 - t1


@replayable.tool
def ping(i: int) -> int:
    return i


@replayable.workflow("bench.short")
def short_agent(n: int) -> int:
    for i in range(n):
        ping(i)
    return n


def short_recordings(path: Path, n: int, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds in the loop and in the whole recording (flush included), per repeat."""
    store = SQLiteStore(path)
    loops: list[float] = []
    totals: list[float] = []
    try:
        with replayable.recording(store):
            short_agent(10)  # the store open in the writer process
        for _ in range(repeats):
            gc.collect()
            rec = replayable.recording(store, durability="buffered")
            t0 = time.perf_counter()
            with rec:
                short_agent(n)
                t1 = time.perf_counter()
            t2 = time.perf_counter()
            loops.append(t1 - t0)
            totals.append(t2 - t0)
    finally:
        store.close()
    return loops, totals


def bytes_on_disk(path: Path, n: int) -> tuple[float, dict[str, float]]:
    """Bytes per event of a fresh store holding one run of ``n`` trivial tool calls: the
    whole file after a checkpoint (the write-ahead log emptied into it), divided by
    ``n``; and per table and index, the pages each takes (``dbstat``), per event."""
    store = SQLiteStore(path)
    try:
        with replayable.recording(store, durability="buffered"):
            short_agent(n)
    finally:
        store.close()
    conn = sqlite3.connect(str(path))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        parts = {
            str(name): int(size) / n
            for name, size in conn.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
            )
        }
    finally:
        conn.close()
    wal = path.with_name(path.name + "-wal")
    size = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return size / n, parts


def with_big_requests(events: Sequence[Event], request: bytes) -> list[Event]:
    """The same events carrying a larger request, fingerprinted and re-chained for real."""
    out: list[Event] = []
    prev = events[0].prev_hash
    text = request.decode()
    for e in events:
        e = msgspec.structs.replace(
            e, request=text, fingerprint=fingerprint(e.kind, e.name, request), prev_hash=prev
        )
        e = msgspec.structs.replace(e, hash=event_hash(e))
        out.append(e)
        prev = e.hash
    return out


def batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def append_rate(path: Path, start: RunStart, chunks: list[Sequence[Event]]) -> float:
    """Events/s of ``SQLiteStore.append`` over ``chunks`` into a fresh database."""
    store = SQLiteStore(path)
    try:
        n = sum(len(c) for c in chunks)
        gc.collect()
        t0 = time.perf_counter()
        for i, chunk in enumerate(chunks):
            store.append([start] if i == 0 else [], chunk, [])
        return n / (time.perf_counter() - t0)
    finally:
        store.close()


def raw_rate(path: Path, chunks: list[list[tuple[Any, ...]]], table: str | None) -> float:
    """Events/s of raw ``executemany``: into a plain table when ``table`` is None, else into
    the store's own table (schema created by opening a store there first)."""
    if table is not None:
        SQLiteStore(path).close()
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if table is None:
            table = "plain_events"
            conn.execute(f"CREATE TABLE {table} ({', '.join(_COLUMNS)})")
        sql = _INSERT.format(table=table)
        n = sum(len(c) for c in chunks)
        gc.collect()
        t0 = time.perf_counter()
        for chunk in chunks:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(sql, chunk)
            conn.execute("COMMIT")
        return n / (time.perf_counter() - t0)
    finally:
        conn.close()


def run(cfg: Config) -> Section:
    sec = Section("ingest", "ingest: sustained events/s into SQLite from one agent process")
    n_e2e = cfg.pick(200_000, 20_000)
    n_store = cfg.pick(100_000, 20_000)
    repeats = cfg.pick(3, 2)
    size = writer_batch_size()

    with temp_dir("ingest") as tmp:
        # (a) end-to-end through a recording. Sustained: the writer process (started
        # once per agent process) is warmed up by a short recording first.
        warm_writer(tmp)
        e2e: list[tuple[float, float]] = []
        for r in range(cfg.pick(2, 1)):
            store = SQLiteStore(tmp / f"e2e-{r}.db")
            try:
                _, calls_s, flush_s = record(store, n_e2e)
            finally:
                store.close()
            e2e.append((calls_s, flush_s))
        n_short = 2000
        loops, totals = short_recordings(tmp / "short.db", n_short, cfg.pick(9, 3))
        n_bytes = 10_000
        per_event, disk_parts = bytes_on_disk(tmp / "bytes.db", n_bytes)
        e2e_rates = [n_e2e / (c + f) for c, f in e2e]
        e2e_rate = statistics.median(e2e_rates)
        calls_s, flush_s = min(e2e, key=lambda cf: abs(n_e2e / sum(cf) - e2e_rate))

        # The same with the writer as a thread of the agent's process, for reference.
        before = settings.writer
        replayable.configure(writer="thread")
        try:
            store = SQLiteStore(tmp / "e2e-thread.db")
            try:
                _, tcalls_s, tflush_s = record(store, n_e2e)
            finally:
                store.close()
        finally:
            settings.writer = before
        thread_rate = n_e2e / (tcalls_s + tflush_s)

        # The same through the writer into memory: what the writer costs without SQLite.
        mem = MemoryStore()
        run_id, mcalls_s, mflush_s = record(mem, n_store)
        mem_rate = n_store / (mcalls_s + mflush_s)
        events = mem.events(run_id)
        start = mem.get_run(run_id).start
        mem.close()

        # (b) store-level appends of those events, and the raw baselines.
        chunks = batches(events, size)
        rows = [[event_to_row(e) for e in chunk] for chunk in chunks]
        ours, plain, same_schema = [], [], []
        for r in range(repeats):
            ours.append(append_rate(tmp / f"store-{r}.db", start, chunks))
            plain.append(raw_rate(tmp / f"raw-{r}.db", rows, None))
            same_schema.append(raw_rate(tmp / f"raw-schema-{r}.db", rows, "events"))

        # The same with a 1 KB request per event.
        big_req = orjson.dumps({"request": payload_1kb()}, option=orjson.OPT_SORT_KEYS)
        big = with_big_requests(events[: n_store // 4], big_req)
        big_chunks = batches(big, size)
        big_rows = [[event_to_row(e) for e in chunk] for chunk in big_chunks]
        ours_big, plain_big = [], []
        for r in range(repeats):
            ours_big.append(append_rate(tmp / f"store-big-{r}.db", start, big_chunks))
            plain_big.append(raw_rate(tmp / f"raw-big-{r}.db", big_rows, None))
    store_rate = statistics.median(ours)
    plain_rate = statistics.median(plain)
    schema_rate = statistics.median(same_schema)
    big_rate = statistics.median(ours_big)
    big_plain_rate = statistics.median(plain_big)

    sec.row(
        f"end-to-end, {n_e2e:,} tool calls",
        rate(e2e_rate),
        f"median of {len(e2e)}: {calls_s:.2f} s calling + {flush_s:.2f} s final flush "
        f"({calls_s / n_e2e * 1e6:.1f} µs per call in the agent); "
        f"{e2e_rate / store_rate:.2f}x SQLiteStore.append",
    )
    sec.row(
        f"  with the writer as a thread, {n_e2e:,} calls",
        rate(thread_rate),
        f"{tcalls_s:.2f} s calling + {tflush_s:.2f} s final flush "
        f"({tcalls_s / n_e2e * 1e6:.1f} µs per call in the agent)",
    )
    sec.row(
        f"end-to-end into memory://, {n_store:,} calls",
        rate(mem_rate),
        "same path without SQLite (writer CPU bound)",
    )
    sec.row(
        f"SQLiteStore.append, {n_store:,} events",
        rate(store_rate),
        f"median of {repeats}; batches of {size}; {store_rate / plain_rate:.2f}x raw",
    )
    sec.row("raw executemany, plain table", rate(plain_rate), "baseline: no key, no index")
    sec.row(
        "raw executemany, the store's schema",
        rate(schema_rate),
        f"primary key + index; {schema_rate / plain_rate:.2f}x plain",
    )
    sec.row(
        f"SQLiteStore.append, {len(big):,} events, 1 KB request",
        rate(big_rate),
        f"{big_rate / big_plain_rate:.2f}x raw plain table ({rate(big_plain_rate)})",
    )
    loop_s = statistics.median(loops)
    total_s = statistics.median(totals)
    short_ratio = statistics.median(t / lp for lp, t in zip(loops, totals, strict=True))
    sec.row(
        f"recording {n_short:,} trivial calls, flush included",
        f"{total_s / n_short * 1e6:.1f} µs/call",
        f"{loop_s / n_short * 1e6:.1f} µs/call in the loop; {short_ratio:.2f}x "
        f"(median of {len(loops)})",
    )
    events_parts = sum(v for k, v in disk_parts.items() if "events" in k)
    sec.row(
        f"bytes on disk per trivial tool event, {n_bytes:,} events",
        f"{per_event:.0f} B",
        f"whole file after a checkpoint / events; the events table and its key "
        f"{events_parts:.0f} B (dbstat)",
    )
    sec.targets.append(
        Target("end-to-end ingest", e2e_rate, TARGET_EVENTS_PER_S, "events/s", op=">=")
    )
    sec.targets.append(
        Target("bytes on disk per trivial tool event", per_event, TARGET_BYTES_PER_EVENT, "B")
    )
    sec.targets.append(
        Target(
            "end-to-end ingest / store-level append",
            e2e_rate / store_rate,
            0.8,
            "x",
            op=">=",
            note="the writer must not be the bottleneck",
        )
    )
    sec.targets.append(
        Target(f"recording {n_short:,} calls incl. flush / in the loop", short_ratio, 2.0, "x")
    )
    sec.targets.append(
        Target("store-level append", store_rate, TARGET_EVENTS_PER_S, "events/s", op=">=")
    )
    sec.data = {
        "bytes_events": n_bytes,
        "bytes_per_event": per_event,
        "bytes_per_event_by_object": disk_parts,
        "short_calls": n_short,
        "short_loop_s": loops,
        "short_total_s": totals,
        "short_total_over_loop": short_ratio,
        "e2e_events": n_e2e,
        "e2e_events_per_s": e2e_rates,
        "e2e_over_store_append": e2e_rate / store_rate,
        "e2e_calls_s": [c for c, _ in e2e],
        "e2e_flush_s": [f for _, f in e2e],
        "writer": settings.writer,
        "e2e_thread_writer_events_per_s": thread_rate,
        "memory_events_per_s": mem_rate,
        "store_events": n_store,
        "batch_size": size,
        "store_append_events_per_s": ours,
        "raw_plain_events_per_s": plain,
        "raw_same_schema_events_per_s": same_schema,
        "store_over_raw_plain": store_rate / plain_rate,
        "store_1kb_events": len(big),
        "store_append_1kb_events_per_s": ours_big,
        "raw_plain_1kb_events_per_s": plain_big,
    }
    sec.notes.append(
        "the tool call: search('weather in paris tomorrow', i) -> {'ok': True, "
        "'n': 3}; events counted are boundary events (run records excluded)"
    )
    return sec
