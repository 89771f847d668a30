"""Commands that execute agent code: ``replay`` and ``demo``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
import typer
from rich.panel import Panel
from rich.text import Text

import replayable
from replayable.cli._context import fail, state, stdout
from replayable.cli.render import status_text
from replayable.errors import ReplayDivergenceError

__all__ = ["DEMO_STORE_URL", "demo", "find_examples", "replay"]

DEMO_STORE_URL: Final = "sqlite:///./.replayable/demo.db"


def _importable(path: Path) -> None:
    entry = str(path)
    if entry not in sys.path:
        sys.path.insert(0, entry)


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def replay(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run id or a unique prefix of one.")],
    strict: Annotated[
        bool, typer.Option("--strict", help="Stop at the first divergence instead of reporting it.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Re-execute a recorded run against its tape; exit 0 if identical, 1 otherwise.

    The run's entrypoint is imported by name, so run this from the directory
    the agent was recorded in (it is put on the import path).
    """
    store = state(ctx).store()
    run_id = store.resolve(run)
    _importable(Path.cwd())
    examples = find_examples()
    if examples is not None and str(examples) not in sys.path:
        # Last on the path: the bundled demo's agent imports, and shadows nothing.
        sys.path.append(str(examples))
    try:
        result = replayable.replay(run_id, store=store, strict=strict)
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
    error = result.error
    if as_json:
        typer.echo(
            _json_text(
                {
                    "run_id": result.run_id,
                    "status": result.status,
                    "events_served": result.events_served,
                    "output": result.output,
                    "error": None
                    if error is None
                    else {"type": type(error).__name__, "message": str(error)},
                    "divergence": None
                    if result.divergence is None
                    else result.divergence.to_dict(),
                }
            )
        )
    else:
        console = stdout()
        console.print(
            Text.assemble("replay of ", (result.run_id, "cyan"), ": ", status_text(result.status))
        )
        console.print(f"events served: {result.events_served}")
        if error is not None:
            console.print(Text(f"raised {type(error).__name__}: {error}", style="red"))
        elif result.divergence is None:
            console.print("output:", _json_text(result.output), markup=False, soft_wrap=True)
        if result.divergence is not None:
            console.print(
                Panel(result.divergence.message, title="divergence", border_style="yellow")
            )
    if result.status != "identical":
        raise typer.Exit(1)


def find_examples() -> Path | None:
    """The ``examples`` folder holding the contract-review demo, if one can be found.

    Looked for under the current directory, then beside the package source
    (an editable install of the repository).
    """
    candidates = [
        Path.cwd() / "examples",
        Path(replayable.__file__).resolve().parents[2] / "examples",
    ]
    for folder in candidates:
        if (folder / "contract_review" / "demo.py").is_file():
            return folder
    return None


def demo(
    ctx: typer.Context,
    seed: Annotated[int, typer.Option(help="Seed of the scripted model's sampling noise.")] = 7,
    reruns: Annotated[int, typer.Option(min=1, help="Live re-runs to show.")] = 3,
) -> None:
    """Record, re-run, replay and verify a contract-review agent that fails silently.

    Uses ``sqlite:///./.replayable/demo.db`` unless ``--store`` (or
    ``$REPLAYABLE_STORE``) names another store.
    """
    folder = find_examples()
    if folder is None:
        raise fail("cannot find examples/contract_review; run this from the replayable repository")
    _importable(folder)
    module = importlib.import_module("contract_review.demo")
    url = state(ctx).store_url or DEMO_STORE_URL
    outcome = module.run_demo(url, stdout(), seed=seed, reruns=reruns)
    if not outcome.ok:
        raise typer.Exit(1)
