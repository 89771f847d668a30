"""``replayable diff A B``: two runs side by side, the first meaningful divergence on top."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final

import orjson
import typer
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from replayable.cli._context import whole_stdout
from replayable.cli.audit import AsUser, Purpose, RoleOpt, reader
from replayable.diff import FieldChange, RunDiff, StepPair

__all__ = ["diff", "diff_view", "main_change"]

_STATUS_STYLES: Final = {
    "same": "dim",
    "changed": "yellow",
    "different_call": "red",
    "inserted": "green",
    "removed": "red",
}
_RANK_STYLES: Final = {"structural": "red", "significant": "bold red", "text": "yellow"}
#: What a person reads first: significant fields (risk, amounts, decisions), then structure.
_READ_ORDER: Final = {"significant": 0, "structural": 1, "text": 2, "noise": 3}


def _short(value: Any, width: int = 36) -> str:
    if value == "<missing>":
        return "—"
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _change_text(change: FieldChange, width: int = 36) -> str:
    return f"{change.where}: {_short(change.old, width)} → {_short(change.new, width)}"


def main_change(pair: StepPair) -> str:
    """The most important difference of an aligned pair, as one line."""
    if pair.status == "inserted":
        return "only in the second run"
    if pair.status == "removed":
        return "only in the first run"
    if pair.status == "different_call":
        left = pair.left.name if pair.left else "?"
        right = pair.right.name if pair.right else "?"
        return f"different calls: {left} vs {right}"
    meaningful = sorted(
        (c for c in pair.changes if c.rank != "noise"), key=lambda c: _READ_ORDER[c.rank]
    )
    if not meaningful:
        return "" if not pair.changes else f"noise only ({len(pair.changes)} fields)"
    first = meaningful[0]
    more = f"  (+{len(meaningful) - 1} more)" if len(meaningful) > 1 else ""
    return _change_text(first) + more


def _pair_row(pair: StepPair, is_first: bool) -> list[RenderableType]:
    ev = pair.left or pair.right
    assert ev is not None
    status = Text(pair.status, style=_STATUS_STYLES.get(pair.status, ""))
    if is_first:
        status = Text("▶ " + pair.status, style="bold yellow")
    return [
        str(pair.left.seq) if pair.left else "—",
        Text.assemble((ev.kind, "blue"), " ", ev.name),
        str(pair.right.seq) if pair.right else "—",
        status,
        Text(main_change(pair), style=_RANK_STYLES.get(pair.rank or "", "")),
    ]


def _is_first(result: RunDiff, pair: StepPair) -> bool:
    first = result.first
    if first is None or first.kind == "run":
        return False
    return (pair.left.seq if pair.left else None) == first.left_step and (
        pair.right.seq if pair.right else None
    ) == first.right_step


def diff_view(result: RunDiff, *, all_pairs: bool = False) -> RenderableType:
    """Header, first divergence, aligned steps (unchanged ones folded unless ``all_pairs``),
    and the changes to the runs' outputs."""
    left, right = result.left, result.right
    parts: list[RenderableType] = [
        Text.assemble(
            "A ",
            (left.run_id, "cyan"),
            f"  {left.workflow}  {left.status}\n",
            "B ",
            (right.run_id, "cyan"),
            f"  {right.workflow}  {right.status}",
        )
    ]
    if result.first is None:
        parts.append(Text("no meaningful difference: the runs are identical", style="green"))
    else:
        parts.append(
            Panel(
                Text(result.first.describe()),
                title="first divergence",
                border_style="yellow",
                expand=False,
            )
        )
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("A step", justify="right", no_wrap=True)
    table.add_column("kind name", no_wrap=True)
    table.add_column("B step", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("main change")
    folded = 0
    for pair in result.pairs:
        if pair.status == "same" and not all_pairs:
            folded += 1
            continue
        if folded:
            table.add_row("", Text(f"… {folded} identical", style="dim"), "", "", "")
            folded = 0
        table.add_row(*_pair_row(pair, _is_first(result, pair)))
    if folded:
        table.add_row("", Text(f"… {folded} identical", style="dim"), "", "", "")
    parts.append(table)
    changes = [c for c in result.output_changes if c.rank != "noise"]
    if changes:
        parts.append(_output_table(changes))
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result.counts().items()))
    parts.append(Text(f"{len(result.pairs)} aligned steps: {counts}", style="dim"))
    return Group(*parts)


def _output_table(changes: Sequence[FieldChange]) -> Table:
    table = Table(title="output changes", show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("field", no_wrap=True)
    table.add_column("A")
    table.add_column("B")
    table.add_column("rank", no_wrap=True)
    for c in sorted(changes, key=lambda c: _READ_ORDER[c.rank]):
        style = _RANK_STYLES.get(c.rank, "")
        table.add_row(c.where, _short(c.old, 48), _short(c.new, 48), Text(c.rank, style=style))
    return table


def diff(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(help="First run: id or unique prefix.")],
    b: Annotated[str, typer.Argument(help="Second run: id or unique prefix.")],
    ignore: Annotated[
        list[str] | None,
        typer.Option("--ignore", metavar="PATH", help="Path pattern that never matters."),
    ] = None,
    significant: Annotated[
        list[str] | None,
        typer.Option("--significant", metavar="PATH", help="Path pattern that always matters."),
    ] = None,
    all_pairs: Annotated[
        bool, typer.Option("--all", help="Show unchanged steps too (and list them in JSON).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Align two runs step by step and name where they first part ways.

    Exit 0 if they are identical (noise aside), 1 if they differ. Paths are
    dotted patterns such as ``response.*.id`` or ``request.amount``. Reading both
    runs is written to the access log.
    """
    audit = reader(ctx, user, role, purpose)
    result = audit.diff(
        audit.store.resolve(a),
        audit.store.resolve(b),
        ignore=ignore or (),
        significant=significant or (),
    )
    if as_json:
        data = result.to_dict(all_pairs=all_pairs)
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode())
    else:
        whole_stdout().print(diff_view(result, all_pairs=all_pairs))
    if not result.identical:
        raise typer.Exit(1)
