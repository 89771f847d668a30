"""Recorded runs for the web tests and benchmarks: chained and sealed as the writer does,
with a tenant and any number of events."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Any

import msgspec
import orjson

from replayable.events.canonical import event_hash, genesis_hash, run_seal
from replayable.events.ids import uuid7
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store import EventStore
from tests.audit_runs import Call, llm, tool

__all__ = ["Call", "llm", "make_run", "tool"]

_counter = itertools.count(1)


def make_run(
    store: EventStore,
    calls: Sequence[Call],
    *,
    workflow: str = "contract_review",
    tenant: str | None = None,
    started_at: float = 1_790_000_000.0,
    metadata: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
    output: Any = None,
) -> str:
    """Append one finished run made of ``calls``; returns its id."""
    n = next(_counter)
    run_id = uuid7(int(started_at * 1000), hashlib.sha256(f"web{n}".encode()).digest()[:10])
    start = RunStart(
        run_id=run_id,
        workflow=workflow,
        entrypoint=f"agents:{workflow}",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=tenant,
        input='{"args":["C-1"],"kwargs":{}}',
        metadata=dict(metadata or {}),
        code={"git": "abc123"},
        env_hash=None,
        lineage=dict(lineage or {}),
        started_at=started_at,
    )
    events: list[Event] = []
    prev = genesis_hash(run_id)
    for i, c in enumerate(calls):
        request = orjson.dumps(c.request).decode()
        draft = Event(
            run_id=run_id,
            seq=i + 1,
            kind=c.kind,
            name=c.name,
            key=f"r:{i}",
            parent=None,
            call_site=None,
            request=request,
            fingerprint=hashlib.sha256(f"{c.kind}{c.name}{request}".encode()).hexdigest(),
            response=None if c.error else orjson.dumps(c.response).decode(),
            encoding="json",
            error=None
            if c.error is None
            else orjson.dumps({"type": "builtins:RuntimeError", "message": c.error}).decode(),
            side_effect=c.side_effect,
            started_at=started_at + i * 0.01,
            duration_ns=1_000_000,
            metadata=dict(c.metadata),
            chain_index=i,
            prev_hash=prev,
            hash="",
        )
        event = msgspec.structs.replace(draft, hash=event_hash(draft))
        events.append(event)
        prev = event.hash
    out = orjson.dumps(output if output is not None else {"risk": "low"}).decode()
    ended = started_at + 0.01 * len(calls) + 0.5
    end = RunEnd(
        run_id=run_id,
        status="completed",
        output=out,
        error=None,
        ended_at=ended,
        event_count=len(events),
        last_hash=run_seal(prev, start, "completed", out, None, ended, len(events)),
    )
    store.append([start], events, [end])
    return run_id


def review_calls(rules: Any = ()) -> list[Call]:
    """The contract review's five steps; step 3 is the compliance lookup."""
    return [
        tool("read_contract", {"contract_id": "C-1"}, {"contract_id": "C-1", "text": "…"}),
        llm('{"jurisdiction": "GB-SCT"}'),
        tool("query_compliance_rules", {"jurisdiction": "GB-SCT"}, list(rules)),
        llm('{"risk": "low"}'),
        tool(
            "file_report",
            {"contract_id": "C-1", "risk": "low"},
            {"status": "filed"},
            side_effect=True,
        ),
    ]
