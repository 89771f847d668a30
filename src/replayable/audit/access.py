"""Reads that leave a trace: every payload shown through these readers is logged first.

:class:`AuditReader` is what the CLI, the reports and the web app read runs
through. It takes the :class:`~replayable.audit.actor.Actor`, the channel
(``cli``, ``web``, ``api``, ``report``) and the purpose, and appends one
access-log entry per read (who, when, which run and steps, what kind of data)
*before* it returns the data: a read that cannot be logged fails, and nothing
is shown. Reading the access log is itself logged.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from replayable.audit.actor import Actor, check_channel, require
from replayable.audit.annotations import AnnotationSet, annotate_run, new_id
from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag
from replayable.events.model import Event, Run
from replayable.store.base import EventStore

if TYPE_CHECKING:
    from replayable.audit.policies import Policy, PolicyResult
    from replayable.audit.scan import QueueItem
    from replayable.diff.result import RunDiff
    from replayable.replay.session import ReplayResult
    from replayable.replay.stepper import Stepper
    from replayable.store.search import EventQuery, SearchPage

__all__ = ["AuditReader", "Searchable", "log_access", "log_reads"]


class Searchable(Protocol):
    """What answers an impact query: a store, or a search over its archive."""

    def search(self, query: EventQuery) -> SearchPage: ...


def log_access(
    store: EventStore,
    actor: Actor,
    *,
    channel: str,
    what: Iterable[str],
    run_id: str | None = None,
    steps: Iterable[int] = (),
    purpose: str | None = None,
    tenant: str | None = None,
    now: float | None = None,
) -> AccessEntry:
    """Append one access-log entry and return it."""
    reads = [(run_id, tenant, steps)]
    return log_reads(
        store, actor, channel=channel, what=what, reads=reads, purpose=purpose, now=now
    )[0]


def log_reads(
    store: EventStore,
    actor: Actor,
    *,
    channel: str,
    what: Iterable[str],
    reads: Iterable[tuple[str | None, str | None, Iterable[int]]],
    purpose: str | None = None,
    now: float | None = None,
) -> list[AccessEntry]:
    """Append one entry per ``(run_id, tenant, steps)`` read, all in one transaction."""
    at = time.time() if now is None else now
    kinds, via = tuple(what), check_channel(channel)
    entries = [
        AccessEntry(
            entry_id=new_id(at),
            at=at,
            login=actor.login,
            user=actor.user,
            role=actor.role,
            channel=via,
            purpose=purpose,
            run_id=run_id,
            steps=tuple(steps),
            what=kinds,
            tenant=tenant,
        )
        for run_id, tenant, steps in reads
    ]
    if entries:
        store.append_access(entries)
    return entries


class AuditReader:
    """Reads runs, payloads, annotations, flags and the access log on behalf of an actor.

    >>> reader = AuditReader(store, Actor.current(store), channel="cli", purpose="INC-204")
    >>> events = reader.events(run_id)        # logged: which steps, request and response
    """

    def __init__(
        self,
        store: EventStore,
        actor: Actor,
        *,
        channel: str = "api",
        purpose: str | None = None,
    ) -> None:
        self.store = store
        self.actor = actor
        self.channel = check_channel(channel)
        self.purpose = purpose

    def _log(
        self,
        what: Iterable[str],
        run: Run | None = None,
        steps: Iterable[int] = (),
    ) -> AccessEntry:
        return log_access(
            self.store,
            self.actor,
            channel=self.channel,
            what=what,
            run_id=None if run is None else run.run_id,
            steps=steps,
            purpose=self.purpose,
            tenant=None if run is None else run.start.tenant,
        )

    def _log_runs(self, what: Iterable[str], reads: Sequence[tuple[Run, Iterable[int]]]) -> None:
        """One entry per run read, all appended in one transaction."""
        log_reads(
            self.store,
            self.actor,
            channel=self.channel,
            what=what,
            reads=[(run.run_id, run.start.tenant, steps) for run, steps in reads],
            purpose=self.purpose,
        )

    def _record(self, run: str | Run) -> Run:
        return self.store.run(run) if isinstance(run, str) else run

    def _tapes(self, record: Run, children: str) -> list[tuple[Run, list[int]]]:
        """The run and (served from their tapes) its child runs, each with its steps."""
        reads = [(record, [e.seq for e in self.store.events(record.run_id)])]
        if children == "tape":
            todo = self.store.children(record.run_id)
            while todo:
                child = todo.pop(0)
                reads.append((child, [e.seq for e in self.store.events(child.run_id)]))
                todo.extend(self.store.children(child.run_id))
        return reads

    def run(self, run: str) -> Run:
        """The run record by id or prefix (its header: not a payload, not logged)."""
        require(self.actor, "read", "read runs")
        return self.store.run(run)

    def events(self, run: str | Run, steps: Sequence[int] | None = None) -> list[Event]:
        """The run's events (only ``steps`` if given), logged as a read of their
        requests and responses."""
        require(self.actor, "read", "read recorded payloads")
        record = self.store.run(run) if isinstance(run, str) else run
        if steps is None:
            events = self.store.events(record.run_id)
        else:
            found = (self.store.event_at(record.run_id, s) for s in dict.fromkeys(steps))
            events = [e for e in found if e is not None]
        self._log(("request", "response"), record, (e.seq for e in events))
        return events

    def timeline(self, run: str | Run) -> tuple[list[Event], AnnotationSet]:
        """The run's events and annotations together, logged as one read (what ``show``
        and the run page display)."""
        require(self.actor, "read", "read recorded payloads")
        record = self.store.run(run) if isinstance(run, str) else run
        events = self.store.events(record.run_id)
        found = AnnotationSet(record.run_id, tuple(self.store.annotations(record.run_id)))
        self._log(("request", "response", "annotations"), record, (e.seq for e in events))
        return events, found

    def annotations(self, run: str | Run) -> AnnotationSet:
        """The run's annotations (current state and history), logged."""
        require(self.actor, "read", "read annotations")
        record = self.store.run(run) if isinstance(run, str) else run
        found = AnnotationSet(record.run_id, tuple(self.store.annotations(record.run_id)))
        self._log(("annotations",), record, sorted({a.seq for a in found if a.seq is not None}))
        return found

    def flags(
        self, *, run: str | Run | None = None, rule: str | None = None, since: float | None = None
    ) -> list[AnomalyFlag]:
        """Anomaly flags (their evidence quotes payloads), logged."""
        require(self.actor, "read", "read anomaly flags")
        record = None if run is None else self.store.run(run) if isinstance(run, str) else run
        found = self.store.flags(
            run_id=None if record is None else record.run_id, rule=rule, since=since
        )
        steps = sorted({s for f in found for s in f.steps}) if record is not None else ()
        self._log(("flags",), record, steps)
        return found

    def queue(
        self, *, open_only: bool = False, rule: str | None = None, run: str | None = None
    ) -> list[QueueItem]:
        """The anomaly queue (flags with the annotations closing them), logged."""
        from replayable.audit.scan import anomaly_queue

        require(self.actor, "read", "read anomaly flags")
        record = None if run is None else self.store.run(run)
        items = anomaly_queue(
            self.store,
            open_only=open_only,
            rule=rule,
            run_id=None if record is None else record.run_id,
        )
        steps = sorted({s for i in items for s in i.flag.steps}) if record is not None else ()
        self._log(("flags",), record, steps)
        return items

    def access_log(
        self,
        *,
        run: str | None = None,
        who: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[AccessEntry]:
        """Access-log entries, oldest first; this read is logged before it is made,
        so it appears in its own answer."""
        require(self.actor, "read_access_log", "read the access log")
        record = None if run is None else self.store.run(run)
        self._log(("access_log",), record)
        return self.store.access_entries(
            run_id=None if record is None else record.run_id, who=who, since=since, limit=limit
        )

    def replay(self, run: str | Run, **options: Any) -> ReplayResult:
        """Re-execute a recorded run (keyword options as :func:`replayable.replay`),
        logged first as a read of its tape and of the child runs served from theirs.

        Only roles that may replay (``engineer``, ``admin``) may call it: an auditor
        reads events without triggering replays."""
        from replayable.replay.api import replay

        require(self.actor, "replay", "replay runs")
        record = self._record(run)
        self._log_runs(
            ("request", "response", "replay"), self._tapes(record, options.get("children", "tape"))
        )
        return replay(record.run_id, store=self.store, **options)

    def check(self, run: str | Run, policies: Iterable[Policy]) -> list[PolicyResult]:
        """Every policy's verdict on a recorded run, logged first as a read of the run
        and its child runs (policies read their events)."""
        from replayable.audit.policies import check_run

        require(self.actor, "read", "judge recorded runs")
        record = self._record(run)
        self._log_runs(("request", "response", "policy"), self._tapes(record, "tape"))
        return check_run(self.store, record.run_id, policies)

    def stepper(self, run: str | Run) -> Stepper:
        """A :class:`~replayable.replay.stepper.Stepper` on the run, logged like a replay."""
        from replayable.replay.stepper import Stepper

        require(self.actor, "replay", "replay runs")
        record = self._record(run)
        self._log_runs(("request", "response", "replay"), self._tapes(record, "tape"))
        return Stepper(record.run_id, store=self.store)

    def diff(
        self,
        a: str | Run,
        b: str | Run,
        *,
        ignore: Iterable[str] = (),
        significant: Iterable[str] = (),
    ) -> RunDiff:
        """Two runs compared step by step (see :func:`replayable.diff`), logged as a read
        of both runs' payloads before it is returned."""
        from replayable.diff.result import diff

        require(self.actor, "read", "read recorded payloads")
        left, right = self._record(a), self._record(b)
        result = diff(left, right, store=self.store, ignore=ignore, significant=significant)
        self._log_runs(
            ("request", "response", "diff"),
            [
                (left, [p.left.seq for p in result.pairs if p.left is not None]),
                (right, [p.right.seq for p in result.pairs if p.right is not None]),
            ],
        )
        return result

    def search(self, query: EventQuery, source: Searchable | None = None) -> SearchPage:
        """One page of runs whose events match ``query`` (their payloads are searched),
        logged as one ``search`` entry per run found, naming the matching steps.

        ``source`` answers instead of the store (the Parquet archive on DuckDB:
        :class:`replayable.archive.search.ArchiveSearch`); the log is the store's."""
        require(self.actor, "read", "search recorded payloads")
        page = (source or self.store).search(query)
        self._log_runs(("search",), [(h.run, [e.seq for e in h.events]) for h in page.hits])
        return page

    def annotate(
        self,
        run: str,
        *,
        step: int | None = None,
        verdict: str | None,
        note: str,
        policy: str | None = None,
        amends: str | None = None,
        retract: bool = False,
        closes: Iterable[str] = (),
    ) -> Annotation:
        """Append an annotation as this reader's actor (analyst or admin roles)."""
        return annotate_run(
            self.store,
            self.actor,
            run,
            step=step,
            verdict=verdict,
            note=note,
            policy=policy,
            amends=amends,
            retract=retract,
            closes=closes,
        )
