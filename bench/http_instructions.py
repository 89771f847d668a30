"""The HTTP seam's own cost in instructions, which no load on the machine can move.

Runs the SDK call of ``bench_http.py`` against the provider answering from memory
(no socket, no provider process) under ``valgrind --tool=callgrind``, twice: ``N``
calls inside a recorded run, then ``N`` calls outside it (the patched transport
passes straight through). Instructions are counted only inside the timed loop
(collection is toggled on a ``functools.reduce`` wrapped around it), in every
thread of the agent's process; the writer process is not traced. The difference
per call is what the seam executes, the hand-off to the writer included.

Slow (a few minutes: the interpreter's start-up and imports run under valgrind
too); not part of ``run.py``. ``python bench/http_instructions.py [N]``
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _agent(mode: str, n: int) -> None:
    """Inside valgrind: ``n`` canned calls, recorded (``seam``) or not (``plain``)."""
    sys.path.insert(0, str(HERE))
    import bench_http as bench
    import replayable
    from harness import temp_dir, warm_writer
    from replayable.store.sqlite import SQLiteStore

    @replayable.workflow("bench.http.instructions")
    def agent() -> int:
        with bench._canned_client() as client:
            for _ in range(20):  # both paths warm, every cache filled
                bench._call(client)
                with bench._outside_run():
                    bench._call(client)

            def loop(_a: int, _b: int) -> int:
                if mode == "seam":
                    for _ in range(n):
                        bench._call(client)
                else:
                    with bench._outside_run():
                        for _ in range(n):
                            bench._call(client)
                return 0

            return functools.reduce(loop, [0, 1])

    with temp_dir("http-instructions") as tmp:
        warm_writer(tmp)
        store = SQLiteStore(tmp / "http.db")
        try:
            with replayable.recording(store):
                agent()
        finally:
            store.close()


def _count(mode: str, n: int, folder: Path) -> int:
    out = folder / f"callgrind.{mode}.out"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--inside",
            mode,
            str(n),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")},
    )
    found = re.search(r"^totals:\s*(\d+)", out.read_text(), re.M)
    if found is None:
        raise SystemExit(f"no totals in {out}")
    return int(found.group(1))


def main(n: int) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory(prefix="replayable-callgrind-") as tmp:
        seam = _count("seam", n, Path(tmp))
        plain = _count("plain", n, Path(tmp))
    print(f"recorded call: {seam / n:,.0f} instructions")
    print(f"plain call:    {plain / n:,.0f} instructions")
    print(f"seam per call: {(seam - plain) / n:,.0f} instructions ({seam / plain - 1:+.2%})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        _agent(sys.argv[2], int(sys.argv[3]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
