"""Commands that re-execute agent code against a recording: ``replay`` and ``step``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import orjson
import typer
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from replayable.cli._context import fail, stdout, visible
from replayable.cli._overrides import check_overrides
from replayable.cli._replay import agent_paths
from replayable.cli.audit import AsUser, Purpose, RoleOpt, reader
from replayable.cli.render import event_parts, status_text
from replayable.cli.runtree import lineage_rows
from replayable.errors import ConfigurationError, ReplayDivergenceError, ReplayError
from replayable.replay.frames import PausePoint
from replayable.replay.loading import check_not_erased, load_entrypoint
from replayable.replay.session import ReplayResult
from replayable.replay.stepper import StepperShell

__all__ = ["parse_overrides", "pause_view", "replay", "step"]

_OK = frozenset({"identical", "completed", "paused"})
#: ``replayable replay`` exit codes: 0 identical (or completed, paused), 1 diverged or
#: failed, 2 usage or input error, 3 the replay could not start (the entry module is
#: missing, failed to import or ran live code at import, or the record was refused).
EXIT_NOT_STARTED = 3


def _s(items: Any) -> str:
    return "" if len(items) == 1 else "s"


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def parse_overrides(items: list[str]) -> dict[int, Any]:
    """``N=@file.json`` or ``N=<json literal>`` options as ``{N: value}``."""
    out: dict[int, Any] = {}
    for item in items:
        step_text, sep, value_text = item.partition("=")
        if not sep or not step_text.strip().isdigit():
            raise ConfigurationError(
                f"--override {item!r} is not STEP=VALUE; use 3=@value.json or 3='{{\"rows\": []}}'"
            )
        step_no = int(step_text)
        if value_text.startswith("@"):
            path = Path(value_text[1:])
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise ConfigurationError(
                    f"--override {step_no}: cannot read {str(path)!r}: {exc.strerror or exc}"
                ) from None
            where = f"the file {str(path)!r}"
        else:
            raw, where = value_text.encode(), repr(value_text)
        try:
            out[step_no] = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            hint = "" if value_text.startswith("@") else " (a string needs JSON quotes: '\"text\"')"
            raise ConfigurationError(
                f"--override {step_no}: {where} is not JSON: {exc}{hint}"
            ) from None
    return out


def pause_view(point: PausePoint) -> RenderableType:
    """The event a replay paused before, and the agent's stack with each frame's locals."""
    ev = point.event
    args, result, failed = event_parts(ev)
    parts: list[RenderableType] = [
        Text.assemble(
            (f"step {ev.seq} ", "bold"),
            (ev.kind, "blue"),
            " ",
            (ev.name, "bold"),
            f"({args})",
        ),
        Text.assemble("recorded: ", (result, "red" if failed else "green")),
        Text(f"stack, entry first ({len(point.frames)} frame{_s(point.frames)}):", style="bold"),
    ]
    for i, frame in enumerate(point.frames):
        parts.append(
            Text.assemble(
                f"  #{i} ", (frame.function, "cyan"), f"  {frame.file}:{frame.line}", style=""
            )
        )
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(overflow="fold")
        for name, value in frame.locals.items():
            grid.add_row(f"      {name} =", Text(value))
        if frame.locals:
            parts.append(grid)
    return Panel(
        Group(*parts), title=f"paused before step {ev.seq}", border_style="cyan", expand=False
    )


def _result_dict(result: ReplayResult, lineage: dict[str, Any] | None) -> dict[str, Any]:
    error = result.error
    return {
        "run_id": result.run_id,
        "status": result.status,
        "events_served": result.events_served,
        "output": result.output,
        "error": None if error is None else {"type": type(error).__name__, "message": str(error)},
        "divergence": None if result.divergence is None else result.divergence.to_dict(),
        "paused": None if result.paused is None else result.paused.to_dict(),
        "new_run_id": result.new_run_id,
        "lineage": lineage,
        "blocked": list(result.blocked),
    }


def _print_result(result: ReplayResult, lineage: dict[str, Any] | None, store: Any) -> None:
    console = stdout()
    what = "replay"
    if lineage and lineage.get("mode") == "fork":
        what = f"fork at step {lineage.get('fork_step')}"
    elif lineage:
        what = "counterfactual replay"
    console.print(
        Text.assemble(f"{what} of ", (result.run_id, "cyan"), ": ", status_text(result.status))
    )
    console.print(f"events served: {result.events_served}")
    if result.new_run_id:
        console.print(Text.assemble("new run: ", (result.new_run_id, "bold cyan")))
        for label, value in lineage_rows(lineage or {}):
            console.print(Text.assemble(f"  {label}: ", value))
    if result.blocked and result.new_run_id:
        names = {e.seq: e.name for e in store.events(result.new_run_id)}
        for seq in result.blocked:
            console.print(
                Text(
                    f"side effect blocked at step {seq}: {names.get(seq, '?')} was not executed; "
                    "the recorded response was served",
                    style="magenta",
                )
            )
    if result.paused is not None:
        console.print(pause_view(result.paused))
    elif result.error is not None:
        console.print(Text(f"raised {type(result.error).__name__}: {result.error}", style="red"))
    elif result.divergence is None:
        console.print("output:", _json_text(result.output), markup=False, soft_wrap=True)
    if result.divergence is not None:
        console.print(Panel(result.divergence.message, title="divergence", border_style="yellow"))


def replay(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run id or a unique prefix of one.")],
    strict: Annotated[
        bool, typer.Option("--strict", help="Stop at the first divergence instead of reporting it.")
    ] = False,
    stop_at: Annotated[
        int | None,
        typer.Option("--stop-at", metavar="N", help="Pause before step N; print it and the stack."),
    ] = None,
    fork_at: Annotated[
        int | None,
        typer.Option("--fork-at", metavar="N", help="Tape before step N, live from N (a new run)."),
    ] = None,
    override: Annotated[
        list[str] | None,
        typer.Option(
            "--override",
            metavar="N=VALUE",
            help="Value for step N instead of the live call: N=@file.json or N=<JSON>.",
        ),
    ] = None,
    live: Annotated[
        list[str] | None,
        typer.Option("--live", metavar="NAME", help="Kind or name to run live (counterfactual)."),
    ] = None,
    allow_live: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-live", metavar="NAME", help="Side-effect tool that may run for real."
        ),
    ] = None,
    children: Annotated[
        str, typer.Option("--children", metavar="tape|live", help="Child runs from tape or live.")
    ] = "tape",
    on_side_effect: Annotated[
        str,
        typer.Option(
            "--on-side-effect",
            metavar="stop|recorded",
            help="A guarded side effect with a new request: stop, or serve the recorded response.",
        ),
    ] = "stop",
    entry: Annotated[
        str | None,
        typer.Option(
            "--entry",
            metavar="MODULE:FUNCTION",
            help="The workflow function to call instead of the recorded entrypoint.",
        ),
    ] = None,
    allow_network: Annotated[
        bool,
        typer.Option(
            "--allow-network",
            help="Let connections made outside every boundary through (refused by default "
            "in the parts served from the tape).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Re-execute a recorded run: exactly, up to a step, forked at a step, or counterfactually.

    Exit 0 when identical, completed or paused; 1 when diverged or failed; 2 for a
    usage or input error; 3 when the replay could not start (its entry module is
    missing, fails to import or runs live code at import, or the record is refused).
    A fork or counterfactual replay records a new run whose lineage names
    this one. The run's entrypoint is imported by name, so run this from the
    directory the agent was recorded in (it is put on the import path); only a
    ``@replayable.workflow`` from an allowed module is called (``[tool.replayable]
    entrypoints``), or the function ``--entry`` names. Reading the tape is written to the
    access log (engineer and admin roles may replay).
    """
    overrides = parse_overrides(override or [])
    if stop_at is not None and (fork_at is not None or overrides or live):
        raise fail(
            "--stop-at pauses a pure replay; it cannot be combined with --fork-at, "
            "--override or --live"
        )
    audit = reader(ctx, user, role, purpose)
    store = audit.store
    run_id = store.resolve(run)
    recorded = store.get_run(run_id)
    if recorded.erased is not None:
        try:
            check_not_erased(recorded)
        except ReplayError as exc:
            raise fail(str(exc)) from None
    unreadable = recorded.problems
    if unreadable:
        # A start record that cannot be read names no input to replay with.
        raise fail(f"run {run_id} cannot be replayed: its record is unreadable ({unreadable[0]})")
    overrides = check_overrides(store, run_id, overrides)
    agent_paths()
    try:
        fn = load_entrypoint(store.run(run_id), entry) if entry else None
        result = audit.replay(
            run_id,
            fn=fn,
            strict=strict,
            stop_at=stop_at,
            fork_at=fork_at,
            overrides=overrides,
            live=live or (),
            allow_live=allow_live or (),
            children=cast(Literal["tape", "live"], children),
            on_side_effect=cast(Literal["stop", "recorded"], on_side_effect),
            allow_network=allow_network,
        )
    except ReplayError as exc:
        # One line and its own exit code: the replay never started.
        typer.echo(f"error: {visible(' '.join(str(exc).split()))}", err=True)
        raise typer.Exit(EXIT_NOT_STARTED) from None
    except ReplayDivergenceError as exc:
        if as_json:
            typer.echo(
                _json_text(
                    {"run_id": run_id, "status": "diverged", "divergence": exc.divergence.to_dict()}
                )
            )
        else:
            stdout().print(Text("diverged", style="yellow"), Panel(exc.divergence.message))
        raise typer.Exit(1) from None
    lineage = store.run(result.new_run_id).start.lineage if result.new_run_id else None
    if as_json:
        typer.echo(_json_text(_result_dict(result, lineage)))
    else:
        _print_result(result, lineage, store)
    if result.status not in _OK:
        raise typer.Exit(1)


def step(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run id or a unique prefix of one.")],
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Step through a replay like a debugger, reading commands from stdin ('help' lists them).

    Works in a terminal and through a pipe: ``printf 'next\\nwhere\\nquit\\n' |
    replayable step RUN``. Exit 1 if the replay diverged or failed. Reading the tape is
    written to the access log.
    """
    audit = reader(ctx, user, role, purpose)
    run_id = audit.store.resolve(run)
    agent_paths()
    stepper = audit.stepper(run_id)
    result = StepperShell(stepper, sys.stdin, sys.stdout).run()
    if result is not None and result.status in ("diverged", "failed"):
        raise typer.Exit(1)
