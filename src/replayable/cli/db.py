"""``replayable db``: set up a PostgreSQL store (schema migrations, roles, tenants)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from replayable.cli._context import state, stdout, visible
from replayable.errors import ConfigurationError, StoreError
from replayable.store import DEFAULT_STORE_URL, open_store, postgres_store_class

__all__ = ["db_app", "register"]

db_app = typer.Typer(
    name="db",
    help="Set up a PostgreSQL store: schema migrations, database roles and tenants.",
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
    postgres_store_class()  # names the extra to install when psycopg is missing
    return url


@db_app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Create or upgrade the store's schema. Safe to run twice; never downgrades."""
    url = _postgres_url(ctx, "upgrade")
    from replayable.store.postgres import LATEST_VERSION, connect, parse_url
    from replayable.store.postgres import upgrade as run_upgrade

    target = parse_url(url)
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
        str,
        typer.Option(
            help="Role names are PREFIX_writer, PREFIX_auditor, PREFIX_maintenance, "
            "PREFIX_analyst, PREFIX_admin and PREFIX_steward."
        ),
    ] = "replayable",
    login: Annotated[
        bool, typer.Option("--login/--no-login", help="Create the roles able to log in.")
    ] = False,
) -> None:
    """Create the store's roles and grant them on its schema (run as the owner)."""
    from replayable.store.postgres import init_roles as make_roles

    url = _postgres_url(ctx, "init-roles")
    open_store(url).close()  # the schema must exist (and be current) before granting on it
    with _admin_connection(url, "creating roles") as (conn, target):
        roles = make_roles(conn, target.schema, prefix=prefix, login=login)
    out = stdout()
    out.print(f"{roles.writer}: INSERT and SELECT in its tenants (recording agents)")
    out.print(f"{roles.auditor}: SELECT in its tenants (audit reads)")
    out.print(f"{roles.analyst}: SELECT in its tenants (annotations, when the audit tables exist)")
    out.print(f"{roles.maintenance}: SELECT and the maintenance procedures (purge) in its tenants")
    out.print(f"{roles.admin}: grants and revokes tenants (`replayable db grant-tenant`)")
    out.print(f"{roles.steward}: no login; owns the maintenance procedures")
    out.print("no role sees any tenant until granted: replayable db grant-tenant ROLE TENANT")


@contextlib.contextmanager
def _admin_connection(url: str, action: str) -> Iterator[tuple[Any, Any]]:
    import psycopg

    from replayable.store.postgres import connect, parse_url
    from replayable.store.postgres._connect import raise_store_error

    target = parse_url(url)
    conn = connect(target)
    try:
        yield conn, target
    except psycopg.errors.InsufficientPrivilege as exc:
        raise StoreError(
            f"{action} in {target.display} was refused: only the schema owner or a member "
            f"of the admin role (PREFIX_admin) may do that ({str(exc).strip().splitlines()[0]})"
        ) from exc
    except psycopg.Error as exc:
        raise_store_error(exc, target, action)
    finally:
        conn.close()


_TENANT_HELP = "The tenant, as named by ?tenant= in store URLs ('' for runs recorded without one)."


@db_app.command("grant-tenant")
def grant_tenant(
    ctx: typer.Context,
    role: Annotated[str, typer.Argument(help="A login or group role.")],
    tenant: Annotated[str, typer.Argument(help=_TENANT_HELP)],
    write: Annotated[
        bool,
        typer.Option("--write/--read", help="Read and write the tenant, or only read it."),
    ] = False,
) -> None:
    """Let ROLE (and every login holding it) read TENANT, and with --write record into it."""
    from replayable.store.postgres import grant_tenant as grant

    url = _postgres_url(ctx, "grant-tenant")
    with _admin_connection(url, "granting a tenant") as (conn, target):
        grant(conn, target.schema, role, tenant, write=write)
    right = "read and write" if write else "read"
    stdout().print(f"{role} may now {right} tenant {tenant!r}")


@db_app.command("revoke-tenant")
def revoke_tenant(
    ctx: typer.Context,
    role: Annotated[str, typer.Argument(help="A login or group role.")],
    tenant: Annotated[str, typer.Argument(help=_TENANT_HELP)],
) -> None:
    """Take TENANT away from ROLE: its next statement no longer sees it."""
    from replayable.store.postgres import revoke_tenant as revoke

    url = _postgres_url(ctx, "revoke-tenant")
    with _admin_connection(url, "revoking a tenant") as (conn, target):
        had = revoke(conn, target.schema, role, tenant)
    if not had:
        raise ConfigurationError(f"{role} had not been granted tenant {tenant!r}")
    stdout().print(f"{role} may no longer read or write tenant {tenant!r}")


@db_app.command("tenants")
def tenants(ctx: typer.Context) -> None:
    """List who may read or write which tenant (owner and admin role only)."""
    from replayable.store.postgres import list_members

    url = _postgres_url(ctx, "tenants")
    with _admin_connection(url, "listing tenants") as (conn, target):
        rows = list_members(conn, target.schema)
    for member, tenant, can_write in rows:
        typer.echo(visible(f"{member}\t{tenant}\t{'write' if can_write else 'read'}"))
    if not rows:
        typer.echo("no tenant granted yet", err=True)


def register(app: typer.Typer) -> None:
    """Add the ``db`` command group to ``app``."""
    app.add_typer(db_app, name="db")


@db_app.command("train-dictionary")
def train_dictionary(
    ctx: typer.Context,
    tenant: Annotated[
        str | None, typer.Option(help="The tenant to train for (default: each tenant with blobs).")
    ] = None,
    size: Annotated[int, typer.Option(help="Dictionary size in bytes.", min=1024)] = 16_384,
    samples: Annotated[int, typer.Option(help="How many stored blobs to train on.", min=8)] = 2000,
) -> None:
    """Train a zstd dictionary on the stored payload blobs; new writes compress with it.

    Works on every store (SQLite, PostgreSQL). Old blobs keep the dictionary (or
    none) they were written with and stay readable.
    """
    import time

    from replayable.store.payloads import train_dictionary as train

    store = state(ctx).store()
    tenants = [tenant] if tenant is not None else store.tier_tenants()
    if not tenants:
        raise ConfigurationError(f"{store.url} holds no payload blobs to train a dictionary on")
    out = stdout()
    for t in tenants:
        try:
            report = train(store, t, size=size, samples=samples, at=time.time())
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        out.print(
            f"tenant {t or '(none)'!r}: dictionary {report.dict_id} from {report.samples} blobs "
            f"({report.sample_bytes:,} bytes): zstd {report.plain_ratio:.2f}x, "
            f"with dictionary {report.dict_ratio:.2f}x"
        )
