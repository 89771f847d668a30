"""Write the README's performance table from one full ``make bench`` run.

``python bench/readme_table.py [RESULTS] [--readme README.md] [--allow-busy] [--check]``

RESULTS is the JSON that ``bench/run.py`` writes (default
``.replayable/bench-results.json``). The table goes between the markers
``<!-- bench-table:begin -->`` and ``<!-- bench-table:end -->``: one row per
target of every benchmark, with the figure that run measured, its limit and
whether it was met, under a line that says when, on which commit, at what load
and how fast the CPU was. Every figure in it is one run's, so a quiet rerun of
``make bench`` reproduces it; nothing is typed in by hand.

Refused, with the reason: a quick run, a run with a benchmark that did not run
(unless ``--allow-errors``), a run on a busy machine (unless ``--allow-busy``),
a README without the markers. ``--check`` exits 1 when the README's table is
not the one this run would write.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- bench-table:begin -->"
END = "<!-- bench-table:end -->"


class TableError(Exception):
    """The results cannot make a README table; the message says why."""


def render(results: dict[str, Any], *, allow_busy: bool = False, allow_errors: bool = False) -> str:
    """The Markdown between the markers for ``results`` (the JSON of one run)."""
    if results.get("mode") != "full":
        raise TableError(f"a {results.get('mode', 'unknown')} run: the table needs a full run")
    if not results.get("quiet", False) and not allow_busy:
        raise TableError(
            f"the machine was busy (load average {results.get('load_average_start')} at the "
            "start); rerun on a quiet machine or pass --allow-busy"
        )
    benches: dict[str, Any] = results.get("benchmarks") or {}
    if not benches:
        raise TableError("the results hold no benchmarks")
    broken = {name: b["error"] for name, b in benches.items() if b.get("error")}
    if broken and not allow_errors:
        listed = "; ".join(f"{n}: {e}" for n, e in broken.items())
        raise TableError(f"benchmarks that did not run: {listed}")
    floor = results.get("cpu_floor_ns")
    when = str(results.get("when", "?"))
    head = (
        f"One full `make bench` on {when[:10]} at {when[11:16]} UTC, commit "
        f"`{results.get('commit') or '?'}`, Python {results.get('python', '?')}, "
        f"{results.get('cpus', '?')} CPUs; load average {results.get('load_average_start')} "
        f"at the start ({results.get('load_average_end')} at the end, with its own processes)"
        + (f"; CPU floor {floor / 1000:.2f} µs (orjson + sha256 of 1 KB)" if floor else "")
        + ". Written by `bench/readme_table.py`; every ratio is against a baseline "
        "measured in the same run."
    )
    lines = [head, "", "| benchmark | target | measured | limit | |", "|---|---|---|---|---|"]
    for name, bench in benches.items():
        if bench.get("error"):
            lines.append(f"| {name} | did not run | {_cell(bench['error'])} | | ERR |")
            continue
        for t in bench.get("targets", []):
            value = t.get("value")
            shown = "not measured" if value is None else f"{_num(value)} {t.get('unit', '')}"
            limit = f"{t.get('op', '<=')} {_num(t.get('limit'))} {t.get('unit', '')}"
            verdict = {"PASS": "met", "MISS": "missed"}.get(t.get("verdict", ""), "n/a")
            lines.append(
                f"| {name} | {_cell(t.get('name', '?'))} | {shown.strip()} | "
                f"{_cell(limit.replace('<=', '≤').replace('>=', '≥')).strip()} | {verdict} |"
            )
    return "\n".join(lines)


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def splice(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``."""
    start = readme.find(BEGIN)
    end = readme.find(END)
    if start < 0 or end < 0 or end < start:
        raise TableError(f"the README has no {BEGIN} … {END} section")
    return readme[: start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "results", nargs="?", type=Path, default=ROOT / ".replayable" / "bench-results.json"
    )
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--allow-busy", action="store_true", help="accept a run on a busy machine")
    parser.add_argument("--allow-errors", action="store_true", help="list benchmarks that failed")
    parser.add_argument(
        "--check", action="store_true", help="only say whether the table is current"
    )
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        table = render(results, allow_busy=args.allow_busy, allow_errors=args.allow_errors)
        readme = args.readme.read_text()
        updated = splice(readme, table)
    except FileNotFoundError as exc:
        print(
            f"readme_table: {exc.filename}: no such file (run `make bench` first)", file=sys.stderr
        )
        return 2
    except (TableError, json.JSONDecodeError) as exc:
        print(f"readme_table: {args.results}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if updated != readme:
            print(f"readme_table: {args.readme}'s table is not the one {args.results} gives")
            return 1
        return 0
    args.readme.write_text(updated)
    print(f"readme_table: wrote {sum(1 for _ in table.splitlines()) - 4} rows to {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
