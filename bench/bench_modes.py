"""Partial replay and run diff on long runs.

*Partial*: ``replay(run, stop_at=N)`` of a 10,000-event run against a full replay
of a run that has only N events — the issue's bar is that pausing at step N
costs no more than serving N events (the tape is loaded only up to N).

*Diff*: ``replayable.diff`` of two 10,000-event runs, (a) a run and its replay-like
twin with a handful of changed responses, (b) two runs whose every response
differs, (c) runs of different lengths (inserted steps). Target: <= 0.2 s.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import replayable
from harness import Config, Section, Target, temp_dir
from replayable.store.sqlite import SQLiteStore

TARGET_DIFF_S = 0.2
TARGET_PARTIAL_RATIO = 1.25

_VARIANT: dict[str, Any] = {"every": 0, "skip": ()}


@replayable.tool
def lookup(i: int) -> dict[str, Any]:
    every = _VARIANT["every"]
    changed = bool(every) and i % every == 0
    return {"i": i, "price": i * 2 + (1 if changed else 0), "status": "ok"}


@replayable.workflow("bench.modes")
def agent(n: int) -> int:
    total = 0
    for i in range(n):
        if i in _VARIANT["skip"]:
            continue
        total += lookup(i)["price"]
    return total


def _record(store: SQLiteStore, n: int, every: int = 0, skip: tuple[int, ...] = ()) -> str:
    _VARIANT.update(every=every, skip=skip)
    with replayable.recording(store) as rec:
        agent(n)
    _VARIANT.update(every=0, skip=())
    return rec.run_ids[0]


def _median_time(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _paired_times(a: Any, b: Any, reps: int) -> tuple[float, float, float]:
    """Median wall times of ``a`` and ``b`` timed in turns (a b, then b a, …), so that
    a burst of other work, or the writer process of the recording just made still
    winding down, falls on both; and the ratio of their median thread CPU times."""
    wall: dict[Any, list[float]] = {a: [], b: []}
    cpu: dict[Any, list[int]] = {a: [], b: []}
    for rep in range(reps * 2):
        fn = (a, b)[rep % 2] if rep // 2 % 2 == 0 else (b, a)[rep % 2]
        gc.collect()
        c0, t0 = time.thread_time_ns(), time.perf_counter()
        fn()
        wall[fn].append(time.perf_counter() - t0)
        cpu[fn].append(time.thread_time_ns() - c0)
    median = statistics.median
    return median(wall[a]), median(wall[b]), median(cpu[a]) / max(median(cpu[b]), 1)


def run(cfg: Config) -> Section:
    sec = Section("modes", "modes: partial replay to step N, and diff of two long runs")
    n_total = 10_000
    reps = cfg.pick(7, 3)
    # A replay of 100 events takes about a millisecond: more pairs than the diff's, so
    # that the median of each side holds on a shared machine (about 6 s in all).
    pairs = cfg.pick(21, 5)
    with temp_dir("modes") as tmp:
        store = SQLiteStore(tmp / "modes.db")
        try:
            long_run = _record(store, n_total)
            figures: dict[str, Any] = {}
            worst = 0.0
            for n in (100, 1_000, 5_000):
                short = _record(store, n)

                def partial(n: int = n) -> None:
                    r = replayable.replay(long_run, store=store, fn=agent, stop_at=n)
                    if r.status != "paused" or r.events_served != n - 1:
                        raise RuntimeError(f"stop_at={n}: {r.status}, {r.events_served} served")

                def full(short: str = short, n: int = n) -> None:
                    r = replayable.replay(short, store=store, fn=agent)
                    if r.status != "identical":
                        raise RuntimeError(f"replay of {n} events: {r.status}")

                t_partial, t_full, cpu_ratio = _paired_times(partial, full, pairs)
                ratio = t_partial / t_full
                worst = max(worst, ratio)
                figures[f"partial_{n}"] = {
                    "stop_at_s": t_partial,
                    "full_n_s": t_full,
                    "ratio": ratio,
                    "cpu_ratio": cpu_ratio,
                }
                sec.row(
                    f"stop_at={n:,} of {n_total:,}",
                    f"{t_partial * 1000:,.1f} ms",
                    f"full replay of a {n:,}-event run {t_full * 1000:,.1f} ms; ratio {ratio:.2f} "
                    f"(CPU time {cpu_ratio:.2f})",
                )
            sec.targets.append(
                Target(
                    "partial replay / serving N events (worst)", worst, TARGET_PARTIAL_RATIO, "x"
                )
            )

            twin = _record(store, n_total, every=2_000)
            shifted = _record(store, n_total, skip=(10, 5_000, 9_000))
            different = _record(store, n_total, every=1)
            slowest = 0.0
            for label, other in (
                ("5 changed responses", twin),
                ("3 removed steps", shifted),
                ("every response changed", different),
            ):
                holder: dict[str, Any] = {}

                def run_diff(other: str = other, holder: dict[str, Any] = holder) -> None:
                    holder["d"] = replayable.diff(long_run, other, store=store)

                t = _median_time(run_diff, reps)
                slowest = max(slowest, t)
                d = holder["d"]
                figures[f"diff_{label}"] = {"s": t, "counts": d.counts()}
                first = d.first.describe() if d.first else "identical"
                sec.row(
                    f"diff 10k vs 10k, {label}",
                    f"{t * 1000:,.1f} ms",
                    f"{d.counts()}; first: {first[:60]}",
                )
            sec.targets.append(
                Target("diff of two 10k-event runs (slowest case)", slowest, TARGET_DIFF_S, "s")
            )
            sec.data.update(figures)
        finally:
            store.close()
    return sec


if __name__ == "__main__":
    from harness import format_section

    print(format_section(run(Config())))
