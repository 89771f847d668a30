"""``replayable compactor``: move records from a JetStream stream into the sink store.

Every compactor of a stream pulls from one durable consumer (``compactor`` by
default) on the stream's work queue, so the server hands each message to one
of them and adding a process adds throughput. A compactor fetches up to
``batch`` messages, as many as make ``fetch_bytes`` at the size of the latest
(a message is a frame of one run's records, or one record in a stream written
before frames), writes their
records to the sink in one ``append`` (COPY on PostgreSQL) and acknowledges the
messages only once the sink committed. A message
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
import gc
import itertools
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import msgspec
import orjson

from replayable.errors import AppendOnlyError, ConfigurationError, RunNotFoundError, StoreError
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store.base import EventStore
from replayable.store.stream import StreamStore, decode, ensure_stream, parse_stream_url
from replayable.store.stream._cipher import SEALED, SealedMessageError, stream_cipher
from replayable.store.stream._wire import decode_event, decode_frame, unpacked, unpacked_size

__all__ = ["Compactor", "CompactorReport", "compactor_states", "stream_state"]

log = logging.getLogger("replayable.compactor")

DEFAULT_CONSUMER: Final = "compactor"
#: How long a delivered message may stay unacknowledged before it goes to another.
ACK_WAIT_S: Final = 30.0
#: How long a record whose run's start is not in the sink yet waits to come again.
RETRY_DELAY_S: Final = 0.5
#: A sealed message no key here opens comes back this much later (another compactor,
#: or this one once its key is configured, takes it meanwhile).
SEALED_RETRY_S: Final = 10.0
#: Run ids a compactor remembers as started in the sink (cleared when full).
_KNOWN_CAP: Final = 200_000
#: The control line of a delivery: ``HMSG <subject> <sid> <reply> <header bytes> <bytes>``.
_DELIVERY: Final = re.compile(rb"HMSG ([^ \r\n]+) [^ \r\n]+ ([^ \r\n]+) (\d+) (\d+)\r\n")
#: The message bytes one fetch aims at: with frames of about a megabyte, four of them
#: to a sink write. A fetch asks for as many messages as that makes at the size of
#: the latest ones (a frame, or a record written before frames).
FETCH_BYTES: Final = 4 << 20
#: How far past ``fetch_bytes`` one fetch may go when message sizes jump (the bound
#: the server enforces: rarely reached, since the count is the bound as a rule).
FETCH_BYTES_CAP: Final = 16
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
    #: Sealed messages no configured key opens here: left in the stream, not stored;
    #: and why, for the last of them.
    sealed: int = 0
    sealed_error: str | None = None
    in_flight: int = 0
    #: When the oldest record this compactor holds unacknowledged was published.
    oldest_in_flight: float | None = None
    #: When the first batch arrived, and when the last was committed.
    first_batch_at: float | None = None
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
        fetch_bytes: int = FETCH_BYTES,
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
        if fetch_bytes < 1:
            raise ConfigurationError(f"fetch_bytes must be at least 1, not {fetch_bytes}")
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
        self.fetch_bytes = fetch_bytes
        self.ack_wait = ack_wait
        self.archive = archive or options.get("archive")
        self.archive_every = archive_every
        self.archive_after = archive_after
        self.report = CompactorReport(name or f"{socket.gethostname()}-{os.getpid()}")
        #: Opens sealed messages (see :mod:`replayable.store.stream._cipher`).
        self.cipher = stream_cipher()
        self._known: set[str] = set()
        #: The size the next fetch's messages are reckoned at (see ``_fetch_count``).
        self._msg_bytes = 1 << 20
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None
        self._kv: Any = None
        self._last_archive = time.monotonic()
        self._flushing: asyncio.Future[None] | None = None
        #: The one thread that writes to the sink, batch after batch in stream order.
        self._sink_thread: ThreadPoolExecutor | None = None
        #: When the sink last failed a batch (the next waits a second from then).
        self._failed_at: float | None = None

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
        # What a compactor allocates is batches of records, short-lived and never part
        # of a cycle: with the collector's default threshold it ran every few hundred
        # records and took a seventh of the process's time. Everything alive before the
        # run is kept out of its way, as in the writer's process; both are undone after.
        threshold = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(threshold[0], 10_000), *threshold[1:])
        try:
            return asyncio.run(self._run(until_idle, max_seconds, stop))
        finally:
            gc.set_threshold(*threshold)
            gc.unfreeze()
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
        wait = 1.0 if until_idle is None else min(1.0, until_idle)
        # The next batch is fetched while the sink writes this one.
        fetching: asyncio.Task[list[Any]] | None = asyncio.ensure_future(
            self._sub.pull(self._fetch_count(), wait)
        )
        # The batch before, being written to the sink and then acknowledged.
        writing: asyncio.Future[None] | None = None
        try:
            while True:
                assert fetching is not None
                msgs = await fetching
                fetching = None
                if (stop is not None and stop()) or (
                    max_seconds is not None and time.monotonic() - t0 > max_seconds
                ):
                    await self._sub.nak(msgs, 0.0)  # to another compactor at once
                    break
                if msgs:
                    self._sized(msgs)
                    fetching = asyncio.ensure_future(self._sub.pull(self._fetch_count(), 0.0))
                    batch = await self._prepare(msgs)
                    # Queued to the sink's thread at once: it starts this batch the
                    # moment the one before committed, without waiting for this loop
                    # to settle that one (acknowledging is off the sink's path).
                    stored = self._submit(batch)
                    if writing is not None:
                        await writing
                    writing = asyncio.ensure_future(self._settle(batch, stored))
                    idle_since = time.monotonic()
                elif writing is not None:
                    await writing
                    writing = None
                now = time.monotonic()
                if not msgs and until_idle is not None and now - idle_since >= until_idle:
                    break
                if self.archive and (not msgs or now - self._last_archive > self.archive_every):
                    await self._archive_now()
                await self._maybe_report()
                if fetching is None:
                    fetching = asyncio.ensure_future(self._sub.pull(self._fetch_count(), wait))
        finally:
            if writing is not None:
                try:
                    await writing
                except Exception:
                    log.exception("replayable: compactor: the last batch failed")
            if self._flushing is not None:
                try:
                    await self._flushing
                except Exception:
                    pass
                self._flushing = None
            if fetching is not None:
                try:
                    await self._sub.nak(await fetching, 0.0)
                except Exception:
                    pass
            await self._maybe_report(force=True, final=True)
            await self._close()
            if self._sink_thread is not None:
                self._sink_thread.shutdown(wait=True)
                self._sink_thread = None
        return self.report

    async def _connect(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = self.config
        self._nc = await nats.connect(cfg.server, connect_timeout=2, name="replayable-compactor")
        self._js = self._nc.jetstream(timeout=cfg.timeout)
        # Made by whichever compactor comes first; the same config makes no change.
        await ensure_stream(self._js, cfg)
        await self._js.add_consumer(
            cfg.stream,
            ConsumerConfig(
                durable_name=self.consumer,
                filter_subject=f"{cfg.prefix}.>",
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=self.ack_wait,
                max_ack_pending=max(20_000, 4 * self.batch),
                max_deliver=-1,
            ),
        )
        # Deliveries and acks on a connection of their own: a lean reader of the NATS
        # protocol where the server asks for no TLS and no login, else nats-py's with
        # only the status line of each message read.
        host, _, port = cfg.server.removeprefix("nats://").rpartition(":")
        puller: _RawPuller | _Puller = _RawPuller(
            host, int(port), cfg.stream, self.consumer, cfg.timeout
        )
        try:
            await puller.start()
        except _NeedsClient:
            data = await nats.connect(cfg.server, connect_timeout=2, name="replayable-compactor")
            if hasattr(data, "_process_headers"):
                data._process_headers = _status_only  # type: ignore[method-assign]
            puller = _Puller(data, cfg.stream, self.consumer, cfg.timeout)
            await puller.start()
        # The server's bound only holds a fetch when message sizes jump: nats-server 2.9
        # leaves a redelivered message that meets the bound unsent yet pending, until
        # its ack wait (and then delivers it twice), so the count is the bound as a
        # rule. Never under what one message may be: a request whose bound its next
        # message exceeds would get none, every time.
        puller.max_bytes = max(self.fetch_bytes * FETCH_BYTES_CAP, 2 * puller.max_payload)
        self._msg_bytes = puller.max_payload
        self._sub = puller
        try:
            self._kv = await self._js.create_key_value(
                bucket=bucket_name(cfg.stream), ttl=30, history=1
            )
        except Exception as exc:  # status is a report, never a reason to stop compacting
            log.warning("replayable: compactor status bucket unavailable: %s", exc)

    def _fetch_count(self) -> int:
        """How many messages the next fetch asks for: ``fetch_bytes`` at the size of the
        latest messages, at most ``batch``."""
        return max(1, min(self.batch, self.fetch_bytes // max(1, self._msg_bytes)))

    def _sized(self, msgs: Sequence[Any]) -> None:
        """Take the size of a fetch's messages, a compressed frame's unpacked: up to the
        largest at once, down by half a fetch (a burst of small ones after large ones
        widens the fetches slowly)."""
        largest = max(unpacked_size(m.data) for m in msgs)
        self._msg_bytes = (
            largest if largest >= self._msg_bytes else max(largest, self._msg_bytes // 2)
        )

    async def _close(self) -> None:
        if self._sub is not None:
            try:
                await asyncio.wait_for(self._sub.close(), 5)
            except Exception:
                pass
            self._sub = None
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.close(), 5)
            except Exception:
                pass
            self._nc = None

    async def step(self, msgs: list[Any]) -> int:
        """Compact one fetched batch; how many messages it settled."""
        await self._settle(await self._prepare(msgs))
        return len(msgs)

    async def _prepare(self, msgs: list[Any]) -> _Batch:
        """Decode a fetched batch (while the sink may still write the one before)."""
        batch = _Batch(msgs)
        events = batch.events
        for msg in msgs:
            data = msg.data
            head = data[:1]
            if head == SEALED:
                try:
                    data = unpacked(data, self.cipher)
                except SealedMessageError as exc:
                    # Not ours to drop: a compactor started without the key leaves it in
                    # the stream for one that has it, and says so (in its log, once for
                    # each key, and in its status).
                    why = str(exc)
                    if why != self.report.sealed_error:
                        log.error(
                            "replayable: compactor: stream %s message %s on %s and others "
                            "like it are left in the stream: %s", self.config.stream,
                            _stream_seq(msg.reply), _text(msg.subject), why,
                        )  # fmt: skip
                    self.report.sealed += 1
                    self.report.sealed_error = why
                    batch.rejected.add(id(msg))
                    await self._sub.nak([msg], SEALED_RETRY_S)
                    continue
                except ConfigurationError:
                    pass  # `decode` below names what is wrong, and the message is refused
                head = data[:1]
            # Nearly every message is a frame of one run's records (or, written before
            # frames, one event): decoded straight into the record types (the decoders
            # `decode` uses); anything else, or a message that does not decode, goes
            # through `decode`, which names what is wrong.
            if head == b"z":  # a compressed frame (one that does not unpack: below)
                try:
                    data = unpacked(data)
                    head = b"f"
                except ConfigurationError:
                    pass
            if head == b"f":
                try:
                    frame = decode_frame(memoryview(data)[1:])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    pass
                else:
                    if frame.starts:
                        batch.starts += [(msg, r) for r in frame.starts]
                    events += [(msg, r) for r in frame.events]
                    if frame.ends:
                        batch.ends += [(msg, r) for r in frame.ends]
                    continue
            elif head == b"e":
                try:
                    events.append((msg, decode_event(memoryview(data)[1:])))
                    continue
                except (msgspec.DecodeError, msgspec.ValidationError):
                    pass
            try:
                kind, record = decode(data, self.cipher)
            except ConfigurationError as exc:
                # Data, never a command: a message that is no record is reported and
                # taken off the queue (it can never be stored).
                log.error(
                    "replayable: compactor: stream %s message %s on %s is refused: %s",
                    self.config.stream, _stream_seq(msg.reply), _text(msg.subject), exc,
                )  # fmt: skip
                self.report.rejected += 1
                batch.rejected.add(id(msg))
                await self._sub.term([msg])
                continue
            if kind == "f":  # not reached: a frame that decodes is taken above
                events += [(msg, r) for r in record.events]
            elif kind == "e":
                events.append((msg, record))
            elif kind == "s":
                batch.starts.append((msg, record))
            elif kind == "x":
                batch.ends.append((msg, record))
            else:
                batch.blobs.append((msg, record))
        return batch

    def _submit(self, batch: _Batch) -> asyncio.Future[tuple[int, list[Any]]]:
        """Queue a decoded batch to the sink's thread; its (written, deferred) to come."""
        if self.report.first_batch_at is None:
            self.report.first_batch_at = time.time()
        if self._sink_thread is None:
            self._sink_thread = ThreadPoolExecutor(1, thread_name_prefix="replayable-sink")
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._sink_thread, self._store_paced, batch)

    def _store_paced(self, batch: _Batch) -> tuple[int, list[Any]]:
        """:meth:`_store`, a second after the sink last failed (a sink that is down is
        not asked again at once by every batch already fetched)."""
        if self._failed_at is not None:
            pause = self._failed_at + 1.0 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        try:
            found = self._store(batch)
        except BaseException:
            self._failed_at = time.monotonic()
            raise
        self._failed_at = None
        return found

    async def _settle(
        self, batch: _Batch, stored: asyncio.Future[tuple[int, list[Any]]] | None = None
    ) -> None:
        """Wait for a decoded batch's write to the sink, then acknowledge it; one at a
        time, in order."""
        msgs = batch.msgs
        if stored is None:
            stored = self._submit(batch)
        self.report.in_flight = batch.size()
        # In stream order: the first is the oldest.
        self.report.oldest_in_flight = _published_at(msgs[0].reply) if msgs else None
        try:
            written, deferred = await stored
        except Exception as exc:
            # The sink is down or refused: nothing is acknowledged; the messages are
            # handed back to come again (to this compactor or another) in a second.
            # A batch the sink refuses for good comes back too, its error in `status`.
            self.report.last_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, StoreError):
                log.warning("replayable: compactor: %s", exc)
            else:
                log.exception("replayable: compactor: the sink refused a batch")
            await self._sub.nak(msgs, 1.0)
            return
        finally:
            self.report.in_flight = 0
            self.report.oldest_in_flight = None

        def held() -> Iterator[tuple[Any, Any]]:
            return itertools.chain(batch.starts, batch.events, batch.ends)

        # A message is settled once: a frame holds many records, and a message any of
        # whose records waits or is refused waits or is refused whole (those of its
        # records written already are skipped as stored when it comes again).
        if batch.refused:
            # Taken off the queue: no write can ever store them.
            refused = _unique(batch.refused)
            await self._sub.term(refused)
            gone = {id(m) for m in refused}
            self.report.rejected += sum(1 for m, _ in held() if id(m) in gone)
            deferred = [m for m in deferred if id(m) not in gone]
        deferred = _unique(deferred)
        back = {id(m) for m in deferred}
        later = back | {id(m) for m in batch.refused}
        later |= batch.rejected
        settle = [m for m in batch.msgs if id(m) not in later]
        settled = (
            batch.size() - len(batch.blobs)
            if not later
            else sum(1 for m, _ in held() if id(m) not in later)
        )
        await self._sub.ack(settle)
        if deferred:
            self.report.deferred += sum(1 for m, _ in held() if id(m) in back)
            await self._sub.nak(deferred, RETRY_DELAY_S)
        # That the acks reached the server is confirmed off the batches' path (a lost ack
        # only brings the batch again, skipped as stored): before the next batch's.
        if self._flushing is not None:
            await self._flushing
        self._flushing = asyncio.ensure_future(self._sub.flush())
        self.report.batches += 1
        self.report.records += written
        self.report.skipped += settled - written
        self.report.last_commit_at = time.time()
        self.report.last_error = None

    def _store(self, batch: _Batch) -> tuple[int, list[Any]]:
        """On the sink's thread: hold back what waits for its run's start, write the rest;
        (records written, messages to hand back)."""
        starts, events, ends = batch.starts, batch.events, batch.ends
        # Runs the sink must hold a start for before their events and ends go in.
        batch_starts = {s.run_id for _, s in starts}
        needed = {e.run_id for _, e in events} | {x.run_id for _, x in ends}
        needed -= batch_starts | self._known
        missing: set[str] = set()
        if needed:
            found = self._started(needed)
            self._remember(found)
            missing = needed - found
        deferred = [m for m, e in events if e.run_id in missing]
        deferred += [m for m, x in ends if x.run_id in missing]
        if missing:
            events = [(m, r) for m, r in events if r.run_id not in missing]
            ends = [(m, r) for m, r in ends if r.run_id not in missing]
        try:
            written = self._write(
                [b for _, b in batch.blobs],
                [s for _, s in starts],
                [e for _, e in events],
                [x for _, x in ends],
            )
        except ConfigurationError:
            # A record the sink can never take (a run id that is no UUID, a tenant the
            # sink does not write for) must not hold the others back: run by run.
            written, refused = self._write_runs(batch, starts, events, ends)
            deferred += refused
            batch.refused = refused
        self._remember(batch_starts)
        return written, deferred

    def _write_runs(
        self,
        batch: _Batch,
        starts: list[tuple[Any, RunStart]],
        events: list[tuple[Any, Event]],
        ends: list[tuple[Any, RunEnd]],
    ) -> tuple[int, list[Any]]:
        """Write each run's records on their own; (written, messages of refused runs)."""
        self._write([b for _, b in batch.blobs], [], [], [])
        runs: dict[str, tuple[list[Any], list[Any], list[Any]]] = {}
        for m, st in starts:
            runs.setdefault(st.run_id, ([], [], []))[0].append((m, st))
        for m, e in events:
            runs.setdefault(e.run_id, ([], [], []))[1].append((m, e))
        for m, x in ends:
            runs.setdefault(x.run_id, ([], [], []))[2].append((m, x))
        written = 0
        refused: list[Any] = []
        for run_id, (rs, re_, rx) in runs.items():
            try:
                written += self._write(
                    [], [r for _, r in rs], [r for _, r in re_], [r for _, r in rx]
                )
            except ConfigurationError as exc:
                log.error(
                    "replayable: compactor: the sink refuses run %r for good, %d record(s) "
                    "taken off stream %s: %s",
                    run_id, len(rs) + len(re_) + len(rx), self.config.stream, exc,
                )  # fmt: skip
                refused += [m for m, _ in (*rs, *re_, *rx)]
        return written, refused

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
        # A record twice in one batch (two frames of it, a spool drained after the
        # server's duplicate window) goes in once, the first time it came.
        out_starts: list[RunStart] = []
        for s in starts:
            if s.run_id not in have_start:
                have_start.add(s.run_id)
                out_starts.append(s)
        out_events: list[Event] = []
        for e in events:
            if (e.run_id, e.seq) not in have_event:
                have_event.add((e.run_id, e.seq))
                out_events.append(e)
        out_ends: list[RunEnd] = []
        for x in ends:
            if x.run_id not in have_end:
                have_end.add(x.run_id)
                out_ends.append(x)
        return out_starts, out_events, out_ends

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


