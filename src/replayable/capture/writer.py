"""The background writer: the hot path hands records off, this thread persists them.

One writer per store. Boundaries append a raw record to a deque (no lock, no
hashing, no I/O); the writer thread drains it in batches, redacts and
fingerprints requests, links each run's hash chain, and writes the batch in
one transaction (group commit). A durable caller waits on its own record's
waiter, so many threads share one commit.

A batch is built once: its hash chain links are final from then on, and every
retry, spool and drain sends the very same records, so a batch the store had
committed without acknowledging is recognised (by the PostgreSQL store's batch
digest, or record by record) and never written twice.

Store calls run on a committer thread and the writer waits for each at most
``0.4 * max_block_s``; a call that takes longer counts as a stalled store.

**Outages.** When the store cannot be reached (a :class:`StoreError` from a
lost or refused connection, a stall, a locked database), the writer appends
batches to a local spool file instead (see :mod:`replayable.capture.spool`;
``spool_dir``, default ``$REPLAYABLE_SPOOL_DIR`` or ``./.replayable/spool``),
fsynced per batch in durable mode, and retries the store with backoff. When
the store answers again it drains the spool in order and deletes the file
once every batch in it is committed; while a spool is pending, new batches
queue behind it, so each run's records reach the store in order and its
chain is unbroken. A spool left by a process that ended during an outage is
adopted and drained by the next writer for the same store. Stores that live
in memory are not spooled: their batches wait in memory for the retry.

``on_store_failure`` chooses what the agent sees during an outage:

* ``"spool"`` (fail-open, the default): the agent keeps running. A durable
  boundary returns once its record is fsynced in the spool.
* ``"raise"`` (fail-closed): handed-off records are still spooled, but every
  boundary raises :class:`StoreError` until the spool has drained, and a
  durable boundary raises instead of returning.

Either way a durable boundary waits at most ``max_block_s`` seconds.

**Permanent errors.** A batch the store refuses for a reason a retry cannot
fix (:class:`AppendOnlyError` for a duplicate, :class:`SchemaVersionError`,
a record the database cannot hold) is retried record by record: the valid
records are written, each refused one fails its durable waiter with the
error and is kept in ``<store key>.rejected.jsonl`` in the spool directory,
and one :class:`RuntimeWarning` per batch names the store and the error. A
refused record keeps its place in its run's hash chain, so ``verify`` on
that run points at the gap.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from replayable.capture.batches import Batch, Committer, Waiter, is_permanent
from replayable.capture.config import settings
from replayable.capture.linker import Chain, Linker, PendingEvent
from replayable.capture.procwriter import ProcessWriter
from replayable.capture.spool import Spool, SpoolBatch, adopt_leftovers, append_rejects
from replayable.errors import (
    ConfigurationError,
    StoreError,
)
from replayable.events.model import RunStart
from replayable.events.redaction import Redactor

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["OnStoreFailure", "PendingEvent", "Writer", "writer_for"]

log = logging.getLogger("replayable.writer")

OnStoreFailure = Literal["spool", "raise"]


_EVENT, _START, _END, _BLOB, _MARK = range(5)
_LETTER = {_EVENT: "e", _START: "s", _END: "x", _BLOB: "b"}
_MIN_BACKOFF, _MAX_BACKOFF = 0.05, 2.0


def default_spool_dir() -> Path:
    """``$REPLAYABLE_SPOOL_DIR``, else ``.replayable/spool`` under the current directory."""
    return Path(os.environ.get("REPLAYABLE_SPOOL_DIR") or ".replayable/spool").absolute()


def _warn(message: str) -> None:
    # This runs on the writer thread: a warnings filter set to "error" must not stop it.
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Exception:
        log.warning(message)


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
    ) -> None:
        self.store = store
        self._linker = Linker(store, redactor or Redactor())
        self.batch_size = batch_size
        self.interval = interval
        self.durable_timeout = durable_timeout
        self.max_block_s = 5.0
        self.on_store_failure: OnStoreFailure = "spool"
        self.spool_dir: Path | None = None
        self._queue: collections.deque[tuple[int, Any, Waiter | None]] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self.last_error: BaseException | None = None
        # Outage state, touched only by the writer thread once it runs.
        self._spool: Spool | None = None
        self._held: collections.deque[Batch] = collections.deque()
        self._leftovers: list[Spool] = []
        self._down: StoreError | None = None
        self._backoff = _MIN_BACKOFF
        self._next_try = 0.0
        self._drained = threading.Event()
        self._drained.set()
        self._committer = Committer()
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
        if spool_dir is not None and not self.store.url.startswith("memory:"):
            directory = Path(spool_dir).absolute()
            if directory != self.spool_dir and self._spool is None:
                self.spool_dir = directory
                # Adopt what an ended process left for this store; drained in the background.
                found = adopt_leftovers(directory, self.store.url)
                if found:
                    self._leftovers.extend(found)
                    self._drained.clear()
                    self._wake.set()

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
        self._queue.extend([(_EVENT, p, None) for p in pending])
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    def _refusing_event(self, pending: PendingEvent, durable: bool = False) -> None:
        # Installed as ``self.event`` while a fail-closed writer is in an outage,
        # so the normal path pays nothing for the check.
        if durable:
            self._submit_and_wait(_EVENT, pending)
        else:
            self._queue.append((_EVENT, pending, None))
        self._raise_down()

    def _raise_down(self) -> None:
        down = self._down
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

    def end(self, end: tuple[str, str, bytes | None, bytes | None, float], durable: bool) -> None:
        """Hand off a run's outcome; the writer adds the chain head and count."""
        if durable:
            self._submit_and_wait(_END, end)
        else:
            self._queue.append((_END, end, None))
            self._wake.set()

    def blob(self, digest: str, data: bytes) -> None:
        self._queue.append((_BLOB, (digest, data), None))

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything handed off so far is committed (or, fail-open, spooled)."""
        if threading.current_thread() is self._thread or self._closed or self._pid != os.getpid():
            return
        self._submit_and_wait(_MARK, None, self.durable_timeout if timeout is None else timeout)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every spooled batch is in the store; ``False`` if it is not by ``timeout``."""
        self._next_try = 0.0
        self._wake.set()
        return self._drained.wait(timeout)

    @property
    def spooled(self) -> bool:
        """Whether records wait in a spool or in memory for the store to come back."""
        return not self._drained.is_set()

    def _submit_and_wait(self, kind: int, item: Any, timeout: float | None = None) -> None:
        waiter = Waiter()
        self._queue.append((kind, item, waiter))
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

    # -- writer thread ------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                if self._step():
                    return
            except Exception as exc:
                # The thread must outlive any bug of its own: a dead writer would
                # silently drop every record handed to it afterwards.
                log.exception("replayable: the writer for %s hit an error", self.store.url)
                self.last_error = exc
                time.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, _MAX_BACKOFF)

    def _step(self) -> bool:
        """One round of the writer thread; ``True`` once it has shut down."""
        queue = self._queue
        while queue:
            # Only this thread takes from the queue: what it counts is there.
            pop = queue.popleft
            raw: list[tuple[int, Any, Waiter | None]] = [
                pop() for _ in range(min(len(queue), self.batch_size))
            ]
            try:
                batch = self._build(raw)
            except StoreError as exc:
                # Building an end record may need the run's start from the store;
                # nothing has advanced, so put the batch back and retry later.
                self.last_error = exc
                self._queue.extendleft(reversed(raw))
                time.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, _MAX_BACKOFF)
                break
            self._persist(batch)
            if self._due():
                self._drain_some()
        if self._due():
            self._drain_some()
        if self._closed and not self._queue:
            self._shutdown()
            return True
        return False

    # -- persisting ---------------------------------------------------------

    def _store_write(self, data: SpoolBatch, durable: bool) -> None:
        for digest, blob in data.blobs:
            self.store.put_blob(digest, blob)
        if data.starts or data.events or data.ends:
            self.store.append(data.starts, data.events, data.ends, durable=durable)

    def _commit(self, batch: Batch) -> Exception | None:
        data = batch.data
        _, error = self._committer.call(
            lambda: self._store_write(data, batch.durable),
            self.stall_s,
            f"writing to {self.store.url}",
        )
        return error

    def _backlogged(self) -> bool:
        return bool(self._held) or (self._spool is not None and self._spool.pending)

    def _due(self) -> bool:
        if not (self._leftovers or self._backlogged()):
            if self._down is not None and not self._committer.busy:
                # A drain round that ran out of time right after the last spooled
                # batch went in: nothing is left, so the store is back.
                self._recovered()
            return False
        if self._committer.busy:
            self._unstick()
            return False
        return time.monotonic() >= self._next_try

    def _unstick(self) -> None:
        """A store call that has hung far past the stall bound (a read the network will
        never answer) holds the store; ask the store to abort it."""
        hung = time.monotonic() - self._committer.started
        if (
            hung > max(5.0, 10 * self.stall_s)
            and self._committer.interrupted != self._committer.started
        ):
            self._committer.interrupted = self._committer.started
            log.warning(
                "replayable: a call to %s hung for %.0fs; interrupting it", self.store.url, hung
            )
            try:
                self.store.interrupt()
            except Exception as exc:
                log.warning("replayable: could not interrupt %s: %s", self.store.url, exc)

    def _persist(self, batch: Batch) -> None:
        if self._backlogged():
            self._hold(batch, self._down or StoreError(f"{self.store.url} is unavailable"))
            return
        error = self._commit(batch)
        if error is None:
            self._succeeded()
            batch.resolve(None)
            return
        if is_permanent(error):
            error = self._split(batch, error)
            if error is None:
                return
        self._failed(error)
        self._hold(batch, error)

    def _succeeded(self) -> None:
        self._backoff = _MIN_BACKOFF
        self.last_error = None

    def _failed(self, error: BaseException) -> None:
        self.last_error = error
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF)

    def _hold(self, batch: Batch, error: BaseException) -> None:
        """Keep a batch the store cannot take now: in the spool, else in memory."""
        if self._down is None:
            if isinstance(error, StoreError):
                self._down = error
            else:
                self._down = StoreError(f"writing to {self.store.url} failed: {error}")
                self._down.__cause__ = error
            self._drained.clear()
            log.warning(
                "replayable: %s is unavailable (%s); records are %s until it is back",
                self.store.url,
                error,
                "spooled" if self.spool_dir is not None else "kept in memory",
            )
            if self.on_store_failure == "raise":
                self.__dict__["event"] = self._refusing_event
        refusal = self._refusal(self._down) if self.on_store_failure == "raise" else None
        if not self._held and self.spool_dir is not None:
            try:
                if self._spool is None:
                    self._spool = Spool.create(self.spool_dir, self.store.url)
                self._spool.append(batch.data, fsync=batch.durable)
            except OSError as exc:
                _warn(
                    f"replayable: cannot spool records for {self.store.url} to "
                    f"{self.spool_dir}: {exc}; keeping them in memory"
                )
            else:
                batch.resolve(refusal)
                return
        if refusal is not None:
            batch.resolve(refusal)
        self._held.append(batch)

    def _split(self, batch: Batch, error: Exception) -> Exception | None:
        """Write a refused batch record by record; refuse only the records that fail.

        Returns a transient error if the store went away meanwhile (the caller
        then keeps the whole batch; what was written is recognised on retry).
        """
        refused: list[tuple[str, Any, Exception]] = []
        outcomes: list[tuple[Waiter | None, Exception | None]] = []
        only = len(batch.data) == 1
        for kind, record, waiter in batch.units():
            single = Batch.single(kind, record, batch.durable)
            err = error if only else self._commit(single)
            if err is not None and not is_permanent(err):
                return err
            if err is not None and self._already_stored(kind, record):
                err = None
            if err is not None:
                refused.append((kind, record, err))
            outcomes.append((waiter, err))
        self._succeeded()
        if refused:
            self._report(refused)
        for waiter, err in outcomes:
            if waiter is not None:
                waiter.resolve(err)
        for mark in batch.marks:
            mark.resolve(None)
        return None

    def _already_stored(self, kind: str, record: Any) -> bool:
        """Whether the store holds this very record (a retry of a committed write)."""

        def look() -> bool:
            if kind == "e":
                stored = self.store.event_at(record.run_id, record.seq)
                return stored is not None and stored.hash == record.hash
            run = self.store.get_run(record.run_id)
            if kind == "s":
                s = run.start
                return (s.started_at, s.input, s.workflow) == (
                    record.started_at,
                    record.input,
                    record.workflow,
                )
            if kind == "x":
                return run.end is not None and run.end.last_hash == record.last_hash
            return False

        found, error = self._committer.call(look, self.stall_s, f"reading {self.store.url}")
        return error is None and bool(found)

    def _report(self, refused: list[tuple[str, Any, Exception]]) -> None:
        where = ""
        if self.spool_dir is not None:
            try:
                path = append_rejects(
                    self.spool_dir, self.store.url, ((k, r) for k, r, _ in refused)
                )
                where = f"; they are kept in {path}"
            except OSError as exc:
                where = f"; they could not be kept ({exc})"
        kind, record, error = refused[0]
        first = f"{getattr(record, 'run_id', '')}#{getattr(record, 'seq', kind)}"
        _warn(
            f"replayable: {self.store.url} refused {len(refused)} record(s), the first "
            f"{first}: {type(error).__name__}: {error}{where}"
        )

    def _drain_some(self, budget: float = 0.2) -> None:
        """Send spooled and held batches to the store, oldest first, for up to ``budget`` s."""
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline and not self._committer.busy:
            if self._leftovers:
                if not self._drain_spool(self._leftovers[0]):
                    return
                if not self._leftovers[0].pending:
                    self._leftovers.pop(0).remove()
                continue
            if self._spool is not None and self._spool.pending:
                if not self._drain_spool(self._spool):
                    return
                continue
            if self._held:
                batch = self._held[0]
                error = self._commit(batch)
                if error is not None and is_permanent(error):
                    error = self._split(batch, error)
                elif error is None:
                    batch.resolve(None)
                if error is not None:
                    self._failed(error)
                    return
                self._held.popleft()
                continue
            self._recovered()
            return

    def _drain_spool(self, spool: Spool) -> bool:
        """Write the spool's next batch; ``False`` if the store is still unavailable."""
        try:
            item = spool.next_batch()
        except OSError as exc:
            _warn(f"replayable: cannot read the spool {spool.path}: {exc}")
            self._failed(exc)
            return False
        if item is None:
            return True
        data, offset = item
        batch = Batch.from_spool(data)
        error = self._commit(batch)
        if error is not None and is_permanent(error):
            error = self._split(batch, error)
        if error is not None:
            self._failed(error)
            return False
        self._succeeded()
        spool.advance(offset)
        return True

    def _recovered(self) -> None:
        """Everything spooled is in the store: go back to writing directly."""
        if self._spool is not None:
            self._spool.remove()
            self._spool = None
        if self._down is not None:
            log.warning("replayable: %s is back; the spool is drained", self.store.url)
        self._down = None
        self.__dict__.pop("event", None)
        self._backoff = _MIN_BACKOFF
        self._drained.set()

    def _shutdown(self) -> None:
        self._committer.stop()
        for spool in (*self._leftovers, *([self._spool] if self._spool else [])):
            spool.release()  # left for the next writer of this store to drain

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
        for kind, item, waiter in raw:
            durable = durable or waiter is not None
            if kind == _MARK:
                if waiter is not None:
                    marks.append(waiter)
                continue
            try:
                if kind == _EVENT:
                    record: Any = linker.event(item, chains)
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
        linker.commit(chains, ended)
        if refused:
            self._report(refused)
        return Batch(data, owned, marks, durable)

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
                if self._spool is None:
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
            with _writers_lock:
                if _writers.get(self.store) is self:
                    del _writers[self.store]


