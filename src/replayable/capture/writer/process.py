"""The writer process: the agent's process only encodes and forwards.

With the in-process :class:`~replayable.capture.writer.Writer`, the writer
thread's per-event work (redaction, fingerprints, hash chains, building rows,
the store's driver) shares the interpreter lock with the agent, so an agent
that makes calls in a tight loop pays for all of it. A :class:`ProcessWriter`
has the same interface, but its hot path only encodes the hand-off with
msgpack (C) and appends it to a list. One forwarding thread per process
writes the encoded records to a pipe in frames, and one child process
(``python -m replayable.capture.writer._child``), shared by every store this process
records to, runs an ordinary ``Writer`` per store against its own connection:
redaction, chains, group commit, the outage spool, all of it.

Durable records and flushes wait for the child's acknowledgement, which it
sends once the batch holding them is committed (or spooled, fail-open). If
the agent's process is killed, the child still commits what it had received.
If the child dies, every store falls back to an in-process ``Writer``: for what
follows, and for what the child was sent but had not said it kept (committed,
spooled or refused; it says so every 50 ms), which the agent's process holds on to
until then. The in-process writer skips what the child stored, so a child killed
while behind loses nothing the agent's process handed it. Until the child says it is
up (its start-up takes 0.1 s idle, up to 1 s on a loaded machine), a run's
start is stored from the agent's process before the run's first boundary
returns, so that a kill of both in that window leaves the run listed; the
child builds the run's events on that start (an ``S`` record). A run that ends
in that window too, before any of its records went down the pipe, is stored
whole from the agent's process at its end: a short script then waits for
neither the child's start nor its exit (given no run, it is stopped at exit).

This is the default for stores that another process can open (SQLite files,
PostgreSQL); ``REPLAYABLE_WRITER=thread`` or ``configure(writer="thread")``
keeps the writer in-process. Stores that live in memory, and recordings that
fail closed (``on_store_failure="raise"``, which the agent must see at once),
always use the in-process writer.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from replayable.capture.writer.channel import WAKE_AT, current_channel
from replayable.capture.writer.core import Writer
from replayable.capture.writer.handoff import ENCODER as _ENCODER
from replayable.capture.writer.handoff import apply, decode, plain
from replayable.errors import StoreError
from replayable.events.redaction import Redactor
from replayable.store.crypto import data_key_env
from replayable.store.integrity import Integrity, integrity_env

if TYPE_CHECKING:
    from collections.abc import Callable

    from replayable.capture.writer.linker import PendingEvent
    from replayable.events.model import RunStart
    from replayable.store.base import EventStore

__all__ = ["ProcessWriter"]

log = logging.getLogger("replayable.writer")

#: Records one store may have waiting for the forwarder before the hot path waits too.
MAX_QUEUED = 65_536
#: Bytes of records one store may have sent and not yet seen kept by the writer process
#: (which the agent's process holds meanwhile) before the forwarder stops sending more:
#: then they wait in the buffer, and beyond ``MAX_QUEUED`` the hot path waits.
MAX_UNKEPT_BYTES = 64 << 20


class ProcessWriter:
    """One store's records, forwarded to the writer process; same calls as ``Writer``."""

    def __init__(
        self,
        store: EventStore,
        *,
        redactor: Redactor,
        max_block_s: float = 5.0,
        on_store_failure: str = "spool",
        spool_dir: str | os.PathLike[str] | None = None,
        durable_timeout: float = 30.0,
    ) -> None:
        self.store = store
        self.durable_timeout = durable_timeout
        self.max_block_s = max_block_s
        self.on_store_failure = on_store_failure
        self.spool_dir = None if spool_dir is None else os.fspath(spool_dir)
        self.last_error: BaseException | None = None
        #: Called once the writer has closed (its registry forgets it).
        self.on_close: Callable[[], None] | None = None
        self._redactor = redactor
        self._buf: list[bytes] = []
        # Kept until their runs end, so that if the child dies they go to the
        # in-process writer too: the start of every run not yet ended (a run's events
        # are never stored without its start) and the blobs they name.
        self._open_runs: dict[str, bytes] = {}
        # Durable runs are written in this process (see ``_durable``).
        self._lane: Writer | None = None
        self._lane_blobs: set[str] = set()
        self._lane_lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}
        # Blobs not yet sent to the writer process: they go just before the first start
        # it is to store, so that a writer process given no run never opens the store
        # (a recording whose runs are all stored here leaves nothing for it to write).
        self._unsent: dict[str, bytes] = {}
        self._blob_lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._fallback: Writer | None = None
        self._drain_lock = threading.Lock()
        # Records sent to the writer process and not yet kept there (committed, spooled
        # or refused), with the count sent up to each frame's end: if it dies, they go
        # to the in-process writer, which skips what it stored (see ``kept``).
        self._sent = 0
        self._unkept: collections.deque[tuple[int, list[bytes], int]] = collections.deque()
        # Their bytes, sent (by the forwarder) and kept (by the answer reader): one
        # counter per thread.
        self._sent_bytes = 0
        self._kept_bytes = 0
        #: Runs whose start went to the writer process (not taken back, see ``end``):
        #: while there are none, it holds nothing this store waits for.
        self._child_runs = 0
        self._pid = os.getpid()
        # Chain keys and the anchor as this process sees them: the writer process is
        # shared by stores opened at different times, so it takes them from here.
        self._integrity_env = integrity_env()
        self._integrity = Integrity.from_env(self._integrity_env)  # a bad key fails here
        config = {
            "url": store.url,
            # The credentials travel down the pipe, never in argv, a log or an error.
            "open": store.connect_url(),
            "integrity_env": self._integrity_env,
            # And the data keys the store encrypts with, as this process sees them.
            "data_env": data_key_env(),
            "redact_keys": sorted(redactor.keys),
            "redact_patterns": list(redactor.patterns),
            "max_block_s": max_block_s,
            "on_store_failure": on_store_failure,
            "spool_dir": self.spool_dir,
        }
        self._config = config
        self._buf.append(_ENCODER.encode(("o", config)))
        self._channel = current_channel()
        sid = self._channel.add(self)
        if sid is None:  # it died between being found and being joined
            self._sid = 0
            self._fall_back(self._channel.dead or EOFError("the writer process ended"))
        else:
            self._sid = sid
            self._channel.wake.set()

    # -- hot path -------------------------------------------------------------------

    def event(self, pending: PendingEvent, durable: bool = False) -> None:
        """Hand off one event; with ``durable`` return once it is committed."""
        if durable:
            self._durable().event(pending, True)
            return
        try:
            data = _ENCODER.encode(("e", pending))
        except TypeError:
            data = _ENCODER.encode(("e", plain(pending)))
        buf = self._buf
        buf.append(data)
        if self._fallback is not None:  # the child ended while this call was on its way
            self._drain()
            return
        n = len(buf)
        if n >= WAKE_AT or n >= MAX_QUEUED:
            if n >= MAX_QUEUED:
                self._backpressure()
            elif not self._channel.wake.is_set():
                self._channel.wake.set()

    def start(self, start: RunStart, durable: bool = False) -> None:
        if durable:
            self._start_here(start, keep=True)  # the run is written here to its end
            return
        data: bytes | None = None
        if not self._channel.ready.is_set() and self._fallback is None:
            # The writer process is still starting (0.1 s idle, up to 1 s on a loaded
            # machine): a kill of both now would take the run with it. Its start is
            # stored here, before the run's first boundary can return; the writer
            # process builds the run's events and end on it.
            try:
                linked = self._start_here(start)
            except StoreError:
                linked = None  # not stored in time: the writer process writes it
            if linked is not None:
                data = _ENCODER.encode(("S", linked))
        if data is None:
            data = _ENCODER.encode(("s", start))
            self._send_blobs()  # the writer process stores this start and what it names
        self._open_runs[start.run_id] = data
        self._channel.count_run(self, 1)
        self._append(data)

    def _send_blobs(self) -> None:
        # Under a lock: a start sent from another thread at the same time goes after
        # every blob this one took (the writer process stores a blob before its start).
        with self._blob_lock:
            unsent = self._unsent
            while unsent:
                self._append(unsent.popitem()[1])

    def _start_here(self, start: RunStart, keep: bool = False) -> RunStart | None:
        """Store a run's start from this process (with the blobs it names); unless
        ``keep``, hand it back as linked (``None`` if it was refused) for the writer
        process to build the run on."""
        lane = self._lane_with_blobs()
        lane.start(start, True)
        return None if keep else lane.take_start(start.run_id)

    def _lane_with_blobs(self) -> Writer:
        """The in-process writer, given every blob it has not written yet (the runs it
        writes may name them)."""
        lane = self._durable()
        for digest, data in list(self._blobs.items()):
            if digest not in self._lane_blobs:
                self._lane_blobs.add(digest)
                _, (name, raw) = decode(data)
                lane.blob(name, raw)
            self._unsent.pop(digest, None)  # stored here: the writer process need not
        return lane

    def end(self, end: tuple[str, str, bytes | None, bytes | None, float], durable: bool) -> None:
        if durable:
            self._durable().end(end, True)
            return
        start = self._open_runs.pop(end[0], None)
        if not self._open_runs and len(self._blobs) > 64:
            self._blobs = {d: b for d, b in self._blobs.items() if d in self._unsent}
        if start is not None and not self._channel.ready.is_set() and self._take_back(end, start):
            return
        self._append(_ENCODER.encode(("x", end)))
        self._channel.wake.set()

    def _take_back(
        self, end: tuple[str, str, bytes | None, bytes | None, float], start: bytes
    ) -> bool:
        """Store a run that ends before the writer process is up from this process, if
        none of its records has gone down the pipe yet; ``False`` if one has (the writer
        process stores the run, as usual).

        Such a run's start is stored here already (see ``start``): its events and end
        follow it, committed before this returns, so that a short script's exit need not
        wait for the writer process to start. Every record goes one way or the other,
        never both: the records are taken out of the buffer under the lock the forwarder
        takes them under, and only if the run's start is still among them (the buffer
        is in order, so then none of the run's records has been sent).
        """
        if decode(start)[0] != "S":
            return False  # its start is not stored here: the writer process writes it
        run_id = end[0]
        with self._drain_lock:
            buf = self._buf
            n = len(buf)
            records = buf[:n]
            if self._fallback is not None or not any(r is start for r in records):
                return False
            # Slice, then delete, then put back the other runs' records at the front: the
            # hot path appends concurrently at the end; the forwarder waits for the lock.
            del buf[:n]
            mine: list[tuple[str, Any]] = []
            others: list[bytes] = []
            after = False
            for data in records:
                if data is start:
                    after = True
                    mine.append(decode(data))
                    continue
                if after:
                    kind, item = decode(data)
                    if kind == "e" and item[0] == run_id:
                        mine.append((kind, item))
                        continue
                others.append(data)
            buf[0:0] = others
            self._channel.count_run(self, -1)
            # Committed before the lock is let go: a record of the run handed off after
            # this (from a thread the run left behind) reaches the writer process after
            # the run is in the store, as it would after the run's end otherwise.
            lane = self._lane_with_blobs()
            for kind, item in mine:
                apply(lane, kind, item)
            try:
                lane.end(end, True)
            except StoreError as exc:
                # The in-process writer keeps them (stored or spooled once it can); the
                # recording's flush waits for them and reports it.
                self.last_error = exc
        return True

    def blob(self, digest: str, data: bytes) -> None:
        encoded = _ENCODER.encode(("b", (digest, data)))
        # Blobs are few (a recording's environment snapshot) and named by their digest:
        # kept like the starts that refer to them, and written again harmlessly. One
        # goes to the writer process with the next start it is to store (``start``).
        self._blobs[digest] = encoded
        if self._fallback is not None:
            self._append(encoded)
        else:
            self._unsent[digest] = encoded

    def _durable(self) -> Writer:
        """The in-process writer of this store's durable runs.

        A durable boundary waits for its commit; through the writer process that
        cost two pipe crossings and four thread hand-offs beside the disk's own
        time. Durable runs are written here instead, by the waiting caller itself
        when no batch is in progress (see ``Writer``), and a death of the writer
        process cannot touch them.
        """
        lane = self._lane
        if lane is None:
            with self._lane_lock:
                if self._lane is None:
                    self._lane = Writer(
                        self.store,
                        redactor=self._redactor,
                        integrity=self._integrity,
                        max_block_s=self.max_block_s,
                        on_store_failure="spool",
                        spool_dir=self.spool_dir,
                    )
                lane = self._lane
        return lane

    def _append(self, data: bytes) -> None:
        self._buf.append(data)
        if self._fallback is not None:
            self._drain()

    def _send_and_wait(self, data: bytes | None, timeout: float | None = None) -> None:
        ticket, waiter = self._channel.ticket()
        if data is not None:
            self._append(data)
        bound = self.max_block_s if timeout is None else timeout
        self._append(_ENCODER.encode(("m", [ticket, bound])))
        self._channel.wake.set()
        if not waiter.done.wait(bound):
            raise StoreError(
                f"the writer process for {self.store.url} did not confirm within {bound:g}s"
            )
        if waiter.outcome is None:
            return
        if self._channel.dead is not None:
            # The child ended while we waited: what it had not been sent goes to the
            # in-process writer (being started now, perhaps), so confirm there.
            deadline = time.monotonic() + bound
            while self._fallback is None and time.monotonic() < deadline:
                time.sleep(0.005)
            fallback = self._fallback
            if fallback is not None:
                self._drain()  # after it has been handed all it takes over (see below)
                fallback.flush(max(0.0, deadline - time.monotonic()) or bound)
                return
        raise StoreError(f"writing to {self.store.url} failed: {waiter.outcome}")

    def _backpressure(self) -> None:
        """The child is behind by ``MAX_QUEUED`` records: wait until it catches up."""
        channel = self._channel
        while len(self._buf) >= MAX_QUEUED // 2 and channel.dead is None:
            channel.wake.set()
            time.sleep(0.001)

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything handed off so far is committed."""
        if self._closed or self._pid != os.getpid():
            return
        bound = self.durable_timeout if timeout is None else timeout
        if self._lane is not None:
            self._lane.flush(bound)
        if self._fallback is not None:
            # Under the drain lock, which ``_fall_back`` holds while it hands the
            # in-process writer what the writer process may not have kept: a flush
            # queued before that is done would not wait for the rest of it.
            self._drain()
            self._fallback.flush(bound)
            return
        if self._child_runs:
            self._send_and_wait(None, bound)

    def kept(self, count: int) -> None:
        """The writer process has kept this store's first ``count`` records: they need
        not be held any longer (called by the thread reading its answers)."""
        unkept = self._unkept
        let_go = False
        while unkept and unkept[0][0] <= count:
            self._kept_bytes += unkept.popleft()[2]
            let_go = True
        if let_go and self._buf:
            self._channel.wake.set()  # the forwarder may have been held back by them

    def may_send(self) -> bool:
        """Whether the forwarder may send more (see ``MAX_UNKEPT_BYTES``)."""
        return self._sent_bytes - self._kept_bytes < MAX_UNKEPT_BYTES

    # -- the writer process ended -------------------------------------------------------

    def _fall_back(self, exc: BaseException) -> None:
        """Write what was not sent, and everything after it, in this process."""
        self.last_error = exc
        fallback = Writer(
            self.store,
            adopt=True,
            redactor=self._redactor,
            integrity=self._integrity,
            max_block_s=self.max_block_s,
            on_store_failure="spool" if self.on_store_failure == "spool" else "raise",
            spool_dir=self.spool_dir,
        )
        # What the child may not have committed: the blobs and starts of open runs
        # (a start the store holds already is recognised and not written twice; the
        # in-process writer adopts the runs and skips any seq it holds or has written).
        # They go first, under the drain lock, so no event reaches the fallback before
        # its run's start.
        with self._drain_lock:
            # Set before: a hand-off from here on drains the buffer itself (after these),
            # so a call already on its way through this object's methods loses nothing.
            self._fallback = fallback
            for data in (*self._blobs.values(), *self._open_runs.values()):
                kind, item = decode(data)
                apply(fallback, kind, item)
            # Then what it was sent and may not have kept (a start, event or end it
            # stored is recognised by the in-process writer and not written twice).
            while self._unkept:
                for data in self._unkept.popleft()[1]:
                    kind, item = decode(data)
                    apply(fallback, kind, item)
        # Everything else, now and later, goes through the buffer to the fallback.
        self._drain()

    def _drain(self) -> None:
        """Hand what waits in the buffer to the in-process writer, in order, once each."""
        fallback = self._fallback
        assert fallback is not None
        with self._drain_lock:
            buf = self._buf
            n = len(buf)
            records = buf[:n]
            del buf[:n]
            for data in records:
                kind, item = decode(data)
                apply(fallback, kind, item)

    # -- the rest of the Writer interface ----------------------------------------------

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        self._redactor = redactor
        if self._lane is not None:
            self._lane.redactor = redactor
        if self._fallback is not None:
            self._fallback.redactor = redactor
        else:
            self._append(_ENCODER.encode(("r", [sorted(redactor.keys), list(redactor.patterns)])))

    def configure(
        self,
        *,
        max_block_s: float | None = None,
        on_store_failure: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Change the outage settings; the child's writer takes them in order."""
        if self._lane is not None:
            self._lane.configure(max_block_s=max_block_s, spool_dir=spool_dir)
        if self._fallback is not None:
            self._fallback.configure(
                max_block_s=max_block_s,
                on_store_failure=on_store_failure,  # type: ignore[arg-type]
                spool_dir=spool_dir,
            )
            return
        options: dict[str, Any] = {}
        if max_block_s is not None:
            self.max_block_s = options["max_block_s"] = float(max_block_s)
        if spool_dir is not None:
            self.spool_dir = options["spool_dir"] = os.fspath(spool_dir)
        if options:
            self._append(_ENCODER.encode(("k", options)))

    @property
    def stall_s(self) -> float:
        """How long the child's writer waits for one store call before it spools."""
        return max(0.05, 0.4 * self.max_block_s)

    def _ask(self, kind: str, item: Any, timeout: float) -> str | None:
        ticket, waiter = self._channel.ticket()
        self._append(_ENCODER.encode((kind, [ticket, item])))
        self._channel.wake.set()
        if not waiter.done.wait(timeout):
            raise StoreError(
                f"the writer process for {self.store.url} did not answer within {timeout:g}s"
            )
        return waiter.outcome

    @property
    def spooled(self) -> bool:
        """Whether records wait in the child's spool for the store to come back."""
        if self._lane is not None and self._lane.spooled:
            return True
        if self._fallback is not None:
            return self._fallback.spooled
        if self._closed:
            return False
        return self._ask("q", None, self.durable_timeout) == "spooled"

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until the child's spool is in the store; ``False`` if not by ``timeout``."""
        if self._lane is not None and not self._lane.drain(timeout):
            return False
        if self._fallback is not None:
            return self._fallback.drain(timeout)
        if self._closed:
            return True
        return self._ask("d", timeout, timeout + self.durable_timeout) is None

    def close(self) -> None:
        """Flush, then let the child close its writer and its connection to the store."""
        if self._closed or self._pid != os.getpid():
            return  # closed already, or a forked child's copy: the parent owns it
        try:
            if self._fallback is None:
                closing = _ENCODER.encode(("c", None))
                if self._child_runs:
                    self._send_and_wait(closing, self.durable_timeout)
                else:  # it holds nothing of this store's to wait for
                    self._append(closing)
        finally:
            self._closed = True
            self._closing = True
            self._channel.wake.set()
            if self._fallback is not None:
                self._drain()  # everything it takes over handed to it first
                self._fallback.close()
            if self._lane is not None:
                self._lane.close()
            if self.on_close is not None:
                self.on_close()
