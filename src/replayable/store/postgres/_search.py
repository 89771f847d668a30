"""Impact queries in SQL: an :class:`EventQuery` compiled to one JSONB query."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from replayable.store.postgres._store import _EVENT_ROW_COLS, run_tags
from replayable.store.search import EventQuery, Predicate, SearchHit, SearchPage

if TYPE_CHECKING:
    from replayable.store.postgres._store import PostgresStore

__all__ = ["compile_predicate", "search"]

_COLUMNS: Final = {
    "request": "e.input_payload",
    "response": "e.output_payload",
    "error": "(e.error_text::jsonb)",
    "metadata": "e.metadata",
}
_EMPTY: Final = "ARRAY['[]', '{}', '\"\"', 'null']::jsonb[]"
_COMPARE: Final = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def compile_predicate(p: Predicate) -> tuple[str, list[Any]]:
    """SQL for one predicate and its parameters; semantics match ``Predicate.matches``."""
    col = _COLUMNS[p.side]
    path = list(p.path)
    at = f"({col} #> %s::text[])"
    text_at = f"({col} #>> %s::text[])"
    if p.op == "exists":
        return f"{at} IS NOT NULL", [path]
    if p.op == "missing":
        return f"{at} IS NULL", [path]
    if p.op == "eq":
        return f"{at} = %s::jsonb", [path, orjson.dumps(p.value).decode()]
    if p.op == "ne":
        return f"{at} IS DISTINCT FROM %s::jsonb", [path, orjson.dumps(p.value).decode()]
    if p.op == "empty":
        return f"{at} = ANY({_EMPTY})", [path]
    if p.op == "nonempty":
        return f"({at} IS NOT NULL AND NOT {at} = ANY({_EMPTY}))", [path, path]
    if p.op == "prefix":
        return (
            f"(jsonb_typeof({at}) = 'string' AND starts_with({text_at}, %s))",
            [path, path, p.value],
        )
    if p.op == "contains":
        return (
            f"(jsonb_typeof({at}) = 'string' AND strpos({text_at}, %s) > 0)",
            [path, path, p.value],
        )
    number = f"(CASE WHEN jsonb_typeof({at}) = 'number' THEN {text_at}::numeric END)"
    return f"{number} {_COMPARE[p.op]} %s::numeric", [path, path, p.value]


def search(store: PostgresStore, query: EventQuery) -> SearchPage:
    """Runs with matching events, newest first, paginated by run."""
    where: list[str] = []
    params: list[Any] = []
    if query.workflow is not None:
        where.append("r.workflow = %s")
        params.append(query.workflow)
    if query.metadata:
        if any(isinstance(v, dict | list) for v in query.metadata.values()):
            return SearchPage([], query.offset, None)
        where.append("r.tags @> %s::text[]")
        params.append(run_tags(dict(query.metadata)))
    if query.kind is not None:
        where.append("e.event_type = %s")
        params.append(query.kind)
    if query.name is not None:
        where.append("e.name = %s")
        params.append(query.name)
    if query.since is not None:
        where.append("e.timestamp_utc >= %s")
        params.append(query.since)
    if query.until is not None:
        where.append("e.timestamp_utc <= %s")
        params.append(query.until)
    for predicate in query.where:
        clause, args = compile_predicate(predicate)
        if predicate.side in ("request", "response"):
            # A payload in the blob tier is not in the JSONB column: such an event is a
            # candidate here and is tested in Python once its payload is joined.
            clause = f"(e.{predicate.side}_ref IS NOT NULL OR {clause})"
        where.append(clause)
        params.extend(args)
    sql = (
        "SELECT e.run_id::text, array_agg(e.sequence ORDER BY e.sequence) "
        "FROM agent_execution_events e JOIN runs r ON r.run_id = e.run_id"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " GROUP BY e.run_id, r.started_at ORDER BY r.started_at DESC, e.run_id DESC"
        " LIMIT %s OFFSET %s"
    )
    params.extend((query.limit + 1, query.offset))
    found = store.query(sql, params)
    more = len(found) > query.limit
    found = found[: query.limit]
    if not found:
        return SearchPage([], query.offset, None)
    run_ids = [row[0] for row in found]
    runs = store.get_runs(run_ids)
    pairs_run = [rid for rid, seqs in found for _ in seqs]
    pairs_seq = [s for _, seqs in found for s in seqs]
    rows = store.query(
        f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events "
        "WHERE (run_id, sequence) IN (SELECT * FROM unnest(%s::uuid[], %s::int[])) "
        "ORDER BY run_id, sequence",
        (pairs_run, pairs_seq),
    )
    by_run: dict[str, list[Any]] = {}
    tiered = {(row[0], row[1]) for row in rows if row[20] is not None or row[21] is not None}
    for event in store.joined(rows):
        if (event.run_id, event.seq) in tiered and not query.matches_event(event):
            continue
        by_run.setdefault(event.run_id, []).append(event)
    hits = [SearchHit(runs[rid], by_run[rid]) for rid in run_ids if rid in runs and rid in by_run]
    return SearchPage(hits, query.offset, query.offset + query.limit if more else None)