_writers: weakref.WeakKeyDictionary[EventStore, Writer | ProcessWriter] = (
    weakref.WeakKeyDictionary()
)
_writers_lock = threading.Lock()


def _forget_writers() -> None:
    # A forked child has none of its parent's writer threads (nor its pipe to the
    # writer process): it starts writers of its own when it records.
    global _writers_lock
    _writers_lock = threading.Lock()
    _writers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_writers)


def can_spawn_writer() -> bool:
    """Whether this interpreter can start the writer process: a plain Python, not a
    frozen application or a server that embeds one (their executable is not Python)."""
    exe = sys.executable
    if not exe or getattr(sys, "frozen", False):
        return False
    return os.path.basename(exe).lower().startswith(("python", "pypy"))


def writer_for(
    store: EventStore,
    *,
    max_block_s: float | None = None,
    on_store_failure: OnStoreFailure | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
) -> Writer | ProcessWriter:
    """The store's writer, started on first use; given options reconfigure it.

    A store that a second process can open gets a :class:`ProcessWriter` unless
    ``configure(writer="thread")`` (or ``$REPLAYABLE_WRITER=thread``) says otherwise;
    a fail-closed recording (``on_store_failure="raise"``) always gets the
    in-process writer, which sees an outage the moment it starts.
    """
    if on_store_failure == "raise":
        with _writers_lock:
            running = _writers.get(store)
        if isinstance(running, ProcessWriter) and not running._closed:
            running.close()  # what it holds is committed (or spooled) before the switch
    with _writers_lock:
        writer = _writers.get(store)
        if writer is None or writer._closed:
            block = 5.0 if max_block_s is None else max_block_s
            if (
                settings.writer == "process"
                and on_store_failure != "raise"
                and not store.url.startswith("memory:")
                and can_spawn_writer()
            ):
                writer = ProcessWriter(
                    store,
                    redactor=settings.redactor,
                    max_block_s=block,
                    on_store_failure="spool",
                    spool_dir=spool_dir if spool_dir is not None else default_spool_dir(),
                )
            else:
                writer = Writer(
                    store,
                    redactor=settings.redactor,
                    max_block_s=block,
                    on_store_failure=on_store_failure or "spool",
                    spool_dir=spool_dir,
                )
            _writers[store] = writer
            store.add_close_hook(writer.close)
            return writer
    writer.configure(
        max_block_s=max_block_s, on_store_failure=on_store_failure, spool_dir=spool_dir
    )
    return writer


def close_writer(store: EventStore) -> None:
    """Flush and stop ``store``'s writer if it has one."""
    with _writers_lock:
        writer = _writers.pop(store, None)
    if writer is not None:
        writer.close()


@atexit.register
def _flush_all() -> None:
    for writer in list(_writers.values()):
        try:
            writer.flush(timeout=10.0)
        except Exception as exc:  # the process is ending: say so, do not raise
            warnings.warn(f"replayable: could not flush events at exit: {exc}", stacklevel=1)
