"""Records the store refuses for good: written one by one, the refused ones kept aside.

A batch the store refuses for a reason a retry cannot fix
(:class:`~replayable.errors.StoreRefusedError`: a duplicate, a newer schema, a
record the database cannot hold) is retried record by record. The valid
records are written; each refused one fails its durable waiter with the error
and is kept in ``<store key>.rejected.jsonl`` in the spool directory, and one
:class:`RuntimeWarning` per batch names the store and the error. A record that
the store already holds (a retry of a write that was committed but never
acknowledged) counts as written.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayable.capture.writer.batches import Batch, Committer, Waiter, is_permanent
from replayable.capture.writer.spool import append_rejects

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["Refusals", "warn"]

log = logging.getLogger("replayable.writer")

Refused = tuple[str, Any, Exception]


def warn(message: str) -> None:
    """A :class:`RuntimeWarning`, or a log line where a warnings filter set to "error"
    would turn it into an exception on the writer's own thread."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Exception:
        log.warning(message)


class Refusals:
    """Splits refused batches and keeps what the store refuses for good."""

    def __init__(
        self,
        store: EventStore,
        committer: Committer,
        commit: Callable[[Batch], Exception | None],
        stall_s: Callable[[], float],
        spool_dir: Callable[[], Path | None],
    ) -> None:
        self.store = store
        self._committer = committer
        self._commit = commit
        self._stall_s = stall_s
        self._spool_dir = spool_dir

    def split(self, batch: Batch, error: Exception) -> Exception | None:
        """Write a refused batch record by record; refuse only the records that fail.

        Returns a transient error if the store went away meanwhile (the caller
        then keeps the whole batch; what was written is recognised on retry).
        """
        refused: list[Refused] = []
        outcomes: list[tuple[Waiter | None, Exception | None]] = []
        only = len(batch.data) == 1
        for kind, record, waiter in batch.units():
            single = Batch.single(kind, record, batch.durable)
            err = error if only else self._commit(single)
            if err is not None and not is_permanent(err):
                return err
            if err is not None and self.already_stored(kind, record):
                err = None
            if err is not None:
                refused.append((kind, record, err))
            outcomes.append((waiter, err))
        if refused:
            self.report(refused)
        for waiter, err in outcomes:
            if waiter is not None:
                waiter.resolve(err)
        for mark in batch.marks:
            mark.resolve(None)
        return None

    def already_stored(self, kind: str, record: Any) -> bool:
        """Whether the store holds this very record (a retry of a committed write)."""
        store = self.store

        def look() -> bool:
            if kind == "e":
                stored = store.event_at(record.run_id, record.seq)
                return stored is not None and stored.hash == record.hash
            run = store.get_run(record.run_id)
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

        found, error = self._committer.call(look, self._stall_s(), f"reading {store.url}")
        return error is None and bool(found)

    def report(self, refused: list[Refused]) -> None:
        """Keep refused records in the rejects file and warn once, naming the first."""
        where = ""
        directory = self._spool_dir()
        if directory is not None:
            try:
                path = append_rejects(directory, self.store.url, ((k, r) for k, r, _ in refused))
                where = f"; they are kept in {path}"
            except OSError as exc:
                where = f"; they could not be kept ({exc})"
        kind, record, error = refused[0]
        if isinstance(record, dict):  # a hand-off that never became a record
            first = f"{record.get('run_id', '')}#{kind}"
        else:
            first = f"{getattr(record, 'run_id', '')}#{getattr(record, 'seq', kind)}"
        warn(
            f"replayable: {self.store.url} refused {len(refused)} record(s), the first "
            f"{first}: {type(error).__name__}: {error}{where}"
        )
