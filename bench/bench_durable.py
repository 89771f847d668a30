"""Durable mode against the disk's floor, measured in the same run.

The floor, like with like: a bare SQLite commit (``BEGIN IMMEDIATE``, one
``INSERT``, ``COMMIT`` through the ``sqlite3`` module) of the very row a durable
boundary stores (the last recorded event's row as the store wrote it, every
column, a new seq each time) into a table of the store's own schema (its
indexes and triggers), in a file of the same folder with the store's settings
(WAL, ``synchronous=FULL``, the setting a durable commit uses). So the floor
holds everything a durable boundary must pay (the row's pages and one fsync of
the WAL) and the ratio is what the path from the agent's boundary to the
commit and back costs on top. Beside it, for
reference: one ``fsync`` of an appended 4 KB page, and a bare commit of a
two-column row (a smaller row, fewer index pages).

A floor sample is taken right after each boundary, so both see the same disk
and the same load. The sequential figure is measured in several rounds in this
one process (each round its own boundaries and floor samples); the ratio
reported is the median of the rounds' ratios (median boundary / median floor),
with the lowest and highest beside it. Then the throughput of eight threads
recording durably at once (group commit: one commit serves many).
Target: a sequential durable boundary at most 1.3x the floor.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import replayable
from harness import Config, Section, Target, temp_dir, warm_writer
from replayable.capture.config import settings
from replayable.capture.writer import writer_for
from replayable.store.sqlite import SQLiteStore

__all__ = ["run"]


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


class Floor:
    """The disk's floor, timed one operation at a time between the boundaries measured,
    so that both see the same disk and the same load."""

    def __init__(self, folder: Path) -> None:
        self.page = os.urandom(4096)
        self.fd = os.open(folder / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        SQLiteStore(folder / "floor.db").close()  # the store's schema, indexes and triggers
        self.conn = sqlite3.connect(folder / "floor.db", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
        self.body = "x" * 600
        self.row: list[object] | None = None
        self.insert = ""
        self.seq_at = 1
        self.seq = 0
        self.fsync: list[float] = []
        self.small: list[float] = []
        self.sqlite: list[float] = []

    def same_row(self, db: Path) -> None:
        """From now on commit the last event row stored in ``db`` (every column as the
        store wrote it), each time with a new seq."""
        conn = sqlite3.connect(db)
        try:
            cursor = conn.execute("SELECT * FROM events ORDER BY rowid DESC LIMIT 1")
            row = cursor.fetchone()
            columns = [d[0] for d in cursor.description]
        finally:
            conn.close()
        self.row = list(row)
        self.seq_at = columns.index("seq")
        self.insert = (
            f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join('?' * len(row))})"
        )

    def sample(self) -> None:
        """One bare commit of the boundary's row; now and then the reference figures."""
        if self.row is None:
            return
        conn = self.conn
        self.seq += 1
        self.row[self.seq_at] = self.seq
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(self.insert, self.row)
        conn.execute("COMMIT")
        t1 = time.perf_counter()
        self.sqlite.append(t1 - t0)
        if self.seq % 4 == 0:
            t0 = time.perf_counter()
            os.write(self.fd, self.page)
            os.fsync(self.fd)
            t1 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", (self.body,))
            conn.execute("COMMIT")
            t2 = time.perf_counter()
            self.fsync.append(t1 - t0)
            self.small.append(t2 - t1)

    def close(self) -> None:
        os.close(self.fd)
        self.conn.close()


@replayable.tool
def durable_step(i: int) -> dict[str, int]:
    return {"i": i, "square": i * i}


def _sequential(
    folder: Path, writer: str, n: int, rounds: int, floor: Floor
) -> tuple[list[float], list[float]]:
    """Per round: median µs of one durable boundary (one agent, through ``writer``) and
    of the floor sampled between its boundaries."""
    before = settings.writer
    settings.writer = writer
    took: list[float] = []

    @replayable.workflow
    def sequential_agent(count: int) -> None:
        for i in range(count):
            t0 = time.perf_counter()
            durable_step(i)
            took.append(time.perf_counter() - t0)
            floor.sample()

    boundary: list[float] = []
    bare: list[float] = []
    store = replayable.open_store(f"sqlite:///{folder}/{writer}.db")
    try:
        with replayable.recording(store, durability="durable", spool_dir=folder / "spool"):
            sequential_agent(20)  # warm: the writer started, the connection open
            if floor.row is None:
                writer_for(store).flush()
                floor.same_row(folder / f"{writer}.db")
            for _ in range(rounds):
                took.clear()
                floor.sqlite.clear()
                sequential_agent(n)
                boundary.append(_median_us(took))
                bare.append(_median_us(floor.sqlite))
    finally:
        store.close()
        settings.writer = before
    return boundary, bare


