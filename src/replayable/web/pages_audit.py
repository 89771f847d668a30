"""Audit routes: the diff, the anomaly queue, annotations, reports and the access log."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, Field

from replayable.audit.access import log_access
from replayable.audit.render import to_html, to_markdown
from replayable.audit.report import build_report, report_json
from replayable.cli._options import parse_when
from replayable.cli.query import build_query, q_text
from replayable.cli.render import event_summary
from replayable.diff import diff as run_diff
from replayable.events.model import Event
from replayable.web import views
from replayable.web.app import ctx_of
from replayable.web.context import Ctx

Deco = Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]

__all__ = ["AnnotationIn", "register"]

CtxDep = Annotated[Ctx, Depends(ctx_of)]
_FORMATS = {
    "json": "application/json",
    "md": "text/markdown; charset=utf-8",
    "html": "text/html; charset=utf-8",
}


class AnnotationIn(BaseModel):
    """A new annotation: on the run (``step`` null) or one step; a correction names
    ``amends``; a retraction sets ``retract`` and gives only a note."""

    step: int | None = Field(default=None, ge=0, le=2**31 - 1)
    verdict: str | None = Field(default=None, max_length=32)
    note: str = Field(max_length=20_000)
    policy: str | None = Field(default=None, max_length=200)
    amends: str | None = Field(default=None, max_length=64)
    retract: bool = False
    closes: list[str] = Field(default_factory=list, max_length=50)


def _side(e: Event | None) -> dict[str, Any] | None:
    if e is None:
        return None
    summary, failed = event_summary(e, width=120)
    return {
        "seq": e.seq,
        "kind": e.kind,
        "name": e.name,
        "summary": views.visible(summary),
        "failed": failed,
    }


def register(both: Deco, page: Deco, api: Deco, out: Callable[..., Response]) -> None:
    @both("/diff", "read")
    def diff_page(
        ctx: CtxDep,
        a: str | None = None,
        b: str | None = None,
        noise: bool = False,
        same: bool = False,
    ) -> Response:
        """Two runs aligned step by step: the first meaningful divergence, changed fields,
        inserted and removed steps. Noise (key order, whitespace, volatile ids) is hidden
        unless ``noise``; identical steps are counted, and listed with ``same``."""
        if not a or not b:
            return out(ctx, "diff.html", {"left": None, "right": None, "a": a, "b": b})
        left, right = ctx.run(a), ctx.run(b)
        result = run_diff(left, right, store=ctx.store)
        pairs = []
        shown_l: list[int] = []
        shown_r: list[int] = []
        first = result.first
        for i, p in enumerate(result.pairs):
            changes = [c for c in p.changes if noise or c.rank != "noise"]
            status = p.status
            if status == "changed" and not changes:
                status = "same"
            if status == "same" and not same:
                continue
            is_first = first is not None and (
                (p.left.seq if p.left else None) == first.left_step
                and (p.right.seq if p.right else None) == first.right_step
            )
            if p.left is not None:
                shown_l.append(p.left.seq)
            if p.right is not None:
                shown_r.append(p.right.seq)
            pairs.append(
                {
                    "index": i,
                    "status": status,
                    "rank": p.rank,
                    "first": is_first,
                    "left": _side(p.left),
                    "right": _side(p.right),
                    "changes": [
                        {
                            "where": c.where,
                            "rank": c.rank,
                            "old": views.clip(views.pretty(c.old), 2000),
                            "new": views.clip(views.pretty(c.new), 2000),
                        }
                        for c in changes
                    ],
                }
            )
        reader = ctx.reader()
        for record, steps in ((left, shown_l), (right, shown_r)):
            log_access(
                ctx.store,
                reader.actor,
                channel=reader.channel,
                what=("request", "response"),
                run_id=record.run_id,
                steps=steps,
                purpose=reader.purpose,
                tenant=record.start.tenant,
            )
        data = {
            "a": a,
            "b": b,
            "left": views.run_summary(left),
            "right": views.run_summary(right),
            "identical": result.identical,
            "first_divergence": None if first is None else first.to_dict(),
            "first_text": None if first is None else views.visible(first.describe()),
            "counts": result.counts(),
            "output_changes": [
                {
                    "where": c.where,
                    "rank": c.rank,
                    "old": views.clip(views.pretty(c.old), 2000),
                    "new": views.clip(views.pretty(c.new), 2000),
                }
                for c in result.output_changes
                if noise or c.rank != "noise"
            ],
            "pairs": pairs,
            "noise": noise,
            "same": same,
        }
        return out(ctx, "diff.html", data)

    @both("/anomalies", "read")
    def anomalies(
        ctx: CtxDep,
        rule: str | None = None,
        workflow: str | None = None,
        all: bool = False,
    ) -> Response:
        """The anomaly queue: open flags (``all`` for closed ones too), worst first,
        grouped by rule and workflow, each linking to its run and steps."""
        items = ctx.reader().queue(open_only=not all, rule=rule or None)
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for item in items:
            f = item.flag
            if workflow and f.workflow != workflow:
                continue
            if ctx.principal.tenant is not None and (f.tenant or "") != ctx.principal.tenant:
                continue
            groups.setdefault((f.rule, f.workflow), []).append(views.flag_dict(f, item.closed_by))
        data = {
            "rule": rule,
            "workflow": workflow,
            "all": all,
            "groups": [
                {"rule": r, "workflow": w, "flags": flags}
                for (r, w), flags in sorted(groups.items())
            ],
            "may_annotate": ctx.may("annotate"),
        }
        return out(ctx, "anomalies.html", data)

    @api("/runs/{run}/annotations", "read")
    def annotations(ctx: CtxDep, run: str) -> dict[str, Any]:
        """A run's annotations: the current ones and every version (written to the access log)."""
        record = ctx.run(run)
        found = ctx.reader().annotations(record)
        return {
            "run_id": record.run_id,
            "current": [a.annotation_id for a in found.current],
            "history": [views.annotation_dict(a, found) for a in found.history],
        }

    @api("/runs/{run}/annotations", "annotate", method="POST", status_code=201)
    def annotate_api(ctx: CtxDep, run: str, body: AnnotationIn) -> dict[str, Any]:
        """Append an annotation (analysts and admins); never edited later."""
        record = ctx.run(run)
        made = ctx.reader().annotate(
            record.run_id,
            step=body.step,
            verdict=body.verdict,
            note=body.note,
            policy=body.policy,
            amends=body.amends,
            retract=body.retract,
            closes=body.closes,
        )
        return views.annotation_dict(made)

    @page("/runs/{run}/annotate", "annotate", method="POST")
    async def annotate_form(ctx: CtxDep, run: str, request: Request) -> Response:
        form = await request.form()

        def field(name: str) -> str | None:
            value = form.get(name)
            return value.strip() or None if isinstance(value, str) else None

        record = ctx.run(run)
        step_text = field("step")
        try:
            step = None if step_text is None else int(step_text)
        except ValueError:
            raise HTTPException(400, f"step {step_text!r} is not a number") from None
        retract = field("retract") is not None
        ctx.reader().annotate(
            record.run_id,
            step=step,
            verdict=None if retract else field("verdict"),
            note=field("note") or "",
            policy=field("policy"),
            amends=field("amends"),
            retract=retract,
            closes=[c for c in (field("closes") or "").replace(",", " ").split() if c],
        )
        target = f"/runs/{record.run_id}" + (f"?step={step}#step-{step}" if step else "")
        return RedirectResponse(target, 303)

    @both("/runs/{run}/report", "read")
    def run_report(ctx: CtxDep, run: str, format: str = "html") -> Response:
        """The run's audit report (``format`` json, md or html) as a download: header,
        lineage, chain and seal, timeline, flags, annotations and the access-log summary."""
        if format not in _FORMATS:
            raise HTTPException(400, f"format {format!r} is not one of json, md, html")
        record = ctx.run(run)
        data = build_report(ctx.reader(), record)
        body = _render(data, format)
        return Response(
            body,
            media_type=_FORMATS[format],
            headers={"content-disposition": f'attachment; filename="{record.run_id}.{format}"'},
        )

    @both("/reports", "read")
    def query_report(
        ctx: CtxDep,
        workflow: str | None = None,
        kind: str | None = None,
        name: str | None = None,
        since: str | None = None,
        until: str | None = None,
        meta: Annotated[list[str] | None, Query()] = None,
        where: Annotated[list[str] | None, Query()] = None,
        download: bool = False,
        archived: bool = False,
    ) -> Response:
        """The report of an impact query: the runs whose events match, and with
        ``download`` a zip of each run's report in JSON, Markdown and HTML."""
        given = any((workflow, kind, name, since, until, meta, where))
        q = build_query(
            workflow=workflow or None,
            kind=kind or None,
            name=name or None,
            since=since or None,
            until=until or None,
            meta=[m for m in meta or () if m],
            where=[w for w in where or () if w],
            limit=200,
            include_archived=archived,
        )
        found = ctx.store.search(q) if given else None
        hits = [h for h in found.hits if ctx.sees(h.run)] if found is not None else []
        if download:
            reader = ctx.reader()
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
                for h in hits:
                    data = build_report(
                        reader, h.run, matching=[e.seq for e in h.events], query=q_text(q)
                    )
                    for fmt in _FORMATS:
                        zf.writestr(f"{h.run_id}.{fmt}", _render(data, fmt))
            return Response(
                buffer.getvalue(),
                media_type="application/zip",
                headers={"content-disposition": 'attachment; filename="impact-report.zip"'},
            )
        data = {
            "query": q_text(q) if given else None,
            "params": {
                "workflow": workflow,
                "kind": kind,
                "name": name,
                "since": since,
                "until": until,
                "meta": meta or [],
                "where": where or [],
            },
            # Archived runs whose payloads the query did not search (never silent).
            "archived_not_searched": found.archived_skipped if found is not None else 0,
            "runs": [
                {
                    **views.run_summary(h.run),
                    "steps": [{"seq": e.seq, "kind": e.kind, "name": e.name} for e in h.events],
                }
                for h in hits
            ],
        }
        return out(ctx, "reports.html", data)

    @both("/access-log", "read_access_log")
    def access_log(
        ctx: CtxDep,
        run: str | None = None,
        who: str | None = None,
        since: str | None = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 200,
    ) -> Response:
        """Who read which payloads, when, through what and why (auditors and admins).
        This read is logged too."""
        if run:
            ctx.run(run)
        entries = ctx.reader().access_log(
            run=run or None, who=who or None, since=parse_when(since or None, "since"), limit=limit
        )
        rows = [
            {
                "at": views.iso(e.at),
                "user": e.user,
                "login": e.login,
                "role": e.role,
                "channel": e.channel,
                "run_id": e.run_id,
                "steps": list(e.steps),
                "what": list(e.what),
                "purpose": e.purpose,
            }
            for e in reversed(entries)
            if ctx.principal.tenant is None or (e.tenant or "") == ctx.principal.tenant
        ]
        return out(
            ctx, "access_log.html", {"entries": rows, "run": run, "who": who, "since": since}
        )


def _render(data: dict[str, Any], fmt: str) -> bytes:
    if fmt == "json":
        return report_json(data)
    if fmt == "md":
        return to_markdown(data).encode()
    return to_html(data).encode()
