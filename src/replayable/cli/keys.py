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


@keys_app.command("rotate")
def rotate(ctx: typer.Context) -> None:
    """Wrap every payload data key again under the current key-encryption key.

    Set the new KEK as current (REPLAYABLE_DATA_KEY, or "current" in the
    REPLAYABLE_DATA_KEYRING file) with the old one still in the keyring; payloads
    are not rewritten. Afterwards the old KEK can be retired.
    """
    from replayable.cli._context import state
    from replayable.store.crypto import DataKeys, data_keys_from_env

    try:
        store = state(ctx).store()
        keys = DataKeys(store, data_keys_from_env())
        rewrapped, current = keys.rotate()
    except ConfigurationError as exc:
        raise fail(str(exc)) from None
    typer.echo(
        f"re-wrapped {rewrapped} data key(s) under the current key-encryption key "
        f"({current} were already)"
    )


@keys_app.command("status")
def status() -> None:
    """Say which chain key and anchor the environment configures."""
    try:
        typer.echo(Integrity.from_env().describe())
    except ConfigurationError as exc:
        raise fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
