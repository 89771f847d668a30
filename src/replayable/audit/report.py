"""Audit reports: one run's header, lineage, chain status, timeline, flags, annotations and
access-log summary, as a plain dict, then as JSON, Markdown or a self-contained HTML file.

:func:`build_report` reads through an :class:`~replayable.audit.access.AuditReader`
(channel ``report``), so producing a report is itself in the access log. A
section the reader's role or database login may not read is marked
``{"available": false, "reason": …}`` instead of failing the report.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson

from replayable.audit.access import AuditReader
from replayable.audit.actor import require
from replayable.audit.annotations import AnnotationSet
from replayable.audit.rules import plain
from replayable.audit.verify import verify_annotations
from replayable.errors import AccessDeniedError
from replayable.events.audit import Annotation
from replayable.events.model import Event, Run
from replayable.store.verify import verify_run

__all__ = ["REPORT_VERSION", "build_report", "report_json"]

#: Version of the report's JSON layout.
REPORT_VERSION = 1

T = TypeVar("T")


def _section(read: Callable[[], T]) -> T | dict[str, Any]:
    try:
        return read()
    except AccessDeniedError as exc:
        return {"available": False, "reason": str(exc)}


def _payload(text: str | None) -> Any:
    return None if text is None else plain(orjson.loads(text))


def _annotation(a: Annotation, found: AnnotationSet) -> dict[str, Any]:
    return {
        "annotation_id": a.annotation_id,
        "seq": a.seq,
        "verdict": a.verdict,
        "retract": a.retract,
        "policy": a.policy,
        "note": a.note,
        "author": a.author,
        "role": a.role,
        "login": a.login,
        "created_at": a.created_at,
        "amends": a.amends,
        "closes": list(a.closes),
        "current": a in found.current,
        "hash": a.hash,
    }


def _lineage(reader: AuditReader, run: Run) -> dict[str, Any]:
    s = run.start
    return {
        "parent_run_id": s.parent_run_id,
        "parent_seq": s.parent_seq,
        "root_run_id": s.root_run_id,
        "lineage": s.lineage,
        "children": [c.run_id for c in reader.store.children(run.run_id)],
    }


def _chain(reader: AuditReader, run: Run) -> dict[str, Any]:
    events = verify_run(reader.store, run.run_id)
    out: dict[str, Any] = {
        "ok": events.ok,
        "message": events.message,
        "first_bad_seq": events.first_bad_seq,
        "seal": "sealed" if run.end is not None else "unsealed (no end record)",
    }
    notes = _section(lambda: verify_annotations(reader.store, run.run_id))
    if isinstance(notes, dict):
        out["annotations"] = notes
    else:
        out["annotations"] = {"ok": notes.ok, "message": notes.message}
        out["ok"] = events.ok and notes.ok
    return out


def _access_summary(reader: AuditReader, run: Run, recent: int) -> dict[str, Any]:
    require(reader.actor, "read_access_log", "read the access log")
    entries = reader.access_log(run=run.run_id)
    readers = Counter(f"{e.user} ({e.role})" for e in entries)
    return {
        "reads": len(entries),
        "readers": dict(readers.most_common()),
        "channels": dict(Counter(e.channel for e in entries).most_common()),
        "first_at": entries[0].at if entries else None,
        "last_at": entries[-1].at if entries else None,
        "recent": [
            {
                "at": e.at,
                "user": e.user,
                "login": e.login,
                "role": e.role,
                "channel": e.channel,
                "purpose": e.purpose,
                "steps": list(e.steps),
                "what": list(e.what),
            }
            for e in entries[-recent:]
        ],
    }


def _event(e: Event, *, payload: bool, marks: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": e.seq,
        "kind": e.kind,
        "name": e.name,
        "started_at": e.started_at,
        "duration_ms": e.duration_ns / 1e6,
        "side_effect": e.side_effect,
        "failed": e.error is not None,
        "marks": sorted(marks),
        "hash": e.hash,
    }
    if payload:
        out["request"] = _payload(e.request)
        out["response"] = _payload(e.response)
        out["error"] = e.error_value()
    return out


def build_report(
    reader: AuditReader,
    run: str | Run,
    *,
    matching: Iterable[int] = (),
    query: str | None = None,
    recent_reads: int = 20,
    now: float | None = None,
) -> dict[str, Any]:
    """The audit report of ``run`` as a JSON-ready dict.

    The timeline lists every event; the payloads of the ``matching`` steps (an
    impact query's hits), of flagged steps and of annotated steps are included.
    """
    # Whatever edge asked for it, what a report reads is logged as read by a report.
    reader = AuditReader(reader.store, reader.actor, channel="report", purpose=reader.purpose)
    record = reader.store.run(run) if isinstance(run, str) else run
    matching = set(matching)
    flags = _section(lambda: reader.queue(run=record.run_id))
    flagged: dict[int, list[str]] = {}
    for item in flags if isinstance(flags, list) else []:
        for seq in item.flag.steps:
            flagged.setdefault(seq, []).append(item.flag.rule)
    notes = _section(lambda: reader.annotations(record))
    noted = {a.seq for a in notes.current} if isinstance(notes, AnnotationSet) else set()
    every = reader.store.events(record.run_id)
    shown = sorted({e.seq for e in every} & (matching | set(flagged) | noted))
    # The payloads this report shows are logged as read, step by step.
    with_payload = {e.seq: e for e in reader.events(record, steps=shown)} if shown else {}
    timeline = []
    matching_steps = []
    for e in every:
        marks = [*(["match"] if e.seq in matching else []), *flagged.get(e.seq, [])]
        if e.seq in noted:
            marks.append("annotated")
        step = _event(with_payload.get(e.seq, e), payload=e.seq in with_payload, marks=marks)
        step["matches"] = e.seq in matching
        timeline.append(step)
        if e.seq in matching and e.seq in with_payload:
            matching_steps.append(step)
    s = record.start
    return {
        "report_version": REPORT_VERSION,
        "generated_at": time.time() if now is None else now,
        "generated_by": {
            "user": reader.actor.user,
            "role": reader.actor.role,
            "login": reader.actor.login,
            "purpose": reader.purpose,
        },
        "query": query,
        "run": {
            "run_id": record.run_id,
            "workflow": record.workflow,
            "entrypoint": s.entrypoint,
            "status": record.status,
            "started_at": record.started_at,
            "ended_at": record.ended_at,
            "duration_s": None if record.ended_at is None else record.ended_at - record.started_at,
            "metadata": s.metadata,
            "tenant": s.tenant,
            "code": s.code,
            "env_hash": s.env_hash,
            "input": _payload(s.input),
            "output": _payload(record.end.output) if record.end else None,
            "error": _payload(record.end.error) if record.end else None,
        },
        "lineage": _lineage(reader, record),
        "chain": _chain(reader, record),
        "timeline": timeline,
        "payload_steps": shown,
        "matching_steps": matching_steps,
        "flags": flags
        if isinstance(flags, dict)
        else [
            {
                "flag_id": i.flag.flag_id,
                "rule": i.flag.rule,
                "steps": list(i.flag.steps),
                "score": i.flag.score,
                "evidence": i.flag.evidence,
                "created_at": i.flag.created_at,
                "open": i.open,
                "closed_by": i.closed_by,
            }
            for i in flags
        ],
        "annotations": notes
        if isinstance(notes, dict)
        else {
            "current": [a.annotation_id for a in notes.current],
            "history": [_annotation(a, notes) for a in notes.history],
        },
        "access_log": _section(lambda: _access_summary(reader, record, recent_reads)),
    }


def report_json(report: dict[str, Any]) -> bytes:
    """The report as indented JSON bytes."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