class _Puller:
    """Pull requests of one durable consumer, answered on an inbox of this connection.

    nats-py's ``fetch`` waits for each message with a timer of its own and acks
    with a coroutine per message; here a batch arrives through one subscription
    callback and is acknowledged in one write of ``PUB`` frames.
    """

    def __init__(self, nc: Any, stream: str, consumer: str, timeout: float) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.prefix = f"{nc.new_inbox()}." if nc is not None else ""
        self.timeout = timeout
        self.got: list[Any] = []
        #: The most bytes one pull request is answered with (0: no bound).
        self.max_bytes = 0
        #: The most bytes a message may have on this server.
        self.max_payload = 1 << 20
        self.want = 0
        self.current = ""
        self.answered = asyncio.Event()
        self._n = 0

    async def start(self) -> None:
        self.max_payload = int(getattr(self.nc, "max_payload", 0) or self.max_payload)
        await self.nc.subscribe(self.prefix + "*", cb=self._on)

    async def _on(self, msg: Any) -> None:
        if msg.reply:  # a delivery (perhaps of an earlier request: still ours to settle)
            self.got.append(msg)
            if len(self.got) >= self.want:
                self.answered.set()
        elif msg.subject == self.current:  # a status: no more for this request
            self.answered.set()

    async def pull(self, n: int, wait: float) -> list[Any]:
        """Up to ``n`` messages: what is there now, else the first to come within ``wait``
        seconds and what is there with it."""
        taken = await self._request(n, None)
        if not taken and wait > 0:
            taken = await self._request(1, wait)
            if taken:
                taken += await self._request(n - len(taken), None)
        return taken

    async def _request(self, n: int, wait: float | None) -> list[Any]:
        if n <= 0:
            return []
        self._n += 1
        self.current = f"{self.prefix}{self._n}"
        self.want = n
        self.answered.clear()
        body: dict[str, Any] = {"batch": n - len(self.got)}
        if self.max_bytes:
            body["max_bytes"] = self.max_bytes
        if wait is None:
            body["no_wait"] = True
        else:
            body["expires"] = int(wait * 1e9)
        if body["batch"] > 0:
            await self.nc.publish(self.subject, orjson.dumps(body), reply=self.current)
            try:
                await asyncio.wait_for(self.answered.wait(), (wait or 0.0) + self.timeout)
            except TimeoutError:
                pass
        taken, self.got = self.got, []
        return taken

    async def _reply(self, msgs: Sequence[Any], body: bytes) -> None:
        if not msgs:
            return
        frame = b" %d\r\n%s\r\n" % (len(body), body)
        send = getattr(self.nc, "_send_command", None)
        if send is None:
            for m in msgs:
                await self.nc.publish(m.reply, body)
            return
        await send(b"".join(b"PUB " + m.reply.encode() + frame for m in msgs))
        await self.nc._flush_pending()

    async def ack(self, msgs: Sequence[Any]) -> None:
        await self._reply(msgs, b"+ACK")

    async def nak(self, msgs: Sequence[Any], delay: float) -> None:
        body = b"-NAK" if delay <= 0 else b'-NAK {"delay": %d}' % int(delay * 1e9)
        await self._reply(msgs, body)

    async def term(self, msgs: Sequence[Any]) -> None:
        await self._reply(msgs, b"+TERM")

    async def flush(self) -> None:
        await self.nc.flush(timeout=self.timeout)

    async def close(self) -> None:
        await self.nc.close()


