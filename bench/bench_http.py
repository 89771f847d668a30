"""HTTP-seam overhead: the same OpenAI SDK call with and without the recording transport.

A fake provider runs in a child process on 127.0.0.1 (so its work does not
share this process's interpreter lock). In one run, batches alternate
between a plain call (no run active: the patched transport passes straight
through) and the same call inside a recorded run (the seam records it), in
pairs whose order alternates. Each batch is timed twice: in CPU time of the
agent's thread (``time.thread_time_ns``) and on the wall clock. The figure
judged is the median of the paired CPU differences (each recorded batch
against the plain batch beside it):

- a non-streaming chat completion, per call (target <= 20 µs);
- a 500-chunk streamed chat completion, per chunk (target <= 1 µs);
- a replay of recorded calls against the live local call (replay must be faster).

The SDK call itself takes ~1.3 ms (the provider's work, two sockets, the
SDK's request building and parsing) and its wall time swings by more than the
seam costs, from one batch to the next, with whatever else the two cores run:
the wall-clock differences are printed beside the CPU ones, with the spread of
both (the quartiles of the paired differences and a bootstrap 90% interval of
their median), but they are not what is judged. The CPU time holds the
seam's own work and whatever slowdown the writer process causes the agent's
thread by sharing the cores with it, not time spent waiting.

The same pairs are then measured with the provider replaced by a canned
response inside this process (the transport's connection pool answers from
memory): no socket, no provider process, so what remains of the difference is
the seam and the writer's work beside it.

Run alone: ``python bench/bench_http.py [--quick]``.
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent

import httpx2  # noqa: E402
import openai  # noqa: E402
import orjson  # noqa: E402

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

TARGET_CALL_US = 20.0
TARGET_CHUNK_US = 1.0
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


# -- a provider answering from memory ------------------------------------------------


def _canned_bodies() -> tuple[bytes, list[bytes]]:
    """The fake provider's chat completion and its 500-chunk stream, as bytes."""
    base = {"id": "chatcmpl-1", "created": 1700000000, "model": "fake-1"}
    answer = {
        **base,
        "object": "chat.completion",
        "usage": {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21},
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Answer: what is the weather"},
                "finish_reason": "stop",
            }
        ],
    }
    chunk = {**base, "object": "chat.completion.chunk"}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(data) + b"\n\n"

    events = [event({"role": "assistant"})]
    events += [event({"content": f"w{i} "}) for i in range(CHUNKS)]
    events += [event({}, "stop"), b"data: [DONE]\n\n"]
    return orjson.dumps(answer), events


class _CannedPool:
    """Stands in for an ``httpx2`` transport's connection pool: reads the request body
    and answers from memory, a stream chunk by chunk."""

    def __init__(self) -> None:
        self.body, self.events = _canned_bodies()

    def handle_request(self, request: Any) -> Any:
        import httpcore2

        if orjson.loads(b"".join(request.stream)).get("stream"):
            headers = [(b"content-type", b"text/event-stream")]
            return httpcore2.Response(200, headers=headers, content=iter(self.events))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
            (b"x-request-id", b"req-1"),
        ]
        return httpcore2.Response(200, headers=headers, content=self.body)

    def close(self) -> None:
        pass


def _canned_client() -> openai.OpenAI:
    transport = httpx2.HTTPTransport()
    transport._pool = _CannedPool()  # type: ignore[assignment]
    http = httpx2.Client(transport=transport)
    return openai.OpenAI(
        base_url="http://canned.invalid/v1", api_key=KEY, max_retries=0, http_client=http
    )


# -- paired batches --------------------------------------------------------------------


def _alternate(
    client: openai.OpenAI, fn: Callable[[openai.OpenAI], None], batch: int, pairs: int
) -> dict[str, list[float]]:
    """Per-call ns of ``fn`` outside a run and inside it, in pairs of batches whose order
    alternates: the agent thread's CPU (``plain_cpu``, ``seam_cpu``) and the wall
    clock (``plain``, ``seam``); index ``i`` of each list is pair ``i``."""
    cpu, clock = time.thread_time_ns, time.perf_counter_ns
    out: dict[str, list[float]] = {"plain": [], "seam": [], "plain_cpu": [], "seam_cpu": []}
    for i in range(pairs):
        if i % 16 == 0:
            gc.collect()
        for mode in (0, 1) if i % 2 else (1, 0):
            if mode == 0:
                with _outside_run():
                    c0, t0 = cpu(), clock()
                    for _ in range(batch):
                        fn(client)
                    t1, c1 = clock(), cpu()
                out["plain"].append((t1 - t0) / batch)
                out["plain_cpu"].append((c1 - c0) / batch)
            else:
                c0, t0 = cpu(), clock()
                for _ in range(batch):
                    fn(client)
                t1, c1 = clock(), cpu()
                out["seam"].append((t1 - t0) / batch)
                out["seam_cpu"].append((c1 - c0) / batch)
    return out


def _measure(
    client: openai.OpenAI, batch: int, pairs: int, stream_pairs: int
) -> dict[str, list[float]]:
    for _ in range(20):  # warm the connection pool and both code paths
        _call(client)
        with _outside_run():
            _call(client)
    _stream(client)
    with _outside_run():
        _stream(client)
    calls = _alternate(client, _call, batch, pairs)
    streams = _alternate(client, _stream, 1, stream_pairs)
    return {
        **{f"call_{k}": v for k, v in calls.items()},
        **{f"stream_{k}": v for k, v in streams.items()},
    }


@replayable.workflow("bench.http")
def http_agent(base_url: str, batch: int, pairs: int, stream_pairs: int) -> dict[str, Any]:
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        return _measure(client, batch, pairs, stream_pairs)


