"""The routes: each page and its JSON twin share one handler, which builds a dict of data
and renders it as HTML (``/…``) or returns it as JSON (``/api/…``).

Every route names the action it needs (see :mod:`replayable.web.context`); every
read of payloads goes through :class:`~replayable.audit.AuditReader` or
:mod:`replayable.web.reads`, which write the access log before returning data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query
from fastapi.responses import JSONResponse, RedirectResponse, Response

from replayable.errors import AccessDeniedError
from replayable.events.audit import ROLES, VERDICTS
from replayable.events.model import BOUNDARY_KINDS, Run
from replayable.store import verify_run
from replayable.web import reads, views
from replayable.web.app import ctx_of
from replayable.web.context import Ctx, WebState, route
from replayable.web.reads import RunQuery, event_count, event_page, list_runs

__all__ = ["register"]

CtxDep = Annotated[Ctx, Depends(ctx_of)]


def out(ctx: Ctx, template: str, data: dict[str, Any], status: int = 200) -> Response:
    """``data`` as JSON for the API, else rendered into ``template``."""
    if ctx.api:
        return JSONResponse(data, status)
    return ctx.state.templates.TemplateResponse(
        ctx.request, template, {"ctx": ctx, "d": data}, status_code=status
    )


def _maybe(read: Callable[[], Any]) -> tuple[Any, str | None]:
    """A read that this role or database login may not make gives ``None`` and why."""
    try:
        return read(), None
    except AccessDeniedError as exc:
        return None, " ".join(str(exc).split())


def register(app: FastAPI, state: WebState, guard: Callable[[str], Any]) -> None:
    def both(path: str, action: str, method: str = "GET", **kw: Any) -> Callable[[Any], Any]:
        def deco(fn: Any) -> Any:
            route(app, state, method, path, action, guard, **kw)(fn)
            route(app, state, method, "/api" + path, action, guard, **kw)(fn)
            return fn

        return deco

    def page(path: str, action: str, method: str = "GET", **kw: Any) -> Callable[[Any], Any]:
        return route(app, state, method, path, action, guard, **kw)

    def api(path: str, action: str, method: str = "GET", **kw: Any) -> Callable[[Any], Any]:
        return route(app, state, method, "/api" + path, action, guard, **kw)

    @page("/", "signed_in")
    def home(ctx: CtxDep) -> Response:
        return RedirectResponse("/runs", 303)

    @api("/me", "signed_in")
    def me(ctx: CtxDep) -> dict[str, Any]:
        """Who you are signed in as, your role, and what it allows."""
        p = ctx.principal
        allowed = [
            a for a in ("read", "annotate", "replay", "read_access_log", "admin") if p.may(a)
        ]
        return {"name": p.name, "role": p.role, "tenant": p.tenant, "via": p.via, "may": allowed}

    # -- runs ----------------------------------------------------------------------

    @both("/runs", "read")
    def runs(
        ctx: CtxDep,
        workflow: str | None = None,
        status: str | None = None,
        since: str | None = None,
        until: str | None = None,
        meta: Annotated[list[str] | None, Query()] = None,
        tenant: str | None = None,
        rule: str | None = None,
        verdict: str | None = None,
        kind: str | None = None,
        name: str | None = None,
        where: Annotated[list[str] | None, Query()] = None,
        sort: str = "-started",
        page: Annotated[int, Query(ge=1, le=100_000)] = 1,
        per: Annotated[int, Query(ge=1, le=500)] = 50,
        archived: bool = False,
    ) -> Response:
        """Runs, newest first: by workflow, status, start time, metadata ``key=value``,
        tenant (admins), anomaly rule, annotation verdict, and the event predicates of
        ``replayable query`` (kind, name, ``where='response.rows empty'``; ``archived``
        searches dropped archived payloads too, fetched from the archive)."""
        q = RunQuery(
            workflow=workflow or None,
            status=status or None,
            since=since or None,
            until=until or None,
            meta=tuple(m for m in meta or () if m),
            tenant=(tenant or None) if ctx.principal.role == "admin" else None,
            rule=rule or None,
            verdict=verdict or None,
            kind=kind or None,
            name=name or None,
            where=tuple(w for w in where or () if w),
            sort=sort,
            page=page,
            per=per,
            archived=archived,
        )
        reader = ctx.reader()
        found, steps, more, complete, skipped = list_runs(reader, q, ctx.principal.tenant)
        store = ctx.store
        rows = []
        for r in found:
            row = views.run_summary(r, r.end.event_count if r.end is not None else None)
            row["matching_steps"] = [
                {"seq": e.seq, "kind": e.kind, "name": e.name} for e in steps.get(r.run_id, [])
            ]
            rows.append(row)
        data = {
            "store": store.url,
            "query": dict(q.params()),
            "query_pairs": q.params(),
            "page": q.page,
            "per": q.per,
            "next_page": q.page + 1 if more else None,
            # False when a filter the store cannot apply looked at the newest runs only.
            "searched_all": complete,
            "searched_newest": None if complete else reads.SCAN_LIMIT,
            # Archived runs whose payloads a payload filter did not search (never silent).
            "archived_not_searched": skipped,
            "runs": rows,
            "verdicts": list(VERDICTS),
            "kinds": list(BOUNDARY_KINDS),
        }
        return out(ctx, "runs.html", data)

    def run_data(ctx: Ctx, ref: str, page_no: int | None, step: int | None) -> dict[str, Any]:
        record = ctx.run(ref)
        reader = ctx.reader()
        store = ctx.store
        total = event_count(store, record)
        per = ctx.state.config.page_size
        pages = max(1, -(-total // per))
        if step is not None:
            page_no = min(max(1, (step - 1) // per + 1), pages)
        page_no = min(max(1, page_no or 1), pages)
        first, last = (page_no - 1) * per + 1, page_no * per
        events, following = event_page(reader, record, first, last)
        found, notes_denied = _maybe(lambda: reader.annotations(record))
        flags, flags_denied = _maybe(lambda: reader.flags(run=record))
        by_step = views.group_notes(found)
        by_flag = views.group_flags(flags or [])
        origin = record.started_at
        cards = [
            views.card(
                e,
                events[i + 1] if i + 1 < len(events) else following,
                origin,
                notes=by_step.get(e.seq, []),
                flags=by_flag.get(e.seq, []),
            )
            for i, e in enumerate(events)
        ]
        s = record.start
        children = store.children(record.run_id)
        derived, siblings = _related(ctx, record)
        header = views.run_summary(record, total)
        header.update(
            entrypoint=s.entrypoint,
            code=s.code,
            env_hash=s.env_hash,
            lineage=s.lineage,
            parent_seq=s.parent_seq,
            root_run_id=s.root_run_id,
            input=views.clip(views.pretty(views.tree(s.input)), ctx.state.config.payload_limit),
            output=None
            if record.end is None or record.end.output is None
            else views.clip(
                views.pretty(views.tree(record.end.output)), ctx.state.config.payload_limit
            ),
            error=None
            if record.end is None or record.end.error is None
            else views.clip(
                views.pretty(views.tree(record.end.error)), ctx.state.config.payload_limit
            ),
            children=[views.run_summary(c) for c in children if ctx.sees(c)],
            derived=[views.run_summary(r) for r in derived],
            same_workflow=[views.run_summary(r) for r in siblings[:20]],
        )
        return {
            "run": header,
            "events": cards,
            "page": page_no,
            "pages": pages,
            "per": per,
            "total_events": total,
            "step": step,
            "annotations_on_run": [views.annotation_dict(a) for a in by_step.get(None, [])],
            "annotations_denied": notes_denied,
            "flags": [views.flag_dict(f) for f in flags or []],
            "flags_denied": flags_denied,
            "verdicts": list(VERDICTS),
            "may_annotate": ctx.may("annotate"),
            "may_replay": ctx.may("replay"),
        }

    @both("/runs/{run}", "read")
    def run_page(
        ctx: CtxDep,
        run: str,
        page: Annotated[int | None, Query(ge=1, le=10_000_000)] = None,
        step: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    ) -> Response:
        """A run: header, lineage, and one page of timeline cards (``step`` jumps to the page
        holding that step). Reading it is written to the access log."""
        return out(ctx, "run.html", run_data(ctx, run, page, step))

    @both("/runs/{run}/events/{seq}", "read")
    def payload(
        ctx: CtxDep,
        run: str,
        seq: Annotated[int, Path(ge=0, le=2**31 - 1)],
        full: bool = False,
    ) -> Response:
        """One event's request, response, error and metadata (an LLM call also as a
        conversation), cut at the page's limit unless ``full``. Written to the access log."""
        record = ctx.run(run)
        found = ctx.reader().events(record, steps=[seq])
        if not found:
            raise HTTPException(404, f"run {record.run_id} has no step {seq}")
        limit = 0 if full else ctx.state.config.payload_limit
        data = views.payload_view(found[0], limit)
        data["run_id"] = record.run_id
        return out(ctx, "payload.html", data)

    @api("/runs/{run}/verify", "read")
    def verify(ctx: CtxDep, run: str) -> dict[str, Any]:
        """The run's hash chain and seal: intact, altered, truncated, unsealed, …"""
        record = ctx.run(run)
        report = verify_run(ctx.store, record.run_id)
        return {
            "run_id": record.run_id,
            "status": report.status,
            "ok": report.ok,
            "message": report.message,
            "first_bad_seq": report.first_bad_seq,
            "keyed": report.keyed,
            "anchored": report.anchored,
        }

    from replayable.web import pages_audit, pages_jobs, pages_people

    pages_audit.register(both, page, api, out)
    pages_jobs.register(both, page, api, out, state)
    pages_people.register(both, page, api, out, state, list(ROLES))


def _related(ctx: Ctx, record: Run) -> tuple[list[Run], list[Run]]:
    """Replays and forks of ``record`` (runs of its workflow whose lineage names it), and
    the other recent runs of its workflow (to diff against)."""
    from replayable.store import RunFilter

    derived: list[Run] = []
    others: list[Run] = []
    for r in ctx.store.list_runs(RunFilter(workflow=record.workflow, limit=500)):
        if r.run_id == record.run_id or not ctx.sees(r):
            continue
        named = record.run_id in map(str, r.start.lineage.values())
        (derived if named else others).append(r)
    return derived, others