class _NeedsClient(Exception):
    """The server asks for TLS or a login: the full client is used."""


class _Delivery:
    __slots__ = ("data", "reply", "subject")

    def __init__(self, subject: bytes, reply: bytes, data: bytes) -> None:
        self.subject = subject
        self.reply = reply
        self.data = data


class _RawPuller(_Puller):
    """:class:`_Puller` over a plain NATS protocol connection of its own: frames are cut
    from the socket's bytes with ``find`` (a few microseconds a message, where nats-py's
    parser, message objects and queues took tens)."""

    def __init__(self, host: str, port: int, stream: str, consumer: str, timeout: float) -> None:
        import nats.nuid

        super().__init__(None, stream, consumer, timeout)
        self.host, self.port = host or "127.0.0.1", port
        self.prefix = f"_INBOX.{nats.nuid.NUID().next().decode()}."
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._pongs: list[asyncio.Future[None]] = []
        self.broken: BaseException | None = None
        #: The length of the incomplete frame :meth:`_frames` left (0: not known).
        self.need = 0

    async def start(self) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.timeout
        )
        line = await asyncio.wait_for(reader.readline(), self.timeout)
        info = orjson.loads(line[5:]) if line.startswith(b"INFO ") else {}
        if info.get("tls_required") or info.get("auth_required") or not info.get("headers"):
            writer.close()
            raise _NeedsClient
        self.max_payload = int(info.get("max_payload") or self.max_payload)
        connect = orjson.dumps(
            {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
             "protocol": 1, "lang": "python", "name": "replayable-compactor"}
        )  # fmt: skip
        self._writer = writer
        self._reading = asyncio.ensure_future(self._read(reader))
        writer.write(b"CONNECT %s\r\nSUB %s* 1\r\n" % (connect, self.prefix.encode()))
        await self.flush()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        # What is left of an incomplete frame, in pieces, and how many bytes that frame
        # needs whole (0: not known yet): a frame of a megabyte arrives in many reads,
        # and is put together once, not once a read.
        parts: list[bytes] = []
        have = 0
        try:
            while True:
                chunk = await reader.read(1 << 20)
                if not chunk:
                    raise ConnectionError("the NATS server closed the connection")
                if self.need and have + len(chunk) < self.need:
                    parts.append(chunk)
                    have += len(chunk)
                    continue
                rest = self._frames(b"".join((*parts, chunk)) if parts else chunk)
                parts = [rest] if rest else []
                have = len(rest)
        except (ConnectionError, OSError, ValueError) as exc:
            self.broken = exc
        finally:
            self.answered.set()
            for pong in self._pongs:
                if not pong.done():
                    pong.set_exception(ConnectionError(f"NATS connection lost: {self.broken}"))

    def _frames(self, buf: bytes) -> bytes:
        """Handle every whole frame in ``buf``; what is left of an incomplete one (and in
        ``need`` how long that one is, when its control line says)."""
        self.need = 0
        pos = 0
        find = buf.find
        delivery = _DELIVERY.match
        got = self.got
        try:
            while True:
                # A delivery (headers and a reply subject), nearly every frame: its
                # control line read in one match; anything else the general way below.
                m = delivery(buf, pos)
                if m is not None:
                    subject, reply, headers, total = m.groups()
                    body = m.end()
                    stop = body + int(total)
                    if len(buf) < stop + 2:
                        self.need = stop + 2 - pos
                        return buf[pos:]
                    got.append(_Delivery(subject, reply, buf[body + int(headers) : stop]))
                    pos = stop + 2
                    continue
                end = find(b"\r\n", pos)
                if end < 0:
                    return buf[pos:]
                op = buf[pos : pos + 4]
                if op == b"MSG " or op == b"HMSG":
                    parts = buf[pos:end].split(b" ")
                    total = int(parts[-1])
                    headers = int(parts[-2]) if op == b"HMSG" else 0
                    body = end + 2
                    if len(buf) < body + total + 2:
                        self.need = body + total + 2 - pos
                        return buf[pos:]
                    reply = parts[3] if len(parts) == (6 if op == b"HMSG" else 5) else b""
                    self._on_frame(parts[1], reply, buf[body + headers : body + total])
                    pos = body + total + 2
                    continue
                if op == b"PING":
                    assert self._writer is not None
                    self._writer.write(b"PONG\r\n")
                elif op == b"PONG":
                    if self._pongs:
                        pong = self._pongs.pop(0)
                        if not pong.done():
                            pong.set_result(None)
                elif op == b"-ERR":
                    log.warning("replayable: compactor: NATS said %s", buf[pos:end].decode())
                pos = end + 2
        finally:
            if got is self.got and len(got) >= self.want:
                self.answered.set()

    def _on_frame(self, subject: bytes, reply: bytes, data: bytes) -> None:
        if reply:  # a delivery (subject and reply stay bytes: the ack is written back)
            self.got.append(_Delivery(subject, reply, data))
            if len(self.got) >= self.want:
                self.answered.set()
        elif subject.decode() == self.current:  # a status: no more for this request
            self.answered.set()

    def _send(self, data: bytes) -> None:
        if self.broken is not None or self._writer is None:
            raise ConnectionError(f"NATS connection lost: {self.broken}")
        self._writer.write(data)

    async def _request(self, n: int, wait: float | None) -> list[Any]:
        if n <= 0:
            return []
        self._n += 1
        self.current = f"{self.prefix}{self._n}"
        self.want = n
        self.answered.clear()
        batch = n - len(self.got)
        if batch > 0:
            bound = b',"max_bytes":%d' % self.max_bytes if self.max_bytes else b""
            body = (
                b'{"batch":%d%s,"no_wait":true}' % (batch, bound)
                if wait is None
                else b'{"batch":%d%s,"expires":%d}' % (batch, bound, int(wait * 1e9))
            )
            self._send(
                b"PUB %s %s %d\r\n%s\r\n"
                % (self.subject.encode(), self.current.encode(), len(body), body)
            )
            try:
                await asyncio.wait_for(self.answered.wait(), (wait or 0.0) + self.timeout)
            except TimeoutError:
                pass
            if self.broken is not None:
                raise ConnectionError(f"NATS connection lost: {self.broken}")
        taken, self.got = self.got, []
        return taken

    async def _reply(self, msgs: Sequence[Any], body: bytes) -> None:
        if msgs:
            frame = b" %d\r\n%s\r\n" % (len(body), body)
            self._send(b"".join(b"PUB " + m.reply + frame for m in msgs))

    async def flush(self) -> None:
        pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)
        self._send(b"PING\r\n")
        assert self._writer is not None
        await self._writer.drain()
        await asyncio.wait_for(pong, self.timeout)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        if self._reading is not None:
            self._reading.cancel()
            try:
                await self._reading
            except (asyncio.CancelledError, Exception):
                pass