def _concurrent(folder: Path, writer: str, threads: int, per: int) -> float:
    """Durable boundaries per second with ``threads`` agents recording at once."""
    before = settings.writer
    settings.writer = writer

    @replayable.workflow
    def concurrent_agent(count: int) -> None:
        for i in range(count):
            durable_step(i)

    store = replayable.open_store(f"sqlite:///{folder}/c-{writer}.db")
    try:
        with replayable.recording(store, durability="durable", spool_dir=folder / "spool"):
            concurrent_agent(5)
            workers = [
                threading.Thread(target=replayable.carry(concurrent_agent), args=(per,))
                for _ in range(threads)
            ]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - t0
    finally:
        store.close()
        settings.writer = before
    return threads * per / elapsed


def _ratio(boundary: list[float], bare: list[float]) -> tuple[float, float, float]:
    """Median, lowest and highest of the rounds' boundary / floor ratios."""
    ratios = [b / f for b, f in zip(boundary, bare, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def run(cfg: Config) -> Section:
    sec = Section("durable", "Durable mode against the disk's floor (same run)")
    n = cfg.pick(400, 100)
    rounds = cfg.pick(5, 2)
    with temp_dir("bench-durable") as folder:
        # The writer process started before anything is timed: its start-up (a new
        # interpreter importing the package) would share the CPUs with the first rounds.
        warm_writer(folder)
        floor = Floor(folder)
        try:
            process, process_floor = _sequential(folder, "process", n, rounds, floor)
            thread, thread_floor = _sequential(folder, "thread", n, rounds, floor)
        finally:
            floor.close()
        fsync_us = _median_us(floor.fsync)
        small_us = _median_us(floor.small)
        per = cfg.pick(250, 40)
        group_process = _concurrent(folder, "process", 8, per)
        group_thread = _concurrent(folder, "thread", 8, per)
    floor_us = statistics.median(process_floor + thread_floor)
    process_us = statistics.median(process)
    thread_us = statistics.median(thread)
    p_ratio, p_low, p_high = _ratio(process, process_floor)
    t_ratio, t_low, t_high = _ratio(thread, thread_floor)
    sec.row("reference: fsync of an appended 4 KB page", f"{fsync_us:,.0f} µs")
    sec.row("reference: bare SQLite commit, two-column row", f"{small_us:,.0f} µs")
    sec.row("floor: bare SQLite commit of the same event row", f"{floor_us:,.0f} µs")
    sec.row(
        "durable boundary, sequential, writer process",
        f"{process_us:,.0f} µs",
        f"{p_ratio:.2f}x the floor (rounds {p_low:.2f}-{p_high:.2f})",
    )
    sec.row(
        "durable boundary, sequential, in-process writer",
        f"{thread_us:,.0f} µs",
        f"{t_ratio:.2f}x the floor (rounds {t_low:.2f}-{t_high:.2f})",
    )
    floor_rate = 1e6 / floor_us
    sec.row(
        "8 threads, durable, writer process",
        f"{group_process:,.0f} /s",
        f"{group_process / floor_rate:.1f}x one commit per event",
    )
    sec.row(
        "8 threads, durable, in-process writer",
        f"{group_thread:,.0f} /s",
        f"{group_thread / floor_rate:.1f}x one commit per event",
    )
    sec.notes.append(
        f"sequential: {rounds} rounds of {n} boundaries, each beside {n} floor commits; "
        "the ratio is the median of the rounds'"
    )
    sec.targets.append(Target("sequential durable boundary / floor", p_ratio, 1.3, "x"))
    sec.targets.append(
        Target(
            "8 durable agents / one commit per event",
            group_process / floor_rate,
            1.0,
            "x",
            op=">=",
        )
    )
    sec.data.update(
        fsync_us=fsync_us,
        small_row_commit_us=small_us,
        sqlite_floor_us=floor_us,
        sequential_process_us=process_us,
        sequential_thread_us=thread_us,
        sequential_process_ratios=[b / f for b, f in zip(process, process_floor, strict=True)],
        sequential_thread_ratios=[b / f for b, f in zip(thread, thread_floor, strict=True)],
        sequential_process_ratio=p_ratio,
        sequential_thread_ratio=t_ratio,
        concurrent_process_per_s=group_process,
        concurrent_thread_per_s=group_thread,
    )
    return sec
