"""Impact queries in SQL: an :class:`EventQuery` compiled to one JSONB query."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Final

from replayable.store.payloads import REF_PREFIX, tier_ref
from replayable.store.postgres._store import _EVENT_ROW_COLS, DROPPED_EVENT, run_tags
from replayable.store.search import POSTGRES, EventQuery, Predicate, SearchHit, SearchPage

if TYPE_CHECKING:
    from replayable.store.postgres._store import PostgresStore

__all__ = ["compile_predicate", "search"]


def compile_predicate(p: Predicate) -> tuple[str, list[Any]]:
    """SQL for one predicate and its parameters; semantics match ``Predicate.matches``
    (the shared builder's PostgreSQL dialect: jsonb tests are exact)."""
    return POSTGRES.compile(p)


#: The newest runs the walk looks through before the index-driven query takes over:
#: at least this many, or this many times the runs a page needs.
_WALK_RUNS: Final = 200
_WALK_FACTOR: Final = 4


def search(store: PostgresStore, query: EventQuery) -> SearchPage:
    """Runs with matching events, newest first, paginated by run (see :func:`_search`).

    Archived runs whose hot payloads were dropped keep their events' metadata hot but
    not their payloads: a query that tests payloads leaves those events out of the SQL
    and counts their runs (``archived_skipped``), or, with ``include_archived``, tests
    those runs in Python on their events fetched from the archive and merges them in
    by start time.
    """
    if not query.tests_payloads:
        return _search(store, query, exclude_archived=False)
    if not query.include_archived:
        page = _search(store, query, exclude_archived=True)
        return dataclasses.replace(page, archived_skipped=_archived_count(store, query))
    need = query.offset + query.limit + 1
    wide = dataclasses.replace(query, offset=0, limit=need)
    hot = _search(store, wide, exclude_archived=True).hits
    cold: list[SearchHit] = []
    seen = {h.run_id for h in hot}
    for rid in _archived_ids(store, query):
        if rid in seen:
            continue
        if len(cold) == need:
            break
        matching = [e for e in store.events(rid) if query.matches_event(e)]
        if matching:
            runs = store.get_runs([rid])
            if rid in runs:
                cold.append(SearchHit(runs[rid], matching))
    merged = sorted(hot + cold, key=lambda h: (h.run.started_at, h.run_id), reverse=True)
    shown = merged[query.offset : query.offset + query.limit]
    more = len(merged) > query.offset + query.limit
    return SearchPage(shown, query.offset, query.offset + query.limit if more else None)


def _run_conditions(query: EventQuery) -> tuple[str, list[Any]] | None:
    """The runs' conditions in SQL (``None``: no run can match)."""
    run_where: list[str] = []
    run_params: list[Any] = []
    if query.workflow is not None:
        run_where.append("r.workflow = %s")
        run_params.append(query.workflow)
    if query.metadata:
        if any(isinstance(v, dict | list) for v in query.metadata.values()):
            return None
        run_where.append("r.tags @> %s::text[]")
        run_params.append(run_tags(dict(query.metadata)))
    return " AND ".join(run_where) or "TRUE", run_params


def _archived_count(store: PostgresStore, query: EventQuery) -> int:
    found = _run_conditions(query)
    if found is None:
        return 0
    cond, params = found
    rows = store.query(
        f"SELECT count(*) FROM runs r JOIN archived_runs a ON a.run_id = r.run_id WHERE {cond} "
        f"AND EXISTS ({_DROPPED_IN_RUN})",
        params,
    )
    return int(rows[0][0])


#: A run (``r``) some of whose events' payloads were dropped from the hot store.
_DROPPED_IN_RUN: Final = (
    f"SELECT 1 FROM agent_execution_events e WHERE e.run_id = r.run_id AND {DROPPED_EVENT}"
)


def _archived_ids(store: PostgresStore, query: EventQuery) -> list[str]:
    """The archived runs with dropped payloads meeting the run conditions, newest first."""
    found = _run_conditions(query)
    if found is None:
        return []
    cond, params = found
    rows = store.query(
        "SELECT r.run_id::text FROM runs r JOIN archived_runs a ON a.run_id = r.run_id "
        f"WHERE {cond} AND EXISTS ({_DROPPED_IN_RUN}) ORDER BY r.started_at DESC, r.run_id DESC",
        params,
    )
    return [row[0] for row in rows]


def _search(store: PostgresStore, query: EventQuery, *, exclude_archived: bool) -> SearchPage:
    """Runs with matching events, newest first, paginated by run.

    Two plans, chosen by what the data turn out to be. A *walk* goes through the
    newest runs in ``started_at`` order (the runs index) and probes each run's events
    through its (run_id, sequence) key, stopping as soon as the page is full: a few
    milliseconds when matches are common (the seed's impact query matches in most
    runs). When a bounded window of runs does not fill the page, matches are rare, and
    the *index* plan finds every matching event first (through the kind and name
    index where given) and orders their runs. JSONB predicates defeat the planner's
    row estimates, so the choice is made here rather than left to one query.
    """
    conditions = _run_conditions(query)
    if conditions is None:
        return SearchPage([], query.offset, None)
    run_cond, run_params = conditions
    where: list[str] = []
    params: list[Any] = []
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
        elif predicate.side == "error":
            clause = f"(starts_with(e.error_text, '{REF_PREFIX}') OR {clause})"
        where.append(clause)
        params.extend(args)
    if exclude_archived:
        # An archived event whose payloads were dropped cannot be tested here.
        where.append(
            f"NOT ({DROPPED_EVENT} AND EXISTS (SELECT 1 FROM archived_runs a "
            "WHERE a.run_id = e.run_id))"
        )
    event_cond = " AND ".join(where) or "TRUE"
    need = query.offset + query.limit + 1
    window = max(_WALK_RUNS, need * _WALK_FACTOR)
    ordered = (
        None
        if _rare(store, query, window)
        else _walk(store, run_cond, run_params, event_cond, params, window, need)
    )
    if ordered is None:
        matching = store.query(
            f"SELECT DISTINCT e.run_id FROM agent_execution_events e WHERE {event_cond}", params
        )
        ordered = [
            row[0]
            for row in store.query(
                "SELECT r.run_id::text FROM runs r WHERE r.run_id = ANY(%s::uuid[]) "
                f"AND {run_cond} ORDER BY r.started_at DESC, r.run_id DESC LIMIT %s",
                [[row[0] for row in matching], *run_params, need],
            )
        ]
    page_ids = ordered[query.offset : query.offset + query.limit]
    more = len(ordered) > query.offset + query.limit
    if not page_ids:
        return SearchPage([], query.offset, None)
    seqs = dict(
        store.query(
            "SELECT e.run_id::text, array_agg(e.sequence ORDER BY e.sequence) "
            f"FROM agent_execution_events e WHERE e.run_id = ANY(%s::uuid[]) AND {event_cond} "
            "GROUP BY e.run_id",
            [page_ids, *params],
        )
    )
    found = [(rid, seqs[rid]) for rid in page_ids if rid in seqs]
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
    tiered = {
        (row[0], row[1])
        for row in rows
        if row[20] is not None or row[21] is not None or tier_ref(row[11]) is not None
    }
    archived = store.archived_runs(run_ids)
    for event in store.joined([row for row in rows if row[0] not in archived]):
        if (event.run_id, event.seq) in tiered and not query.matches_event(event):
            continue
        by_run.setdefault(event.run_id, []).append(event)
    for rid, matched in found:
        if rid in archived:
            # Matched on metadata the hot store keeps; the events shown come whole
            # from the archive (or the reader says why they cannot).
            wanted = set(matched)
            by_run[rid] = [e for e in store.events(rid) if e.seq in wanted]
    hits = [SearchHit(runs[rid], by_run[rid]) for rid in run_ids if rid in runs and rid in by_run]
    return SearchPage(hits, query.offset, query.offset + query.limit if more else None)


def _rare(store: PostgresStore, query: EventQuery, n: int) -> bool:
    """Whether fewer than ``n`` events have the query's kind and name (both indexed):
    finding them all through the index is then cheaper than walking runs."""
    if query.kind is None and query.name is None:
        return False
    cond = []
    params: list[Any] = []
    if query.kind is not None:
        cond.append("e.event_type = %s")
        params.append(query.kind)
    if query.name is not None:
        cond.append("e.name = %s")
        params.append(query.name)
    rows = store.query(
        "SELECT count(*) FROM (SELECT 1 FROM agent_execution_events e "
        f"WHERE {' AND '.join(cond)} LIMIT %s) s",
        [*params, n],
    )
    return int(rows[0][0]) < n


def _walk(
    store: PostgresStore,
    run_cond: str,
    run_params: list[Any],
    event_cond: str,
    params: list[Any],
    window: int,
    need: int,
) -> list[str] | None:
    """The first ``need`` matching runs among the newest ``window``, newest first, or
    ``None`` when that window holds fewer and there are more runs beyond it."""
    walked = store.query(
        "SELECT w.run_id::text FROM (SELECT r.run_id, r.started_at FROM runs r "
        f"WHERE {run_cond} ORDER BY r.started_at DESC, r.run_id DESC LIMIT %s) w "
        "CROSS JOIN LATERAL (SELECT 1 FROM agent_execution_events e "
        f"WHERE e.run_id = w.run_id AND {event_cond} LIMIT 1) m "
        "ORDER BY w.started_at DESC, w.run_id DESC LIMIT %s",
        [*run_params, window, *params, need],
    )
    if len(walked) == need or _runs_fewer_than(store, run_cond, run_params, window):
        return [row[0] for row in walked]
    return None


def _runs_fewer_than(store: PostgresStore, run_cond: str, params: list[Any], n: int) -> bool:
    """Whether fewer than ``n`` runs meet the run conditions (the walk then saw them all)."""
    rows = store.query(
        f"SELECT count(*) FROM (SELECT 1 FROM runs r WHERE {run_cond} LIMIT %s) s", [*params, n]
    )
    return int(rows[0][0]) < n
