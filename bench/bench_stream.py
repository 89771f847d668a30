"""Ingest through NATS JetStream: publish rate, compactor throughput, end-to-end latency.

Needs NATS with JetStream (``$REPLAYABLE_BENCH_NATS``, default 127.0.0.1:4222) and
PostgreSQL (``$REPLAYABLE_BENCH_PG``); every run works in fresh streams and schemas
it deletes afterwards. Runnable alone: ``python bench/bench_stream.py [--quick]``.

(a) One agent process recording into ``nats://…`` (buffered, through the writer
process) until every record is acknowledged by JetStream, as a ratio to a raw
nats-py ``publish_async`` of the very same record bodies, subjects and keys, one
message a record, waiting for every ack, measured in the same run. The store
publishes a batch's records of a run as one frame: the raw client publishing the
very frames the store published (the same messages, byte for byte) is shown
beside it; that ratio sets the agent's recording (capture, the writer process)
against nothing but the frames' publish.
(b) One compactor moving a backlog of writer-built events from the stream into
PostgreSQL, as a ratio to ``PostgresStore.append`` of the same events in the same
batches (the store's own ingest, buffered). The stream holds the events as the
writer publishes them: each batch of the writer's size as frames (cut to the
server's message size). The compactor runs as a user gets it: its default fetches
(2,048 messages, 4 MiB) and durable commits, since it acknowledges a record only
once the sink has it on disk. Each side's CPU seconds
per event are reported too. Then two compactor processes on one backlog of the
same size, reported as a scaling factor.
(c) End to end: a durable boundary returns, a compactor process is running; the time
until the event is queryable in PostgreSQL, p50 and p99.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import multiprocessing.queues
import os
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replayable
from bench_ingest import batches, record, writer_batch_size
from bench_postgres import append_rate, fresh, schemas, store_url
from harness import Config, Section, Target, rate, temp_dir, warm_writer
from replayable.archive.stream import FETCH_BYTES, Compactor
from replayable.capture.writer import writer_for
from replayable.events.model import Event, RunStart
from replayable.store import MemoryStore, open_store
from replayable.store.postgres import PostgresStore
from replayable.store.stream import parse_stream_url
from replayable.store.stream._wire import encode, message_id, records

NATS = os.environ.get("REPLAYABLE_BENCH_NATS", "127.0.0.1:4222")
TARGET_PUBLISH_RATIO = 0.8
TARGET_COMPACT_RATIO = 0.8


def _url(stream: str, sink: str) -> str:
    return f"nats://{NATS}?stream={stream}&sink={sink}"


async def _delete(names: Sequence[str]) -> None:
    import nats

    nc = await nats.connect(f"nats://{NATS}", connect_timeout=2)
    try:
        js = nc.jetstream()
        for name in names:
            for call, arg in (
                (js.delete_stream, name),
                (js.delete_key_value, f"{name}_compactors"),
            ):
                try:
                    await call(arg)
                except Exception:
                    pass
    finally:
        await nc.close()


def raw_publish_rate(stream: str, messages: Sequence[tuple[str, str, bytes]]) -> float:
    """Messages/s of nats-py ``publish_async`` of ``messages``, waiting for every ack."""

    async def go() -> float:
        import nats
        from nats.js.api import RetentionPolicy, StreamConfig

        nc = await nats.connect(f"nats://{NATS}")
        try:
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(
                    name=stream, subjects=[f"{stream}.>"], retention=RetentionPolicy.WORK_QUEUE
                )
            )
            prefix = stream + "."
            gc.collect()
            t0 = time.perf_counter()
            futures = [
                await js.publish_async(
                    prefix + subject, body, stream=stream, headers={"Nats-Msg-Id": mid}
                )
                for subject, mid, body in messages
            ]
            await asyncio.gather(*futures)
            return len(messages) / (time.perf_counter() - t0)
        finally:
            await nc.close()

    return asyncio.run(go())


def published(url: str) -> list[tuple[str, str, bytes]]:
    """What the stream holds: (subject without its prefix, message id, body) each."""
    cfg = parse_stream_url(url)[0]

    async def go() -> list[tuple[str, str, bytes]]:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig

        nc = await nats.connect(cfg.server)
        try:
            js = nc.jetstream()
            info = await js.stream_info(cfg.stream)
            sub = await js.pull_subscribe(
                f"{cfg.prefix}.>",
                durable="bench_reader",
                stream=cfg.stream,
                config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1),
            )
            out: list[tuple[str, str, bytes]] = []
            while len(out) < info.state.messages:
                for msg in await sub.fetch(4096, timeout=5):
                    subject = msg.subject[len(cfg.prefix) + 1 :]
                    out.append((subject, msg.headers["Nats-Msg-Id"], msg.data))
            return out
        finally:
            await nc.close()

    return asyncio.run(go())


def one_a_record(messages: Sequence[tuple[str, str, bytes]]) -> list[tuple[str, str, bytes]]:
    """The records of ``messages`` (frames) one a message, each with its key as the id: the
    same record bodies in the form a client publishing record by record sends."""
    return [
        (subject, message_id(kind, record), encode(kind, record))
        for subject, _, body in messages
        for kind, record in records(body)
    ]


def publish_rate(stream: str, sink: str, n: int) -> tuple[float, list[tuple[str, str, bytes]]]:
    """Events/s of one agent recording ``n`` calls into the stream, until all acked;
    and the messages it published (subject without the prefix, id, body)."""
    url = _url(stream, sink)
    store = open_store(url)
    try:
        _, calls_s, flush_s = record(store, n)
        # A batch JetStream did not acknowledge in time went to the spool: the figure
        # counts until it is drained into the stream too.
        t0 = time.perf_counter()
        if not writer_for(store).drain(timeout=120):
            raise AssertionError("the spool did not drain into the stream")
        flush_s += time.perf_counter() - t0
    finally:
        store.close()
    messages = published(url)
    held = sum(len(records(body)) for _, _, body in messages)
    assert held >= n, f"{held} of {n} records were published"
    return n / (calls_s + flush_s), messages


def fill(stream: str, sink: str, start: RunStart, chunks: Sequence[Sequence[Event]]) -> int:
    """Publish the events (and their run's start) to a fresh stream."""
    store = open_store(_url(stream, sink))
    try:
        for i, chunk in enumerate(chunks):
            store.append([start] if i == 0 else [], chunk, [])
    finally:
        store.close()
    return sum(len(c) for c in chunks)


def _compact(
    url: str, batch: int, out: multiprocessing.queues.Queue[tuple[float, float, int, float]]
) -> None:
    cpu = time.process_time()
    # The compactor as a user gets it: durable commits (acknowledged only once on disk).
    report = Compactor(url, batch=batch).run(until_idle=1.0)
    cpu = time.process_time() - cpu
    out.put((report.first_batch_at or 0.0, report.last_commit_at or 0.0, report.records, cpu))


def compact_rate(url: str, n: int, processes: int, batch: int) -> tuple[float, float]:
    """Events/s of ``processes`` compactor processes emptying a backlog of ``n`` events:
    from the first batch any of them took to the last commit (connecting and making
    the consumer are not counted); and their CPU seconds per event (all of their run,
    connecting and the idle second at the end included)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    gc.collect()
    procs = [ctx.Process(target=_compact, args=(url, batch, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert sum(r[2] for r in reports) >= n, f"{sum(r[2] for r in reports)} of {n} compacted"
    first = min(r[0] for r in reports if r[2])
    last = max(r[1] for r in reports)
    return n / (last - first), sum(r[3] for r in reports) / n


@replayable.tool
def durable_step(i: int) -> int:
    return i


def latencies(stream: str, sink: str, samples: int) -> list[float]:
    """Seconds from a durable boundary's return until its event is queryable in the sink."""
    url = _url(stream, sink)
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=lambda: Compactor(url, batch=512).run(max_seconds=300))
    store = open_store(url)
    reader = PostgresStore(sink)
    out: list[float] = []
    try:
        proc.start()
        with replayable.recording(store, durability="durable") as rec:

            @replayable.workflow
            def probe(n: int) -> None:
                run_id = rec.run_ids[0]
                for i in range(n):
                    durable_step(i)
                    t0 = time.perf_counter()
                    while not reader.query(
                        "SELECT 1 FROM agent_execution_events WHERE run_id = %s AND sequence = %s",
                        (run_id, i + 1),
                    ):
                        if time.perf_counter() - t0 > 30:
                            raise AssertionError(f"event {i + 1} never reached the sink")
                        time.sleep(0.0005)
                    out.append(time.perf_counter() - t0)

            probe(samples)
    finally:
        proc.kill()
        proc.join()
        reader.close()
        store.close()
    return out


