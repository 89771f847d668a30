"""Rows to records: the column order the SQL stores select, decoded once for all of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from replayable.events.model import Event, Run, RunEnd, RunStart

__all__ = ["event_from_row", "event_to_row", "run_from_row"]


def run_from_row(row: Sequence[Any]) -> Run:
    """A :class:`Run` from a row of the run columns followed by the end-record columns
    (``None`` there for a run without an end record)."""
    start = RunStart(
        run_id=row[0],
        workflow=row[1],
        entrypoint=row[2],
        parent_run_id=row[3],
        parent_seq=row[4],
        root_run_id=row[5],
        tenant=row[6],
        input=row[7],
        metadata=orjson.loads(row[8]),
        code=orjson.loads(row[9]),
        env_hash=row[10],
        lineage=orjson.loads(row[11]),
        started_at=row[12],
        schema_version=row[13],
    )
    end = None
    if row[14] is not None:
        end = RunEnd(
            run_id=row[14],
            status=row[15],
            output=row[16],
            error=row[17],
            ended_at=row[18],
            event_count=row[19],
            last_hash=row[20],
            schema_version=row[21],
        )
    return Run(start=start, end=end)


def event_from_row(r: Sequence[Any]) -> Event:
    """An :class:`Event` from a row of the event columns in field order."""
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
        metadata=orjson.loads(r[15]),
        chain_index=r[16],
        prev_hash=r[17],
        hash=r[18],
        schema_version=r[19],
    )


def event_to_row(e: Event) -> tuple[Any, ...]:
    """An event's columns in field order, as :func:`event_from_row` reads them."""
    return (
        e.run_id,
        e.seq,
        e.kind,
        e.name,
        e.key,
        e.parent,
        e.call_site,
        e.request,
        e.fingerprint,
        e.response,
        e.encoding,
        e.error,
        int(e.side_effect),
        e.started_at,
        e.duration_ns,
        orjson.dumps(e.metadata, option=orjson.OPT_SORT_KEYS).decode(),
        e.chain_index,
        e.prev_hash,
        e.hash,
        e.schema_version,
    )
