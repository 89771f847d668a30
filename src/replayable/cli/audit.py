"""``replayable annotate``, ``annotations`` and ``access-log``: the audit trail from the shell.

Who acts is ``--as USER --role ROLE`` (or ``$REPLAYABLE_USER``/``$REPLAYABLE_ROLE``;
by default the login, as admin). Every read of payloads is written to the access
log with ``--purpose`` when given.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import msgspec
import orjson
import typer
from rich.table import Table
from rich.text import Text

from replayable.audit.access import AuditReader
from replayable.audit.actor import Actor
from replayable.audit.annotations import AnnotationSet
from replayable.cli._context import state, stdout
from replayable.cli._options import parse_when
from replayable.events.audit import VERDICTS, Annotation

__all__ = [
    "AsUser",
    "Purpose",
    "RoleOpt",
    "access_log",
    "annotate",
    "annotation_lines",
    "annotations_cmd",
    "reader",
    "register",
]

AsUser = Annotated[
    str | None,
    typer.Option("--as", metavar="USER", help="Acting user (default $REPLAYABLE_USER or login)."),
]
RoleOpt = Annotated[
    str | None,
    typer.Option(
        "--role", help="Acting role: engineer, analyst, auditor, admin (default $REPLAYABLE_ROLE)."
    ),
]
Purpose = Annotated[
    str | None, typer.Option("--purpose", help="Why you read this; kept in the access log.")
]

VERDICT_STYLES = {
    "ok": "green",
    "concern": "yellow",
    "violation": "bold red",
    "needs-review": "cyan",
}


def reader(
    ctx: typer.Context, user: str | None, role: str | None, purpose: str | None
) -> AuditReader:
    """The CLI's reader: the store of ``--store``, the acting user, channel ``cli``."""
    store = state(ctx).store()
    return AuditReader(
        store, Actor.current(store, user=user, role=role), channel="cli", purpose=purpose
    )


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _label(a: Annotation) -> Text:
    if a.retract:
        return Text("retracted", style="dim")
    return Text(a.verdict or "?", style=VERDICT_STYLES.get(a.verdict or "", ""))


def annotation_lines(a: Annotation, *, indent: str = "") -> Text:
    """One annotation as two lines: verdict, where, who and when; then the note."""
    where = "run" if a.seq is None else f"step {a.seq}"
    head = Text(indent + "✎ ")
    head.append_text(_label(a))
    head.append(f"  {where}  {a.author} ({a.role})  {_when(a.created_at)}  {a.annotation_id[:13]}")
    if a.policy:
        head.append(f"  policy {a.policy}")
    if a.amends:
        head.append(f"  amends {a.amends[:13]}", style="dim")
    if a.closes:
        head.append(f"  closes {', '.join(c[:13] for c in a.closes)}", style="dim")
    head.append("\n" + indent + "  " + " ".join(a.note.split()), style="")
    return head


def annotation_to_dict(a: Annotation, found: AnnotationSet | None = None) -> dict[str, object]:
    """An annotation as JSON (with ``current`` when the set it belongs to is given)."""
    out: dict[str, object] = msgspec.structs.asdict(a)
    out["closes"] = list(a.closes)
    if found is not None:
        out["current"] = a in found.current
    return out


def annotate(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run id or a unique prefix of one.")],
    verdict: Annotated[
        str | None, typer.Option(help=f"One of {', '.join(VERDICTS)} (not with --retract).")
    ] = None,
    note: Annotated[str, typer.Option(help="What was reviewed and found.")] = "",
    step: Annotated[int | None, typer.Option(help="Annotate this event (seq).")] = None,
    policy: Annotated[str | None, typer.Option(help="The policy or rule it refers to.")] = None,
    amends: Annotated[
        str | None, typer.Option(help="Correct this annotation (id or prefix).")
    ] = None,
    retract: Annotated[
        str | None, typer.Option(help="Withdraw this annotation (id or prefix).")
    ] = None,
    closes: Annotated[
        list[str] | None, typer.Option("--closes", help="Close this anomaly flag (repeatable).")
    ] = None,
    user: AsUser = None,
    role: RoleOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the annotation as JSON.")] = False,
) -> None:
    """Attach a compliance annotation to a run or one of its events (never edited later:
    correct with --amends, withdraw with --retract)."""
    if amends and retract:
        from replayable.errors import ConfigurationError

        raise ConfigurationError("pass --amends or --retract, not both")
    r = reader(ctx, user, role, None)
    made = r.annotate(
        run,
        step=step,
        verdict=verdict,
        note=note,
        policy=policy,
        amends=amends or retract,
        retract=retract is not None,
        closes=closes or (),
    )
    if as_json:
        typer.echo(orjson.dumps(annotation_to_dict(made), option=orjson.OPT_INDENT_2).decode())
        return
    stdout().print(annotation_lines(made))


def annotations_cmd(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run id or a unique prefix of one.")],
    history: Annotated[
        bool, typer.Option("--history", help="Every version, corrections and retractions too.")
    ] = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List a run's annotations as they stand (``--history`` for every version)."""
    r = reader(ctx, user, role, purpose)
    found = r.annotations(run)
    if as_json:
        typer.echo(
            orjson.dumps(
                {
                    "run_id": found.run_id,
                    "current": [a.annotation_id for a in found.current],
                    "history": [annotation_to_dict(a, found) for a in found.history],
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
        return
    out = stdout()
    shown = list(found.history) if history else found.current
    if not shown:
        out.print(f"run {found.run_id}: no annotations", style="dim")
        return
    current = set(found.current)
    for a in shown:
        line = annotation_lines(a)
        if history and a not in current:
            line.stylize("dim")
        out.print(line)
    if not history and len(found.history) > len(shown):
        out.print(f"({len(found.history)} versions in all; --history shows them)", style="dim")


def access_log(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option(help="Only reads of this run.")] = None,
    who: Annotated[str | None, typer.Option(help="Only reads by this login or user.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Reads at or after: ISO date/time, or an age like 2h, 30d.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many (the newest).")] = 200,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Who read which payloads, when, through what and why (auditor and admin roles).
    This read is logged too."""
    r = reader(ctx, user, role, purpose)
    entries = r.access_log(run=run, who=who, since=parse_when(since, "--since"), limit=limit)
    if as_json:
        for e in entries:
            typer.echo(orjson.dumps(msgspec.structs.asdict(e)).decode())
        return
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for column in ("when", "who", "role", "via", "run", "steps", "what", "purpose"):
        table.add_column(column, no_wrap=column != "purpose")
    for e in entries:
        steps = ",".join(map(str, e.steps)) if len(e.steps) <= 6 else f"{len(e.steps)} steps"
        who_text = e.user if e.user == e.login else f"{e.user} ({e.login})"
        table.add_row(
            _when(e.at),
            who_text,
            e.role,
            e.channel,
            (e.run_id or "")[:13],
            steps,
            ",".join(e.what),
            e.purpose or "",
        )
    stdout().print(table)


def register(app: typer.Typer) -> None:
    """Add ``annotate``, ``annotations`` and ``access-log`` to ``app``."""
    app.command("annotate")(annotate)
    app.command("annotations")(annotations_cmd)
    app.command("access-log")(access_log)
