"""HTTP-seam overhead: the same OpenAI SDK call with and without the recording transport.

A fake provider runs in a child process on 127.0.0.1 (so its work does not
share this process's interpreter lock). In one run, batches alternate
between a plain call (no run active: the patched transport passes straight
through) and the same call inside a recorded run (the seam records it).
Overhead is the difference of the per-call medians:

- a non-streaming chat completion, per call (target <= 50 µs);
- a 500-chunk streamed chat completion, per chunk (target <= 2 µs);
- a replay of recorded calls against the live local call (replay must be faster).

Alongside the wall-clock overheads, the same batches are timed in CPU time of
the agent's thread (``time.thread_time_ns``): the extra CPU that thread spends
with the seam (its own work, plus whatever slowdown the writer process and the
fake provider cause it by sharing the cores), as opposed to time spent waiting.

Run alone: ``python bench/bench_http.py [--quick]``.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent

import openai  # noqa: E402

import replayable  # noqa: E402
from harness import (  # noqa: E402
    Config,
    Section,
    Target,
    format_section,
    temp_dir,
    us,
    warm_writer,
)
from replayable.capture.context import _STATE  # noqa: E402
from replayable.store.sqlite import SQLiteStore  # noqa: E402

TARGET_CALL_US = 50.0
TARGET_CHUNK_US = 2.0
CHUNKS = 500
KEY = "sk-bench-abcdefghijklmnopqrstuvwxyz0123"
MESSAGES: list[Any] = [{"role": "user", "content": "what is the weather in Paris today?"}]


@contextlib.contextmanager
def _server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "integrations" / "servers.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def _outside_run() -> Iterator[None]:
    token = _STATE.set(None)
    try:
        yield
    finally:
        _STATE.reset(token)


def _call(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="fake-1", messages=MESSAGES, temperature=0.0)


def _stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=f"chunks-{CHUNKS}", messages=MESSAGES, stream=True
    )
    n = sum(1 for _ in stream)
    assert n >= CHUNKS


def _alternate(
    client: openai.OpenAI, fn: Callable[[openai.OpenAI], None], batch: int, samples: int
) -> dict[str, list[float]]:
    """Per-call ns of ``fn`` outside a run and inside it, in alternating batches:
    wall clock (``plain``, ``seam``) and the agent thread's CPU (``plain_cpu``, ``seam_cpu``)."""
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    out: dict[str, list[float]] = {"plain": [], "seam": [], "plain_cpu": [], "seam_cpu": []}
    for i in range(samples):
        for mode in (0, 1) if i % 2 else (1, 0):
            gc.collect()
            if mode == 0:
                with _outside_run():
                    c0, t0 = cpu(), clock()
                    for _ in range(batch):
                        fn(client)
                    out["plain"].append((clock() - t0) / batch)
                    out["plain_cpu"].append((cpu() - c0) / batch)
            else:
                c0, t0 = cpu(), clock()
                for _ in range(batch):
                    fn(client)
                out["seam"].append((clock() - t0) / batch)
                out["seam_cpu"].append((cpu() - c0) / batch)
    return out


@replayable.workflow("bench.http")
def http_agent(base_url: str, batch: int, samples: int, stream_samples: int) -> dict[str, Any]:
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        for _ in range(20):  # warm the connection pool and both code paths
            _call(client)
            with _outside_run():
                _call(client)
        calls = _alternate(client, _call, batch, samples)
        streams = _alternate(client, _stream, 1, stream_samples)
    return {
        **{f"call_{k}": v for k, v in calls.items()},
        **{f"stream_{k}": v for k, v in streams.items()},
    }


@replayable.workflow("bench.http.replay")
def replay_agent(base_url: str, n: int) -> int:
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        for _ in range(n):
            _call(client)
    return n


def _paired(seam: list[float], plain: list[float]) -> float:
    """Median of the differences between each recorded batch and the plain batch
    beside it (the two of a pair ran back to back, so slow drift cancels)."""
    return statistics.median(s - p for s, p in zip(seam, plain, strict=True))


