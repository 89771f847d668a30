"""A run's place among other runs: its header, its lineage and its tree of child runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from replayable.cli.render import (
    call_args,
    decoded,
    format_duration,
    format_time,
    plain,
    run_duration,
    short_value,
    status_text,
    type_name,
)
from replayable.events.model import Event, Run
from replayable.store import EventStore

__all__ = ["lineage_rows", "root_run", "run_header", "run_tree", "tree_to_dict"]

#: Deepest tree drawn; sub-agents nest a few levels, never this many.
_MAX_DEPTH: Final = 32


#: Width that no value reaches: ``whole`` views shorten nothing.
_WHOLE: Final = 1 << 30


def run_header(
    run: Run, children: Sequence[Run] = (), events: Sequence[Event] = (), *, whole: bool = False
) -> Table:
    """Key facts about a run as a two-column grid, lineage included; with the run's
    ``events``, whether it was fully captured.

    ``whole`` shows input, output, metadata and code in full (for output that
    is not a terminal); otherwise they are shortened to fit a screen.
    """
    s = run.start
    wide = _WHOLE if whole else 0
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("run", Text(s.run_id, style="cyan"))
    grid.add_row("workflow", s.workflow)
    grid.add_row("entrypoint", s.entrypoint)
    grid.add_row("status", status_text(run.status))
    gaps = [e for e in events if e.kind == "gap"]
    if gaps:
        addresses = sorted({e.name for e in gaps})
        shown = ", ".join(addresses[:3]) + (" …" if len(addresses) > 3 else "")
        grid.add_row(
            "capture",
            Text(
                f"not fully captured: {len(gaps)} connection{'' if len(gaps) == 1 else 's'} "
                f"outside any boundary ({shown}); see the gap events",
                style="bold yellow",
            ),
        )
    grid.add_row("started", format_time(s.started_at))
    if run.ended_at is not None:
        grid.add_row(
            "ended", f"{format_time(run.ended_at)}  ({format_duration(run_duration(run))})"
        )
    grid.add_row("tenant", s.tenant or "—")
    grid.add_row("input", _input_text(s.input, wide or 100))
    if run.end is not None and run.end.output is not None:
        grid.add_row("output", short_value(decoded(run.end.output), wide or 100))
    if run.end is not None and run.end.error is not None:
        err = decoded(run.end.error) or {}
        grid.add_row("error", Text(f"{type_name(err)}: {err.get('message', '')}", style="red"))
    grid.add_row("metadata", _pairs(s.metadata, wide or 48))
    grid.add_row("code", _pairs(s.code, wide or 48))
    if s.env_hash:
        grid.add_row("env", s.env_hash if whole else s.env_hash[:16])
    if s.parent_run_id:
        where = f" at step {s.parent_seq}" if s.parent_seq is not None else ""
        grid.add_row("parent", f"{s.parent_run_id}{where}")
    if s.root_run_id and s.root_run_id != s.run_id:
        grid.add_row("root", s.root_run_id)
    for label, value in lineage_rows(s.lineage):
        grid.add_row(label, value)
    if children:
        grid.add_row(
            "children", "\n".join(f"{c.run_id}  {c.workflow}  {c.status}" for c in children)
        )
    return grid


def lineage_rows(lineage: Mapping[str, Any]) -> list[tuple[str, Text]]:
    """``replay of`` / ``forked from … at step N`` and the rest of the lineage, as rows."""
    if not lineage:
        return [("lineage", Text("— (recorded, not a replay)", style="dim"))]
    rows: list[tuple[str, Text]] = []
    rest = dict(lineage)
    forked = rest.pop("forked_from", None)
    step = rest.pop("fork_step", None)
    replay_of = rest.pop("replay_of", None)
    mode = rest.pop("mode", None)
    if forked:
        how = " (override)" if rest.pop("overridden", False) else " (live from there on)"
        rows.append(("forked from", Text.assemble((str(forked), "cyan"), f" at step {step}", how)))
    if replay_of and replay_of != forked:
        rows.append(("replay of", Text(str(replay_of), style="cyan")))
    if mode:
        rows.append(("mode", Text(str(mode))))
    if rest:
        rows.append(("lineage", Text(_pairs(rest, _WHOLE))))
    return rows


def _label(run: Run, here: str) -> Text:
    s = run.start
    text = Text.assemble((s.run_id, "cyan"), "  ", s.workflow, "  ", status_text(run.status))
    if s.parent_seq is not None:
        text.append(f"  (step {s.parent_seq} of its parent)", style="dim")
    if s.lineage.get("forked_from"):
        text.append(f"  fork of {s.lineage['forked_from']}", style="dim")
    if s.run_id == here:
        text.append("  ◀ this run", style="bold yellow")
    return text


def root_run(store: EventStore, run: Run) -> Run:
    """The top-level run of the tree ``run`` belongs to."""
    top = run
    for _ in range(_MAX_DEPTH):
        parent = top.start.parent_run_id
        if not parent:
            break
        top = store.run(parent)
    return top


def run_tree(store: EventStore, run: Run) -> Tree | None:
    """The tree of runs ``run`` belongs to, from its top-level run down through every child
    run; ``None`` for a run with neither parent nor children."""
    top = root_run(store, run)
    kids = store.children(top.run_id)
    if top.run_id == run.run_id and not kids:
        return None
    tree = Tree(_label(top, run.run_id), guide_style="dim")

    def grow(node: Tree, children: Sequence[Run], depth: int) -> None:
        for child in children:
            branch = node.add(_label(child, run.run_id))
            if depth < _MAX_DEPTH:
                grow(branch, store.children(child.run_id), depth + 1)

    grow(tree, kids, 1)
    return tree


def tree_to_dict(store: EventStore, run: Run, depth: int = 0) -> dict[str, Any]:
    """``run`` and its child runs, recursively, as plain JSON."""
    s = run.start
    children = store.children(run.run_id) if depth < _MAX_DEPTH else []
    return {
        "run_id": s.run_id,
        "workflow": s.workflow,
        "status": run.status,
        "parent_seq": s.parent_seq,
        "lineage": s.lineage,
        "children": [tree_to_dict(store, c, depth + 1) for c in children],
    }


def _input_text(encoded: str, width: int) -> str:
    tree = decoded(encoded)
    if width < _WHOLE and isinstance(tree, dict) and set(tree) <= {"args", "kwargs"}:
        return f"({call_args(tree)})"
    return short_value(tree, width)


def _pairs(mapping: Mapping[str, Any], width: int) -> str:
    if not mapping:
        return "—"
    return "  ".join(f"{k}={short_value(plain(v), width)}" for k, v in mapping.items())
