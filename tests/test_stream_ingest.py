"""Ingest through NATS JetStream: the stream store, the compactor, reads of what is
still in the stream, outages (fault proxy) and ``replayable status``; against the real
server on 127.0.0.1:4222 and the real PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard
from typer.testing import CliRunner

import replayable
from replayable.archive.stream import FETCH_BYTES, Compactor, stream_state
from replayable.capture.writer import writer_for
from replayable.cli import app
from replayable.errors import ConfigurationError, RunNotFoundError, StoreUnavailableError
from replayable.store import open_store
from replayable.store.postgres import PostgresStore
from replayable.store.stream import StreamStore, parse_stream_url
from replayable.store.stream._wire import (
    encode,
    frames,
    message_id,
    records,
    run_subject,
    unpacked,
)
from replayable.store.verify import verify_store
from tests import test_store_contract as contract
from tests.faultproxy import FaultProxy
from tests.nats_helpers import SERVER, stream_name
from tests.pg_helpers import PgServer, pg
from tests.test_store_contract import make_end, make_events, make_start, new_id

__all__ = ["pg", "stream_name"]

pytestmark = pytest.mark.slow

BOUND = 1.0


@replayable.tool
def lookup(i: int) -> int:
    return i * 3


@replayable.workflow
def ingest_agent(n: int) -> int:
    return sum(lookup(i) for i in range(n))


@pytest.fixture
def sink_url(pg: PgServer) -> str:
    return pg.url(pg.new_schema("ingest"))


@pytest.fixture
def url(stream_name: str, sink_url: str) -> str:
    return f"nats://{SERVER}?stream={stream_name}&sink={sink_url}"


@pytest.fixture
def store(url: str) -> Iterator[StreamStore]:
    s = open_store(url)
    assert isinstance(s, StreamStore)
    yield s
    s.close()


def start_of(run_id: str, **kwargs: Any) -> Any:
    """A run start with no environment snapshot (verify would look for its blob)."""
    start = msgspec.structs.replace(make_start(run_id, **kwargs), env_hash=None)
    contract._STARTS[run_id] = start  # what make_end seals
    return start


def compact(url: str, **kwargs: Any) -> Any:
    return Compactor(url, **kwargs).run(until_idle=0.2, max_seconds=30)


def raw_messages(store: StreamStore) -> list[tuple[str, str | None, bytes]]:
    """Every message in the stream: (subject, message id, body)."""

    async def read() -> list[tuple[str, str | None, bytes]]:
        js = await store.client.js()
        info = await js.stream_info(store.stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(store.stream, seq)
            out.append((msg.subject, (msg.headers or {}).get("Nats-Msg-Id"), msg.data))
        return out

    return store.client.run(read(), "reading", timeout=20)


def messages(store: StreamStore) -> list[tuple[str, str | None, str, Any]]:
    """Every record in the stream: (subject, its message's id, kind, record)."""
    return [
        (subject, mid, kind, record)
        for subject, mid, body in raw_messages(store)
        for kind, record in records(body)
    ]


def publish_raw(store: StreamStore, items: list[tuple[str, str | None, bytes]]) -> None:
    """Publish ``(subject, message id or None, body)`` each as it is."""

    async def go() -> None:
        js = await store.client.js()
        for subject, mid, body in items:
            await js.publish(subject, body, headers={"Nats-Msg-Id": mid} if mid else None)

    store.client.run(go(), "publishing", timeout=20)


# -- the URL --------------------------------------------------------------------------


def test_url_names_stream_and_sink_and_masks_the_password() -> None:
    cfg, sink, _ = parse_stream_url(
        "nats://127.0.0.1:4222?stream=s1&replicas=3&sink=postgresql://u:pw@h/db?schema=x&tenant=t"
    )
    assert (cfg.stream, cfg.prefix, cfg.replicas) == ("s1", "s1", 3)
    assert sink == "postgresql://u:pw@h/db?schema=x&tenant=t"
    _, encoded, _ = parse_stream_url("nats://h?stream=s&sink=sqlite%3A%2F%2F%2Ftmp%2Fx.db")
    assert encoded == "sqlite:///tmp/x.db"


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("nats://h:4222?stream=s", "names no sink"),
        ("nats://h:4222?stream=s&colour=red&sink=memory://", "unknown option 'colour'"),
        ("nats://h:4222?stream=a.b&sink=memory://", "stream 'a.b'"),
        ("nats://h:4222?stream=s&replicas=0&sink=memory://", "replicas"),
        ("nats://h:4222?stream=s&sink=nats://h?stream=t", "cannot be a stream"),
        ("nats://h:4222/subject?stream=s&sink=memory://", "not a path"),
    ],
)
def test_bad_urls_say_what_is_wrong(bad: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_stream_url(bad)


def test_shown_url_masks_the_sink_password(stream_name: str, pg: PgServer) -> None:
    schema = pg.new_schema("mask")
    base = pg.url(schema).replace("postgresql://postgres@", "postgresql://postgres:hunter2@")
    s = open_store(f"nats://{SERVER}?stream={stream_name}&sink={base}")
    try:
        assert "hunter2" not in s.url
        assert "hunter2" in s.connect_url()
        assert f"stream={stream_name}" in s.url
    finally:
        s.close()


def test_a_stream_made_for_other_subjects_is_refused(stream_name: str) -> None:
    base = f"nats://{SERVER}?stream={stream_name}"
    first = open_store(f"{base}&subject={stream_name}_one&sink=memory://")
    first.close()
    with pytest.raises(ConfigurationError, match=f"not {stream_name}_two"):
        open_store(f"{base}&subject={stream_name}_two&sink=memory://")


def test_unreachable_server_is_unavailable_at_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        open_store("nats://127.0.0.1:9?stream=nowhere&timeout=1&sink=memory://")
    assert time.monotonic() - t0 < 5


# -- publishing -----------------------------------------------------------------------


def test_records_are_published_by_tenant_workflow_and_run_with_their_keys(
    store: StreamStore, tmp_path: Path
) -> None:
    """A batch's records of a run are one frame on <stream>.<tenant>.<workflow>.<run>,
    its id the run, its first and last record's keys and a digest of its body."""
    with replayable.recording(store, spool_dir=tmp_path, metadata={"team": "x"}) as rec:
        assert ingest_agent(4) == 18
    (run_id,) = rec.run_ids
    subject = f"{store.stream}._.ingest_agent.{run_id}"
    keys = {"s": lambda r: "s", "e": lambda r: str(r.seq), "x": lambda r: "x"}
    for subj, mid, body in raw_messages(store):
        if body[:1] == b"b":
            continue
        assert (subj, body[:1]) == (subject, b"f")
        held = records(body)
        first, last = keys[held[0][0]](held[0][1]), keys[held[-1][0]](held[-1][1])
        digest = hashlib.sha256(body).hexdigest()[:16]
        assert mid == f"{run_id}:{first}-{last}:{digest}"
    # In stream order as a rule; a publish that timed out on a loaded machine is spooled
    # and sent again later, so the set of records is what is checked, in record order.
    order = {"s": 0, "e": 1, "x": 2}
    found = sorted(
        (m for m in messages(store) if m[2] != "b"),
        key=lambda m: (order[m[2]], getattr(m[3], "seq", 0)),
    )
    assert [(s, kind) for s, _, kind, _ in found] == [
        (subject, "s"),
        *[(subject, "e") for i in range(1, 5)],
        (subject, "x"),
    ]
    assert [r.seq for _, _, k, r in found if k == "e"] == [1, 2, 3, 4]
    # The records carry the writer's hash chain.
    events = [r for _, _, k, r in found if k == "e"]
    assert events[0].chain_index == 0
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))


