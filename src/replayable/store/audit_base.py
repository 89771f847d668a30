"""The audit half of the store contract: annotations, the access log, anomaly flags.

Every backend keeps these in their own append-only tables, apart from the
event log and linked to it by run id and seq. The store only stores and
reads; hashing, roles and the anomaly rules live in :mod:`replayable.audit`.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec
import orjson

from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag, WorkflowStats

if TYPE_CHECKING:
    from replayable.events.model import Event, Run


__all__ = [
    "STATS_WINDOW",
    "AuditStore",
    "RunSummary",
    "may_be_empty",
    "may_be_error",
    "may_refuse",
    "scan_event_from_row",
    "stats_from",
    "summarize",
    "summarize_calls",
    "summary_sql",
]

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

    def annotation_head(self, run_id: str) -> Annotation | None:
        """The last annotation of the run's chain (what the next one links to)."""
        chain = self.annotations(run_id)
        return chain[-1] if chain else None

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

    def run_summaries(self, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        """What the built-in anomaly rules could find in each run, counted without
        building its events (see :class:`RunSummary`); SQL stores count in the database."""
        return {r: summarize(r, events) for r, events in self.events_of(run_ids).items()}

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
    from replayable.events.model import EVENT_SCHEMA_VERSION, Event
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
            and (r[19] == EVENT_SCHEMA_VERSION or r[19] == 1)
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


# -- run summaries: what the anomaly scan reads before it reads a run's events ------------

#: Kinds whose results are data a decision rests on (empty-data rule), and kinds whose
#: repeated identical calls count as a loop (repeated-call rule).
DATA_KINDS: Final = ("tool", "retrieval", "state_read")
REPEAT_KINDS: Final = ("tool", "http", "retrieval")
ROW_KEYS: Final = ("rows", "results", "items", "records", "data", "matches", "hits", "documents")
COUNT_KEYS: Final = ("count", "total", "row_count", "rowcount", "total_count", "num_results")
EMPTY_TEXTS: Final = ("[]", "null", "{}", '""')
EMPTY_HINTS: Final = (*(f'"{k}"' for k in (*ROW_KEYS, *COUNT_KEYS)), '"$t"')
ERROR_HINTS: Final = ('"error"', '"status"', '"$t"')
#: Lower-case words every built-in refusal pattern contains one of. All ASCII (or
#: uncased): a database's lower() and Python's agree on them.
REFUSAL_WORDS: Final = (
    "sorry",
    "unable",
    "cannot",
    "can't",
    "can’t",
    "won't",
    "won’t",
    "not able",
    '"refusal":"',
)
BLOCKED_KEY: Final = "side_effect_blocked"


def may_be_empty(text: str | None) -> bool:
    """Whether a stored response text can decode to empty data (``null``, ``[]``, a result
    whose rows are empty or whose count is zero); ``False`` is certain."""
    if text is None or text in EMPTY_TEXTS:
        return True
    if text[:1] != "{":
        return False  # a non-empty list or string, a number, a boolean
    return any(hint in text for hint in EMPTY_HINTS)


def may_be_error(text: str | None) -> bool:
    """Whether a stored response text can be error-shaped (``error``, ``status`` fields)."""
    return text is not None and any(hint in text for hint in ERROR_HINTS)


def may_refuse(text: str | None) -> bool:
    """Whether a stored LLM response can hold a built-in refusal pattern."""
    if text is None:
        return False
    lower = text.lower()
    return any(word in lower for word in REFUSAL_WORDS)


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Counts over one run's events that bound what the built-in rules can find in it:
    LLM calls; tool or HTTP calls that failed or may be error-shaped; data reads that
    may be empty; LLM answers that may refuse; calls (tool, HTTP, retrieval) identical
    to the call of those kinds just before them; events whose metadata names a blocked
    side effect. A rule whose count is zero (or
    below its threshold) cannot fire, so the scan reads only the other runs' events."""

    run_id: str
    llm_calls: int = 0
    tool_errors: int = 0
    empty_results: int = 0
    refusals: int = 0
    repeats: int = 0
    blocked: int = 0


#: One event as :func:`summarize_calls` reads it: kind, name, fingerprint, response
#: text, whether it failed, whether it is a side effect, whether its metadata names a
#: blocked side effect.
Call = tuple[str, str, str, "str | None", bool, bool, bool]


def summarize(run_id: str, events: Iterable[Event]) -> RunSummary:
    """A run's :class:`RunSummary` from its events (the reference the SQL stores match)."""
    return summarize_calls(
        run_id,
        (
            (e.kind, e.name, e.fingerprint, e.response, e.error is not None, e.side_effect,
             BLOCKED_KEY in e.metadata)
            for e in events
        ),
    )  # fmt: skip


def summarize_calls(run_id: str, calls: Iterable[Call]) -> RunSummary:
    """A run's :class:`RunSummary` from its events' :data:`Call` columns, in seq order."""
    llm = errors = empty = refusals = blocked = repeats = 0
    last: tuple[str, str] | None = None
    for kind, name, fingerprint, response, failed, side_effect, names_blocked in calls:
        if kind == "llm":
            llm += 1
            refusals += response is not None and may_refuse(response)
        elif kind in ("tool", "http"):
            errors += failed or may_be_error(response)
        if kind in DATA_KINDS and not side_effect and not failed:
            empty += may_be_empty(response)
        if kind in REPEAT_KINDS:
            repeats += (name, fingerprint) == last
            last = (name, fingerprint)
        blocked += names_blocked
    return RunSummary(
        run_id=run_id,
        llm_calls=llm,
        tool_errors=errors,
        empty_results=empty,
        refusals=refusals,
        repeats=repeats,
        blocked=blocked,
    )


def summary_sql(
    *,
    events: str,
    seq: str,
    kind: str,
    response: str,
    error: str,
    metadata: str,
    no_side_effect: str,
    contains: Callable[[str, str], str],
    literal: Callable[[str], str],
) -> str:
    """The statement counting :class:`RunSummary` fields per run in a database server
    (an in-process SQLite reads :data:`Call` columns and counts faster in Python), in one dialect:
    ``events`` a FROM clause giving the chosen runs' events as ``v``, their columns by
    name, ``contains(column, text)`` a substring test and ``literal`` a quoted string.
    Rows: run id, then the counts in field order (runs without events are absent)."""

    def any_of(column: str, needles: Iterable[str]) -> str:
        return "(" + " OR ".join(contains(column, n) for n in needles) + ")"

    def one_of(values: Iterable[str]) -> str:
        return "(" + ", ".join(literal(v) for v in values) + ")"

    # The conditions read the columns as the first step names them.
    empty = (
        f"(response IS NULL OR response IN {one_of(EMPTY_TEXTS)} OR "
        f"(substr(response, 1, 1) = '{{' AND {any_of('response', EMPTY_HINTS)}))"
    )
    # One pass: each call is compared with the previous call of the repeating kinds
    # (the window is partitioned on being one), the rest is counted per run.
    return f"""
        SELECT run_id,
               count(CASE WHEN kind = 'llm' THEN 1 END),
               count(CASE WHEN kind IN ('tool', 'http')
                          AND (error IS NOT NULL OR {any_of("response", ERROR_HINTS)})
                          THEN 1 END),
               count(CASE WHEN kind IN {one_of(DATA_KINDS)} AND pure AND error IS NULL
                          AND {empty} THEN 1 END),
               count(CASE WHEN kind = 'llm' AND response IS NOT NULL
                          AND {any_of("lower(response)", REFUSAL_WORDS)} THEN 1 END),
               count(CASE WHEN again THEN 1 END),
               count(CASE WHEN {contains("metadata", f'"{BLOCKED_KEY}"')} THEN 1 END)
          FROM (
            SELECT v.run_id, v.{kind} AS kind, v.{response} AS response, v.{error} AS error,
                   {no_side_effect} AS pure, v.{metadata} AS metadata,
                   (v.{kind} IN {one_of(REPEAT_KINDS)} AND v.name = lag(v.name) OVER w
                    AND v.fingerprint = lag(v.fingerprint) OVER w) AS again
              FROM {events}
            WINDOW w AS (PARTITION BY v.run_id, v.{kind} IN {one_of(REPEAT_KINDS)} ORDER BY v.{seq})
          ) AS ev
         GROUP BY run_id
    """


def summaries_from_rows(
    run_ids: Sequence[str], rows: Iterable[Sequence[Any]]
) -> dict[str, RunSummary]:
    """:class:`RunSummary` per run from :func:`summary_sql` rows (zeros for no events)."""
    out = {r: RunSummary(run_id=r) for r in run_ids}
    for run_id, llm, errors, empty, refusals, repeats, blocked in rows:
        out[str(run_id)] = RunSummary(
            run_id=str(run_id),
            llm_calls=int(llm),
            tool_errors=int(errors),
            empty_results=int(empty),
            refusals=int(refusals),
            repeats=int(repeats),
            blocked=int(blocked),
        )
    return out
