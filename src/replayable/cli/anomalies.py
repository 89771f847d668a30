"""``replayable anomalies``: the anomaly queue, and ``anomalies scan`` that fills it.

::

    replayable anomalies scan --since 30d            # every finished run not yet scanned
    replayable anomalies scan --follow --interval 10
    replayable anomalies --open --rule empty_data_decision
    replayable annotate RUN --verdict violation --note … --closes FLAG   # closes a flag
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Annotated

import msgspec
import orjson
import typer
from rich.table import Table

from replayable.audit.rules import AnomalyConfig, registry
from replayable.audit.scan import Scanner, ScanResult
from replayable.cli._context import state, stdout, visible
from replayable.cli._options import parse_when
from replayable.cli.audit import AsUser, Purpose, RoleOpt, reader

__all__ = ["anomalies_app", "register"]

anomalies_app = typer.Typer(
    name="anomalies",
    help="The anomaly queue (flags by rule), and `scan` to look for new ones.",
    invoke_without_command=True,
)


@anomalies_app.callback()
def anomalies(
    ctx: typer.Context,
    open_only: Annotated[
        bool, typer.Option("--open", help="Only flags no annotation has closed.")
    ] = False,
    rule: Annotated[str | None, typer.Option(help="Only this rule (name or number).")] = None,
    run: Annotated[str | None, typer.Option(help="Only flags of this run.")] = None,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """List anomaly flags, worst first. Close one with `annotate RUN --closes FLAG`."""
    if ctx.invoked_subcommand is not None:
        return
    items = reader(ctx, user, role, purpose).queue(open_only=open_only, rule=rule, run=run)
    if as_json:
        for item in items:
            data = msgspec.structs.asdict(item.flag)
            data["closed_by"] = item.closed_by
            typer.echo(orjson.dumps(data).decode())
        return
    out = stdout()
    if not items:
        out.print("no anomaly flags" + (" open" if open_only else ""), style="dim")
        return
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for column in ("flag", "rule", "run", "workflow", "steps", "score", "state", "evidence"):
        table.add_column(column, no_wrap=column != "evidence", overflow="fold")
    for item in items:
        f = item.flag
        table.add_row(
            f.flag_id[:13],
            f.rule,
            f.run_id[:13],
            f.workflow,
            ",".join(map(str, f.steps[:8])) + ("…" if len(f.steps) > 8 else ""),
            f"{f.score:g}",
            "open" if item.open else f"closed by {item.closed_by[:13] if item.closed_by else ''}",
            orjson.dumps(f.evidence).decode()[:160],
        )
    out.print(table)
    counts = Counter(i.flag.rule for i in items)
    out.print(
        f"{len(items)} flag(s): " + ", ".join(f"{r} {n}" for r, n in counts.most_common()),
        markup=False,
    )


def _summary(result: ScanResult) -> str:
    counts = Counter(f.rule for f in result.flags)
    found = ", ".join(f"{rule} {n}" for rule, n in counts.most_common()) or "none"
    return (
        f"scanned {result.runs} run(s) in {result.seconds:.2f}s "
        f"({result.runs_per_s:,.0f} runs/s); flags: {found}"
    )


@anomalies_app.command("scan")
def scan(
    ctx: typer.Context,
    since: Annotated[
        str | None, typer.Option(help="Only runs started at or after: 30d, 12h, an ISO date.")
    ] = None,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow.")] = None,
    rule: Annotated[
        list[str] | None, typer.Option("--rule", help="Only these rules (repeatable).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep scanning new runs until interrupted.")
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between scans with --follow.")
    ] = 5.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the new flags as JSON lines.")
    ] = False,
) -> None:
    """Run the anomaly rules over every finished run no scan has seen yet, and store flags.

    Thresholds come from ``[tool.replayable.anomalies]`` in pyproject.toml.
    """
    store = state(ctx).store()
    scanner = Scanner(store, rules=rule, config=AnomalyConfig.from_project())
    out = stdout()

    def report(result: ScanResult) -> None:
        if as_json:
            for f in result.flags:
                typer.echo(orjson.dumps(msgspec.structs.asdict(f)).decode())
        elif result.runs or not follow:
            out.print(_summary(result), markup=False)
        for run_id, name, message in result.errors:
            typer.echo(visible(f"warning: rule {name} failed on run {run_id}: {message}"), err=True)

    when = parse_when(since, "--since")
    if not follow:
        report(scanner.scan(since=when, workflow=workflow))
        return
    if not as_json:
        out.print(f"following {store.url}: a scan every {interval:g}s (Ctrl-C stops)")
    try:
        scanner.follow(interval=interval, since=when, workflow=workflow, on_result=report)
    except KeyboardInterrupt:
        if not as_json:
            out.print(f"stopped at {time.strftime('%H:%M:%S')}")


@anomalies_app.command("rules")
def rules() -> None:
    """List the registered anomaly rules and their default thresholds."""
    out = stdout()
    for r in registry.values():
        defaults = ", ".join(
            f"{k}={v!r}" for k, v in r.defaults.items() if k not in ("patterns", "fallbacks")
        )
        number = f"{r.number}. " if r.number else ""
        out.print(f"{number}{r.name}: {r.description}" + (f" [{defaults}]" if defaults else ""))


def register(app: typer.Typer) -> None:
    """Add the ``anomalies`` command group to ``app``."""
    app.add_typer(anomalies_app, name="anomalies")