async def _status_only(headers: bytes | None) -> dict[str, str] | None:
    """A message's headers as far as the compactor reads them: the status of a control
    message (``NATS/1.0 404 No Messages``), nothing of a record's."""
    if not headers:
        return None
    line = headers[: headers.find(b"\r\n")]
    parts = line.split(b" ", 2)
    if len(parts) >= 2 and parts[1]:
        found = {"Status": parts[1].decode("ascii", "replace")}
        if len(parts) == 3:
            found["Description"] = parts[2].decode("utf-8", "replace")
        return found
    return None


def _ack_tokens(reply: str | bytes) -> list[str]:
    """The tokens of a JetStream ack subject, in the older layout
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>``)
    whichever the server sent (the newer one adds a domain and an account hash)."""
    text = reply.decode("ascii", "replace") if isinstance(reply, bytes) else reply
    tokens = text.split(".")
    return tokens if len(tokens) == 9 else ["$JS", "ACK", *tokens[4:11]]


def _published_at(reply: str | bytes | None) -> float | None:
    try:
        return int(_ack_tokens(reply or "")[7]) / 1e9
    except (IndexError, ValueError):
        return None


def _stream_seq(reply: str | bytes | None) -> str:
    tokens = _ack_tokens(reply or "")
    return tokens[5] if len(tokens) > 5 else "?"


class _Batch:
    """One fetched batch, decoded: each record with the message it came in."""

    __slots__ = ("blobs", "ends", "events", "msgs", "refused", "rejected", "starts")

    def __init__(self, msgs: list[Any]) -> None:
        self.msgs = msgs
        #: Messages that are no record (taken off the queue as they were decoded).
        self.rejected: set[int] = set()
        #: Messages of runs the sink refuses for good (taken off the queue).
        self.refused: list[Any] = []
        self.starts: list[tuple[Any, RunStart]] = []
        self.events: list[tuple[Any, Event]] = []
        self.ends: list[tuple[Any, RunEnd]] = []
        self.blobs: list[tuple[Any, tuple[str, bytes]]] = []

    def size(self) -> int:
        """How many records the batch holds."""
        return len(self.starts) + len(self.events) + len(self.ends) + len(self.blobs)


def _unique(msgs: Sequence[Any], leave: set[int] | frozenset[int] = frozenset()) -> list[Any]:
    """``msgs`` once each, in order, but those whose id is in ``leave``."""
    return [m for i, m in {id(m): m for m in msgs}.items() if i not in leave]


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


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
