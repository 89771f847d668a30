"""Store outages and refusals: the writer spools, bounds every wait, drains in order,
and writes the valid records of a batch the store refuses."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import pytest

import replayable
from replayable.capture.config import settings
from replayable.capture.writer import PendingEvent, Writer, writer_for
from replayable.capture.writer.spool import Spool, SpoolBatch, read_records, rejects_path
from replayable.errors import AppendOnlyError, StoreError
from replayable.store.postgres import PostgresStore
from replayable.store.sqlite import SQLiteStore
from tests.faultproxy import FaultProxy
from tests.pg_helpers import SERVER, PgServer, pg
from tests.test_store_contract import make_events, make_start, new_id

__all__ = ["pg"]

pytestmark = pytest.mark.slow

BOUND = 1.0  # max_block_s in these tests
SLACK = 0.5  # scheduling noise on a loaded machine
HOOKS: dict[int, Callable[[], None]] = {}
TOOK: list[float] = []


@replayable.tool
def step(i: int) -> int:
    time.sleep(0.005)
    return i * 2


@replayable.workflow
def outage_agent(n: int) -> int:
    total = 0
    for i in range(n):
        hook = HOOKS.get(i)
        if hook is not None:
            hook()
        t0 = time.monotonic()
        total += step(i)
        TOOK.append(time.monotonic() - t0)
    return total


def wait_until(check: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what or "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def _clean_hooks() -> Iterator[None]:
    HOOKS.clear()
    TOOK.clear()
    yield
    HOOKS.clear()
    TOOK.clear()


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    """A fault proxy in front of the test PostgreSQL server."""
    parts = urlsplit(SERVER)
    with FaultProxy((parts.hostname or "127.0.0.1", parts.port or 5432), lifetime=60) as p:
        yield p


@pytest.fixture
def urls(pg: PgServer, proxy: FaultProxy) -> tuple[str, str]:
    """(through the proxy, direct) URLs of one fresh schema."""
    schema = pg.new_schema("spool")
    user = urlsplit(SERVER).username or "postgres"
    via = pg.url(schema, server=f"postgresql://{user}@127.0.0.1:{proxy.port}")
    via += "&connect_timeout=1&options=-cstatement_timeout%3D2000"
    return via, pg.url(schema)


def check_runs(direct_url: str, run_ids: list[str], n: int, status: str = "completed") -> None:
    """Every run is in PostgreSQL once, with ``n`` events, a valid chain, and it replays."""
    store = PostgresStore(direct_url)
    try:
        for run_id in run_ids:
            (count,) = store.query(
                "SELECT count(*) FROM agent_execution_events WHERE run_id = %s", (run_id,)
            )[0]
            assert count == n
            assert [e.seq for e in store.events(run_id)] == list(range(1, n + 1))
            assert store.get_run(run_id).status == status
            assert replayable.verify_run(store, run_id).ok
            if status == "completed":
                result = replayable.replay(run_id, store=store, fn=outage_agent)
                assert result.status == "identical"
                assert result.divergence is None
    finally:
        store.close()


@pytest.mark.parametrize("durability", ["buffered", "durable"])
def test_outage_is_spooled_and_drained_exactly_once(
    durability: str, urls: tuple[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """Cut mid-run: the agent keeps going within the bound; then every event is stored once."""
    via, direct = urls
    store = PostgresStore(via)
    writer = writer_for(store, max_block_s=BOUND, spool_dir=tmp_path)

    def restore() -> None:
        # ``spooled`` turns true as the writer takes the outage, just before it writes
        # the batch to the spool file: wait for the file too.
        wait_until(
            lambda: writer.spooled and any(tmp_path.glob("*.jsonl")),
            what="the outage went to a spool file",
        )
        proxy.restore()

    HOOKS.update({10: proxy.cut, 40: restore})
    try:
        with replayable.recording(store, durability=durability) as rec:  # type: ignore[arg-type]
            assert outage_agent(50) == sum(range(50)) * 2
            assert outage_agent(5) == 20
        assert max(TOOK) < BOUND + SLACK
        if not writer.drain(timeout=40):
            import faulthandler
            import sys

            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            pytest.fail(f"not drained; last error {writer.last_error!r}")
        assert not list(tmp_path.glob("*-*.jsonl")), "the drained spool is removed"
        HOOKS.clear()
        check_runs(direct, rec.run_ids[:1], 50)
        check_runs(direct, rec.run_ids[1:], 5)
    finally:
        store.close()


def test_stall_is_detected_within_the_bound(
    urls: tuple[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """A server that stops answering costs a durable boundary at most the bound."""
    via, direct = urls
    store = PostgresStore(via)
    writer = writer_for(store, max_block_s=BOUND, spool_dir=tmp_path)

    def stall() -> None:
        proxy.stall = True

    def unstall() -> None:
        assert writer.spooled
        proxy.reset()
        proxy.restore()

    HOOKS.update({5: stall, 15: unstall})
    try:
        with replayable.recording(store, durability="durable") as rec:
            outage_agent(20)
        assert max(TOOK) < BOUND + SLACK
        assert max(TOOK[5:15]) >= writer.stall_s * 0.9, "the stall was waited out, not skipped"
        assert writer.drain(timeout=40)
        HOOKS.clear()
        check_runs(direct, rec.run_ids, 20)
    finally:
        store.close()


def raised_at(direct_url: str, run_id: str, seq: int) -> None:
    """The step whose boundary raised StoreError to the agent is recorded as that error."""
    store = PostgresStore(direct_url)
    try:
        events = store.events(run_id)
        assert [e.seq for e in events if e.error is None] == list(range(1, seq))
        last = events[seq - 1]
        assert last.response is None
        assert last.error is not None
        assert "StoreError" in last.error
        assert "on_store_failure='raise'" in last.error
    finally:
        store.close()


def test_fail_closed_raises_at_the_agent(
    urls: tuple[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """With on_store_failure='raise' the boundary raises StoreError within the bound."""
    via, direct = urls
    store = PostgresStore(via)
    writer = writer_for(store, max_block_s=BOUND, spool_dir=tmp_path, on_store_failure="raise")
    HOOKS[5] = proxy.cut
    try:
        rec = replayable.recording(store, durability="durable")
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=r"unavailable|failed"), rec:
            outage_agent(20)
        assert len(TOOK) == 5, "the first boundary after the cut raised"
        assert time.monotonic() - t0 < 2 * (BOUND + SLACK)
        proxy.restore()
        assert writer.drain(timeout=40)
        # Nothing handed off is lost: the six calls and the failed outcome are stored.
        check_runs(direct, rec.run_ids, 6, status="failed")
        raised_at(direct, rec.run_ids[0], 6)
    finally:
        store.close()


def test_fail_closed_buffered_raises_at_the_next_boundary(
    urls: tuple[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """Buffered, fail-closed: once the outage is seen the next boundary raises; nothing is lost."""
    via, direct = urls
    store = PostgresStore(via)
    writer = writer_for(store, max_block_s=BOUND, spool_dir=tmp_path, on_store_failure="raise")
    HOOKS.update({5: proxy.cut, 6: lambda: wait_until(lambda: writer.spooled)})
    try:
        rec = replayable.recording(store)
        with pytest.raises(StoreError, match="on_store_failure='raise'"), rec:
            outage_agent(20)
        # The writer may see the reset while step 5 runs (its next batch fails at
        # once) or only once the hook at step 6 has waited for the spool: either way
        # the first boundary after the outage was seen raised.
        assert len(TOOK) in (5, 6), "the boundary after the outage was seen raised"
        proxy.restore()
        assert writer.drain(timeout=40)
        # The call that raised had run, so its event is kept with the others.
        check_runs(direct, rec.run_ids, len(TOOK) + 1, status="failed")
        raised_at(direct, rec.run_ids[0], len(TOOK) + 1)
    finally:
        store.close()


def test_spool_of_an_ended_process_is_drained_on_next_start(
    urls: tuple[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """A spool left behind by a writer that ended during an outage is drained by the next one."""
    via, direct = urls
    first = PostgresStore(via)
    writer_for(first, max_block_s=0.3, spool_dir=tmp_path)
    proxy.cut()
    with replayable.recording(first) as rec:
        outage_agent(8)
    first.close()  # the writer stops with the store unreachable: the spool stays
    # One file per spooling episode: a slow machine may start a second one mid-run.
    left = sorted(tmp_path.glob("*-*.jsonl"))
    assert left
    assert sum(1 for f in left for kind, _ in read_records(f) if kind == "e") == 8

    proxy.restore()
    second = PostgresStore(via)
    try:
        writer = writer_for(second, spool_dir=tmp_path)
        assert writer.drain(timeout=40)
        assert not any(f.exists() for f in left)
        check_runs(direct, rec.run_ids, 8)
    finally:
        second.close()


def pending(run_id: str, seq: int) -> PendingEvent:
    return (
        run_id,
        seq,
        "tool",
        "lookup",
        None,
        None,
        None,
        b'{"q":1}',
        b"2",
        False,
        None,
        False,
        1000.0 + seq,
        10,
        None,
    )


def test_permanent_refusal_writes_the_rest(sqlite_path: Path, tmp_path: Path) -> None:
    """A duplicate is refused (waiter errors, warning, rejects file); later records still land."""
    store = SQLiteStore(sqlite_path)
    writer = Writer(store, spool_dir=tmp_path, max_block_s=2.0)
    run_id = new_id(1)
    try:
        writer.start(make_start(run_id))
        writer.event(pending(run_id, 1))
        writer.event(pending(run_id, 2))
        writer.flush()
        with (
            pytest.warns(RuntimeWarning, match=f"{store.url}.*refused 1 record"),
            pytest.raises(StoreError) as info,
        ):
            writer.event(pending(run_id, 2), durable=True)
        assert isinstance(info.value.__cause__, AppendOnlyError)

        def hand_off(seqs: tuple[int, ...]) -> None:
            for seq in seqs:
                writer.event(pending(run_id, seq))
            writer.flush()

        with pytest.warns(RuntimeWarning, match="AppendOnlyError"):
            hand_off((3, 1, 4))
        writer.event(pending(run_id, 5), durable=True)
        assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4, 5]
        rejected = read_records(rejects_path(tmp_path, store.url))
        assert sorted(r.seq for _, r in rejected) == [1, 2]
        # The refused records keep their chain positions: verify points at the gap.
        report = replayable.verify_run(store, run_id)
        assert not report.ok
        assert report.first_bad_seq == 3
        assert not writer.spooled, "a refusal is not an outage"
    finally:
        writer.close()
        store.close()


def test_spool_round_trip_is_byte_identical(tmp_path: Path) -> None:
    """A batch read back from the spool encodes exactly as written; a torn tail is ignored."""
    run_id = new_id(2)
    events = make_events(run_id, 3)
    batch = SpoolBatch(
        starts=[make_start(run_id, metadata={"k": [1, 2.5, {"x": None}]})],
        events=events,
        blobs=[("d", b"\x00\xff")],
    )
    spool = Spool.create(tmp_path, "sqlite:///x.db")
    spool.append(batch, fsync=True)
    spool.append(
        SpoolBatch(events=make_events(run_id, 1, first_seq=4, after=events[-1])), fsync=False
    )
    with spool.path.open("ab") as f:
        f.write(b'[3,"e",{"run_id":')  # a crash mid-write
    item = spool.next_batch()
    assert item is not None
    back, offset = item
    encode = msgspec.json.encode
    assert encode([back.starts, back.events, back.ends]) == encode([batch.starts, events, []])
    assert back.blobs == [("d", b"\x00\xff")]
    spool.advance(offset)
    second = spool.next_batch()
    assert second is not None
    assert [e.seq for e in second[0].events] == [4]
    spool.advance(second[1])
    assert not spool.pending
    spool.remove()
    assert not spool.path.exists()


def test_interrupt_unblocks_a_call_hung_on_a_stalled_connection(
    urls: tuple[str, str], proxy: FaultProxy
) -> None:
    """A write stuck on a connection that never answers fails once interrupted; the next
    write reconnects and lands."""
    import threading

    via, direct = urls
    store = PostgresStore(via.replace("&options=-cstatement_timeout%3D2000", ""))
    rid = new_id(7)
    try:
        store.append([make_start(rid)], [], [])
        proxy.stall = True  # the open connection stops forwarding, nothing errors
        outcome: list[BaseException | None] = []

        def write() -> None:
            try:
                store.append([], make_events(rid, 1), [])
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        hung = threading.Thread(target=write)
        hung.start()
        hung.join(timeout=1.0)
        assert hung.is_alive(), "the write is waiting on the stalled connection"
        store.interrupt()
        hung.join(timeout=5.0)
        assert not hung.is_alive()
        assert isinstance(outcome[0], StoreError)
        proxy.restore()
        store.append([], make_events(rid, 1), [])
        reader = PostgresStore(direct)
        try:
            assert [e.seq for e in reader.events(rid)] == [1]
        finally:
            reader.close()
    finally:
        proxy.restore()
        store.close()


def test_writer_process_spools_a_store_it_cannot_reach_yet(
    urls: tuple[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """The child opens the store on first use: unreachable then, it spools and drains later."""
    from replayable.capture.writer import ProcessWriter

    via, direct = urls
    store = PostgresStore(via)  # the agent's own connection is made while the server is up
    proxy.cut()
    before = replayable.capture.config.settings.writer
    replayable.configure(writer="process")
    try:
        writer = writer_for(store, max_block_s=BOUND, spool_dir=tmp_path)
        assert isinstance(writer, ProcessWriter)
        with replayable.recording(store) as rec:
            assert outage_agent(12) == sum(range(12)) * 2
        assert max(TOOK) < BOUND + SLACK
        wait_until(lambda: writer.spooled)
        proxy.restore()
        assert writer.drain(timeout=40), f"not drained; last error {writer.last_error!r}"
        check_runs(direct, rec.run_ids, 12)
    finally:
        replayable.capture.config.settings.writer = before
        store.close()


def test_a_writer_with_nothing_left_to_drain_is_back(sqlite_path: Path, tmp_path: Path) -> None:
    """A drain round can run out of time just after the last spooled batch went in; the
    next round must still see that nothing is left and call the store back."""
    store = SQLiteStore(sqlite_path)
    writer = Writer(store, spool_dir=tmp_path, max_block_s=2.0)
    try:
        # The state such a round leaves: marked down, nothing spooled or held.
        writer._outage.down = StoreError("it was down")
        writer._outage.drained.clear()
        assert writer.spooled
        assert writer.drain(timeout=5), "the writer saw it had nothing left"
        assert not writer.spooled
        run_id = new_id(2)
        writer.start(make_start(run_id))
        writer.event(pending(run_id, 1), durable=True)
        assert [e.seq for e in store.events(run_id)] == [1]
    finally:
        writer.close()
        store.close()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_locked_sqlite_file_holds_a_durable_boundary_at_most_its_bound(
    writer: str, tmp_path: Path
) -> None:
    """Another process holds the database's write lock: a durable caller commits on its
    own thread, so SQLite's own wait must be the bound, not its 30 s busy timeout. The
    boundary spools within the bound, and once the lock is gone all of it lands once."""
    import sqlite3

    db = tmp_path / "locked.db"
    store = SQLiteStore(db)
    before = settings.writer
    settings.writer = writer
    blocker = sqlite3.connect(db, isolation_level=None)
    try:

        def lock() -> None:
            blocker.execute("BEGIN IMMEDIATE")  # the write lock, held

        def release() -> None:
            blocker.execute("ROLLBACK")

        HOOKS.update({2: lock, 5: release})
        t0 = time.monotonic()
        with replayable.recording(
            store, durability="durable", spool_dir=tmp_path / "spool", max_block_s=BOUND
        ) as rec:
            outage_agent(8)
        assert time.monotonic() - t0 < 30, "a durable commit waited out SQLite's busy timeout"
        assert max(TOOK[2:5]) < BOUND + SLACK, TOOK
        assert writer_for(store).drain(timeout=10)
        run_id = rec.run_ids[0]
        assert [e.seq for e in store.events(run_id)] == list(range(1, 9))
        assert store.get_run(run_id).status == "completed"
        assert replayable.verify_run(store, run_id).ok
    finally:
        settings.writer = before
        blocker.close()
        store.close()
