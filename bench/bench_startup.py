"""Start-up: what a fresh interpreter pays for ``import replayable``, and a whole script
that records one tool call.

Each sample is a new interpreter (``sys.executable``, the package this benchmark
imports first on its path), timed from ``Popen`` to its exit with
``time.perf_counter``; its CPU time (user + system, its own children included) comes
from ``os.wait4``. The cases run in turn, round after round, so that a burst of noise
on the machine lands on all of them:

- *bare*: ``python -c pass``, the interpreter's own start-up;
- *import*: ``python -c "import replayable"``;
- *one call*: a script that imports replayable, records one ``@tool`` call inside a
  ``@workflow`` into the default SQLite store (``./.replayable/runs.db`` in a
  temporary directory) and exits, which waits for the writer process to store the
  run. One untimed run first creates the database, as a script run a second time
  finds it, and the modules' bytecode (cached under the temporary directory, as an
  installed package has it, whatever ``PYTHONDONTWRITEBYTECODE`` says).

The import figure is the median of the per-round differences *import - bare*
(the interpreter's own start-up cancels); beside it, the cumulative time
``python -X importtime`` gives the ``replayable`` line (median of the rounds). The
one-call figure is the script's whole wall time, interpreter start-up included:
what a user waits for. The modules ``import replayable`` loads are listed, and the
heavy ones that only some commands need (pyarrow, cryptography, psycopg, zstandard)
must not be among them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import replayable
from harness import Config, Section, Target, temp_dir

TARGET_IMPORT_MS = 15.0
TARGET_ONE_CALL_S = 0.3
#: Imported by some commands only; ``import replayable`` must leave them unloaded.
HEAVY = ("pyarrow", "cryptography", "psycopg", "zstandard")

ONE_CALL = textwrap.dedent(
    """\
    import replayable


    @replayable.tool
    def add(a: int, b: int) -> int:
        return a + b


    @replayable.workflow("bench.startup")
    def agent() -> int:
        return add(1, 2)


    with replayable.recording():
        agent()
    """
)

LOADED = (
    "import sys; before = set(sys.modules); import replayable; "
    "print('\\n'.join(sorted(set(sys.modules) - before)))"
)


def _env(tmp: Path) -> dict[str, str]:
    """The environment of each child: this benchmark's replayable first on its path, and
    bytecode cached (in ``tmp``, not beside the sources) as an installed package has it:
    without it (``PYTHONDONTWRITEBYTECODE``) every start compiles every module again."""
    src = str(Path(replayable.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=src if not path else src + os.pathsep + path)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def _timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child process, from its start to its exit."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args[1:])[:60]}: exit status {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def _importtime_ms(cwd: Path, env: dict[str, str]) -> float:
    """The cumulative time ``-X importtime`` reports for the top-level ``replayable``."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import replayable"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].rstrip() == " replayable":
            return int(parts[1]) / 1000
    raise RuntimeError("python -X importtime printed no line for replayable")


def run(cfg: Config) -> Section:
    sec = Section("startup", "startup: import replayable, and a script recording one tool call")
    rounds = cfg.pick(21, 7)
    py = sys.executable
    with temp_dir("startup") as tmp:
        env = _env(tmp)
        script = tmp / "one_call.py"
        script.write_text(ONE_CALL)
        cases = {
            "bare": [py, "-c", "pass"],
            "import": [py, "-c", "import replayable"],
            "one_call": [py, str(script)],
        }
        # Untimed: creates ./.replayable/runs.db and fills the bytecode cache.
        _timed(cases["one_call"], tmp, env)
        wall: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        importtime: list[float] = []
        for _ in range(rounds):
            for name, args in cases.items():
                w, c = _timed(args, tmp, env)
                wall[name].append(w)
                cpu[name].append(c)
            importtime.append(_importtime_ms(tmp, env))

        from replayable.store.sqlite import SQLiteStore

        store = SQLiteStore(tmp / ".replayable" / "runs.db")
        try:
            stored = sum(1 for r in store.list_runs() if r.workflow == "bench.startup")
        finally:
            store.close()
        if stored != rounds + 1:
            raise RuntimeError(f"the one-call script stored {stored} runs of {rounds + 1}")

        loaded = subprocess.run(
            [py, "-c", LOADED], cwd=tmp, env=env, capture_output=True, text=True, check=True
        ).stdout.split()

    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    import_ms = (
        statistics.median(i - b for i, b in zip(wall["import"], wall["bare"], strict=True)) * 1000
    )
    import_cpu_ms = (
        statistics.median(i - b for i, b in zip(cpu["import"], cpu["bare"], strict=True)) * 1000
    )
    one_call_s = med["one_call"]
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    ours = [m for m in loaded if m.split(".")[0] == "replayable"]

    sec.row(
        "python -c pass",
        f"{med['bare'] * 1000:,.1f} ms",
        f"CPU {med_cpu['bare'] * 1000:.1f} ms (the interpreter's own start-up)",
    )
    sec.row(
        "import replayable",
        f"{import_ms:,.1f} ms",
        f"median of paired (import - pass); CPU {import_cpu_ms:.1f} ms; "
        f"-X importtime {statistics.median(importtime):.1f} ms",
    )
    sec.row(
        "  modules it loads",
        f"{len(loaded)}",
        f"{len(ours)} of replayable ({', '.join(ours)}); heavy: {', '.join(heavy) or 'none'}",
    )
    sec.row(
        "one-call script",
        f"{one_call_s * 1000:,.0f} ms",
        f"CPU {med_cpu['one_call'] * 1000:.0f} ms (its writer process included); "
        f"{one_call_s / med['bare']:.1f}x python -c pass",
    )
    sec.targets.append(
        Target("import replayable (over python -c pass)", import_ms, TARGET_IMPORT_MS, "ms")
    )
    sec.targets.append(Target("heavy modules import replayable loads", len(heavy), 0, "modules"))
    sec.targets.append(Target("script recording one tool call", one_call_s, TARGET_ONE_CALL_S, "s"))
    sec.notes.append(f"median of {rounds} rounds, each a fresh interpreter per case, in turn")
    sec.data = {
        "rounds": rounds,
        "wall_s": wall,
        "cpu_s": cpu,
        "importtime_ms": importtime,
        "import_ms": import_ms,
        "import_cpu_ms": import_cpu_ms,
        "one_call_s": one_call_s,
        "loaded": loaded,
        "heavy": heavy,
    }
    return sec


if __name__ == "__main__":
    from harness import format_section

    print(format_section(run(Config())))
