"""Durable mode against the disk's floor, measured in the same run.

The floor: one ``fsync`` of an appended 4 KB page on this disk, and a bare
SQLite commit of one row with ``synchronous=FULL`` (WAL), as replayable's
store commits. Then a durable boundary (a recorded tool call that returns only
once its event is committed) for a sequential agent, through the writer
process (the default) and the in-process writer, and the throughput of eight
threads recording durably at once (group commit: one commit serves many).
Target: a sequential durable boundary at most 1.3x the SQLite floor.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import replayable
from harness import Config, Section, Target, temp_dir
from replayable.capture.config import settings

__all__ = ["run"]


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


class Floor:
    """The disk's floor, timed one operation at a time between the boundaries measured,
    so that both see the same disk and the same load."""

    def __init__(self, folder: Path) -> None:
        self.page = os.urandom(4096)
        self.fd = os.open(folder / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.conn = sqlite3.connect(folder / "floor.db", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
        self.body = "x" * 600
        self.fsync: list[float] = []
        self.sqlite: list[float] = []

    def sample(self) -> None:
        """One fsync of an appended page, and one bare one-row SQLite commit."""
        t0 = time.perf_counter()
        os.write(self.fd, self.page)
        os.fsync(self.fd)
        t1 = time.perf_counter()
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO t (v) VALUES (?)", (self.body,))
        self.conn.execute("COMMIT")
        t2 = time.perf_counter()
        self.fsync.append(t1 - t0)
        self.sqlite.append(t2 - t1)

    def close(self) -> None:
        os.close(self.fd)
        self.conn.close()


@replayable.tool
def durable_step(i: int) -> dict[str, int]:
    return {"i": i, "square": i * i}


def _sequential(folder: Path, writer: str, n: int, floor: Floor) -> float:
    """Median µs of one durable boundary, one agent, through ``writer``; the floor is
    sampled between its boundaries."""
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

    store = replayable.open_store(f"sqlite:///{folder}/{writer}.db")
    try:
        with replayable.recording(store, durability="durable", spool_dir=folder / "spool"):
            sequential_agent(20)  # warm: the writer started, the connection open
            took.clear()
            sequential_agent(n)
    finally:
        store.close()
        settings.writer = before
    return _median_us(took)


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


def run(cfg: Config) -> Section:
    sec = Section("durable", "Durable mode against the disk's floor (same run)")
    n = cfg.pick(2000, 200)
    with temp_dir("bench-durable") as folder:
        floor = Floor(folder)
        try:
            process_us = _sequential(folder, "process", n, floor)
            thread_us = _sequential(folder, "thread", n, floor)
        finally:
            floor.close()
        # The warm-up calls sampled the floor too: only the measured ones count.
        fsync_us = _median_us(floor.fsync)
        floor_us = _median_us(floor.sqlite)
        per = cfg.pick(250, 40)
        group_process = _concurrent(folder, "process", 8, per)
        group_thread = _concurrent(folder, "thread", 8, per)
    sec.row("floor: fsync of an appended 4 KB page", f"{fsync_us:,.0f} µs")
    sec.row("floor: bare SQLite commit, synchronous=FULL", f"{floor_us:,.0f} µs")
    sec.row(
        "durable boundary, sequential, writer process",
        f"{process_us:,.0f} µs",
        f"{process_us / floor_us:.2f}x the SQLite floor",
    )
    sec.row(
        "durable boundary, sequential, in-process writer",
        f"{thread_us:,.0f} µs",
        f"{thread_us / floor_us:.2f}x the SQLite floor",
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
    sec.targets.append(
        Target("sequential durable boundary / SQLite floor", process_us / floor_us, 1.3, "x")
    )
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
        sqlite_floor_us=floor_us,
        sequential_process_us=process_us,
        sequential_thread_us=thread_us,
        concurrent_process_per_s=group_process,
        concurrent_thread_per_s=group_thread,
    )
    return sec