def _quantile(xs: Sequence[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(cfg: Config) -> Section:
    sec = Section("stream", "stream: NATS JetStream publish, compactor into PostgreSQL, latency")
    n_pub = cfg.pick(50_000, 10_000)
    n_compact = cfg.pick(100_000, 20_000)
    repeats = cfg.pick(3, 1)
    n_latency = cfg.pick(300, 60)
    size = writer_batch_size()
    token = secrets.token_hex(3)
    streams: list[str] = []

    def new_stream(stem: str) -> str:
        name = f"bench_{stem}_{token}_{len(streams)}"
        streams.append(name)
        return name

    mem = MemoryStore()
    run_id, _, _ = record(mem, n_compact)
    events = mem.events(run_id)
    start = mem.get_run(run_id).start
    mem.close()
    chunks = batches(events, size)

    try:
        with schemas() as made, temp_dir("stream") as tmp:
            warm_writer(tmp)
            ours, raw, raw_frames = [], [], []
            for _ in range(repeats):
                sink = store_url(fresh(made, "pub"))
                PostgresStore(sink).close()
                got, messages = publish_rate(new_stream("pub"), sink, n_pub)
                ours.append(got)
                singles = one_a_record(messages)
                raw.append(raw_publish_rate(new_stream("raw"), singles) * n_pub / len(singles))
                raw_frames.append(
                    raw_publish_rate(new_stream("rawf"), messages) * n_pub / len(messages)
                )
                n_frames = len(messages)
            one, two, pg = [], [], []
            cpu_one: list[float] = []
            cpu_pg: list[float] = []
            for _ in range(repeats):
                cpu = time.process_time()
                pg.append(append_rate(fresh(made, "pg"), start, chunks))
                cpu_pg.append((time.process_time() - cpu) / n_compact)
                for procs, into in ((1, one), (2, two)):
                    sink = store_url(fresh(made, f"c{procs}"))
                    PostgresStore(sink).close()
                    stream = new_stream(f"c{procs}")
                    fill(stream, sink, start, chunks)
                    got, per_event = compact_rate(_url(stream, sink), n_compact, procs, size)
                    into.append(got)
                    if procs == 1:
                        cpu_one.append(per_event)
            sink = store_url(fresh(made, "lat"))
            PostgresStore(sink).close()
            lat = latencies(new_stream("lat"), sink, n_latency)
    finally:
        asyncio.run(_delete(streams))

    pub, raw_pub = statistics.median(ours), statistics.median(raw)
    pub_ratio = statistics.median(o / r for o, r in zip(ours, raw, strict=True))
    frames_ratio = statistics.median(o / r for o, r in zip(ours, raw_frames, strict=True))
    c1, c2, pg_rate = statistics.median(one), statistics.median(two), statistics.median(pg)
    c_ratio = statistics.median(o / p for o, p in zip(one, pg, strict=True))
    scaling = statistics.median(t / o for t, o in zip(two, one, strict=True))
    p50, p99 = _quantile(lat, 0.5) * 1e3, _quantile(lat, 0.99) * 1e3
    body = len(encode("e", events[0]))

    sec.row(
        f"agent → stream, {n_pub:,} calls",
        rate(pub),
        f"median of {repeats}; buffered, until every record is acknowledged",
    )
    sec.row(
        "raw nats-py publish_async, one message a record",
        rate(raw_pub),
        f"the same {body:,}-byte record bodies, each its key as the id",
    )
    sec.row("ratio agent / raw publish", f"{pub_ratio:.2f}", "median of per-repeat ratios")
    sec.row(
        "raw nats-py publish_async of the same frames",
        rate(statistics.median(raw_frames)),
        f"the very {n_frames:,} messages the agent's store published; "
        f"agent / this {frames_ratio:.2f} (the agent's rate is its recording's)",
    )
    sec.row(
        f"one compactor → PostgreSQL, {n_compact:,} events",
        rate(c1),
        f"the writer's batches of {size} as frames; fetches of up to {FETCH_BYTES >> 20} MiB",
    )
    sec.row(
        "PostgresStore.append, same events",
        rate(pg_rate),
        "the store's own ingest (buffered, the same batches)",
    )
    sec.row("ratio compactor / store ingest", f"{c_ratio:.2f}", "median of per-repeat ratios")
    sec.row(
        "CPU per event: compactor / append",
        f"{statistics.median(cpu_one) * 1e6:.1f} / {statistics.median(cpu_pg) * 1e6:.1f} µs",
        "client process only (the servers' CPU not counted); medians",
    )
    sec.row("two compactor processes", rate(c2), f"{scaling:.2f}x one (same backlog size)")
    sec.row(
        "durable return → queryable in PostgreSQL",
        f"p50 {p50:.1f} ms",
        f"p99 {p99:.1f} ms over {len(lat)} boundaries, one compactor running",
    )
    sec.targets += [
        Target("publish / raw nats-py", pub_ratio, TARGET_PUBLISH_RATIO, "x", op=">="),
        Target("compactor / store ingest", c_ratio, TARGET_COMPACT_RATIO, "x", op=">="),
    ]
    sec.data = {
        "publish_events_per_s": ours,
        "raw_publish_events_per_s": raw,
        "publish_ratio": pub_ratio,
        "raw_frames_publish_events_per_s": raw_frames,
        "publish_ratio_to_raw_frames": frames_ratio,
        "frames_published": n_frames,
        "message_bytes": body,
        "compactor_events_per_s": one,
        "two_compactors_events_per_s": two,
        "store_append_events_per_s": pg,
        "compactor_ratio": c_ratio,
        "compactor_cpu_s_per_event": cpu_one,
        "store_append_cpu_s_per_event": cpu_pg,
        "two_compactor_scaling": scaling,
        "latency_ms_p50": p50,
        "latency_ms_p99": p99,
        "latency_samples": len(lat),
    }
    return sec


if __name__ == "__main__":
    from harness import format_section

    t = time.perf_counter()
    section = run(Config(quick="--quick" in sys.argv))
    section.seconds = time.perf_counter() - t
    print(format_section(section))
