"""The ``demo`` command, and finding the agent code that replays import."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated, Final

import typer

import replayable
from replayable import allowlist
from replayable.cli._context import fail, state, stdout

__all__ = ["DEMO_STORE_URL", "agent_paths", "demo", "find_examples"]

DEMO_STORE_URL: Final = "sqlite:///./.replayable/demo.db"


def _importable(path: Path) -> None:
    entry = str(path)
    if entry not in sys.path:
        sys.path.insert(0, entry)


def agent_paths() -> None:
    """Make recorded entrypoints importable: the current directory first, then the
    bundled examples last on the path (the demo's agent imports, and shadows nothing)."""
    _importable(Path.cwd())
    examples = find_examples()
    if examples is not None:
        allowlist.trust_folder(examples)
        if str(examples) not in sys.path:
            sys.path.append(str(examples))


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
    allowlist.trust_folder(folder)
    module = importlib.import_module("contract_review.demo")
    url = state(ctx).store_url or DEMO_STORE_URL
    outcome = module.run_demo(url, stdout(), seed=seed, reruns=reruns)
    if not outcome.ok:
        raise typer.Exit(1)
