"""``replayable db``: set up a PostgreSQL store (schema migrations, roles)."""

from __future__ import annotations

from typing import Annotated

import typer

from replayable.cli._context import state, stdout
from replayable.errors import ConfigurationError
from replayable.store import DEFAULT_STORE_URL, open_store

__all__ = ["db_app", "register"]

db_app = typer.Typer(
    name="db",
    help="Set up a PostgreSQL store: schema migrations and database roles.",
    no_args_is_help=True,
)


def _postgres_url(ctx: typer.Context, command: str) -> str:
    import os

    url = state(ctx).store_url or os.environ.get("REPLAYABLE_STORE") or DEFAULT_STORE_URL
    if not url.startswith(("postgresql://", "postgresql+psycopg://")):
        raise ConfigurationError(
            f"`db {command}` needs a PostgreSQL store; pass --store "
            "postgresql://user@host:5432/dbname (the store is " + repr(url.split("?")[0]) + ")"
        )
    return url


@db_app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Create or upgrade the store's schema. Safe to run twice; never downgrades."""
    from replayable.store.postgres import LATEST_VERSION, connect, parse_url
    from replayable.store.postgres import upgrade as run_upgrade

    target = parse_url(_postgres_url(ctx, "upgrade"))
    conn = connect(target)
    try:
        import psycopg

        from replayable.store.postgres._connect import raise_store_error

        try:
            applied = run_upgrade(conn, target.schema, target.display)
        except psycopg.Error as exc:
            raise_store_error(exc, target, "upgrading the schema")
    finally:
        conn.close()
    out = stdout()
    if applied:
        out.print(
            f"schema {target.schema!r}: applied migration(s) "
            f"{', '.join(map(str, applied))}; now at version {LATEST_VERSION}"
        )
    else:
        out.print(f"schema {target.schema!r}: already at version {LATEST_VERSION}")


@db_app.command("init-roles")
def init_roles(
    ctx: typer.Context,
    prefix: Annotated[
        str, typer.Option(help="Role names are PREFIX_writer, PREFIX_auditor, PREFIX_maintenance.")
    ] = "replayable",
    login: Annotated[
        bool, typer.Option("--login/--no-login", help="Create the roles able to log in.")
    ] = False,
) -> None:
    """Create the writer, auditor and maintenance roles and grant them on the store's schema."""
    import psycopg

    from replayable.store.postgres import connect, parse_url
    from replayable.store.postgres import init_roles as make_roles
    from replayable.store.postgres._connect import raise_store_error

    url = _postgres_url(ctx, "init-roles")
    open_store(url).close()  # the schema must exist (and be current) before granting on it
    target = parse_url(url)
    conn = connect(target)
    try:
        roles = make_roles(conn, target.schema, prefix=prefix, login=login)
    except psycopg.Error as exc:
        raise_store_error(exc, target, "creating roles")
    finally:
        conn.close()
    out = stdout()
    out.print(f"{roles.writer}: INSERT and SELECT (recording agents)")
    out.print(f"{roles.auditor}: SELECT only (audit reads)")
    out.print(f"{roles.maintenance}: SELECT and the maintenance procedures (archive, purge)")


def register(app: typer.Typer) -> None:
    """Add the ``db`` command group to ``app``."""
    app.add_typer(db_app, name="db")
