"""Runs and events as plain JSON with stable keys, for ``--json`` output."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from replayable.cli.render import decoded, run_duration
from replayable.events.model import Event, Run

__all__ = ["event_to_dict", "run_to_dict"]


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()


def run_to_dict(
    run: Run, *, event_count: int | None = None, detail: bool = False, children: Iterable[Run] = ()
) -> dict[str, Any]:
    """A run as plain JSON with stable keys.

    ``detail`` adds input, output, code, lineage and children; input and
    output are shown as plain values (type tags removed).
    """
    s = run.start
    out: dict[str, Any] = {
        "run_id": s.run_id,
        "workflow": s.workflow,
        "entrypoint": s.entrypoint,
        "status": run.status,
        "started_at": _iso(s.started_at),
        "ended_at": _iso(run.ended_at),
        "duration_s": run_duration(run),
        "event_count": event_count,
        "parent_run_id": s.parent_run_id,
        "tenant": s.tenant,
        "metadata": s.metadata,
    }
    if detail:
        out.update(
            parent_seq=s.parent_seq,
            root_run_id=s.root_run_id,
            input=decoded(s.input),
            output=decoded(run.end.output) if run.end else None,
            error=decoded(run.end.error) if run.end else None,
            code=s.code,
            env_hash=s.env_hash,
            lineage=s.lineage,
            last_hash=run.end.last_hash if run.end else None,
            children=[c.run_id for c in children],
        )
    return out


def event_to_dict(event: Event) -> dict[str, Any]:
    """An event as plain JSON; payloads are parsed, type tags kept as stored."""
    return {
        "seq": event.seq,
        "kind": event.kind,
        "name": event.name,
        "key": event.key,
        "parent": event.parent,
        "call_site": event.call_site,
        "side_effect": event.side_effect,
        "started_at": _iso(event.started_at),
        "duration_ns": event.duration_ns,
        "request": event.request_value(),
        "response": event.response_tree(),
        "encoding": event.encoding,
        "error": event.error_value(),
        "fingerprint": event.fingerprint,
        "metadata": event.metadata,
        "chain_index": event.chain_index,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }
