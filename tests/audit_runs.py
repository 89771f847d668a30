"""Build recorded runs of any shape for the audit tests, chained and sealed as the writer does."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from replayable.events.canonical import event_hash, genesis_hash, run_seal
from replayable.events.ids import uuid7
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store import EventStore

_counter = itertools.count(1)


@dataclass
class Call:
    """One boundary crossing of a run under construction."""

    kind: str
    name: str
    request: Any = field(default_factory=dict)
    response: Any = None
    error: str | None = None
    side_effect: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


def tool(name: str, request: Any = None, response: Any = None, **kw: Any) -> Call:
    return Call("tool", name, {} if request is None else request, response, **kw)


def llm(text: str = '{"risk": "low"}', **kw: Any) -> Call:
    body = {"choices": [{"message": {"role": "assistant", "content": text, "refusal": None}}]}
    return Call("llm", "chat.completions.create", {"messages": [text[:10]]}, body, **kw)


def record(
    store: EventStore,
    calls: Sequence[Call],
    *,
    workflow: str = "review",
    started_at: float = 1_700_000_000.0,
    duration: float = 10.0,
    status: str = "completed",
    output: Any = "done",
    lineage: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    end: bool = True,
) -> str:
    """Append one run made of ``calls`` to ``store``; returns its id."""
    n = next(_counter)
    run_id = uuid7(int(started_at * 1000), hashlib.sha256(str(n).encode()).digest()[:10])
    start = RunStart(
        run_id=run_id,
        workflow=workflow,
        entrypoint=f"agents:{workflow}",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata=dict(metadata or {}),
        code={},
        env_hash=None,
        lineage=dict(lineage or {}),
        started_at=started_at,
    )
    events: list[Event] = []
    prev = genesis_hash(run_id)
    for i, c in enumerate(calls):
        request = orjson.dumps(c.request, option=orjson.OPT_SORT_KEYS).decode()
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
    ends = []
    if end:
        out = None if status == "failed" else orjson.dumps(output).decode()
        err = '{"type":"builtins:RuntimeError","message":"x"}' if status == "failed" else None
        ended = started_at + duration
        ends.append(
            RunEnd(
                run_id=run_id,
                status=status,  # type: ignore[arg-type]
                output=out,
                error=err,
                ended_at=ended,
                event_count=len(events),
                last_hash=run_seal(prev, start, status, out, err, ended, len(events)),
            )
        )
    store.append([start], events, ends)
    return run_id