def test_a_retried_publish_is_dropped_by_the_server(store: StreamStore) -> None:
    run_id = new_id(1)
    start = start_of(run_id, tenant="acme")
    events = make_events(run_id, 5)
    store.append([start], events, [make_end(run_id, events)])
    depth = stream_state(store.url)["depth"]
    assert depth == 1  # one frame
    store.append([start], events, [make_end(run_id, events)])  # the same batch again
    assert stream_state(store.url)["depth"] == depth
    assert messages(store)[0][0] == f"{store.stream}.acme.triage.{run_id}"


def test_a_retry_batched_otherwise_is_kept_and_written_once(store: StreamStore, url: str) -> None:
    """A publish that failed part way and is sent again in other batches (the spool
    drained as one batch, say) makes frames of other ids: the server keeps them all, the
    compactor writes each record once, and no id ever names two different frames."""
    run_id = new_id(11)
    start = start_of(run_id)
    events = make_events(run_id, 9)
    end = make_end(run_id, events)
    store.append([start], events[:4], [])  # acknowledged, then the writer retried
    store.append([start], events[:7], [])  # the retry, a larger batch
    store.append([], events[2:], [end])  # and the rest, overlapping again
    store.append([], events[2:], [end])  # an exact retry: dropped by the server
    frames = raw_messages(store)
    assert len(frames) == 3
    assert len({mid for _, mid, _ in frames}) == 3
    assert [e.seq for e in store.events(run_id)] == list(range(1, 10))
    report = compact(url)
    assert report.records == 11
    assert report.skipped == 21 - 11  # three frames of 5, 8 and 8 records
    assert stream_state(url)["depth"] == 0
    assert [e.seq for e in store.sink.events(run_id)] == list(range(1, 10))
    assert store.sink.get_run(run_id).status == "completed"
    assert verify_store(store.sink).ok
    # The same overlap split over separate fetches (one message each): once too.
    other = new_id(12)
    events = make_events(other, 5)
    store.append([start_of(other)], events[:3], [])
    store.append([start_of(other)], events, [make_end(other, events)])
    report = compact(url, batch=1)
    assert (report.records, report.skipped) == (7, 4)
    assert [e.seq for e in store.sink.events(other)] == [1, 2, 3, 4, 5]
    assert verify_store(store.sink).ok


