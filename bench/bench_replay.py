"""Full replay of recorded runs of growing length, loading included.

Runs of 1k, 10k and 100k tool events are recorded into one SQLite database;
each is then replayed with ``replayable.replay(run_id, store=..., fn=...)``.
Total is the wall time of that call; *load* is the time that call spends in
the store's reads (run lookup and ``store.events``); *execution* is the replay's own
``duration_s`` (the agent's code running against the tape); *other* is the
rest (indexing the tape, resolving the entrypoint, judging the outcome).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import replayable
from harness import Config, Section, Target, temp_dir
from replayable.events.model import Event, Run
from replayable.store.sqlite import SQLiteStore

TARGET_10K_S = 0.1
TARGET_LINEAR = 1.5


@replayable.tool
def search(query: str, k: int) -> dict[str, Any]:
    return {"ok": True, "n": 3}


@replayable.workflow("bench.replay")
def replay_agent(n: int) -> int:
    for i in range(n):
        search("weather in paris tomorrow", i)
    return n


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


class TimedStore(SQLiteStore):
    """The SQLite store, adding up the time spent in the reads a replay makes."""

    load_s = 0.0

    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        t0 = time.perf_counter()
        try:
            return super().find_run_ids(prefix, limit)
        finally:
            self.load_s += time.perf_counter() - t0

    def get_run(self, run_id: str) -> Run:
        t0 = time.perf_counter()
        try:
            return super().get_run(run_id)
        finally:
            self.load_s += time.perf_counter() - t0

    def events(self, run_id: str) -> list[Event]:
        t0 = time.perf_counter()
        try:
            return super().events(run_id)
        finally:
            self.load_s += time.perf_counter() - t0


def run(cfg: Config) -> Section:
    sec = Section("replay", "replay: full replay of a recorded run, loading from SQLite included")
    big = cfg.pick(100_000, 30_000)
    sizes = (1_000, 10_000, big)
    reps = {1_000: cfg.pick(15, 5), 10_000: cfg.pick(7, 3), big: 3}
    figures: dict[str, Any] = {}

    with temp_dir("replay") as tmp:
        store = TimedStore(tmp / "replay.db")
        try:
            run_ids = {}
            record_s = {}
            for n in sizes:
                gc.collect()
                rec = replayable.recording(store, durability="buffered")
                t0 = time.perf_counter()
                with rec:
                    replay_agent(n)
                record_s[n] = time.perf_counter() - t0
                run_ids[n] = rec.run_ids[0]

            # Repetitions go round-robin over the sizes, so a burst of noise on
            # the machine is shared out rather than landing on one size.
            totals: dict[int, list[float]] = {n: [] for n in sizes}
            loads: dict[int, list[float]] = {n: [] for n in sizes}
            execs: dict[int, list[float]] = {n: [] for n in sizes}
            for rep in range(max(reps.values())):
                for n in sizes:
                    if rep >= reps[n]:
                        continue
                    gc.collect()
                    store.load_s = 0.0
                    t0 = time.perf_counter()
                    result = replayable.replay(run_ids[n], store=store, fn=replay_agent)
                    totals[n].append(time.perf_counter() - t0)
                    loads[n].append(store.load_s)
                    execs[n].append(result.duration_s)
                    if result.status != "identical" or result.events_served != n:
                        raise RuntimeError(
                            f"replay of {n} events: {result.status}, {result.events_served} served"
                        )
            for n in sizes:
                total = _median(totals[n])
                # The breakdown is that of the repetition whose total is the median.
                i = min(range(reps[n]), key=lambda k, n=n, total=total: abs(totals[n][k] - total))
                load, exe = loads[n][i], execs[n][i]
                figures[str(n)] = {
                    "events": n,
                    "record_s": record_s[n],
                    "total_s": totals[n],
                    "load_s": loads[n],
                    "exec_s": execs[n],
                    "us_per_event": total / n * 1e6,
                }
                other = totals[n][i] - load - exe
                sec.row(
                    f"{n:>7,} events",
                    f"{total * 1000:,.1f} ms",
                    f"{total / n * 1e6:5.1f} µs/event = load {load / n * 1e6:4.1f} + "
                    f"exec {exe / n * 1e6:4.1f} + other {other / n * 1e6:4.1f} "
                    f"(median of {reps[n]}; recorded in {record_s[n]:.2f} s)",
                )
        finally:
            store.close()

    per_10k = figures["10000"]["us_per_event"]
    per_big = figures[str(big)]["us_per_event"]
    linear = per_big / per_10k
    sec.row(
        f"per-event cost {big // 1000}k / 10k",
        f"{linear:.2f}x",
        f"1k: {figures['1000']['us_per_event']:.1f} µs/event (fixed costs amortised less)",
    )
    sec.targets.append(
        Target("10k-event replay total", _median(figures["10000"]["total_s"]), TARGET_10K_S, "s")
    )
    sec.targets.append(
        Target(
            f"per-event cost {big // 1000}k / 10k",
            linear,
            TARGET_LINEAR,
            "x",
            note="" if big == 100_000 else "quick: 30k stands in for 100k",
        )
    )
    sec.data = {"runs": figures, "linear_ratio": linear}
    sec.notes.append("each event: search('weather in paris tomorrow', i) -> {'ok': True, 'n': 3}")
    return sec
