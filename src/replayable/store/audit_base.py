"""The audit half of the store contract: annotations, the access log, anomaly flags.

Every backend keeps these in their own append-only tables, apart from the
event log and linked to it by run id and seq. The store only stores and
reads; hashing, roles and the anomaly rules live in :mod:`replayable.audit`.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag, WorkflowStats

if TYPE_CHECKING:
    from replayable.events.model import Event, Run

__all__ = ["STATS_WINDOW", "AuditStore", "stats_from"]

#: Workflow statistics are taken over this many of its most recent finished runs:
#: enough for a stable mean and median, and a cost that does not grow with the log.
STATS_WINDOW = 1000


class AuditStore(ABC):
    """Append-only audit records. :class:`~replayable.store.EventStore` includes it."""

    # -- annotations --------------------------------------------------------------

    @abstractmethod
    def append_annotations(self, annotations: Sequence[Annotation]) -> None:
        """Write annotations in one transaction. A ``(run_id, chain_index)`` already
        taken (a concurrent writer got there first) raises
        :class:`~replayable.errors.AppendOnlyError` and writes nothing."""

    @abstractmethod
    def annotations(self, run_id: str) -> list[Annotation]:
        """The run's annotations in chain order (empty for none)."""

    @abstractmethod
    def flag_closers(self) -> dict[str, str]:
        """Every anomaly flag some annotation names in ``closes``: flag id -> the id of
        the first annotation that closed it."""

    # -- the access log -------------------------------------------------------------

    @abstractmethod
    def append_access(self, entries: Sequence[AccessEntry]) -> None:
        """Append access-log entries in one transaction."""

    @abstractmethod
    def access_entries(
        self,
        *,
        run_id: str | None = None,
        who: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[AccessEntry]:
        """Access-log entries, oldest first; ``who`` matches the login or the user.
        With ``limit``, the newest ``limit`` entries (still oldest first)."""

    # -- anomaly flags ----------------------------------------------------------------

    @abstractmethod
    def append_flags(self, flags: Sequence[AnomalyFlag], scanned: Sequence[str]) -> None:
        """Store a scan's flags and mark ``scanned`` runs as scanned, in one transaction.
        A run already marked raises :class:`~replayable.errors.AppendOnlyError`."""

    @abstractmethod
    def flags(
        self,
        *,
        run_id: str | None = None,
        rule: str | None = None,
        since: float | None = None,
    ) -> list[AnomalyFlag]:
        """Stored flags, oldest first."""

    @abstractmethod
    def unscanned_runs(
        self,
        *,
        since: float | None = None,
        workflow: str | None = None,
        limit: int = 500,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        """Finished runs not yet marked scanned, oldest first by ``(started_at, run_id)``
        and after ``after`` in that order (what a scan takes next)."""

    @abstractmethod
    def events_of(self, run_ids: Sequence[str]) -> dict[str, list[Event]]:
        """Several runs' events in one read, each list ordered by seq."""

    @abstractmethod
    def workflow_stats(self, workflows: Iterable[str]) -> dict[str, WorkflowStats]:
        """LLM calls per run and run durations per workflow, over its
        :data:`STATS_WINDOW` most recent finished runs (computed in the database
        where the backend has one)."""

    def login_name(self) -> str:
        """Who this store connection acts as: the database login, else the OS user."""
        import getpass

        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return "unknown"


def stats_from(workflow: str, rows: Sequence[tuple[int, float]]) -> WorkflowStats:
    """Stats from ``(llm_calls, duration_s)`` rows, for backends that compute in Python."""
    counts = [float(n) for n, _ in rows]
    durations = [d for _, d in rows]
    return WorkflowStats(
        workflow=workflow,
        runs=len(rows),
        llm_mean=statistics.fmean(counts) if counts else 0.0,
        llm_std=statistics.pstdev(counts) if counts else 0.0,
        median_duration=statistics.median(durations) if durations else None,
    )
