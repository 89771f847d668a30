"""``replayable query`` and ``replayable report``: impact queries across runs.

Both take the same filters; ``query`` prints the runs with their matching
steps, ``report`` writes an audit report per affected run (JSON, Markdown and
HTML: timeline, matching steps, lineage, chain check, flags, annotations and
the access-log summary; see :mod:`replayable.audit.report`)::

    replayable query --name query_compliance_rules --since 30d \\
        --where 'response.rows empty' --where 'request.jurisdiction ^= GB'

With ``--archive URL`` (a directory or ``s3://…`` that ``replayable archive`` wrote)
the same query runs on DuckDB over the archive's Parquet files; the store of
``--store`` still gives the runs' records, the tenants the reader may see, the
data keys for encrypted payloads, and the access log.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.progress import (
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from replayable._files import private_dir, write_private
from replayable.audit.access import AuditReader
from replayable.cli._context import state, stdout
from replayable.cli.audit import AsUser, Purpose, RoleOpt, reader
from replayable.errors import ConfigurationError
from replayable.events.model import Run
from replayable.store.search import EventQuery, Predicate

if TYPE_CHECKING:
    from replayable.archive.search import ArchiveSearch

__all__ = ["build_query", "query", "register", "report", "write_report"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

Workflow = Annotated[str | None, typer.Option(help="Only runs of this workflow.")]
Kind = Annotated[str | None, typer.Option(help="Event kind: llm, tool, http, …")]
Name = Annotated[str | None, typer.Option(help="Boundary name, e.g. a tool's name.")]
Since = Annotated[
    str | None, typer.Option(help="Events at or after: 30d, 12h, an ISO date or Unix seconds.")
]
Until = Annotated[str | None, typer.Option(help="Events at or before (same forms as --since).")]
Meta = Annotated[
    list[str] | None, typer.Option("--meta", help="Run metadata KEY=VALUE (repeatable).")
]
ArchiveOpt = Annotated[
    str | None,
    typer.Option(
        "--archive",
        help="Query the Parquet archive at this directory or s3:// URL (on DuckDB) "
        "instead of the store.",
        metavar="URL",
    ),
]
Where = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        "--query",
        help="Predicate 'side.path op value' (repeatable), e.g. 'response.rows empty', "
        "'request.jurisdiction ^= GB'.",
    ),
]
IncludeArchived = Annotated[
    bool,
    typer.Option(
        "--include-archived",
        help="Search the payloads of archived runs whose hot copies were dropped too, "
        "fetched from the archive (slow). Without it, a --where on request or response "
        "leaves those runs out and says how many.",
    ),
]


def parse_time(text: str, option: str, now: float) -> float:
    """Seconds since the epoch from ``30d``, an ISO date/time or a number."""
    m = _RELATIVE.match(text.strip())
    if m:
        return now - float(m[1]) * _UNITS[m[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ConfigurationError(
            f"{option} {text!r} is not a time; use 30d, 12h, 2024-05-01 or Unix seconds"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def build_query(
    *,
    workflow: str | None,
    kind: str | None,
    name: str | None,
    since: str | None,
    until: str | None,
    meta: list[str] | None,
    where: list[str] | None,
    limit: int = 50,
    offset: int = 0,
    now: float | None = None,
    include_archived: bool = False,
) -> EventQuery:
    """An :class:`EventQuery` from command-line strings (errors name the bad option)."""
    clock = time.time() if now is None else now
    metadata: dict[str, Any] = {}
    for item in meta or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"--meta {item!r} must be KEY=VALUE")
        metadata[key] = value
    return EventQuery(
        workflow=workflow,
        kind=kind,
        name=name,
        since=None if since is None else parse_time(since, "--since", clock),
        until=None if until is None else parse_time(until, "--until", clock),
        metadata=metadata,
        where=tuple(Predicate.parse(w) for w in where or []),
        limit=limit,
        offset=offset,
        include_archived=include_archived,
    )


def archived_notice(skipped: int) -> str:
    """What a search left out: archived runs whose payloads it did not search."""
    return (
        f"{skipped} archived run(s) meeting the run filters were not searched: their "
        "payloads are in the archive only; add --include-archived to fetch and search "
        "them, or query the archive itself with --archive URL"
    )


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def query(
    ctx: typer.Context,
    workflow: Workflow = None,
    kind: Kind = None,
    name: Name = None,
    since: Since = None,
    until: Until = None,
    meta: Meta = None,
    where: Where = None,
    limit: Annotated[int, typer.Option(help="Runs per page.")] = 50,
    offset: Annotated[int, typer.Option(help="Runs to skip (from a previous page).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
    archive: ArchiveOpt = None,
    include_archived: IncludeArchived = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Find runs whose events match: by workflow, kind, name, time, metadata and payload.
    Each run found is written to the access log with its matching steps. Archived runs
    are searched on their metadata; their payloads only with --include-archived (else
    the command says how many were left out)."""
    q = build_query(
        workflow=workflow,
        kind=kind,
        name=name,
        since=since,
        until=until,
        meta=meta,
        where=where,
        limit=limit,
        offset=offset,
        include_archived=include_archived,
    )
    audit = reader(ctx, user, role, purpose)
    page = audit.search(q, _archive_search(audit, archive))
    out = stdout()
    for hit in page.hits:
        if as_json:
            typer.echo(
                orjson.dumps(
                    {
                        "run_id": hit.run_id,
                        "workflow": hit.run.workflow,
                        "status": hit.run.status,
                        "started_at": hit.run.started_at,
                        "steps": [
                            {"seq": e.seq, "kind": e.kind, "name": e.name} for e in hit.events
                        ],
                    }
                ).decode()
            )
            continue
        steps = ", ".join(f"#{e.seq} {e.kind}:{e.name}" for e in hit.events)
        out.print(
            f"{hit.run_id}  {hit.run.workflow:<20} {hit.run.status:<10} "
            f"{_when(hit.run.started_at)}  {steps}",
            markup=False,
        )
    if not as_json:
        shown = f"{len(page.hits)} run(s)"
        more = f"; more with --offset {page.next_offset}" if page.next_offset is not None else ""
        out.print(f"{shown} (offset {page.offset}){more}", markup=False)
    if page.archived_skipped:
        if as_json:
            typer.echo(f"note: {archived_notice(page.archived_skipped)}", err=True)
        else:
            out.print(f"note: {archived_notice(page.archived_skipped)}", markup=False)
    waiting = pending_notice(state(ctx).store())
    if waiting:
        if as_json:
            typer.echo(f"note: {waiting}", err=True)
        else:
            out.print(f"note: {waiting}", markup=False)


