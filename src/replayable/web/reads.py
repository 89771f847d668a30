"""The reads the pages make that the library has no single call for, each logged as
:class:`~replayable.audit.AuditReader` logs its own: a page of a run's events, and the
runs listing with the web's filters (tenant, anomaly rule, annotation verdict, sort).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replayable.audit.access import AuditReader, log_access
from replayable.audit.actor import require
from replayable.cli.query import build_query
from replayable.errors import AccessDeniedError, ConfigurationError
from replayable.events.model import Event, Run
from replayable.store import EventStore, RunFilter

__all__ = ["RunQuery", "event_count", "event_page", "list_runs"]

#: Most runs a filtered or re-sorted listing reads before paging in Python.
SCAN_LIMIT = 10_000
_SORTS = ("-started", "started", "workflow", "-workflow", "status", "-status", "duration")


def event_count(store: EventStore, run: Run) -> int:
    """How many events the run holds (a finished run says; a running one is counted)."""
    return run.end.event_count if run.end is not None else len(store.events(run.run_id))


def event_page(
    reader: AuditReader, run: Run, first: int, last: int
) -> tuple[list[Event], Event | None]:
    """Events ``first``..``last`` of ``run`` and the one after (for the gap to it), their
    requests and responses logged as read (the one after is not shown, not logged)."""
    require(reader.actor, "read", "read recorded payloads")
    store = reader.store
    # Read by key: a later page (or a jump to step 5,000) costs what the first one does.
    found = store.events_range(run.run_id, first, last + 1)
    shown = [e for e in found if e.seq <= last]
    following = next((e for e in found if e.seq > last), None)
    log_access(
        store,
        reader.actor,
        channel=reader.channel,
        what=("request", "response"),
        run_id=run.run_id,
        steps=[e.seq for e in shown],
        purpose=reader.purpose,
        tenant=run.start.tenant,
    )
    return shown, following


@dataclass(frozen=True, slots=True)
class RunQuery:
    """The runs page's filters, as its URL carries them."""

    workflow: str | None = None
    status: str | None = None
    since: str | None = None
    until: str | None = None
    meta: tuple[str, ...] = ()
    tenant: str | None = None
    rule: str | None = None
    verdict: str | None = None
    kind: str | None = None
    name: str | None = None
    where: tuple[str, ...] = ()
    sort: str = "-started"
    page: int = 1
    per: int = 50
    #: Search the payloads of archived runs whose hot copies were dropped too (fetched
    #: from the archive); without it such runs are left out and counted.
    archived: bool = False

    def __post_init__(self) -> None:
        if self.sort not in _SORTS:
            raise ConfigurationError(f"sort {self.sort!r} is not one of {', '.join(_SORTS)}")
        if self.page < 1 or not 1 <= self.per <= 500:
            raise ConfigurationError("page must be at least 1 and per between 1 and 500")

    @property
    def event_level(self) -> bool:
        return bool(self.kind or self.name or self.where)

    def params(self) -> list[tuple[str, str]]:
        """The filters as URL query pairs (for shareable links and the next page)."""
        out: list[tuple[str, str]] = []
        for key in (
            "workflow",
            "status",
            "since",
            "until",
            "tenant",
            "rule",
            "verdict",
            "kind",
            "name",
        ):
            value = getattr(self, key)
            if value:
                out.append((key, value))
        out += [("meta", m) for m in self.meta] + [("where", w) for w in self.where]
        if self.sort != "-started":
            out.append(("sort", self.sort))
        if self.per != 50:
            out.append(("per", str(self.per)))
        if self.archived:
            out.append(("archived", "true"))
        return out


def _sort_key(sort: str) -> Any:
    field = sort.lstrip("-")
    if field == "workflow":
        return lambda r: (r.workflow, r.started_at)
    if field == "status":
        return lambda r: (r.status, r.started_at)
    if field == "duration":
        return lambda r: (r.ended_at or r.started_at) - r.started_at
    return lambda r: r.started_at


def list_runs(
    reader: AuditReader, q: RunQuery, tenant: str | None
) -> tuple[list[Run], dict[str, list[Event]], bool, bool, int]:
    """One page of runs matching ``q`` (``tenant``: the only tenant the user may see),
    the matching steps of each (event-level filters), whether a next page exists,
    whether every run was searched: filters and sorts the store cannot apply (tenant,
    anomaly rule, verdict, sort) look at the newest :data:`SCAN_LIMIT` runs only, and
    the page says so when more runs were left unread; and how many archived runs'
    payloads a payload filter did not search (``SearchPage.archived_skipped``)."""
    from replayable.cli._options import parse_meta, parse_status, parse_when

    store = reader.store
    want_tenant = tenant if tenant is not None else q.tenant
    post = want_tenant is not None or q.rule or q.verdict or q.sort != "-started"
    offset = (q.page - 1) * q.per
    steps: dict[str, list[Event]] = {}
    archived_skipped = 0
    if q.event_level:
        eq = build_query(
            workflow=q.workflow,
            kind=q.kind,
            name=q.name,
            since=q.since,
            until=q.until,
            meta=list(q.meta),
            where=list(q.where),
            limit=SCAN_LIMIT if post else q.per + 1,
            offset=0 if post else offset,
            include_archived=q.archived,
        )
        page = store.search(eq)
        archived_skipped = page.archived_skipped
        complete = not post or page.next_offset is None
        runs = [h.run for h in page.hits]
        steps = {h.run_id: h.events for h in page.hits}
        if q.status:
            runs = [r for r in runs if r.status == parse_status(q.status)]
        if steps:
            log_access(
                store,
                reader.actor,
                channel=reader.channel,
                what=("request", "response"),
                purpose=reader.purpose,
            )
    else:
        runs = store.list_runs(
            RunFilter(
                workflow=q.workflow,
                status=parse_status(q.status),
                metadata=parse_meta(q.meta),
                since=parse_when(q.since, "since"),
                until=parse_when(q.until, "until"),
                limit=SCAN_LIMIT if post else offset + q.per + 1,
            )
        )
        complete = not post or len(runs) < SCAN_LIMIT
        if not post:
            runs = runs[offset:]
    if want_tenant is not None:
        runs = [r for r in runs if (r.start.tenant or "") == want_tenant]
    if q.rule:
        flagged = {f.run_id for f in reader.flags(rule=q.rule)}
        runs = [r for r in runs if r.run_id in flagged]
    if q.verdict:
        runs = _with_verdict(reader, runs, q.verdict)
    if post:
        # The longest first for duration; otherwise "-" sorts descending.
        runs.sort(key=_sort_key(q.sort), reverse=q.sort.startswith("-") or q.sort == "duration")
        runs = runs[offset:]
    more = len(runs) > q.per
    return runs[: q.per], steps, more, complete, archived_skipped


def _with_verdict(reader: AuditReader, runs: Sequence[Run], verdict: str) -> list[Run]:
    from replayable.audit.annotations import AnnotationSet

    require(reader.actor, "read", "read annotations")
    out = []
    try:
        for r in runs:
            found = AnnotationSet(r.run_id, tuple(reader.store.annotations(r.run_id)))
            if any(a.verdict == verdict for a in found.current):
                out.append(r)
    except AccessDeniedError:
        return []
    log_access(
        reader.store,
        reader.actor,
        channel=reader.channel,
        what=("annotations",),
        purpose=reader.purpose,
    )
    return out