def test_frames_stay_under_the_servers_message_size(store: StreamStore, url: str) -> None:
    """A run's batch larger than a message may be is cut into frames that each fit; a
    record larger than that goes alone in its frame."""
    run_id = new_id(13)
    events = make_events(run_id, 40)
    size = len(encode("e", events[0]))
    default = store.client.max_payload
    store.client.max_payload = 1024 + 5 * size  # about four events a frame
    store.append([start_of(run_id)], events, [make_end(run_id, events)])
    frames = raw_messages(store)
    assert 8 <= len(frames) <= 14
    assert all(len(body) <= 5 * size for _, _, body in frames)
    assert [r.seq for _, _, k, r in messages(store) if k == "e"] == list(range(1, 41))
    store.client.max_payload = 1024 + size // 2  # smaller than one record
    lone = new_id(14)
    few = make_events(lone, 3)
    store.append([start_of(lone)], few, [make_end(lone, few)])
    assert [len(records(body)) for _, _, body in raw_messages(store)[len(frames) :]] == [
        1, 1, 1, 1, 1
    ]  # fmt: skip
    # And at the server's own size: frames near a megabyte, each read in many pieces.
    store.client.max_payload = default
    big = new_id(16)
    many = make_events(big, 3000)
    store.append([start_of(big)], many, [make_end(big, many)])
    # Compressed on the wire ("z"), each under the bound unpacked too, the id's digest
    # the frame's own.
    bodies = [(mid, body) for _, mid, body in raw_messages(store)[len(frames) + 5 :]]
    assert len(bodies) >= 2
    assert all(body[:1] == b"z" for _, body in bodies)
    sizes = [len(unpacked(body)) for _, body in bodies]
    assert max(sizes) > default // 2
    assert all(size <= default - 1024 for size in sizes)
    for mid, body in bodies:
        assert str(mid).endswith(hashlib.sha256(unpacked(body)).hexdigest()[:16])
        assert len(body) < len(unpacked(body)) // 2
    assert [e.seq for e in store.events(big)] == list(range(1, 3001))  # read as pending
    # A compactor reckons its fetches by the frames' unpacked size.
    sizer = Compactor(url)
    try:
        sizer._sized([types.SimpleNamespace(data=body) for _, body in bodies])
        assert sizer._fetch_count() == FETCH_BYTES // max(sizes)
    finally:
        sizer.sink.close()
    report = compact(url, batch=3)
    assert report.records == 42 + 5 + 3002
    assert [e.seq for e in store.sink.events(run_id)] == list(range(1, 41))
    assert [e.seq for e in store.sink.events(lone)] == [1, 2, 3]
    assert [e.seq for e in store.sink.events(big)] == list(range(1, 3001))
    assert verify_store(store.sink).ok


