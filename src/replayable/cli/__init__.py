"""The ``replayable`` command line: list, show, replay, step through, diff and verify runs.

Every command takes the store from ``--store URL`` (before or after the
command's name; or ``$REPLAYABLE_STORE``, else ``sqlite:///./.replayable/runs.db``),
refuses a store that does not exist, and accepts run-id prefixes. A user
mistake prints one ``error: …`` line on stderr and exits 2; a replay that
diverges or a broken hash chain exits 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from replayable.cli import anomalies as _anomalies
from replayable.cli import archive as _archive
from replayable.cli import audit as _audit
from replayable.cli import check as _check
from replayable.cli import compactor as _compactor
from replayable.cli import db as _db
from replayable.cli import erase as _erase
from replayable.cli import fixtures as _fixtures
from replayable.cli import keys as _keys
from replayable.cli import query as _query
from replayable.cli import status as _status
from replayable.cli import web as _web
from replayable.cli._context import STORE_HELP, CliState, ReplayableGroup
from replayable.cli._diffview import diff
from replayable.cli._inspect import runs, show, verify
from replayable.cli._modes import replay, step
from replayable.cli._replay import demo
from replayable.cli._tools import tools

__all__ = ["app", "main"]

app = typer.Typer(
    name="replayable",
    cls=ReplayableGroup,
    help="Record AI agent runs into a tamper-evident log and replay them exactly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            envvar="REPLAYABLE_STORE",
            metavar="URL",
            help=STORE_HELP,
        ),
    ] = None,
) -> None:
    """Record AI agent runs into a tamper-evident log and replay them exactly."""
    cli_state = CliState(store)
    ctx.obj = cli_state
    ctx.call_on_close(cli_state.close)


app.command("demo")(demo)
app.command("runs")(runs)
app.command("show")(show)
app.command("replay")(replay)
app.command("step")(step)
app.command("diff")(diff)
app.command("tools")(tools)
app.command("verify")(verify)
_db.register(app)
_erase.register(app)
_archive.register(app)
_audit.register(app)
_keys.register(app)
_anomalies.register(app)
_query.register(app)
_status.register(app)
_compactor.register(app)
_fixtures.register(app)
_check.register(app)
_web.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
