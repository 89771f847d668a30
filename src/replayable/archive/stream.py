"""``replayable compactor``: move records from a JetStream stream into the sink store.

Every compactor of a stream pulls from one durable consumer (``compactor`` by
default) on the stream's work queue, so the server hands each message to one
of them and adding a process adds throughput. A compactor fetches up to
``batch`` messages, writes their records to the sink in one ``append`` (COPY
on PostgreSQL) and acknowledges them only once the sink committed. A message
that is not acknowledged (a compactor killed, a sink down) is delivered again
after the consumer's ack wait.

Exactly once: the sink holds each record once (UNIQUE (run_id, seq), one
start and one end per run). A batch delivered again after its commit is
refused by the sink as a duplicate; the compactor then drops what the sink
holds already and writes the rest, and acknowledges everything. The records
are the writer's, hash chain and all: the compactor never builds or links.

A run's start is written before its events and its end: an event whose run the
sink does not hold yet (its start on its way through another compactor) is
handed back to the stream (``nak`` with a delay) and comes again.

Each compactor reports what it does into the ``<stream>_compactors`` key-value
bucket, which ``replayable status`` reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import orjson

from replayable.errors import AppendOnlyError, ConfigurationError, RunNotFoundError, StoreError
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store.base import EventStore
from replayable.store.stream import StreamStore, decode, ensure_stream, parse_stream_url

__all__ = ["Compactor", "CompactorReport", "compactor_states", "stream_state"]

log = logging.getLogger("replayable.compactor")

DEFAULT_CONSUMER: Final = "compactor"
#: How long a delivered message may stay unacknowledged before it goes to another.
ACK_WAIT_S: Final = 30.0
#: How long a record whose run's start is not in the sink yet waits to come again.
RETRY_DELAY_S: Final = 0.5
#: Run ids a compactor remembers as started in the sink (cleared when full).
_KNOWN_CAP: Final = 200_000
#: Seconds between reports to the status bucket.
REPORT_EVERY_S: Final = 2.0


@dataclass
class CompactorReport:
    """What one compactor has done, as ``replayable status`` shows it."""

    name: str
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    started_at: float = field(default_factory=time.time)
    batches: int = 0
    records: int = 0
    skipped: int = 0
    deferred: int = 0
    rejected: int = 0
    in_flight: int = 0
    #: When the oldest record this compactor holds unacknowledged was published.
    oldest_in_flight: float | None = None
    last_commit_at: float | None = None
    last_error: str | None = None
    reported_at: float = 0.0


def bucket_name(stream: str) -> str:
    return f"{stream}_compactors"


class Compactor:
    """One compactor process's work: fetch, write to the sink, acknowledge."""

    def __init__(
        self,
        source: str,
        sink: EventStore | str | None = None,
        *,
        consumer: str = DEFAULT_CONSUMER,
        batch: int = 2048,
        name: str | None = None,
        archive: str | None = None,
        archive_every: float = 60.0,
        archive_after: float = 0.0,
        opener: Callable[[str], EventStore] | None = None,
        ack_wait: float = ACK_WAIT_S,
    ) -> None:
        self.config, sink_url, options = parse_stream_url(
            source if "sink=" in source else source + "&sink=" + _sink_url(sink)
        )
        if batch < 1:
            raise ConfigurationError(f"batch must be at least 1, not {batch}")
        #: Whether the sink was opened here (and is closed when ``run`` returns).
        self.owns_sink = not isinstance(sink, EventStore)
        if isinstance(sink, EventStore):
            self.sink = sink
        else:
            from replayable.store import open_store

            self.sink = (opener or open_store)(sink if isinstance(sink, str) else sink_url)
        if isinstance(self.sink, StreamStore):
            raise ConfigurationError("a compactor's sink cannot be a stream")
        if not ack_wait > 0:
            raise ConfigurationError(f"ack_wait must be positive seconds, not {ack_wait!r}")
        self.consumer = consumer
        self.batch = batch
        self.ack_wait = ack_wait
        self.archive = archive or options.get("archive")
        self.archive_every = archive_every
        self.archive_after = archive_after
        self.report = CompactorReport(name or f"{socket.gethostname()}-{os.getpid()}")
        self._known: set[str] = set()
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None
        self._kv: Any = None
        self._last_archive = time.monotonic()

    # -- running --------------------------------------------------------------------

    def run(
        self,
        *,
        until_idle: float | None = None,
        max_seconds: float | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> CompactorReport:
        """Compact until ``stop()`` says so, the stream was empty for ``until_idle``
        seconds, or ``max_seconds`` passed; returns what was done."""
        try:
            return asyncio.run(self._run(until_idle, max_seconds, stop))
        finally:
            if self.owns_sink:
                self.sink.close()

    async def _run(
        self,
        until_idle: float | None,
        max_seconds: float | None,
        stop: Callable[[], bool] | None,
    ) -> CompactorReport:
        await self._connect()
        t0 = time.monotonic()
        idle_since = time.monotonic()
        try:
            while True:
                if stop is not None and stop():
                    break
                if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                    break
                done = await self.step(1.0 if until_idle is None else min(1.0, until_idle))
                now = time.monotonic()
                if done:
                    idle_since = now
                elif until_idle is not None and now - idle_since >= until_idle:
                    break
                if self.archive and (not done or now - self._last_archive > self.archive_every):
                    await self._archive_now()
                await self._maybe_report()
        finally:
            await self._maybe_report(force=True, final=True)
            await self._close()
        return self.report

    async def _connect(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = self.config
        self._nc = await nats.connect(cfg.server, connect_timeout=2, name="replayable-compactor")
        self._js = self._nc.jetstream(timeout=cfg.timeout)
        # Made by whichever compactor comes first; the same config makes no change.
        await ensure_stream(self._js, cfg)
        self._sub = await self._js.pull_subscribe(
            f"{cfg.prefix}.>",
            durable=self.consumer,
            stream=cfg.stream,
            config=ConsumerConfig(
                durable_name=self.consumer,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=self.ack_wait,
                max_ack_pending=max(20_000, 4 * self.batch),
                max_deliver=-1,
            ),
        )
        try:
            self._kv = await self._js.create_key_value(
                bucket=bucket_name(cfg.stream), ttl=30, history=1
            )
        except Exception as exc:  # status is a report, never a reason to stop compacting
            log.warning("replayable: compactor status bucket unavailable: %s", exc)

    async def _close(self) -> None:
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.close(), 5)
            except Exception:
                pass
            self._nc = None

    async def step(self, wait: float = 1.0) -> int:
        """Fetch one batch (waiting at most ``wait`` seconds for one) and compact it; how
        many messages it settled (0: none came)."""
        from nats.errors import TimeoutError as NatsTimeout

        try:
            msgs = await self._sub.fetch(self.batch, timeout=wait)
        except (TimeoutError, NatsTimeout):
            return 0
        if not msgs:
            return 0
        self.report.in_flight = len(msgs)
        self.report.oldest_in_flight = min(
            (m.metadata.timestamp.timestamp() for m in msgs if m.metadata.timestamp),
            default=None,
        )
        try:
            await self._compact(msgs)
        except StoreError as exc:
            # The sink is down or refused: nothing is acknowledged, so the messages
            # come again after the ack wait (or at once, handed back now).
            self.report.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("replayable: compactor: %s", exc)
            await asyncio.gather(*(m.nak(delay=1.0) for m in msgs), return_exceptions=True)
            await asyncio.sleep(1.0)
            return len(msgs)
        finally:
            self.report.in_flight = 0
            self.report.oldest_in_flight = None
        return len(msgs)

    async def _compact(self, msgs: Sequence[Any]) -> None:
        starts: list[tuple[Any, RunStart]] = []
        events: list[tuple[Any, Event]] = []
        ends: list[tuple[Any, RunEnd]] = []
        blobs: list[tuple[Any, tuple[str, bytes]]] = []
        settle: list[Any] = []
        for msg in msgs:
            try:
                kind, record = decode(msg.data)
            except ConfigurationError as exc:
                # Data, never a command: a message that is no record is reported and
                # taken off the queue (it can never be stored).
                log.error(
                    "replayable: compactor: stream %s message %s on %s is refused: %s",
                    self.config.stream, msg.metadata.sequence.stream, msg.subject, exc,
                )  # fmt: skip
                self.report.rejected += 1
                await msg.term()
                continue
            if kind == "s":
                starts.append((msg, record))
            elif kind == "e":
                events.append((msg, record))
            elif kind == "x":
                ends.append((msg, record))
            else:
                blobs.append((msg, record))
        # Runs the sink must hold a start for before their events and ends go in.
        batch_starts = {s.run_id for _, s in starts}
        needed = {e.run_id for _, e in events} | {x.run_id for _, x in ends}
        needed -= batch_starts | self._known
        if needed:
            found = await asyncio.to_thread(self._started, needed)
            self._remember(found)
            missing = needed - found
        else:
            missing = set()
        deferred = [m for m, e in events if e.run_id in missing]
        deferred += [m for m, x in ends if x.run_id in missing]
        events = [(m, r) for m, r in events if r.run_id not in missing]
        ends = [(m, r) for m, r in ends if r.run_id not in missing]
        written = await asyncio.to_thread(
            self._write,
            [b for _, b in blobs],
            [s for _, s in starts],
            [e for _, e in events],
            [x for _, x in ends],
        )
        self._remember(batch_starts)
        settle = [m for m, _ in (*blobs, *starts, *events, *ends)]
        await asyncio.gather(*(m.ack() for m in settle))
        if deferred:
            self.report.deferred += len(deferred)
            await asyncio.gather(*(m.nak(delay=RETRY_DELAY_S) for m in deferred))
        await self._nc.flush(timeout=self.config.timeout)
        self.report.batches += 1
        self.report.records += written
        self.report.skipped += len(settle) - written - len(blobs)
        self.report.last_commit_at = time.time()
        self.report.last_error = None

    def _remember(self, run_ids: set[str]) -> None:
        if len(self._known) + len(run_ids) > _KNOWN_CAP:
            self._known.clear()
        self._known |= run_ids

    # -- the sink (on a worker thread) ---------------------------------------------------

    def _write(
        self,
        blobs: list[tuple[str, bytes]],
        starts: list[RunStart],
        events: list[Event],
        ends: list[RunEnd],
    ) -> int:
        """Write the records the sink does not hold yet; how many were written."""
        for digest, data in blobs:
            self.sink.put_blob(digest, data)
        if not (starts or events or ends):
            return 0
        try:
            self.sink.append(starts, events, ends, durable=True)
            return len(starts) + len(events) + len(ends)
        except AppendOnlyError:
            pass  # some were committed before (a batch delivered again): write the rest
        starts, events, ends = self._unstored(starts, events, ends)
        if starts or events or ends:
            self.sink.append(starts, events, ends, durable=True)
        return len(starts) + len(events) + len(ends)

    def _started(self, run_ids: set[str]) -> set[str]:
        """Which of ``run_ids`` the sink holds a start for."""
        pg = _pg(self.sink)
        if pg is not None:
            rows = pg.query(
                "SELECT run_id::text FROM runs WHERE run_id = ANY(%s::uuid[])", (sorted(run_ids),)
            )
            return {str(r[0]) for r in rows}
        found: set[str] = set()
        for run_id in run_ids:
            try:
                self.sink.get_run(run_id)
            except RunNotFoundError:
                continue
            found.add(run_id)
        return found

    def _unstored(
        self, starts: list[RunStart], events: list[Event], ends: list[RunEnd]
    ) -> tuple[list[RunStart], list[Event], list[RunEnd]]:
        """The records of a batch the sink does not hold."""
        ids = sorted(
            {s.run_id for s in starts} | {e.run_id for e in events} | {x.run_id for x in ends}
        )
        pg = _pg(self.sink)
        if pg is not None:
            have_start = {str(r[0]) for r in pg.query(
                "SELECT run_id::text FROM runs WHERE run_id = ANY(%s::uuid[])", (ids,)
            )}  # fmt: skip
            have_end = {str(r[0]) for r in pg.query(
                "SELECT run_id::text FROM run_ends WHERE run_id = ANY(%s::uuid[])", (ids,)
            )}  # fmt: skip
            pairs = pg.query(
                "SELECT run_id::text, sequence FROM agent_execution_events "
                "WHERE (run_id, sequence) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))",
                ([e.run_id for e in events], [e.seq for e in events]),
            )
            have_event = {(str(r), int(s)) for r, s in pairs}
        else:
            have_start, have_end, have_event = set(), set(), set()
            for run_id in ids:
                try:
                    run = self.sink.get_run(run_id)
                except RunNotFoundError:
                    continue
                have_start.add(run_id)
                if run.end is not None:
                    have_end.add(run_id)
                have_event |= {(run_id, e.seq) for e in self.sink.events(run_id)}
        return (
            [s for s in starts if s.run_id not in have_start],
            [e for e in events if (e.run_id, e.seq) not in have_event],
            [x for x in ends if x.run_id not in have_end],
        )

    # -- archive and status ------------------------------------------------------------

    async def _archive_now(self) -> None:
        from replayable.archive.parquet import archive

        self._last_archive = time.monotonic()
        dest = self.archive
        assert dest is not None
        try:
            await asyncio.to_thread(archive, self.sink, dest, older_than=self.archive_after)
        except Exception as exc:
            self.report.last_error = f"archive: {exc}"
            log.warning("replayable: compactor: archiving to %s failed: %s", dest, exc)

    async def _maybe_report(self, force: bool = False, final: bool = False) -> None:
        if self._kv is None:
            return
        now = time.time()
        if not force and now - self.report.reported_at < REPORT_EVERY_S:
            return
        self.report.reported_at = now
        try:
            if final:
                await self._kv.delete(_key(self.report.name))
            else:
                await self._kv.put(_key(self.report.name), orjson.dumps(asdict(self.report)))
        except Exception as exc:
            log.debug("replayable: compactor status not reported: %s", exc)


def _key(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _sink_url(sink: EventStore | str | None) -> str:
    if sink is None:
        raise ConfigurationError(
            "a compactor needs a sink: --sink postgresql://… or &sink= in the source"
        )
    return sink if isinstance(sink, str) else sink.connect_url()


def _pg(store: EventStore) -> Any:
    """The store if it is a PostgreSQL one (which answers the batched existence queries)."""
    if type(store).__name__ == "PostgresStore" and hasattr(store, "query"):
        return store
    return None


# -- what ``replayable status`` reads ---------------------------------------------------


def stream_state(source: str, consumer: str = DEFAULT_CONSUMER) -> dict[str, Any]:
    """The stream's depth, the consumer's lag and the compactors' reports."""
    return asyncio.run(_stream_state(source, consumer))


async def _stream_state(source: str, consumer: str) -> dict[str, Any]:
    import nats
    from nats.js.errors import NotFoundError

    cfg, _, _ = parse_stream_url(source if "sink=" in source else source + "&sink=memory://")
    nc = await nats.connect(cfg.server, connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=cfg.timeout)
        try:
            info = await js.stream_info(cfg.stream)
        except NotFoundError:
            raise StoreError(f"no stream {cfg.stream} on {cfg.server}") from None
        state = info.state
        oldest: float | None = None
        if state.messages:
            # A work queue holds what is not acknowledged yet: its first message is the
            # oldest record no compactor has committed.
            try:
                first = await js.get_msg(cfg.stream, seq=state.first_seq, next=True)
                oldest = _ts(first.time)
            except NotFoundError:
                pass
        out: dict[str, Any] = {
            "stream": cfg.stream,
            "server": cfg.server,
            "depth": state.messages,
            "bytes": state.bytes,
            "oldest_at": oldest,
            "consumer": consumer,
            "lag": None,
            "unacknowledged": None,
            "redelivered": None,
            "published": state.last_seq,
            "deliveries": None,
            "compactors": await compactor_states(js, cfg.stream),
        }
        try:
            ci = await js.consumer_info(cfg.stream, consumer)
        except NotFoundError:
            pass
        else:
            out["lag"] = ci.num_pending
            out["unacknowledged"] = ci.num_ack_pending
            out["redelivered"] = ci.num_redelivered
            # Every delivery, first or again (a batch a killed compactor held, a record
            # handed back until its run's start is stored).
            out["deliveries"] = ci.delivered.consumer_seq if ci.delivered else None
        return out
    finally:
        await nc.close()


async def compactor_states(js: Any, stream: str) -> list[dict[str, Any]]:
    """The latest report of each running compactor of ``stream``."""
    from nats.js.errors import BucketNotFoundError, NoKeysError

    try:
        kv = await js.key_value(bucket_name(stream))
    except BucketNotFoundError:
        return []
    try:
        keys = await kv.keys()
    except NoKeysError:
        return []
    found: list[dict[str, Any]] = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except Exception:
            continue
        if entry.value:
            try:
                found.append(orjson.loads(entry.value))
            except orjson.JSONDecodeError:
                continue
    return sorted(found, key=lambda r: str(r.get("name")))


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    import datetime as dt

    text = str(value)
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        # A fraction finer than microseconds: the seconds are enough for an age.
        head = text.partition(".")[0]
        return dt.datetime.fromisoformat(head + "+00:00").timestamp()