def pending_notice(store: Any) -> str | None:
    """What a search over a ``nats://`` store's sink cannot see yet: runs with records
    still in the stream (``None`` when there are none, or for other stores)."""
    from replayable.errors import StoreError
    from replayable.store.stream import StreamStore

    if not isinstance(store, StreamStore):
        return None
    try:
        waiting = store.pending_runs()
    except StoreError as exc:
        return (
            f"stream {store.stream} cannot be read ({exc}); runs not compacted yet are not searched"
        )
    if not waiting:
        return None
    return (
        f"{len(waiting)} run(s) have records in stream {store.stream} not compacted into the "
        "sink yet: they are searched once `replayable compactor` has moved them"
    )


Formats = Annotated[
    list[str] | None,
    typer.Option(
        "--format",
        help="json, md, html or pdf (repeatable; default json, md and html).",
        metavar="FORMAT",
    ),
]
_FORMATS = ("json", "md", "html", "pdf")
_DEFAULT_FORMATS = ("json", "md", "html")


def report(
    ctx: typer.Context,
    workflow: Workflow = None,
    kind: Kind = None,
    name: Name = None,
    since: Since = None,
    until: Until = None,
    meta: Meta = None,
    where: Where = None,
    runs: Annotated[
        list[str] | None,
        typer.Option("--run", help="Report these runs (id or prefix; repeatable), no query."),
    ] = None,
    formats: Formats = None,
    archive: ArchiveOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Directory for the reports.")] = Path(
        "replayable-reports"
    ),
    include_archived: IncludeArchived = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Write an audit report for every run the query matches (or each --run): header,
    lineage, chain and seal status, timeline with the payloads of matching, flagged and
    annotated steps, anomaly flags, annotations with history, and the access-log summary.
    Producing it is written to the access log."""
    chosen = tuple(dict.fromkeys(f.strip().lower() for f in formats or _DEFAULT_FORMATS))
    bad = [f for f in chosen if f not in _FORMATS]
    if bad:
        raise ConfigurationError(f"--format {bad[0]!r} is not one of {', '.join(_FORMATS)}")
    audit = reader(ctx, user, role, purpose)
    store = audit.store
    source = _archive_search(audit, archive) or store
    q = build_query(
        workflow=workflow,
        kind=kind,
        name=name,
        since=since,
        until=until,
        meta=meta,
        where=where,
        limit=200,
        include_archived=include_archived,
    )
    skipped = 0
    private_dir(out)
    written = 0
    offset: int | None = 0
    console = stdout()
    # A bar on a terminal only: a pipe or a log gets the one closing line.
    with Progress(
        SpinnerColumn(),
        TextColumn("writing reports"),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("writing reports", total=len(runs) if runs else None)
        if runs:
            for ref in runs:
                write_report(audit, store.run(ref), out, None, (), chosen)
                written += 1
                bar.advance(task)
            offset = None
        while offset is not None:
            page = source.search(q.page(offset))
            skipped = page.archived_skipped
            if page.next_offset is None:
                bar.update(task, total=written + len(page.hits))
            for hit in page.hits:
                seqs = [e.seq for e in hit.events]
                write_report(audit, hit.run, out, str(q_text(q)), seqs, chosen)
                written += 1
                bar.advance(task)
            offset = page.next_offset
    console.print(f"{written} report(s) written to {out}", markup=False)
    if skipped:
        console.print(f"note: {archived_notice(skipped)}", markup=False)


def _archive_search(audit: AuditReader, url: str | None) -> ArchiveSearch | None:
    if url is None:
        return None
    from replayable.archive.search import ArchiveSearch

    return ArchiveSearch(url, audit.store)


def q_text(q: EventQuery) -> str:
    """The query in words, for report headers."""
    parts = [
        f"{k}={v}"
        for k, v in (("workflow", q.workflow), ("kind", q.kind), ("name", q.name))
        if v is not None
    ]
    if q.since is not None:
        parts.append(f"since {_when(q.since)}")
    if q.until is not None:
        parts.append(f"until {_when(q.until)}")
    parts.extend(f"meta {k}={v}" for k, v in q.metadata.items())
    parts.extend(str(p) for p in q.where)
    return "; ".join(parts) or "(all events)"


def write_report(
    audit: AuditReader,
    run: Run,
    directory: Path,
    query_text: str | None,
    matching: Sequence[int] = (),
    formats: Sequence[str] = ("json", "md", "html"),
) -> list[Path]:
    """Write ``<run_id>.json``/``.md``/``.html``/``.pdf`` (as ``formats`` says) for one run, each
    file 0600; returns the paths."""
    from replayable.audit.render import to_html, to_markdown, to_pdf
    from replayable.audit.report import build_report, report_json

    data = build_report(audit, run, matching=matching, query=query_text)
    written = []
    for fmt in formats:
        path = directory / f"{run.run_id}.{fmt}"
        if fmt == "json":
            write_private(path, report_json(data))
        elif fmt == "md":
            write_private(path, to_markdown(data).encode())
        elif fmt == "pdf":
            write_private(path, to_pdf(data))
        else:
            write_private(path, to_html(data).encode())
        written.append(path)
    return written


def register(app: typer.Typer) -> None:
    """Add ``query`` and ``report`` to ``app``."""
    app.command("query")(query)
    app.command("report")(report)
