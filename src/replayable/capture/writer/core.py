"""The in-process writer: the hot path hands records off, a thread persists them.

One writer per store. Boundaries append a raw record to a deque (no lock, no
hashing, no I/O); the writer thread drains it in batches, redacts and
fingerprints requests, links each run's hash chain (the
:class:`~replayable.capture.writer.linker.Linker`), and writes the batch in
one transaction (group commit). A durable caller waits on its own record's
waiter, so many threads share one commit.

A batch is built once: its hash chain links are final from then on, and every
retry, spool and drain sends the very same records, so a batch the store had
committed without acknowledging is recognised (by the PostgreSQL store's batch
digest, or record by record) and never written twice.

Store calls run on a committer thread and the writer waits for each at most
``0.4 * max_block_s``; a call that takes longer counts as a stalled store. A
durable caller's own batch is committed on its own thread instead where the
store bounds its waits by that bound itself (SQLite: its lock waits), which
spares each durable boundary two thread hand-offs.
What happens then is :mod:`~replayable.capture.writer.outage`'s concern (the
spool, ``spool_dir``, default ``$REPLAYABLE_SPOOL_DIR`` or
``./.replayable/spool``), and a batch refused for good is
:mod:`~replayable.capture.writer.refusals`'s.

``on_store_failure`` chooses what the agent sees during an outage:

* ``"spool"`` (fail-open, the default): the agent keeps running. A durable
  boundary returns once its record is fsynced in the spool.
* ``"raise"`` (fail-closed): handed-off records are still spooled, but every
  boundary raises :class:`StoreError` until the spool has drained, and a
  durable boundary raises instead of returning.

Either way a durable boundary waits at most ``max_block_s`` seconds.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayable.capture.writer.backoff import Backoff
from replayable.capture.writer.batches import Batch, Committer, Job, Waiter, is_permanent
from replayable.capture.writer.linker import Chain, Linker, PendingEvent
from replayable.capture.writer.outage import Outage
from replayable.capture.writer.refusals import Refusals, warn
from replayable.capture.writer.sinks import close_all, hand_off, writer_sinks
from replayable.capture.writer.spool import SpoolBatch
from replayable.capture.writer.status import WriterStatus
from replayable.errors import ConfigurationError, StoreError
from replayable.events.codec import encode_error
from replayable.events.model import RunStart
from replayable.events.redaction import Redactor
from replayable.store.integrity import Integrity

if TYPE_CHECKING:
    from collections.abc import Callable

    from replayable.capture.writer.options import OnStoreFailure
    from replayable.store.base import EventStore

__all__ = ["PendingEvent", "Writer", "default_spool_dir"]

log = logging.getLogger("replayable.writer")

_EVENT, _START, _END, _BLOB, _MARK, _KNOWN, _BULK, _NOTE = range(8)
#: A batch whose persisting has begun: (batch, its raw records, the committer's job
#: or ``None``, the outcome so far).
_Started = tuple[Batch, list[tuple[int, Any, Waiter | None]], Job | None, Exception | None]
_LETTER = {_EVENT: "e", _START: "s", _END: "x", _BLOB: "b"}
#: A batch whose payloads hold a secret somewhere is scanned again in groups of this
#: many events, so that only the groups with a hit are checked event by event.
_SCAN_GROUP = 64


def default_spool_dir() -> Path:
    """``$REPLAYABLE_SPOOL_DIR``, else ``.replayable/spool`` under the current directory."""
    return Path(os.environ.get("REPLAYABLE_SPOOL_DIR") or ".replayable/spool").absolute()


def _failed(pending: PendingEvent, error: BaseException) -> PendingEvent:
    """The hand-off as the agent saw it: ``error`` raised instead of the call's result."""
    tagged = pending[9] if pending[9].__class__ is str else False
    return (*pending[:8], None, tagged, encode_error(error), *pending[11:])


