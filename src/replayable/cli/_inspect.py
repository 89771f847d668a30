"""Read-only commands: ``runs``, ``show`` and ``verify``."""

from __future__ import annotations

from typing import Annotated

import orjson
import typer
from rich.console import RenderableType
from rich.progress import Progress
from rich.text import Text

from replayable.audit.verify import AnnotationChainReport, verify_annotations
from replayable.cli._context import fail, piped, state, stdout, visible, whole_stdout
from replayable.cli._options import parse_meta, parse_status, parse_when
from replayable.cli.audit import (
    AsUser,
    Purpose,
    RoleOpt,
    annotation_lines,
    annotation_to_dict,
    reader,
)
from replayable.cli.decisions import decisions_view
from replayable.cli.jsonview import event_to_dict, run_to_dict
from replayable.cli.render import runs_rows, runs_table, timeline
from replayable.cli.runtree import root_run, run_header, run_tree, tree_to_dict
from replayable.errors import AccessDeniedError, ConfigurationError, RunNotFoundError
from replayable.events.model import Run
from replayable.store import ChainReport, EventStore, RunFilter, StoreReport, verify_run
from replayable.store.integrity import Integrity
from replayable.store.verify import seq_gaps, verify_store

__all__ = ["runs", "show", "verify"]


def _event_count(store: EventStore, run: Run) -> int:
    # A finished run carries its count; only a run cut short needs its events read.
    return run.end.event_count if run.end is not None else len(store.events(run.run_id))


def _print_json(value: object) -> None:
    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode())


