"""``replayable export`` and ``replayable import``: runs to fixture files and back.

::

    replayable export 01a2b3 --sanitize default -o tests/incidents/gb-sct.replay
    replayable export 01a2b3 --tree --sanitize rules.toml -o incident.replay
    replayable import tests/incidents/gb-sct.replay --store sqlite:///runs.db
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from replayable.cli._context import fail, state, stdout

__all__ = ["export", "import_", "register"]


def export(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Run id or unique prefix.")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="The fixture file to write.")
    ] = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="The whole run tree, from its root run.")
    ] = False,
    sanitize: Annotated[
        str | None,
        typer.Option(
            "--sanitize",
            metavar="RULES",
            help="Replace personal data first: 'default' (emails, phones, IBANs, cards, "
            "national ids) or a rules file (.json/.toml).",
        ),
    ] = None,
) -> None:
    """Write a run (and its child runs) to one self-contained fixture file."""
    if run is None or output is None:
        raise fail("export needs a RUN and -o FILE")
    from replayable.testing.fixture import export_fixture
    from replayable.testing.sanitize import SanitizeRules

    rules = SanitizeRules.load(sanitize) if sanitize is not None else None
    fx = export_fixture(state(ctx).store(), run, output, tree=tree, sanitize=rules)
    out = stdout()
    out.print(
        f"wrote {output}: {len(fx.starts)} run(s), {len(fx.events)} events, root {fx.root}",
        markup=False,
    )
    if fx.manifest is not None:
        by_rule = fx.manifest["by_rule"]
        summary = ", ".join(f"{r} {v['replaced']}" for r, v in by_rule.items()) or "nothing found"
        out.print(f"sanitized: {fx.manifest['replaced']} replacement(s) ({summary})", markup=False)


def import_(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A fixture file written by export.")],
) -> None:
    """Load a fixture's runs into the store (runs already there identically are skipped)."""
    from replayable.store import open_store
    from replayable.testing.fixture import import_fixture

    store = open_store(state(ctx).store_url)
    try:
        fx = import_fixture(file, store)
    finally:
        store.close()
    stdout().print(
        f"imported {len(fx.starts)} run(s), {len(fx.events)} events from {file}; root {fx.root}",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.command("export")(export)
    app.command("import")(import_)