class Writer:
    """Batches records into the store from a daemon thread."""

    def __init__(
        self,
        store: EventStore,
        *,
        redactor: Redactor | None = None,
        batch_size: int = 2048,
        interval: float = 0.02,
        durable_timeout: float = 30.0,
        max_block_s: float = 5.0,
        on_store_failure: OnStoreFailure = "spool",
        spool_dir: str | os.PathLike[str] | None = None,
        integrity: Integrity | None = None,
        adopt: bool = False,
    ) -> None:
        self.store = store
        # Chain keys and anchor: the environment's unless given (see store.integrity).
        self._linker = Linker(store, redactor or Redactor(), integrity, adopt=adopt)
        self.batch_size = batch_size
        self.interval = interval
        self.durable_timeout = durable_timeout
        self.max_block_s = 5.0
        self.on_store_failure: OnStoreFailure = "spool"
        self._queue: collections.deque[tuple[int, Any, Waiter | None]] = collections.deque()
        self._wake = threading.Event()
        #: Held by whoever builds and persists batches: the writer thread, or a durable
        #: caller doing it itself.
        self._work = threading.Lock()
        self._closed = False
        self.last_error: BaseException | None = None
        #: The value of the last :meth:`note` reached: everything handed off before it
        #: is committed, spooled or refused.
        self.noted: int = 0
        #: When the oldest record still waiting arrived (``events`` only; the writer
        #: process raises its priority while this is older than its deadline).
        self.waiting_since: float | None = None
        #: Called once the writer has closed (its registry forgets it).
        self.on_close: Callable[[], None] | None = None
        #: Called with ``("down", why)`` when the store becomes unavailable, ``("up", "")``
        #: when it is back (the writer process tells the agent's process).
        self.on_status: Callable[[str, str], None] | None = None
        self._status = WriterStatus(store.url)
        #: What else each committed batch goes to (an OpenTelemetry exporter), if any.
        self._sinks = writer_sinks(store.url)
        self._backoff = Backoff()
        self._committer = Committer()
        # Read from the class: a store not opened yet must not be opened to ask.
        self._bounded = bool(getattr(type(store), "bounds_own_waits", False))
        self._refusals = Refusals(
            store, self._committer, self._commit, lambda: self.stall_s, lambda: self.spool_dir
        )
        # Touched only by the writer thread once it runs.
        self._outage = outage = Outage(
            store, self._committer, self._commit, self._refusals, self._backoff,
            lambda: self.stall_s,
        )  # fmt: skip
        outage.on_down, outage.on_up = self._went_down, self._came_back
        outage.refusal = self._outage_refusal
        outage.on_error = self._set_error
        self._pid = os.getpid()
        self.configure(
            max_block_s=max_block_s,
            on_store_failure=on_store_failure,
            spool_dir=spool_dir if spool_dir is not None else default_spool_dir(),
        )
        self._thread = threading.Thread(target=self._loop, name="replayable-writer", daemon=True)
        self._thread.start()

    @property
    def redactor(self) -> Redactor:
        """The redaction applied to every record this writer builds."""
        return self._linker.redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        self._linker.redactor = redactor

    @property
    def spool_dir(self) -> Path | None:
        """Where batches go while the store is unavailable (``None``: kept in memory)."""
        return self._outage.spool_dir

    def configure(
        self,
        *,
        max_block_s: float | None = None,
        on_store_failure: OnStoreFailure | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Change the outage settings (see the module docstring)."""
        if on_store_failure is not None:
            if on_store_failure not in ("spool", "raise"):
                raise ConfigurationError(
                    f"on_store_failure must be 'spool' or 'raise', not {on_store_failure!r}"
                )
            self.on_store_failure = on_store_failure
        if max_block_s is not None:
            if not max_block_s > 0:
                raise ConfigurationError(f"max_block_s must be positive, not {max_block_s!r}")
            self.max_block_s = float(max_block_s)
        in_memory = self.store.url.startswith("memory:")
        if spool_dir is not None and not in_memory and self._outage.set_dir(Path(spool_dir)):
            self._wake.set()
        self._status.directory = self.spool_dir

    @property
    def stall_s(self) -> float:
        """How long the writer waits for one store call before it treats the store as stalled."""
        return max(0.05, 0.4 * self.max_block_s)

    # -- hot path -----------------------------------------------------------

    def event(self, pending: PendingEvent, durable: bool = False) -> None:
        """Hand off one event; with ``durable`` return only once it is committed."""
        if not durable:
            queue = self._queue
            queue.append((_EVENT, pending, None))
            if len(queue) >= self.batch_size and not self._wake.is_set():
                self._wake.set()
            return
        self._submit_and_wait(_EVENT, pending)

    def events(self, pending: list[PendingEvent]) -> None:
        """Hand off many buffered events at once (the writer process does)."""
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        # One entry for them all: the batch takes them as a list (split where a batch
        # ends), and builds them in one loop.
        self._queue.append((_BULK, pending, None))
        # At once, not at the next interval: the agent's process sends a frame per
        # ``WAKE_AT`` records of a tight loop, built and committed while the loop runs.
        if not self._wake.is_set():
            self._wake.set()

    def _refusing_event(self, pending: PendingEvent, durable: bool = False) -> None:
        # Installed as ``self.event`` while a fail-closed writer is in an outage,
        # so the normal path pays nothing for the check.
        down = self._outage.down
        if down is None or self.on_store_failure != "raise":
            if durable:
                self._submit_and_wait(_EVENT, pending)
            else:
                self._queue.append((_EVENT, pending, None))
            return
        refusal = self._refusal(down)
        # The boundary raises this to the agent: record that, not the call's result,
        # so the tape holds what the agent saw (and replay raises it there too).
        failed = _failed(pending, refusal)
        if durable:
            waiter = Waiter()
            self._queue.append((_EVENT, failed, waiter))
            self._wake.set()
            waiter.done.wait(self.max_block_s)  # spooled (its outcome is this refusal)
        else:
            self._queue.append((_EVENT, failed, None))
        raise refusal

    def _raise_down(self) -> None:
        down = self._outage.down
        if down is not None and self.on_store_failure == "raise":
            raise self._refusal(down)

    def _refusal(self, down: StoreError) -> StoreError:
        where = f" (records are kept in {self.spool_dir})" if self.spool_dir else ""
        error = StoreError(
            f"{self.store.url} is unavailable and on_store_failure='raise'{where}: {down}"
        )
        error.__cause__ = down
        return error

    def start(self, start: RunStart, durable: bool = False) -> None:
        if durable:
            self._submit_and_wait(_START, start)
        else:
            self._queue.append((_START, start, None))
        self._raise_down()

    def known_start(self, start: RunStart) -> None:
        """A run's start, linked and stored by another writer of this store: build its
        events and end on it, without writing it again (see ``ProcessWriter.start``)."""
        self._queue.append((_KNOWN, start, None))

    def take_start(self, run_id: str) -> RunStart | None:
        """The start record this writer built for ``run_id`` (linked as stored), which
        it forgets: another writer will build the run's events and end on it."""
        return self._linker.starts.pop(run_id, None)

    def end(self, end: tuple[str, str, bytes | None, bytes | None, float], durable: bool) -> None:
        """Hand off a run's outcome; the writer adds the chain head and count."""
        if durable:
            self._submit_and_wait(_END, end)
        else:
            self._queue.append((_END, end, None))
            self._wake.set()

    def refuse(self, kind: str, record: Any, error: Exception) -> None:
        """Keep a hand-off that is not a record at all (see ``handoff.apply``) as the
        store's refusals are kept: in the rejects file, with a warning naming it."""
        try:
            self._refusals.report([(kind, record, error)])
        except Exception as exc:  # the record may not even encode for the rejects file
            warn(
                f"replayable: {self.store.url} refused a record ({type(error).__name__}: "
                f"{error}); it could not be kept ({type(exc).__name__}: {exc})"
            )

    def blob(self, digest: str, data: bytes) -> None:
        self._queue.append((_BLOB, (digest, data), None))

    def note(self, value: int) -> None:
        """Mark the place after everything handed off so far: :attr:`noted` becomes
        ``value`` once all of it is committed, spooled or refused. Unlike a flush it
        neither waits nor makes the batch durable (the writer process tells the agent's
        process how far it has kept its records, see ``ProcessWriter``)."""
        self._queue.append((_NOTE, value, None))

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything handed off so far is committed (or, fail-open, spooled)."""
        if threading.current_thread() is self._thread or self._closed or self._pid != os.getpid():
            return
        self._submit_and_wait(_MARK, None, self.durable_timeout if timeout is None else timeout)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every spooled batch is in the store; ``False`` if it is not by ``timeout``."""
        self._backoff.now()
        self._wake.set()
        return self._outage.drained.wait(timeout)

    @property
    def spooled(self) -> bool:
        """Whether records wait in a spool or in memory for the store to come back."""
        return not self._outage.drained.is_set()

    def _submit_and_wait(self, kind: int, item: Any, timeout: float | None = None) -> None:
        if (
            kind == _EVENT
            and self._bounded
            and not self._queue
            and not self._closed
            and self._work.acquire(blocking=False)
        ):
            try:
                if self._commit_alone(item):
                    return
            finally:
                self._work.release()
        waiter = Waiter()
        self._queue.append((kind, item, waiter))
        # A durable caller writes the batch itself when the writer thread is idle: its
        # boundary then costs its commit, not two thread hand-offs besides (a flush
        # leaves the work to the writer thread, as buffered records' building is). Callers
        # that find the work taken wait for the batch in progress, or the next one,
        # which takes every record queued meanwhile (group commit).
        if kind != _MARK and not self._closed and self._work.acquire(blocking=False):
            try:
                self._batches(inline=True)
            except Exception as exc:
                log.exception("replayable: the writer for %s hit an error", self.store.url)
                self.last_error = exc
            finally:
                self._work.release()
            if self._queue:
                self._wake.set()
        else:
            self._wake.set()
        bound = self.max_block_s if timeout is None else timeout
        if not waiter.done.wait(bound):
            raise StoreError(
                f"the store {self.store.url} did not commit within {bound:g}s"
                + (f": {self.last_error}" if self.last_error else "")
            )
        if waiter.outcome is not None:
            raise StoreError(f"writing to {self.store.url} failed: {waiter.outcome}") from (
                waiter.outcome
            )

    def _commit_alone(self, pending: PendingEvent) -> bool:
        """A durable event with nothing queued before it and a store in good health:
        link it and commit it on this thread, without a queue, a waiter or a batch
        (what a sequential durable agent does at every boundary). ``False`` when that
        does not apply (it then goes the usual way, from its start); a failed commit
        goes on as any failed batch does (spool, refusals), and raises where one would.

        The caller holds ``_work`` and found the queue empty, so no other record can
        be built or written meanwhile.
        """
        outage = self._outage
        linker = self._linker
        if (
            self._queue
            or self.on_store_failure != "spool"
            or linker.adopt
            or outage.down is not None
            or outage.leftovers
            or outage.backlogged()
            or self._committer.busy
        ):
            return False
        chains: dict[str, Chain] = {}
        try:
            record = linker.event(pending, chains)
        except Exception:
            return False  # the usual path builds it again and says what is wrong
        if record is None:
            return True  # a seq this writer has linked already
        linker.commit(chains, ())
        try:
            self.store.append_bounded((), (record,), (), durable=True, within=self.stall_s)
        except Exception as exc:
            error: Exception | None = exc
        else:
            outage.succeeded()
            return True
        # As a one-event batch that failed: spooled (fail-open) or refused, and what
        # the store said reaches the caller as it would from the usual path.
        waiter = Waiter()
        data = SpoolBatch()
        data.add("e", record)
        batch = Batch(data, {id(record): waiter}, [], True)
        self._finish(batch, [(_EVENT, pending, waiter)], None, error)
        if not waiter.done.wait(self.max_block_s):
            raise StoreError(
                f"the store {self.store.url} did not commit within {self.max_block_s:g}s"
                + (f": {self.last_error}" if self.last_error else "")
            )
        if waiter.outcome is not None:
            raise StoreError(f"writing to {self.store.url} failed: {waiter.outcome}") from (
                waiter.outcome
            )
        return True

    # -- outage hooks (writer thread) ----------------------------------------

    def _went_down(self) -> None:
        if self.on_store_failure == "raise":
            self.__dict__["event"] = self._refusing_event
        down = self._outage.down
        where = f"spooled to {self.spool_dir}" if self.spool_dir else "kept in memory"
        message = f"replayable: {self.store.url} cannot store records ({down}); they are {where}"
        if self.on_status is not None:
            self.on_status("down", message)
        else:
            warn(message)

    def _came_back(self) -> None:
        self.__dict__.pop("event", None)
        self._status.back()
        if self.on_status is not None:
            self.on_status("up", "")

    def _outage_refusal(self) -> StoreError | None:
        down = self._outage.down
        if self.on_store_failure != "raise" or down is None:
            return None
        return self._refusal(down)

    def _set_error(self, error: BaseException | None) -> None:
        self.last_error = error
        if error is None:
            self._status.committed()
        else:
            self._status.failed(error)

    # -- writer thread ------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._idle():
                # A round with nothing to do leaves ``_work`` alone: a durable caller
                # that found it taken would wait for this thread's next round instead
                # of committing on its own thread.
                continue
            try:
                with self._work:
                    if self._step():
                        return
            except Exception as exc:
                # The thread must outlive any bug of its own: a dead writer would
                # silently drop every record handed to it afterwards.
                log.exception("replayable: the writer for %s hit an error", self.store.url)
                self.last_error = exc
                self._backoff.pause()

    def _idle(self) -> bool:
        """Nothing queued, to drain or to shut down (read without ``_work``: a record
        queued just after is taken by the next round, or by its durable caller)."""
        outage = self._outage
        return (
            not self._queue
            and not self._closed
            and outage.down is None
            and not outage.leftovers
            and not outage.backlogged()
        )

    def _step(self) -> bool:
        """One round of the writer thread; ``True`` once it has shut down."""
        self._batches()
        if self._closed and not self._queue:
            self._committer.stop()
            self._outage.release()
            return True
        return False

    def _batches(self, inline: bool = False) -> None:
        """Build and persist what is queued, then drain the spool if it is time
        (``inline``: on a durable caller's thread, see ``_persist``).

        While the committer writes one batch, the next is built (the store's driver
        leaves the interpreter lock while the database works): a writer behind by
        many batches takes about as long as the slower of the two, not their sum.
        Batches are still persisted one at a time and in order.
        """
        queue = self._queue
        outage = self._outage
        # A batch handed to the committer whose outcome is not settled yet.
        pending: _Started | None = None
        try:
            while queue:
                raw = self._take()
                try:
                    batch = self._build(raw)
                except StoreError as exc:
                    # Building an end record may need the run's start from the store;
                    # nothing has advanced, so put the batch back and retry later.
                    self.last_error = exc
                    self._queue.extendleft(reversed(raw))
                    self._backoff.pause()
                    break
                if pending is not None:
                    started, pending = pending, None
                    self._finish(*started)
                begun = self._begin(batch, raw, inline)
                if begun is None:
                    continue
                # Overlap only what a failure cannot make rebuild (fail-closed batches
                # are linked again with the refusal; see ``_as_refused``).
                if queue and begun[2] is not None and batch.prior is None:
                    pending = begun
                    continue
                self._finish(*begun)
                if outage.due():
                    outage.drain_some()
        finally:
            if pending is not None:
                self._finish(*pending)
        if outage.due():
            outage.drain_some()
        if not queue:
            self.waiting_since = None

    def _take(self) -> list[tuple[int, Any, Waiter | None]]:
        """The next batch's records from the queue: up to ``batch_size`` events, a
        list of many handed off at once split where the batch ends."""
        # Only the holder of ``_work`` takes from the queue: what it counts is there.
        queue = self._queue
        pop = queue.popleft
        room = self.batch_size
        raw: list[tuple[int, Any, Waiter | None]] = []
        while queue and room > 0:
            entry = pop()
            if entry[0] == _BULK:
                items = entry[1]
                if len(items) > room:
                    queue.appendleft((_BULK, items[room:], None))
                    entry = (_BULK, items[:room], None)
                room -= len(entry[1])
            else:
                room -= 1
            raw.append(entry)
        return raw

    # -- persisting ---------------------------------------------------------

    def _store_write(self, data: SpoolBatch, durable: bool) -> None:
        for digest, blob in data.blobs:
            self.store.put_blob(digest, blob)
        if data.starts or data.events or data.ends:
            self.store.append(data.starts, data.events, data.ends, durable=durable)
            if self._sinks:
                hand_off(self._sinks, data)

    def _commit(self, batch: Batch) -> Exception | None:
        data = batch.data
        _, error = self._committer.call(
            lambda: self._store_write(data, batch.durable),
            self.stall_s,
            f"writing to {self.store.url}",
        )
        return error

    def _commit_here(self, batch: Batch) -> Exception | None:
        """Commit ``batch`` on this thread, the store bounding its own waits by the
        stall bound (see ``EventStore.bounds_own_waits``)."""
        data = batch.data
        try:
            self.store.append_bounded(
                data.starts, data.events, data.ends, durable=batch.durable, within=self.stall_s
            )
        except Exception as exc:
            return exc
        if self._sinks:
            hand_off(self._sinks, data)
        return None

    def _persist(
        self, batch: Batch, raw: list[tuple[int, Any, Waiter | None]], inline: bool = False
    ) -> None:
        begun = self._begin(batch, raw, inline)
        if begun is not None:
            self._finish(*begun)

    def _begin(
        self, batch: Batch, raw: list[tuple[int, Any, Waiter | None]], inline: bool
    ) -> _Started | None:
        """Start persisting ``batch``: ``None`` if it is held behind a backlog already,
        else what ``_finish`` settles (a committer's job, or the outcome of a commit
        made on this thread)."""
        outage = self._outage
        if outage.backlogged():
            outage.hold(batch, outage.down or StoreError(f"{self.store.url} is unavailable"))
            self._reached(raw)
            return None
        # A durable caller writing its own batch commits it itself where the store
        # bounds its waits (no blobs: those go one call each, on the committer), unless
        # a call that stalled still holds the store.
        if (
            inline
            and self._bounded
            and batch.durable
            and not batch.data.blobs
            and not self._committer.busy
        ):
            return batch, raw, None, self._commit_here(batch)
        data = batch.data
        job, error = self._committer.submit(
            lambda: self._store_write(data, batch.durable), f"writing to {self.store.url}"
        )
        return batch, raw, job, error

    def _finish(
        self,
        batch: Batch,
        raw: list[tuple[int, Any, Waiter | None]],
        job: Job | None,
        error: Exception | None,
    ) -> None:
        """Settle a batch ``_begin`` started: its waiters, or the outage path."""
        outage = self._outage
        if job is not None:
            _, error = job.result(self.stall_s)
        if error is None:
            outage.succeeded()
            batch.resolve(None)
            self._reached(raw)
            return
        if is_permanent(error):
            error = self._refusals.split(batch, error)
            if error is None:
                outage.succeeded()
                self._reached(raw)
                return
        outage.failed(error)
        if self.on_store_failure == "raise" and batch.owned and batch.prior is not None:
            batch = self._as_refused(batch, raw, error)
        outage.hold(batch, error)
        self._reached(raw)

    def _reached(self, raw: list[tuple[int, Any, Waiter | None]]) -> None:
        """A batch is settled: the last note among its records is reached."""
        for kind, item, _ in reversed(raw):
            if kind == _NOTE:
                self.noted = item
                return

    def _as_refused(
        self, batch: Batch, raw: list[tuple[int, Any, Waiter | None]], error: Exception
    ) -> Batch:
        """Fail-closed: the durable boundaries waiting on ``batch`` will raise; build it
        again with their events recording that refusal, which is what the agent sees."""
        self._outage.mark_down(error)
        down = self._outage.down
        assert down is not None
        refusal = self._refusal(down)
        chains = self._linker.chains
        prior = batch.prior or {}
        after = {run_id: chains.get(run_id) for run_id in prior}
        for run_id, before in prior.items():
            if before is None:
                chains.pop(run_id, None)
            else:
                chains[run_id] = before
        again = [
            (kind, _failed(item, refusal) if kind == _EVENT and waiter else item, waiter)
            for kind, item, waiter in raw
        ]
        try:
            return self._build(again)
        except StoreError:
            # Linking again needed the store: keep the batch as it was built.
            chains.update({r: c for r, c in after.items() if c is not None})
            return batch

    # -- building -----------------------------------------------------------

    def _build(self, raw: list[tuple[int, Any, Waiter | None]]) -> Batch:
        data = SpoolBatch()
        owned: dict[int, Waiter] = {}
        marks: list[Waiter] = []
        refused: list[tuple[str, Any, Exception]] = []
        durable = False
        # Chains advance only once the whole batch is built, so a batch put back
        # after a failed lookup is rebuilt identically.
        chains: dict[str, Chain] = {}
        ended: list[str] = []
        linker = self._linker
        clean, clean_ids = self._scan(raw)
        link_event = linker.event
        add_event = data.events.append

        def refuse(item: Any, exc: Exception) -> None:
            if isinstance(exc, StoreError) and not is_permanent(exc):
                raise exc  # the store is needed to build it: try the batch again later
            refused.append(("e", item, exc))

        for kind, item, waiter in raw:
            if kind == _BULK:
                data.events.extend(linker.events(item, chains, clean, clean_ids, refuse))
                continue
            if kind == _NOTE:
                continue
            if kind == _EVENT and waiter is None:
                # The bulk of a batch: buffered events, built with nothing else to settle.
                try:
                    built = link_event(item, chains, clean or id(item) in clean_ids)
                except Exception as exc:
                    if isinstance(exc, StoreError) and not is_permanent(exc):
                        raise  # the store is needed to build it: try the batch again later
                    refused.append(("e", item, exc))
                    continue
                if built is not None:  # else a hand-off the store holds already
                    add_event(built)
                continue
            durable = durable or waiter is not None
            if kind == _MARK:
                if waiter is not None:
                    marks.append(waiter)
                continue
            if kind == _KNOWN:
                linker.starts[item.run_id] = item
                continue
            try:
                if kind == _EVENT:
                    record: Any = linker.event(item, chains, id(item) in clean_ids)
                    if record is None:  # a hand-off the store holds already
                        if waiter is not None:
                            waiter.resolve(None)
                        continue
                elif kind == _START:
                    record = linker.start(item)
                elif kind == _END:
                    record = linker.end(item, chains)
                    ended.append(record.run_id)
                else:
                    record = item
            except Exception as exc:
                if isinstance(exc, StoreError) and not is_permanent(exc):
                    raise  # the store is needed to build it: try the batch again later
                # A record that cannot be built never will be.
                refused.append((_LETTER[kind], item, exc))
                if waiter is not None:
                    waiter.resolve(exc)
                continue
            if kind == _START:
                linker.starts[record.run_id] = record
            data.add(_LETTER[kind], record)
            if waiter is not None:
                owned[id(record)] = waiter
        prior = None
        if self.on_store_failure == "raise" and not ended:
            # Kept so a fail-closed batch can be linked again (see ``_as_refused``).
            prior = {run_id: linker.chains.get(run_id) for run_id in chains}
        linker.commit(chains, ended)
        if refused:
            self._refusals.report(refused)
        batch = Batch(data, owned, marks, durable)
        batch.prior = prior
        return batch

    def _scan(self, raw: list[tuple[int, Any, Waiter | None]]) -> tuple[bool, set[int]]:
        """Which of the batch's events hold no secret, found with a few scans over many
        payloads at once: ``(True, ...)`` when none does, else the ids of the hand-offs
        found clean in groups of ``_SCAN_GROUP`` (the others are checked one by one)."""
        pending: list[Any] = []
        for kind, item, _ in raw:
            if kind == _EVENT:
                pending.append(item)
            elif kind == _BULK:
                pending.extend(item)
        if not pending:
            return False, set()
        linker = self._linker
        if linker.clean_events(pending):
            return True, set()
        clean: set[int] = set()
        if len(pending) > _SCAN_GROUP:
            for i in range(0, len(pending), _SCAN_GROUP):
                group = pending[i : i + _SCAN_GROUP]
                if linker.clean_events(group):
                    clean.update(map(id, group))
        return False, clean

    def close(self) -> None:
        """Flush, give a pending spool a short chance to drain, and stop the thread.

        A spool that cannot drain now stays on disk for the next writer of the store.
        """
        if self._closed or self._pid != os.getpid():
            return  # closed already, or a forked child's copy: the parent owns it
        try:
            try:
                self.flush(timeout=self.durable_timeout)
            except StoreError:
                if self._outage.spool is None:
                    raise
                # Fail-closed: the records are safe in the spool; closing is not the agent.
            if self.spooled:
                self.drain(timeout=self.max_block_s)
        finally:
            self._closed = True
            self._wake.set()
            if threading.current_thread() is not self._thread:
                # Let the thread release its spool, so the next writer can adopt it.
                self._thread.join(timeout=self.max_block_s)
            if self._sinks:
                close_all(self._sinks)
            if self.on_close is not None:
                self.on_close()