@pytest.mark.parametrize("n", [1, 15, 16, 65_535, 65_536])
def test_a_frame_holds_any_number_of_records(n: int) -> None:
    """The frame's msgpack array headers at each of their sizes (fix, 16 and 32 bits);
    no records make no frame."""
    run_id = new_id(17)
    one = make_events(run_id, 1)[0]
    events = [msgspec.structs.replace(one, seq=i + 1) for i in range(n)]
    assert list(frames(run_id, [], [], [], 1 << 30)) == []
    ((mid, body),) = frames(run_id, [], events, [], 1 << 30)
    assert mid.startswith(f"{run_id}:1-{n}:")
    decoded = records(body)
    assert [r.seq for _, r in decoded] == list(range(1, n + 1))
    assert all(r == e for (_, r), e in zip(decoded, events, strict=True))


def test_records_published_one_a_message_still_read_and_compact(
    store: StreamStore, url: str
) -> None:
    """A stream written before frames (one record a message, its key the id) reads as
    pending and compacts, beside frames of the same run."""
    run_id = new_id(15)
    start = start_of(run_id)
    events = make_events(run_id, 6)
    end = make_end(run_id, events)
    subject = run_subject(store.prefix, None, start.workflow, run_id)
    old = [(subject, message_id("s", start), encode("s", start))]
    old += [(subject, message_id("e", e), encode("e", e)) for e in events[:4]]
    publish_raw(store, old)
    assert store.pending_runs() == {run_id: 5}
    assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4]
    assert store.get_run(run_id).status == "incomplete"
    store.append([], events[3:], [end])  # the writer, upgraded, goes on in frames
    assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4, 5, 6]
    report = compact(url)
    assert (report.records, report.skipped) == (8, 1)
    assert [e.seq for e in store.sink.events(run_id)] == [1, 2, 3, 4, 5, 6]
    assert store.sink.get_run(run_id).status == "completed"
    assert verify_store(store.sink).ok


# -- reading what is not compacted yet -------------------------------------------------


def test_a_run_still_in_the_stream_is_read_from_it(store: StreamStore, url: str) -> None:
    run_id = new_id(2)
    start = start_of(run_id)
    events = make_events(run_id, 6)
    store.append([start], events[:4], [])
    assert store.pending_runs() == {run_id: 1}  # messages: one frame
    assert store.get_run(run_id).status == "incomplete"
    assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4]
    assert [r.run_id for r in store.list_runs()] == [run_id]
    assert store.count_runs() == 1
    assert store.resolve(run_id[:10]) == run_id
    compact(url)
    assert store.pending_runs() == {}
    # Half compacted, half in the stream: both halves are read.
    store.append([], events[4:], [make_end(run_id, events)])
    assert store.get_run(run_id).status == "completed"
    assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4, 5, 6]
    compact(url)
    assert [e.seq for e in store.sink.events(run_id)] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(RunNotFoundError):
        store.get_run(new_id(99))


