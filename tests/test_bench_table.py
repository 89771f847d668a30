"""The README's performance table is written from one benchmark run, never by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import readme_table  # noqa: E402


def _results(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "when": "2026-12-01T15:20:03+00:00",
        "mode": "full",
        "commit": "abc1234",
        "python": "3.11.7",
        "cpus": 2,
        "load_average_start": 0.21,
        "load_average_end": 0.38,
        "quiet": True,
        "cpu_floor_ns": 1870.0,
        "benchmarks": {
            "capture": {
                "error": None,
                "targets": [
                    {"name": "tool overhead, 1 KB arg (µs)", "value": 6.04, "limit": 10.0,
                     "unit": "µs", "op": "<=", "verdict": "PASS"},
                    {"name": "tool overhead / floor", "value": 3.4, "limit": 3.0,
                     "unit": "x", "op": "<=", "verdict": "MISS"},
                ],
            },
            "ingest": {
                "error": None,
                "targets": [
                    {"name": "end to end", "value": 81234.5, "limit": 50000, "unit": "events/s",
                     "op": ">=", "verdict": "PASS"},
                ],
            },
        },
    }  # fmt: skip
    base.update(over)
    return base


README = (
    "# x\n\nintro\n\n<!-- bench-table:begin -->\nold | table\n<!-- bench-table:end -->\n\nafter\n"
)


def test_table_lists_every_target_with_the_runs_figures() -> None:
    table = readme_table.render(_results())
    assert "2026-12-01 at 15:20 UTC" in table
    assert "commit `abc1234`" in table
    assert "load average 0.21 at the start (0.38 at the end, with its own processes)" in table
    assert "CPU floor 1.87 µs" in table
    assert "| capture | tool overhead, 1 KB arg (µs) | 6.04 µs | ≤ 10 µs | met |" in table
    assert "| capture | tool overhead / floor | 3.4 x | ≤ 3 x | missed |" in table
    assert "| ingest | end to end | 81,234 events/s | ≥ 50,000 events/s | met |" in table


def test_splice_replaces_only_the_marked_section() -> None:
    out = readme_table.splice(README, "NEW")
    assert "old | table" not in out
    assert out.startswith("# x\n\nintro\n\n<!-- bench-table:begin -->\nNEW\n")
    assert out.endswith("<!-- bench-table:end -->\n\nafter\n")


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"mode": "quick"}, "a quick run: the table needs a full run"),
        ({"quiet": False, "load_average_start": 3.2}, "the machine was busy (load average 3.2"),
        ({"benchmarks": {}}, "the results hold no benchmarks"),
        (
            {"benchmarks": {"postgres": {"error": "OperationalError: no server", "targets": []}}},
            "benchmarks that did not run: postgres: OperationalError: no server",
        ),
    ],
    ids=["quick", "busy", "empty", "errors"],
)
def test_results_that_cannot_make_a_table_are_refused_with_the_reason(
    over: dict[str, Any], needle: str
) -> None:
    with pytest.raises(readme_table.TableError) as caught:
        readme_table.render(_results(**over))
    assert needle in str(caught.value)


def test_cli_writes_checks_and_refuses(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    readme = tmp_path / "README.md"
    results.write_text(json.dumps(_results()))
    readme.write_text(README)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(BENCH / "readme_table.py"), *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    check = run(str(results), "--readme", str(readme), "--check")
    assert check.returncode == 1
    assert readme.read_text() == README  # --check never writes
    wrote = run(str(results), "--readme", str(readme))
    assert wrote.returncode == 0, wrote.stderr
    assert "6.04 µs" in readme.read_text()
    assert run(str(results), "--readme", str(readme), "--check").returncode == 0

    readme.write_text("# no markers here\n")
    refused = run(str(results), "--readme", str(readme))
    assert refused.returncode == 2
    assert "has no <!-- bench-table:begin -->" in refused.stderr
    assert readme.read_text() == "# no markers here\n"  # nothing half-written

    missing = run(str(tmp_path / "none.json"), "--readme", str(readme))
    assert missing.returncode == 2
    assert "none.json: no such file (run `make bench` first)" in missing.stderr