@replayable.workflow("bench.http.canned")
def canned_agent(batch: int, pairs: int, stream_pairs: int) -> dict[str, Any]:
    with _canned_client() as client:
        return _measure(client, batch, pairs, stream_pairs)


@replayable.workflow("bench.http.replay")
def replay_agent(base_url: str, n: int) -> int:
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        for _ in range(n):
            _call(client)
    return n


class Paired:
    """The paired differences of recorded minus plain batches (ns per call), with their
    median, quartiles and a bootstrap 90% interval of the median."""

    def __init__(self, seam: list[float], plain: list[float], per: int = 1) -> None:
        self.diffs = [(s - p) / per for s, p in zip(seam, plain, strict=True)]
        self.median = statistics.median(self.diffs)
        q = statistics.quantiles(self.diffs, n=4)
        self.q1, self.q3 = q[0], q[2]
        rng = random.Random(0)  # the same resamples every run
        n = len(self.diffs)
        medians = sorted(statistics.median(rng.choices(self.diffs, k=n)) for _ in range(1000))
        self.low, self.high = medians[50], medians[949]

    def detail(self) -> str:
        return f"90% CI {us(self.low)} to {us(self.high)}; quartiles {us(self.q1)}, {us(self.q3)}"

    def as_dict(self) -> dict[str, float]:
        return {
            "median": self.median,
            "ci90_low": self.low,
            "ci90_high": self.high,
            "q1": self.q1,
            "q3": self.q3,
        }


def run(cfg: Config) -> Section:
    sec = Section("http", "http: OpenAI SDK through the HTTP seam vs the same call without it")
    batch = cfg.pick(5, 5)
    pairs = cfg.pick(240, 40)
    stream_pairs = cfg.pick(40, 8)
    replay_n = cfg.pick(500, 100)
    started = time.perf_counter()
    with temp_dir("http") as tmp, _server() as base_url:
        warm_writer(tmp)
        store = SQLiteStore(tmp / "http.db")
        try:
            with replayable.recording(store):
                raw = http_agent(base_url, batch, pairs, stream_pairs)
            with replayable.recording(store):
                canned = canned_agent(batch, pairs, stream_pairs)
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
    call_cpu = Paired(raw["call_seam_cpu"], raw["call_plain_cpu"])
    call_wall = Paired(raw["call_seam"], raw["call_plain"])
    chunk_cpu = Paired(raw["stream_seam_cpu"], raw["stream_plain_cpu"], CHUNKS)
    chunk_wall = Paired(raw["stream_seam"], raw["stream_plain"], CHUNKS)
    canned_call = Paired(canned["call_seam_cpu"], canned["call_plain_cpu"])
    canned_chunk = Paired(canned["stream_seam_cpu"], canned["stream_plain_cpu"], CHUNKS)
    replay_call = med(replays)

    sec.row("chat call, plain", us(call_plain), f"wall, median of {pairs} batches of {batch}")
    sec.row("  agent-thread CPU of it", us(med(raw["call_plain_cpu"])), "thread time")
    sec.row("seam per call, CPU (judged)", us(call_cpu.median), call_cpu.detail())
    sec.row("seam per call, wall", us(call_wall.median), call_wall.detail())
    sec.row(f"{CHUNKS}-chunk stream, plain", us(stream_plain), f"wall, median of {stream_pairs}")
    sec.row("  agent-thread CPU of it", us(med(raw["stream_plain_cpu"])), "thread time")
    sec.row("seam per chunk, CPU (judged)", us(chunk_cpu.median), chunk_cpu.detail())
    sec.row("seam per chunk, wall", us(chunk_wall.median), chunk_wall.detail())
    sec.row(
        "canned provider: chat call, plain",
        us(med(canned["call_plain_cpu"])),
        "CPU; no socket, no provider process",
    )
    sec.row("canned provider: seam per call, CPU", us(canned_call.median), canned_call.detail())
    sec.row("canned provider: seam per chunk, CPU", us(canned_chunk.median), canned_chunk.detail())
    sec.row(
        "replayed call",
        us(replay_call),
        f"{call_plain / replay_call:.1f}x faster than the live local call",
    )
    sec.notes.append(
        "judged: the median of paired differences (recorded batch minus the plain batch "
        "beside it) in the agent thread's CPU time; the wall-clock figures are the same "
        "pairs' and swing with the load"
    )
    sec.targets += [
        Target("seam CPU per non-streaming call", call_cpu.median / 1000, TARGET_CALL_US, "µs"),
        Target("seam CPU per streamed chunk", chunk_cpu.median / 1000, TARGET_CHUNK_US, "µs"),
        Target("replayed call / live call", replay_call / call_plain, 1.0, "ratio"),
    ]
    sec.data = {
        "call_plain_ns": call_plain,
        "call_seam_ns": call_seam,
        "call_plain_cpu_ns": med(raw["call_plain_cpu"]),
        "call_overhead_cpu_ns": call_cpu.median,
        "call_overhead_cpu": call_cpu.as_dict(),
        "call_overhead_wall": call_wall.as_dict(),
        "stream_plain_ns": stream_plain,
        "stream_seam_ns": stream_seam,
        "chunk_overhead_cpu_ns": chunk_cpu.median,
        "chunk_overhead_cpu": chunk_cpu.as_dict(),
        "chunk_overhead_wall": chunk_wall.as_dict(),
        "canned_call_overhead_cpu": canned_call.as_dict(),
        "canned_chunk_overhead_cpu": canned_chunk.as_dict(),
        "replay_call_ns": replay_call,
        "chunks": CHUNKS,
        "batch": batch,
        "pairs": pairs,
        "stream_pairs": stream_pairs,
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
