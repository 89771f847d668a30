"""``replayable tools``: every tool known, and which ones replay guards as side effects."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

import orjson
import typer
from rich.table import Table
from rich.text import Text

from replayable.capture.boundaries import registered_tools
from replayable.capture.config import settings
from replayable.cli._context import fail, state, stdout
from replayable.cli._replay import agent_paths
from replayable.store import EventStore, RunFilter

__all__ = ["ToolInfo", "known_tools", "tools"]

#: Event kinds a ``@replayable.tool`` records (LLM, clock, random and the like are not tools).
_TOOL_KINDS: Final = frozenset({"tool", "retrieval", "state_read", "state_write"})


@dataclass
class ToolInfo:
    """What is known about one tool name, and from where."""

    name: str
    kind: str = "tool"
    function: str | None = None
    declared: bool = False
    configured: bool = False
    recorded_side_effect: bool = False
    recorded_runs: int = 0
    sources: list[str] = field(default_factory=list)

    @property
    def guarded(self) -> bool:
        """Whether a fork or counterfactual replay keeps this tool from running for real."""
        return self.declared or self.configured or self.recorded_side_effect

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "function": self.function,
            "side_effect": self.declared,
            "configured": self.configured,
            "recorded_side_effect": self.recorded_side_effect,
            "recorded_runs": self.recorded_runs,
            "guarded": self.guarded,
            "sources": self.sources,
        }


def known_tools(store: EventStore | None, scan: int = 200) -> list[ToolInfo]:
    """Tools decorated in this process, recorded in the newest ``scan`` runs of ``store``,
    and named in the ``side_effects`` configuration, merged by name."""
    found: dict[str, ToolInfo] = {}

    def get(name: str, source: str) -> ToolInfo:
        info = found.setdefault(name, ToolInfo(name))
        if source not in info.sources:
            info.sources.append(source)
        return info

    for name, meta in registered_tools().items():
        info = get(name, "code")
        info.kind = str(meta.get("kind", "tool"))
        info.function = meta.get("function")
        info.declared = bool(meta.get("side_effect"))
    if store is not None:
        for run in store.list_runs(RunFilter(limit=scan)):
            seen: set[str] = set()
            for event in store.events(run.run_id):
                if event.kind not in _TOOL_KINDS:
                    continue
                info = get(event.name, "store")
                info.kind = event.kind
                info.recorded_side_effect |= event.side_effect
                if event.name not in seen:
                    seen.add(event.name)
                    info.recorded_runs += 1
    for name in settings.side_effects:
        get(name, "config").configured = True
    return sorted(found.values(), key=lambda t: (not t.guarded, t.name))


def _yes(flag: bool) -> Text:
    return Text("yes", style="bold magenta") if flag else Text("—", style="dim")


def tools(
    ctx: typer.Context,
    module: Annotated[
        list[str] | None,
        typer.Option(
            "--module",
            metavar="MOD",
            help="Import this module first so its @replayable.tool functions register.",
        ),
    ] = None,
    scan: Annotated[int, typer.Option(min=0, help="Read tool calls from the newest N runs.")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the tools replay knows and which are guarded as side effects.

    A guarded tool never runs for real in a fork or counterfactual replay
    unless named with ``--allow-live``. Guards come from
    ``@replayable.tool(side_effect=True)``, from recorded calls, and from
    ``side_effects`` in ``[tool.replayable]`` or ``$REPLAYABLE_SIDE_EFFECTS``.
    """
    agent_paths()
    for name in module or []:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise fail(f"cannot import module {name!r}: {exc}") from None
    found = known_tools(state(ctx).store() if scan else None, scan)
    if as_json:
        data = [t.to_dict() for t in found]
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return
    console = stdout()
    if not found:
        console.print("no tools known: pass --module, or record a run first", style="dim")
        return
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("tool", no_wrap=True)
    table.add_column("kind", no_wrap=True, style="blue")
    table.add_column("guarded", no_wrap=True)
    table.add_column("side_effect=True", no_wrap=True)
    table.add_column("config", no_wrap=True)
    table.add_column("recorded", justify="right", no_wrap=True)
    table.add_column("defined in")
    for t in found:
        table.add_row(
            Text(t.name, style="bold" if t.guarded else ""),
            t.kind,
            _yes(t.guarded),
            _yes(t.declared or t.recorded_side_effect),
            _yes(t.configured),
            f"{t.recorded_runs} runs" if t.recorded_runs else "—",
            t.function or "—",
        )
    console.print(table)
    guarded = sum(t.guarded for t in found)
    console.print(f"{len(found)} tools, {guarded} guarded", style="dim")
