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
from typing import TYPE_CHECKING

from replayable.audit.actor import Actor, check_channel, require
from replayable.audit.annotations import AnnotationSet, annotate_run, new_id
from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag
from replayable.events.model import Event, Run
from replayable.store.base import EventStore

if TYPE_CHECKING:
    from replayable.audit.scan import QueueItem

__all__ = ["AuditReader", "log_access"]


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
    at = time.time() if now is None else now
    entry = AccessEntry(
        entry_id=new_id(at),
        at=at,
        login=actor.login,
        user=actor.user,
        role=actor.role,
        channel=check_channel(channel),
        purpose=purpose,
        run_id=run_id,
        steps=tuple(steps),
        what=tuple(what),
        tenant=tenant,
    )
    store.append_access([entry])
    return entry


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