def test_a_pending_run_is_never_silently_partial(
    stream_name: str, sink_url: str, store: StreamStore
) -> None:
    """Stream unreachable: a complete compacted run still reads; an incomplete one fails
    and says its records may be in the stream."""
    host, port = SERVER.split(":")
    done, open_ = new_id(3), new_id(4)
    events = make_events(done, 3)
    store.append([start_of(done), start_of(open_)], events, [make_end(done, events)])
    compact(store.connect_url())
    store.append([], make_events(open_, 2), [])
    with FaultProxy((host, int(port)), lifetime=30) as proxy:
        via = open_store(
            f"nats://127.0.0.1:{proxy.port}?stream={stream_name}&timeout=1&sink={sink_url}"
        )
        try:
            assert [e.seq for e in via.events(open_)] == [1, 2]
            proxy.cut()
            assert [e.seq for e in via.events(done)] == [1, 2, 3]
            assert via.get_run(done).status == "completed"
            with pytest.raises(StoreUnavailableError, match=f"run {open_} is not complete"):
                via.events(open_)
        finally:
            proxy.restore()
            via.close()


# -- the compactor ---------------------------------------------------------------------


def test_compactor_writes_every_record_once_and_acks(
    store: StreamStore, url: str, tmp_path: Path
) -> None:
    with replayable.recording(store, spool_dir=tmp_path) as rec:
        for n in (3, 30, 7):
            ingest_agent(n)
    report = compact(url, batch=16)
    assert report.records == 3 + 30 + 7 + 3 * 2
    assert stream_state(url)["depth"] == 0
    sink = store.sink
    for run_id, n in zip(rec.run_ids, (3, 30, 7), strict=True):
        assert [e.seq for e in sink.events(run_id)] == list(range(1, n + 1))
        assert sink.get_run(run_id).status == "completed"
        assert replayable.replay(run_id, store=store, fn=ingest_agent).status == "identical"
    assert verify_store(sink).ok


def test_events_before_their_start_wait_for_it(store: StreamStore, url: str) -> None:
    """An event whose run the sink does not hold yet goes back to the stream."""
    run_id = new_id(5)
    start = start_of(run_id, tenant="t1")
    events = make_events(run_id, 4)
    store.append([], events, [make_end(run_id, events)])
    first = Compactor(url)
    got = first.run(until_idle=0.3, max_seconds=5)
    assert got.records == 0
    assert got.deferred >= 5
    with pytest.raises(RunNotFoundError):
        store.sink.get_run(run_id)
    store.append([start], [], [])
    report = compact(url)
    assert report.records == 6
    run = store.sink.get_run(run_id)
    assert run.status == "completed"
    assert isinstance(store.sink, PostgresStore)
    assert store.sink.query(
        "SELECT DISTINCT tenant FROM agent_execution_events WHERE run_id = %s", (run_id,)
    ) == [("t1",)]
    assert verify_store(store.sink).ok


def _drain(url: str, out: Any) -> None:
    report = Compactor(url).run(until_idle=1.0, max_seconds=60)
    out.put((report.records, report.skipped))


def test_two_compactors_drain_a_backlog_with_records_handed_back(
    store: StreamStore, url: str
) -> None:
    """Two compactor processes on one run's backlog of frames: the one without the run's
    start hands its frames back until the other stored it, and both stop idle with
    every record stored once and nothing left pending. (With a pull request's byte
    bound met, nats-server 2.9 left such redelivered frames pending and unsent until
    their ack wait: the compactors stopped with them still in the stream.)"""
    import multiprocessing

    run_id = new_id(19)
    events = make_events(run_id, 40_000)
    for i in range(0, len(events), 1024):
        store.append([start_of(run_id)] if i == 0 else [], events[i : i + 1024], [])
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_drain, args=(url, out)) for _ in range(2)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(10)
    state = stream_state(url)
    assert (state["depth"], state["unacknowledged"]) == (0, 0), (state, reports)
    assert sum(r[0] for r in reports) == 40_001, reports
    assert isinstance(store.sink, PostgresStore)
    assert store.sink.query("SELECT count(*) FROM agent_execution_events") == [(40_000,)]


