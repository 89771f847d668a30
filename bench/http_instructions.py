"""The HTTP seam's own cost in instructions, which no load on the machine can move.

Runs the SDK call of ``bench_http.py`` against the provider answering from memory
(no socket, no provider process) under ``valgrind --tool=callgrind``, twice: ``N``
calls inside a recorded run, then ``N`` calls outside it (the patched transport
passes straight through). Instructions are counted only inside the timed loop
(collection is toggled on a ``functools.reduce`` wrapped around it), in every
thread of the agent's process; the writer process is not traced. The difference
per call is what the seam executes, the hand-off to the writer included.

``--stream`` does the same with ``N`` 500-chunk streams and reports per chunk.
Slow (a few minutes: the interpreter's start-up and imports run under valgrind
too); not part of ``run.py``. ``python bench/http_instructions.py [--stream] [N]``
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


def _agent(mode: str, n: int, stream: bool) -> None:
    """Inside valgrind: ``n`` canned calls (or streams), recorded (``seam``) or not (``plain``)."""
    sys.path.insert(0, str(HERE))
    import bench_http as bench
    import replayable
    from harness import temp_dir, warm_writer
    from replayable.store.sqlite import SQLiteStore

    call = bench._stream if stream else bench._call

    @replayable.workflow("bench.http.instructions")
    def agent() -> int:
        with bench._canned_client() as client:
            for _ in range(3 if stream else 20):  # both paths warm, every cache filled
                call(client)
                with bench._outside_run():
                    call(client)

            def loop(_a: int, _b: int) -> int:
                if mode == "seam":
                    for _ in range(n):
                        call(client)
                else:
                    with bench._outside_run():
                        for _ in range(n):
                            call(client)
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


def _count(mode: str, n: int, stream: bool, folder: Path) -> int:
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
            *(["--stream"] if stream else []),
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


def main(n: int, stream: bool) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory(prefix="replayable-callgrind-") as tmp:
        seam = _count("seam", n, stream, Path(tmp))
        plain = _count("plain", n, stream, Path(tmp))
    unit, per = ("stream", n) if stream else ("call", n)
    print(f"recorded {unit}: {seam / per:,.0f} instructions")
    print(f"plain {unit}:    {plain / per:,.0f} instructions")
    print(f"seam per {unit}: {(seam - plain) / per:,.0f} instructions ({seam / plain - 1:+.2%})")
    if stream:
        print(f"seam per chunk: {(seam - plain) / per / bench_chunks():,.0f} instructions")


def bench_chunks() -> int:
    sys.path.insert(0, str(HERE))
    import bench_http

    return bench_http.CHUNKS


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--stream"]
    stream = "--stream" in sys.argv[1:]
    if args[:1] == ["--inside"]:
        _agent(args[1], int(args[2]), stream)
    else:
        main(int(args[0]) if args else (4 if stream else 100), stream)