def run(cfg: Config) -> Section:
    sec = Section("http", "http: OpenAI SDK through the HTTP seam vs the same call without it")
    batch = cfg.pick(20, 10)
    samples = cfg.pick(60, 12)
    stream_samples = cfg.pick(30, 6)
    replay_n = cfg.pick(500, 100)
    started = time.perf_counter()
    with temp_dir("http") as tmp, _server() as base_url:
        warm_writer(tmp)
        store = SQLiteStore(tmp / "http.db")
        try:
            with replayable.recording(store):
                raw = http_agent(base_url, batch, samples, stream_samples)
            with replayable.recording(store) as rec:
                replay_agent(base_url, replay_n)
            replays = []
            for _ in range(cfg.pick(5, 2)):
                gc.collect()
                result = replayable.replay(rec.run_ids[0], store=store, fn=replay_agent)
                assert result.status == "identical", result.divergence
                replays.append(result.duration_s * 1e9 / replay_n)
        finally:
            store.close()

    med = statistics.median
    call_plain, call_seam = med(raw["call_plain"]), med(raw["call_seam"])
    stream_plain, stream_seam = med(raw["stream_plain"]), med(raw["stream_seam"])
    call_over = call_seam - call_plain
    chunk_over = (stream_seam - stream_plain) / CHUNKS
    call_paired = _paired(raw["call_seam"], raw["call_plain"])
    chunk_paired = _paired(raw["stream_seam"], raw["stream_plain"]) / CHUNKS
    call_cpu = med(raw["call_seam_cpu"]) - med(raw["call_plain_cpu"])
    chunk_cpu = (med(raw["stream_seam_cpu"]) - med(raw["stream_plain_cpu"])) / CHUNKS
    replay_call = med(replays)

    sec.row("chat call, plain", us(call_plain), f"median of {samples} batches of {batch}")
    sec.row("chat call, recorded", us(call_seam), f"ratio {call_seam / call_plain:.3f}")
    sec.row("seam overhead per call", us(call_over), f"paired {us(call_paired)}")
    sec.row("  agent-thread CPU of it", us(call_cpu), "thread time, same batches")
    sec.row(f"{CHUNKS}-chunk stream, plain", us(stream_plain), f"median of {stream_samples}")
    sec.row(
        f"{CHUNKS}-chunk stream, recorded",
        us(stream_seam),
        f"ratio {stream_seam / stream_plain:.3f}",
    )
    sec.row("seam overhead per chunk", us(chunk_over), f"paired {us(chunk_paired)}")
    sec.row("  agent-thread CPU of it", us(chunk_cpu), "thread time, same batches")
    sec.row(
        "replayed call",
        us(replay_call),
        f"{call_plain / replay_call:.1f}x faster than the live local call",
    )
    sec.targets += [
        Target("overhead per non-streaming call", call_over / 1000, TARGET_CALL_US, "µs"),
        Target("overhead per streamed chunk", chunk_over / 1000, TARGET_CHUNK_US, "µs"),
        Target("replayed call / live call", replay_call / call_plain, 1.0, "ratio"),
    ]
    sec.data = {
        "call_plain_ns": call_plain,
        "call_seam_ns": call_seam,
        "call_overhead_ns": call_over,
        "stream_plain_ns": stream_plain,
        "stream_seam_ns": stream_seam,
        "chunk_overhead_ns": chunk_over,
        "call_overhead_cpu_ns": call_cpu,
        "chunk_overhead_cpu_ns": chunk_cpu,
        "replay_call_ns": replay_call,
        "chunks": CHUNKS,
    }
    sec.seconds = time.perf_counter() - started
    return sec


def main(quick: bool = False) -> Section:
    """Run the benchmark, print its table and return it."""
    sec = run(Config(quick=quick))
    print(format_section(sec))
    return sec


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
