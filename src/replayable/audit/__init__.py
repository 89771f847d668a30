"""The audit layer: annotations, the access log, anomaly flags and audit reports.

In: a store and an :class:`Actor` (who, in which role, through which login).
Out: append-only audit records beside the event log, and reports.

- :func:`annotate` / :func:`annotations`: structured, hash-chained notes on a run
  or one event; corrections and retractions are new notes naming the old one.
- :class:`AuditReader`: the readers the CLI, reports and web app use; every
  read of payloads is written to the access log first.
- :func:`rule`, :class:`Scanner`: anomaly rules in a registry, and the
  incremental scan that stores their flags.
- :func:`build_report` and the renderers in :mod:`replayable.audit.report`.
"""

# No ``from __future__ import annotations`` here: it would bind the name of the
# public ``annotations`` function. Annotations naming TYPE_CHECKING imports are quoted.

from collections.abc import Iterable
from typing import TYPE_CHECKING

from replayable.audit.access import AuditReader, log_access
from replayable.audit.actor import PERMISSIONS, Actor, require
from replayable.audit.annotations import AnnotationSet, annotate_run
from replayable.audit.rules import AnomalyConfig, Finding, Rule, RuleContext, registry, rule
from replayable.audit.scan import QueueItem, Scanner, ScanResult, anomaly_queue
from replayable.audit.verify import AnnotationChainReport, verify_annotations
from replayable.events.audit import (
    CHANNELS,
    ROLES,
    VERDICTS,
    AccessEntry,
    Annotation,
    AnomalyFlag,
)

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = [
    "CHANNELS",
    "PERMISSIONS",
    "ROLES",
    "VERDICTS",
    "AccessEntry",
    "Actor",
    "Annotation",
    "AnnotationChainReport",
    "AnnotationSet",
    "AnomalyConfig",
    "AnomalyFlag",
    "AuditReader",
    "Finding",
    "QueueItem",
    "Rule",
    "RuleContext",
    "ScanResult",
    "Scanner",
    "annotate",
    "annotations",
    "anomaly_queue",
    "log_access",
    "registry",
    "require",
    "rule",
    "verify_annotations",
]


def _open(store: "EventStore | str | None") -> "tuple[EventStore, bool]":
    from replayable.store import EventStore, open_store

    if isinstance(store, EventStore):
        return store, False
    return open_store(store), True


def annotate(
    run: str,
    step: int | None = None,
    *,
    verdict: str | None,
    note: str,
    policy: str | None = None,
    author: str | None = None,
    role: str | None = None,
    amends: str | None = None,
    retract: bool = False,
    closes: Iterable[str] = (),
    store: "EventStore | str | None" = None,
) -> Annotation:
    """Annotate a run, or its event ``step``, with a verdict (``ok``, ``concern``,
    ``violation``, ``needs-review``), the policy it refers to and a note.

    ``author``/``role`` default to ``$REPLAYABLE_USER``/``$REPLAYABLE_ROLE`` (else the
    login, as ``admin``); only the ``analyst`` and ``admin`` roles may annotate, and on
    PostgreSQL the database login must hold the analyst grants too. ``amends`` names
    an annotation this one corrects (or, with ``retract=True``, withdraws).
    """
    opened, close = _open(store)
    try:
        actor = Actor.current(opened, user=author, role=role)
        return annotate_run(
            opened,
            actor,
            run,
            step=step,
            verdict=verdict,
            note=note,
            policy=policy,
            amends=amends,
            retract=retract,
            closes=closes,
        )
    finally:
        if close:
            opened.close()


def annotations(
    run: str,
    *,
    store: "EventStore | str | None" = None,
    reader: str | None = None,
    role: str | None = None,
    purpose: str | None = None,
) -> AnnotationSet:
    """The run's annotations: ``.current`` and ``.history``. The read is written to the
    access log (channel ``api``) as ``reader`` (default ``$REPLAYABLE_USER``)."""
    opened, close = _open(store)
    try:
        actor = Actor.current(opened, user=reader, role=role)
        return AuditReader(opened, actor, channel="api", purpose=purpose).annotations(run)
    finally:
        if close:
            opened.close()