def test_a_batch_delivered_again_after_its_commit_is_skipped(store: StreamStore, url: str) -> None:
    run_id = new_id(6)
    events = make_events(run_id, 8)
    records = ([start_of(run_id)], events, [make_end(run_id, events)])
    store.append(*records)
    assert compact(url).records == 10
    # Some of the records published again without ids (past the duplicate window, say).

    async def again() -> None:
        js = await store.client.js()
        # Cut differently from the first delivery (the sink's batch digest differs).
        for kind, rows in zip("sex", ([], events[2:], records[2]), strict=True):
            for r in rows:
                await js.publish(run_subject(store.prefix, None, "triage", run_id), encode(kind, r))
        await js.publish(f"{store.prefix}._.triage.{run_id}", b"zgarbage")
        await js.publish(f"{store.prefix}._.triage.{run_id}", b"f\x93\x90garbage")
        # Compressed bodies that are no frame, or would unpack into too much.
        pack = zstandard.ZstdCompressor().compress
        for bad in (b"zgarbage", b"z" + pack(encode("e", events[0])), b"z" + pack(b"f" * 2**27)):
            await js.publish(f"{store.prefix}._.triage.{run_id}", bad)

    store.client.run(again(), "publishing again", timeout=20)
    report = compact(url)
    assert (report.records, report.skipped, report.rejected) == (0, 7, 5)
    assert stream_state(url)["depth"] == 0
    assert [e.seq for e in store.sink.events(run_id)] == list(range(1, 9))
    assert verify_store(store.sink).ok


def test_a_run_the_sink_refuses_for_good_does_not_hold_the_others(
    store: StreamStore, url: str
) -> None:
    """A hostile record (a run id PostgreSQL cannot take) is taken off the queue and
    counted; the good run in the same batch is stored."""
    good, bad = new_id(9), "not-a-uuid\r\nPUB x 1"
    events = make_events(good, 3)
    bad_start = msgspec.structs.replace(start_of(new_id(10)), run_id=bad, root_run_id=bad)
    store.append([start_of(good), bad_start], events, [make_end(good, events)])
    # The id's line break never reached the wire as a frame of its own.
    found = messages(store)
    assert len(found) == 6
    assert any(str(mid).startswith("not-a-uuid__PUB_x_1:s-s:") for _, mid, _, _ in found)
    report = compact(url)
    assert (report.records, report.rejected) == (5, 1)
    assert stream_state(url)["depth"] == 0
    assert [e.seq for e in store.sink.events(good)] == [1, 2, 3]


def test_compactor_command_and_status(store: StreamStore, url: str, sink_url: str) -> None:
    run_id = new_id(7)
    events = make_events(run_id, 3)
    store.append([start_of(run_id)], events, [make_end(run_id, events)])
    source = url.split("&sink=")[0]
    runner = CliRunner()
    quiet = ["--spool-dir", "/nonexistent-x"]
    shown = runner.invoke(app, ["status", "--stream", source, "--json", *quiet])
    body = json.loads(shown.stdout)
    (row,) = body["streams"]
    assert (row["depth"], row["lag"], row["compactors"]) == (1, None, [])  # one frame
    assert row["oldest_at"] is not None
    assert time.time() - row["oldest_at"] < 60
    # Not compacted yet: a listing shows the run, a search says what it cannot see.
    listed = runner.invoke(app, ["--store", url, "runs", "--json"])
    assert run_id in listed.stdout
    searched = runner.invoke(app, ["--store", url, "query"])
    assert searched.exit_code == 0, searched.output
    assert f"1 run(s) have records in stream {store.stream} not compacted" in searched.output
    ran = runner.invoke(
        app, ["compactor", "--source", source, "--sink", sink_url, "--until-idle", "0.5"]
    )
    assert ran.exit_code == 0, ran.output
    assert "compacted 5 record(s)" in ran.stdout
    shown = runner.invoke(app, ["status", "--stream", source, *quiet])
    assert f"stream {store.stream}" in shown.stdout
    assert "0 message(s)" in shown.stdout
    assert "0 not delivered" in shown.stdout
    listed = runner.invoke(app, ["--store", url, "runs", "--json"])
    assert run_id in listed.stdout
    searched = runner.invoke(app, ["--store", url, "query"])
    assert run_id in searched.output
    assert "not compacted" not in searched.output
    verified = runner.invoke(app, ["--store", sink_url, "verify", "--all"])
    assert verified.exit_code == 0, verified.output


