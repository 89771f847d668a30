"""Run the benchmarks: ``python bench/run.py [--quick | --full] [--only NAME] [--profile]``.

Prints one table per benchmark, then a summary with PASS/MISS per target, and
writes every figure as JSON to ``.replayable/bench-results.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

import bench_audit
import bench_capture
import bench_duckdb
import bench_durable
import bench_fixtures
import bench_http
import bench_ingest
import bench_modes
import bench_postgres
import bench_replay
import bench_startup
import bench_stream
import bench_tiers
import bench_web
from harness import Config, Section, format_section, payload_1kb

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / ".replayable" / "bench-results.json"
#: Above this 1-minute load average, other work on the machine is in every figure.
QUIET_LOAD = 0.5

BENCHMARKS: dict[str, Callable[[Config], Section]] = {
    # First: a fresh interpreter per sample, before the others leave files and processes.
    "startup": bench_startup.run,
    "capture": bench_capture.run,
    "durable": bench_durable.run,
    "http": bench_http.run,
    "ingest": bench_ingest.run,
    "modes": bench_modes.run,
    "replay": bench_replay.run,
    "audit": bench_audit.run,
    "web": bench_web.run,
    "fixtures": bench_fixtures.run,
    "tiers": bench_tiers.run,
    # Needs NATS and PostgreSQL; its compactor processes finish before it returns.
    "stream": bench_stream.run,
    "duckdb": bench_duckdb.run,
    # Last: it drives a server process whose background work would otherwise
    # land on the benchmarks that follow it.
    "postgres": bench_postgres.run,
}


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def _summary(sections: list[Section], total: float) -> str:
    lines = ["== summary =="]
    for sec in sections:
        if sec.error is not None:
            lines.append(f"  ERR   {sec.name:<8} did not run: {sec.error}")
        for t in sec.targets:
            value = "n/a" if t.value is None else f"{t.value:,.2f}"
            lines.append(
                f"  {t.verdict:<4}  {sec.name:<8} {t.name}: {value} {t.op} {t.limit:,g} {t.unit}"
            )
    cap = next((s for s in sections if s.name == "capture"), None)
    if cap is not None and cap.error is None:
        rec = cap.data["recorded_trivial"]["median_ns"] / 1000
        idle = cap.data["recorded_trivial_writer_idle"]["median_ns"] / 1000
        rep = cap.data["replayed_trivial"]["median_ns"] / 1000
        lines.append(
            f"  ref   trivial tool call: record {rec:.1f} µs steady, {idle:.1f} µs writer idle"
            f"; replay {rep:.1f} µs"
        )
    missed = sum(1 for s in sections for t in s.targets if t.verdict == "MISS")
    failed = sum(1 for s in sections if s.error is not None)
    lines.append(
        f"  {missed} target(s) missed"
        + (f", {failed} benchmark(s) did not run" if failed else "")
        + f"; total {total:.1f} s"
        + ("; run with --profile for where the time goes" if missed else "")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="replayable benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="the issue's sizes where a benchmark is smaller by default "
        "(audit: 100,000 runs, 5M events; several minutes per store)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the benchmarks, break down where the time goes",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"JSON results file (default {DEFAULT_OUTPUT.relative_to(ROOT)})",
    )
    args = parser.parse_args(argv)
    cfg = Config(quick=args.quick, profile=args.profile)
    names = args.only or list(BENCHMARKS)

    load_start = _load()
    floor_ns = cpu_floor_ns()
    print(
        f"replayable bench ({'quick' if cfg.quick else 'full'}): python "
        f"{platform.python_version()}, {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} cpus, load average {_shown_load(load_start)}; "
        f"CPU floor {floor_ns / 1000:.2f} µs (orjson + sha256 of 1 KB)",
        flush=True,
    )
    _warn_if_busy("at the start", load_start)
    started = time.perf_counter()
    sections: list[Section] = []
    for i, name in enumerate(names):
        if i:
            _settle()
        t0 = time.perf_counter()
        try:
            sec = BENCHMARKS[name](cfg)
        except Exception as exc:  # one broken benchmark (or a missing server) skips, not stops
            sec = Section(name, f"{name}: did not run")
            sec.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            sec.notes.append(sec.error)
        sec.seconds = time.perf_counter() - t0
        sections.append(sec)
        print("\n" + format_section(sec), flush=True)

    if cfg.profile:
        import profiling

        print()
        profiling.run(cfg, names)

    total = time.perf_counter() - started
    load_end = _load()
    print("\n" + _summary(sections, total))
    # The load at the end includes this run's own processes (the writer, the servers):
    # only the load at the start says whether other work shared the machine.
    print(
        f"  load average {_shown_load(load_start)} at the start, {_shown_load(load_end)} at the "
        "end (the end includes this run's own processes)"
    )
    busy = _warn_if_busy("at the start", load_start)

    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if cfg.quick else "full",
        "commit": _commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "quiet": not busy,
        "cpu_floor_ns": floor_ns,
        "total_s": total,
        "benchmarks": {
            s.name: {
                "title": s.title,
                "error": s.error,
                "seconds": s.seconds,
                "rows": [[r.label, r.value, r.detail] for r in s.rows],
                "targets": [t.as_dict() for t in s.targets],
                "figures": s.data,
            }
            for s in sections
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"  results written to {_shown(args.output)}")
    return 0


def _settle() -> None:
    """Between benchmarks: free the last one's garbage and let the disk catch up with
    its writes, so that its aftermath is not timed as part of the next one."""
    gc.collect()
    if hasattr(os, "sync"):
        os.sync()
    time.sleep(1.0)


def _load() -> float | None:
    """The 1-minute load average: other work on the machine shows up in every figure."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _shown_load(load: float | None) -> str:
    return "n/a" if load is None else f"{load:.2f}"


def _warn_if_busy(when: str, load: float | None) -> bool:
    """Say so when the machine was not quiet; True if it was busy."""
    if load is None or load <= QUIET_LOAD:
        return False
    print(
        f"  WARNING: load average {load:.2f} {when} (> {QUIET_LOAD}): other work shared "
        "the CPUs, so absolute figures are inflated; compare ratios within this run only",
        flush=True,
    )
    return True


def cpu_floor_ns(samples: int = 41, batch: int = 200) -> float:
    """Median ns of orjson-dumping and sha256-hashing the 1 KB payload: how fast this
    machine is right now, so figures from two runs can be set side by side."""
    payload = payload_1kb()
    dumps, sha = orjson.dumps, hashlib.sha256
    out = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            sha(dumps(payload, option=orjson.OPT_SORT_KEYS)).digest()
        out.append((time.perf_counter_ns() - t0) / batch)
    return statistics.median(out)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
