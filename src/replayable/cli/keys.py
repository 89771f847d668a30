"""``replayable keys``: make a chain key, and show what tamper evidence is configured."""

from __future__ import annotations

from typing import Annotated

import typer

from replayable.cli._context import fail
from replayable.errors import ConfigurationError
from replayable.store.integrity import Integrity
from replayable.store.keys import ENV_KEY, new_key_text

__all__ = ["register"]

keys_app = typer.Typer(help="Chain keys for tamper evidence.", no_args_is_help=True)


@keys_app.command("new")
def new(
    key_id: Annotated[str, typer.Option("--id", help="The key id runs will name.")] = "k1",
) -> None:
    """Print a fresh key as a REPLAYABLE_CHAIN_KEY line (32 random bytes; keep it secret)."""
    try:
        typer.echo(f"{ENV_KEY}={new_key_text(key_id)}")
    except ConfigurationError as exc:
        raise fail(str(exc)) from None


@keys_app.command("status")
def status() -> None:
    """Say which chain key and anchor the environment configures."""
    try:
        typer.echo(Integrity.from_env().describe())
    except ConfigurationError as exc:
        raise fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
