"""The audit half of the store contract: annotations, the access log, anomaly flags.

Every backend keeps these in their own append-only tables, apart from the
event log and linked to it by run id and seq. The store only stores and
reads; hashing, roles and the anomaly rules live in :mod:`replayable.audit`.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag, WorkflowStats

if TYPE_CHECKING:
    from replayable.events.model import Event, Run


__all__ = ["STATS_WINDOW", "AuditStore", "scan_event_from_row", "stats_from"]

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


def scan_event_from_row(r: Sequence[Any]) -> Event:
    """An event from a row of the event columns, for bulk reads (the anomaly scan).

    Checking every column one by one cost more than the rules; here a row whose
    columns have the plain types a sound row has is built at once, and any other
    row goes through the store's checking decoder, which names its problems.
    Payload text is not parsed here: a rule that cannot parse it is reported by
    the scan and the scan goes on.
    """
    from replayable.events.model import SCHEMA_VERSION, Event
    from replayable.store.rows import event_from_row

    try:
        str_, int_, none = str, int, None
        sound = (
            len(r) == 20
            and type(r[0]) is str_
            and type(r[1]) is int_
            and type(r[2]) is str_
            and type(r[3]) is str_
            and (r[4] is none or type(r[4]) is str_)
            and (r[5] is none or type(r[5]) is int_)
            and (r[6] is none or type(r[6]) is str_)
            and type(r[7]) is str_
            and type(r[8]) is str_
            and (r[9] is none or type(r[9]) is str_)
            and (r[10] == "json" or r[10] == "tagged")
            and (r[11] is none or type(r[11]) is str_)
            and (r[12] is True or r[12] is False or r[12] == 0 or r[12] == 1)
            and type(r[13]) is float
            and type(r[14]) is int_
            and type(r[15]) is str_
            and type(r[16]) is int_
            and type(r[17]) is str_
            and type(r[18]) is str_
            and r[19] == SCHEMA_VERSION
        )
        metadata = {} if r[15] == "{}" else orjson.loads(r[15]) if sound else None
    except orjson.JSONDecodeError:
        sound = False
    if not sound or type(metadata) is not dict:
        return event_from_row(r)
    return Event(
        run_id=r[0],
        seq=r[1],
        kind=r[2],
        name=r[3],
        key=r[4],
        parent=r[5],
        call_site=r[6],
        request=r[7],
        fingerprint=r[8],
        response=r[9],
        encoding=r[10],
        error=r[11],
        side_effect=bool(r[12]),
        started_at=r[13],
        duration_ns=r[14],
        metadata=metadata,
        chain_index=r[16],
        prev_hash=r[17],
        hash=r[18],
    )