def test_status_shows_each_running_compactor(store: StreamStore, url: str) -> None:
    """While compactors run, status names each, its records and what it holds."""
    import threading

    run_id = new_id(8)
    events = make_events(run_id, 3)
    store.append([start_of(run_id)], events, [make_end(run_id, events)])
    stop = threading.Event()
    workers = [Compactor(url, name=f"c{i}") for i in range(2)]
    threads = [threading.Thread(target=w.run, kwargs={"stop": stop.is_set}) for w in workers]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 15
        while True:
            found = stream_state(url)
            reports = found["compactors"]
            if len(reports) == 2 and sum(c["records"] for c in reports) == 5:
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.2)
        assert [c["name"] for c in found["compactors"]] == ["c0", "c1"]
        assert found["depth"] == 0
        assert found["lag"] == 0
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert stream_state(url)["compactors"] == []


# -- outages: the same spool as for PostgreSQL ----------------------------------------


@pytest.mark.parametrize("fault", ["drop", "stall", "reset"])
def test_nats_outage_is_spooled_and_drained_exactly_once(
    fault: str, stream_name: str, sink_url: str, tmp_path: Path
) -> None:
    host, port = SERVER.split(":")
    with FaultProxy((host, int(port)), lifetime=60) as proxy:
        via = f"nats://127.0.0.1:{proxy.port}?stream={stream_name}&timeout=1&sink={sink_url}"
        store = open_store(via)
        writer = writer_for(store, max_block_s=BOUND, spool_dir=tmp_path)
        took: list[float] = []

        @replayable.workflow
        def cut_agent(n: int) -> int:
            total = 0
            for i in range(n):
                if i == 5:
                    if fault == "drop":
                        proxy.cut()
                    elif fault == "stall":
                        proxy.stall = True
                    else:
                        proxy.reset()
                if i == 25:
                    deadline = time.monotonic() + 10
                    while fault != "reset" and not writer.spooled:
                        assert time.monotonic() < deadline, "the outage was never spooled"
                        time.sleep(0.01)
                    proxy.stall = False
                    proxy.reset()
                    proxy.restore()
                t0 = time.monotonic()
                total += lookup(i)
                took.append(time.monotonic() - t0)
                time.sleep(0.01)
            return total

        try:
            with replayable.recording(store, durability="durable") as rec:
                assert cut_agent(40) == sum(range(40)) * 3
            assert max(took) < BOUND + 0.5
            assert writer.drain(timeout=30), f"not drained: {writer.last_error!r}"
        finally:
            store.close()
    compact(f"nats://{SERVER}?stream={stream_name}&sink={sink_url}")
    sink = open_store(sink_url)
    try:
        (run_id,) = rec.run_ids
        assert [e.seq for e in sink.events(run_id)] == list(range(1, 41))
        assert sink.get_run(run_id).status == "completed"
        assert verify_store(sink).ok
    finally:
        sink.close()


def test_durable_returns_after_the_ack(store: StreamStore, tmp_path: Path) -> None:
    """A durable boundary's record is in the stream once the boundary returned."""
    seen: list[int] = []

    @replayable.workflow
    def watched(n: int) -> None:
        for i in range(n):
            lookup(i)
            seen.append(sum(1 for _, _, k, _ in messages(store) if k == "e"))

    with replayable.recording(store, durability="durable", spool_dir=tmp_path):
        watched(3)
    assert seen == [1, 2, 3]


def test_loop_left_clean() -> None:
    """No event loop of the stream client leaks into the test's thread."""
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
