"""Shared pieces of the benchmarks: sizes, timing, statistics, tables and results.

Timing method: a sample is one batch of calls timed with ``time.perf_counter_ns``
around the whole batch; its per-call cost is the batch time divided by the
batch size. A measurement is many samples; the figure reported is the median
of the per-call averages (p10 and p90 alongside), so a descheduled batch on a
noisy machine moves the spread, not the median. Throughputs are wall-clock
totals over a whole run, repeated and reported as the median of the repeats.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Config",
    "Row",
    "Section",
    "Stats",
    "Target",
    "format_section",
    "ns_per_call",
    "payload_1kb",
    "rate",
    "spread",
    "stats",
    "temp_dir",
    "us",
]


@dataclass(frozen=True)
class Config:
    """Sizes of one bench run; ``quick`` shrinks everything for a smoke run."""

    quick: bool = False
    profile: bool = False

    def pick(self, full: int, quick: int) -> int:
        return quick if self.quick else full


@dataclass(frozen=True)
class Stats:
    """Distribution of per-call samples, in nanoseconds."""

    median: float
    p10: float
    p90: float
    mean: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {
            "median_ns": self.median,
            "p10_ns": self.p10,
            "p90_ns": self.p90,
            "mean_ns": self.mean,
            "samples": self.n,
        }


def stats(samples: list[float], warmup: int = 0) -> Stats:
    """Median, p10, p90 and mean of ``samples`` after dropping the first ``warmup``."""
    xs = samples[warmup:] if len(samples) > warmup + 2 else samples
    ordered = sorted(xs)
    k = len(ordered) - 1

    def q(p: float) -> float:
        return ordered[round(p * k)]

    return Stats(
        statistics.median(ordered), q(0.10), q(0.90), statistics.fmean(ordered), len(ordered)
    )


def ns_per_call(call: Callable[[Any], Any], arg: Any, batch: int, samples: int) -> list[float]:
    """``samples`` per-call averages (ns) of ``call(arg)`` timed in batches of ``batch``."""
    clock = time.perf_counter_ns
    loop = range(batch)
    out: list[float] = []
    for _ in range(samples):
        t0 = clock()
        for _ in loop:
            call(arg)
        out.append((clock() - t0) / batch)
    return out


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A throwaway directory for databases, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"replayable-bench-{prefix}-"))
    try:
        yield path
    finally:
        gc.collect()
        shutil.rmtree(path, ignore_errors=True)


def warm_writer(directory: Path) -> None:
    """Start this process's writer process (once per agent process) before anything is
    timed, so that steady-state figures do not include its start-up."""
    from replayable.capture.writer import writer_for
    from replayable.store.sqlite import SQLiteStore

    store = SQLiteStore(directory / "warm-up.db")
    try:
        writer_for(store).flush()
    finally:
        store.close()


def payload_1kb() -> dict[str, Any]:
    """A JSON-like tool argument of about 1 KB: a query and ten small records."""
    return {
        "query": "open invoices for customer ACME Corp with an overdue balance over 30 days",
        "filters": {"region": "EU", "currency": "EUR", "limit": 10},
        "rows": [
            {
                "id": 1000 + i,
                "sku": f"SKU-{i:04d}",
                "qty": i + 1,
                "price": 19.5 + i,
                "status": "overdue" if i % 3 else "open",
                "tags": ["b2b", "priority"],
            }
            for i in range(10)
        ],
    }


# -- results --------------------------------------------------------------------


@dataclass
class Row:
    """One line of a section's table."""

    label: str
    value: str
    detail: str = ""


@dataclass
class Target:
    """A figure checked against a limit. ``passed`` is None when it was not measured."""

    name: str
    value: float | None
    limit: float
    unit: str
    op: str = "<="
    passed: bool | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.passed is None and self.value is not None:
            self.passed = self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    @property
    def verdict(self) -> str:
        return "SKIP" if self.passed is None else ("PASS" if self.passed else "MISS")

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "unit": self.unit,
            "op": self.op,
            "verdict": self.verdict,
            "note": self.note,
        }


@dataclass
class Section:
    """What one benchmark hands back: a table, its targets and raw figures for JSON."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    def row(self, label: str, value: str, detail: str = "") -> None:
        self.rows.append(Row(label, value, detail))


def us(ns: float) -> str:
    """Nanoseconds as microseconds, two decimals."""
    return f"{ns / 1000:.2f} µs"


def spread(s: Stats) -> str:
    return f"p10 {s.p10 / 1000:.2f} / p90 {s.p90 / 1000:.2f} µs, n={s.n}"


def rate(per_s: float) -> str:
    return f"{per_s:,.0f}/s"


def format_section(section: Section) -> str:
    width = max([len(r.label) for r in section.rows] + [10])
    vwidth = max([len(r.value) for r in section.rows] + [8])
    lines = [f"== {section.title} ({section.seconds:.1f} s) =="]
    for r in section.rows:
        tail = f"  {r.detail}" if r.detail else ""
        lines.append(f"  {r.label:<{width}}  {r.value:>{vwidth}}{tail}".rstrip())
    for t in section.targets:
        value = "n/a" if t.value is None else f"{t.value:,.2f}"
        lines.append(
            f"  target  {t.name}: {value} {t.unit} {t.op} {t.limit:,g} {t.unit}"
            f"  -> {t.verdict}" + (f"  ({t.note})" if t.note else "")
        )
    lines.extend(f"  note: {n}" for n in section.notes)
    return "\n".join(lines)