def runs(
    ctx: typer.Context,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow.")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only runs with this status: completed, failed, incomplete.")
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option("--meta", help="Only runs whose metadata has key=value (repeatable)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Started at or after: ISO date/time, or an age like 2h, 3d.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Started at or before: ISO date/time, or an age like 2h.")
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, help="At most this many runs (the rest are counted).")
    ] = 50,
    roots: Annotated[bool, typer.Option("--roots", help="Leave out child runs.")] = False,
    full: Annotated[
        bool, typer.Option("--full", help="Show full run ids (always, when piped).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List runs, newest first. Piped, one tab-separated line per run, nothing cut."""
    run_filter = RunFilter(
        workflow=workflow,
        status=parse_status(status),
        metadata=parse_meta(meta or ()),
        since=parse_when(since, "--since"),
        until=parse_when(until, "--until"),
        roots_only=roots,
        limit=limit,
    )
    store = state(ctx).store()
    found = store.list_runs(run_filter)
    total = store.count_runs(run_filter) if len(found) >= limit else len(found)
    counts: dict[str, int | None] = {r.run_id: _event_count(store, r) for r in found}
    flags = {r.run_id: _flags(store, r) for r in found}
    if as_json:
        _print_json(
            [
                {**run_to_dict(r, event_count=counts[r.run_id]), "flags": flags[r.run_id]}
                for r in found
            ]
        )
    elif not found:
        stdout().print(f"no runs in {store.url} match", style="dim")
    elif piped():
        # A pipe gets every value whole, one run per line, tab-separated.
        for row in runs_rows(found, counts):
            typer.echo(visible("\t".join(row)))
    else:
        stdout().print(runs_table(found, counts, full=full))
    if total > len(found):
        # On stderr, so that what a pipe or --json reads stays a clean listing.
        typer.echo(f"{len(found)} of {total} runs; --limit to see more", err=True)
    # Flags go to stderr where stdout is a listing a program reads.
    quiet = as_json or piped()
    for run_id, problems in flags.items():
        for problem in problems:
            _warn_line(f"run {run_id}: {problem}", err=quiet)
    orphans = sorted(store.event_run_ids() - set(store.iter_run_ids()))
    if orphans:
        shown = ", ".join(orphans[:3]) + ("…" if len(orphans) > 3 else "")
        _warn_line(
            f"{len(orphans)} run id(s) have events but no run record (orphaned): {shown}; "
            "see `replayable verify --all`",
            err=quiet,
        )


def _warn_line(message: str, *, err: bool) -> None:
    if err:
        typer.echo(f"⚠ {visible(message)}", err=True)
    else:
        stdout().print(Text.assemble(("⚠ ", "yellow"), (message, "yellow")))


def _flags(store: EventStore, run: Run) -> list[str]:
    """What is wrong with a listed run's rows beyond its status (a run whose end record
    is missing is listed as incomplete): unreadable columns, seq numbers missing."""
    out = [f"unreadable row: {p}" for p in run.problems]
    events = store.events(run.run_id)
    out += [f"unreadable event seq {e.seq}: {'; '.join(e.problems)}" for e in events if e.problems]
    gaps = seq_gaps(events)
    if gaps:
        shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in gaps[:5])
        out.append(f"gap in its sequence: seq {shown} missing")
    return out


def show(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run id or a unique prefix of one.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the run and its events as JSON.")
    ] = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Show a run: its header and lineage, its tree of runs, then every event in order,
    with its annotations under their events (the read is written to the access log).

    Events of a fork or counterfactual run are marked replayed, override,
    live or blocked.
    """
    audit = reader(ctx, user, role, purpose)
    store = audit.store
    record = audit.run(run)
    events, notes = audit.timeline(record)
    children = store.children(record.run_id)
    if as_json:
        _print_json(
            {
                "run": run_to_dict(record, event_count=len(events), detail=True, children=children),
                "fully_captured": not any(e.kind == "gap" for e in events),
                "events": [
                    {**event_to_dict(e), "problems": list(e.problems)}
                    if e.problems
                    else event_to_dict(e)
                    for e in events
                ],
                "tree": tree_to_dict(store, root_run(store, record)),
                "annotations": [annotation_to_dict(a, notes) for a in notes.history],
            }
        )
        return
    console = whole_stdout()
    console.print(run_header(record, children, events, whole=piped()))
    for problem in record.problems:
        by_design = record.erased is not None and problem.endswith(record.erased)
        label = "⚠ run record, " if by_design else "⚠ unreadable run record: "
        console.print(Text.assemble((label, "bold yellow"), problem))
    console.print()
    tree = run_tree(store, record)
    if tree is not None:
        console.print(Text("run tree", style="bold"))
        console.print(tree)
        console.print()
    on_run = notes.on_step(None)
    for a in on_run:
        console.print(annotation_lines(a))
    if on_run:
        console.print()
    by_step: dict[int, list[RenderableType]] = {}
    for a in notes.current:
        if a.seq is not None:
            by_step.setdefault(a.seq, []).append(annotation_lines(a))
    title = f"{len(events)} event{'' if len(events) == 1 else 's'}"
    console.print(timeline(events, title=title, whole=piped(), notes=by_step))
    for e in events:
        if e.problems:
            console.print(
                Text.assemble(
                    (f"⚠ seq {e.seq} is unreadable: ", "bold yellow"),
                    f"run {record.run_id}, " + "; ".join(e.problems),
                )
            )
    decisions = decisions_view(record, events)
    if decisions is not None:
        console.print()
        console.print(decisions)


def _report_line(report: ChainReport) -> Text:
    mark, style = ("✓", "green") if report.ok else ("✗", "red")
    label = "" if report.ok or report.status == "altered" else f"[{report.status}] "
    return Text.assemble(
        (mark, style), " ", (label, "bold red"), (report.message, "" if report.ok else "red")
    )


def _report_json(r: ChainReport) -> dict[str, object]:
    return {
        "run_id": r.run_id,
        "status": r.status,
        "ok": r.ok,
        "events_checked": r.events_checked,
        "first_bad_seq": r.first_bad_seq,
        "reason": r.reason or None,
        "keyed": r.keyed,
        "key_id": r.key_id,
        "anchored": r.anchored,
        "gaps": [list(g) for g in r.gaps],
        "notes": list(r.notes),
    }


def _verify_one(store: EventStore, run: str, integrity: Integrity, allow: bool) -> ChainReport:
    try:
        run_id = store.resolve(run)
    except RunNotFoundError:
        # A run whose record is gone can still be named in full: the anchor or its
        # orphaned events say what became of it.
        run_id = run.strip().lower()
        try:
            return verify_run(store, run_id, integrity=integrity, allow_unkeyed=allow)
        except RunNotFoundError:
            raise fail(f"no run matches {run!r} in {store.url}") from None
    return verify_run(store, run_id, integrity=integrity, allow_unkeyed=allow)


def verify(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Run id or unique prefix.")] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Verify every run in the store.")] = False,
    allow_unkeyed: Annotated[
        bool,
        typer.Option(
            "--allow-unkeyed", help="Accept runs recorded without a chain key while one is set."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON results.")] = False,
) -> None:
    """Check runs against their chains, seals and the anchor; exit 1 unless every run is intact.

    Each run is intact, altered (naming the first bad record), truncated (the
    anchor saw more), missing (anchored, absent), orphaned (events without a
    run record), unkeyed, gapped (seq numbers missing) or unsealed (no end
    record and no anchor seal). Keys and anchor: REPLAYABLE_CHAIN_KEY,
    REPLAYABLE_KEYRING, REPLAYABLE_ANCHOR.
    """
    if run is None and not all_runs:
        raise fail("name a run to verify, or pass --all")
    if run is not None and all_runs:
        raise fail("pass a run or --all, not both")
    store = state(ctx).store()
    console = stdout()
    try:
        integrity = Integrity.from_env()
    except ConfigurationError as exc:
        raise fail(str(exc)) from None
    if run is not None:
        report = StoreReport([_verify_one(store, run, integrity, allow_unkeyed)])
    else:
        with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task("verifying", total=None)

            def progress(total: int) -> None:
                if total:
                    bar.update(task, total=total)
                else:
                    bar.advance(task)

            report = verify_store(
                store, integrity=integrity, allow_unkeyed=allow_unkeyed, progress=progress
            )
    reports = report.runs
    broken = [r for r in reports if not r.ok]
    notes = _annotation_reports(store, [r.run_id for r in reports], integrity, allow_unkeyed)
    bad_notes = [n for n in notes.values() if not n.ok]
    if as_json:
        rows = [_report_json(r) for r in reports]
        for row in rows:
            found = notes.get(str(row["run_id"]))
            if found is not None:
                row["annotations"] = {
                    "ok": found.ok,
                    "checked": found.checked,
                    "first_bad": found.first_bad,
                    "reason": found.reason or None,
                }
        _print_json(rows)
    else:
        for n in bad_notes:
            console.print(Text.assemble(("✗ ", "red"), (n.message, "red")))
        # A long --all listing shows only the broken runs and a total.
        shown = reports if len(reports) <= 50 else broken
        for line in shown:
            console.print(_report_line(line))
        for problem in report.problems:
            console.print(Text.assemble(("✗ ", "red"), (problem, "red")))
        if all_runs:
            style = "red" if broken or report.problems else "green"
            counts = ", ".join(f"{n} {s}" for s, n in report.counts().items())
            console.print(
                f"{len(reports)} runs checked, {len(broken)} broken ({counts or 'none'})",
                style=style,
            )
    if broken or report.problems or bad_notes:
        raise typer.Exit(1)


def _annotation_reports(
    store: EventStore, run_ids: list[str], integrity: Integrity, allow_unkeyed: bool
) -> dict[str, AnnotationChainReport]:
    """Each run's annotation chain checked; none when this login may not read them."""
    out: dict[str, AnnotationChainReport] = {}
    for run_id in run_ids:
        try:
            out[run_id] = verify_annotations(
                store, run_id, integrity=integrity, allow_unkeyed=allow_unkeyed
            )
        except AccessDeniedError:
            return {}
    return out
