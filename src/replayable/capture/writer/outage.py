"""What the writer does while its store is unavailable: spool, retry, drain in order.

When the store cannot be reached (a
:class:`~replayable.errors.StoreUnavailableError`: a lost or refused
connection, a stall, a locked database), :meth:`Outage.hold` appends each
batch to a local spool file (see :mod:`~replayable.capture.writer.spool`),
fsynced per batch in durable mode, and :meth:`Outage.drain_some` retries the
store with backoff. When the store answers again the spool drains in order
and its file is deleted once every batch in it is committed; while a spool is
pending, new batches queue behind it, so each run's records reach the store
in order and its chain is unbroken. A spool left by a process that ended
during an outage is adopted and drained by the next writer for the same
store. Stores that live in memory are not spooled: their batches wait in
memory for the retry.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from replayable.capture.writer.backoff import Backoff
from replayable.capture.writer.batches import Batch, Committer, is_permanent
from replayable.capture.writer.refusals import Refusals, warn
from replayable.capture.writer.spool import Spool, adopt_leftovers
from replayable.errors import StoreError

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["Outage"]

log = logging.getLogger("replayable.writer")


class Outage:
    """The spool, the batches held in memory, and the state of the store: up or down."""

    def __init__(
        self,
        store: EventStore,
        committer: Committer,
        commit: Callable[[Batch], Exception | None],
        refusals: Refusals,
        backoff: Backoff,
        stall_s: Callable[[], float],
    ) -> None:
        self.store = store
        self.spool_dir: Path | None = None
        self.spool: Spool | None = None
        self.held: collections.deque[Batch] = collections.deque()
        self.leftovers: list[Spool] = []
        #: Why the store is down, or ``None`` while it is up.
        self.down: StoreError | None = None
        self.drained = threading.Event()
        self.drained.set()
        #: Called once when the store goes down and once when it is back.
        self.on_down: Callable[[], None] = lambda: None
        self.on_up: Callable[[], None] = lambda: None
        #: The error a fail-closed writer gives its waiters during an outage, else ``None``.
        self.refusal: Callable[[], StoreError | None] = lambda: None
        #: Set by the writer: the last error of a failed write, ``None`` after a success.
        self.on_error: Callable[[BaseException | None], None] = lambda _: None
        self._committer = committer
        self._commit = commit
        self._refusals = refusals
        self._backoff = backoff
        self._stall_s = stall_s

    def set_dir(self, directory: Path) -> bool:
        """Spool to ``directory`` (until a spool is open); ``True`` if leftovers were adopted."""
        directory = directory.absolute()
        if directory == self.spool_dir or self.spool is not None:
            return False
        self.spool_dir = directory
        # Adopt what an ended process left for this store; drained in the background.
        found = adopt_leftovers(directory, self.store.url)
        if found:
            self.leftovers.extend(found)
            self.drained.clear()
        return bool(found)

    def backlogged(self) -> bool:
        """Whether batches wait (spooled or held) that new ones must queue behind."""
        return bool(self.held) or (self.spool is not None and self.spool.pending)

    def due(self) -> bool:
        """Whether there is something to drain and it is time to try the store again."""
        if not (self.leftovers or self.backlogged()):
            if self.down is not None and not self._committer.busy:
                # A drain round that ran out of time right after the last spooled
                # batch went in: nothing is left, so the store is back.
                self.recovered()
            return False
        if self._committer.busy:
            self._unstick()
            return False
        return self._backoff.due()

    def _unstick(self) -> None:
        """A store call that has hung far past the stall bound (a read the network will
        never answer) holds the store; ask the store to abort it."""
        committer = self._committer
        hung = time.monotonic() - committer.started
        if hung > max(5.0, 10 * self._stall_s()) and committer.interrupted != committer.started:
            committer.interrupted = committer.started
            log.warning(
                "replayable: a call to %s hung for %.0fs; interrupting it", self.store.url, hung
            )
            try:
                self.store.interrupt()
            except Exception as exc:
                log.warning("replayable: could not interrupt %s: %s", self.store.url, exc)

    def failed(self, error: BaseException) -> None:
        self.on_error(error)
        self._backoff.failed()

    def succeeded(self) -> None:
        self.on_error(None)
        self._backoff.succeeded()

    def mark_down(self, error: BaseException) -> None:
        """The store is unavailable because of ``error`` (only the first call counts)."""
        if self.down is None:
            if isinstance(error, StoreError):
                self.down = error
            else:
                self.down = StoreError(f"writing to {self.store.url} failed: {error}")
                self.down.__cause__ = error
            self.drained.clear()
            self.on_down()

    def hold(self, batch: Batch, error: BaseException) -> None:
        """Keep a batch the store cannot take now: in the spool, else in memory."""
        self.mark_down(error)
        refusal = self.refusal()
        if not self.held and self.spool_dir is not None:
            try:
                if self.spool is None:
                    self.spool = Spool.create(self.spool_dir, self.store.url)
                self.spool.append(batch.data, fsync=batch.durable)
            except OSError as exc:
                warn(
                    f"replayable: cannot spool records for {self.store.url} to "
                    f"{self.spool_dir}: {exc}; keeping them in memory"
                )
            else:
                batch.resolve(refusal)
                return
        if refusal is not None:
            batch.resolve(refusal)
        self.held.append(batch)

    def drain_some(self, budget: float = 0.2) -> None:
        """Send spooled and held batches to the store, oldest first, for up to ``budget`` s."""
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline and not self._committer.busy:
            if self.leftovers:
                if not self._drain_spool(self.leftovers[0]):
                    return
                if not self.leftovers[0].pending:
                    self.leftovers.pop(0).remove()
                continue
            if self.spool is not None and self.spool.pending:
                if not self._drain_spool(self.spool):
                    return
                continue
            if self.held:
                batch = self.held[0]
                error = self._commit(batch)
                if error is not None and is_permanent(error):
                    error = self._refusals.split(batch, error)
                elif error is None:
                    batch.resolve(None)
                if error is not None:
                    self.failed(error)
                    return
                self.succeeded()
                self.held.popleft()
                continue
            self.recovered()
            return

    def _drain_spool(self, spool: Spool) -> bool:
        """Write the spool's next batch; ``False`` if the store is still unavailable."""
        try:
            item = spool.next_batch()
        except OSError as exc:
            warn(f"replayable: cannot read the spool {spool.path}: {exc}")
            self.failed(exc)
            return False
        if item is None:
            return True
        data, offset = item
        batch = Batch.from_spool(data)
        error = self._commit(batch)
        if error is not None and is_permanent(error):
            error = self._refusals.split(batch, error)
        if error is not None:
            self.failed(error)
            return False
        self.succeeded()
        spool.advance(offset)
        return True

    def recovered(self) -> None:
        """Everything spooled is in the store: go back to writing directly."""
        if self.spool is not None:
            self.spool.remove()
            self.spool = None
        if self.down is not None:
            log.warning("replayable: %s is back; the spool is drained", self.store.url)
        self.down = None
        self.on_up()
        self._backoff.succeeded()
        self.drained.set()

    def release(self) -> None:
        """Close the spool files, leaving them for the next writer of this store to drain."""
        for spool in (*self.leftovers, *([self.spool] if self.spool else [])):
            spool.release()
