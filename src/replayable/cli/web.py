"""``replayable serve`` and ``replayable users``: the web audit interface and its accounts.

::

    replayable serve                           # 127.0.0.1:8600, embedded store, one local user
    replayable users add dana --role analyst           # asks for a password
    replayable users token olu                         # an API token, shown once
    replayable serve --host 0.0.0.0 --store postgresql://… \\
        --db-login 'postgresql://web_{tenant}_{role}@db/agents?schema=replayable'
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from replayable.cli._context import state, stdout
from replayable.errors import ConfigurationError

__all__ = ["register", "serve", "users_app"]

UsersPath = Annotated[
    Path | None,
    typer.Option(
        "--users",
        envvar="REPLAYABLE_USERS",
        help="The accounts file (default ./.replayable/users.json).",
    ),
]

users_app = typer.Typer(
    name="users",
    help="Accounts of the web interface: add, remove, set-role, password, token, list.",
    no_args_is_help=True,
)


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8600,
    users: UsersPath = None,
    db_login: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL: the store URL each user connects with, naming {role} and "
            "{tenant}, e.g. postgresql://web_{tenant}_{role}@db/agents?schema=replayable.",
        ),
    ] = None,
    one_login: Annotated[
        bool,
        typer.Option(
            "--one-login", help="PostgreSQL: every user through the --store login (app-only roles)."
        ),
    ] = False,
    proxy_header: Annotated[
        str | None,
        typer.Option(help="Take the user's name from this header (an SSO proxy sets it)."),
    ] = None,
    proxy_role_header: Annotated[
        str | None,
        typer.Option(help="The header with the role of a user who has no local account."),
    ] = None,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy", help="Address or network the proxy header is believed from."
        ),
    ] = None,
    insecure_cookies: Annotated[
        bool,
        typer.Option(
            "--insecure-cookies", help="Do not mark cookies Secure (plain HTTP off loopback)."
        ),
    ] = False,
) -> None:
    """Serve the web audit interface: runs, timelines, diffs, annotations, anomaly queue,
    reports and replay jobs, with every page also as JSON under /api/."""
    import uvicorn

    from replayable.web import UserDB, WebConfig, create_app

    store_url = state(ctx).store_url
    config = WebConfig(
        store_url=store_url,
        users=UserDB(users),
        host=host,
        port=port,
        db_login=db_login,
        one_login=one_login,
        proxy_header=proxy_header,
        proxy_role_header=proxy_role_header,
        trusted_proxies=tuple(trusted_proxy or ()),
        secure_cookies=not insecure_cookies,
    )
    app = create_app(config)
    # The store must be there before anyone is told the server is up.
    store = app.state.web.pool.default()
    mode = "accounts" if config.users.configured() else "no accounts: one local user as admin"
    if config.proxy_header:
        mode = f"trusted proxy header {config.proxy_header}"
    stdout().print(f"replayable serve: {store.url} on http://{host}:{port}/ ({mode})", markup=False)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        proxy_headers=bool(trusted_proxy),
        forwarded_allow_ips=",".join(trusted_proxy or ()) or None,
    )


def _password(given: str | None, stdin: bool) -> str | None:
    if stdin:
        return sys.stdin.readline().rstrip("\n")
    if given is not None:
        return given
    if not sys.stdin.isatty():
        return None
    first = typer.prompt("password", hide_input=True)
    if typer.prompt("again", hide_input=True) != first:
        raise ConfigurationError("the two passwords differ")
    return str(first)


@users_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Login name.")],
    role: Annotated[str, typer.Option(help="engineer, analyst, auditor or admin.")],
    tenant: Annotated[str | None, typer.Option(help="The one tenant this user sees.")] = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the password from stdin.")
    ] = False,
    users: UsersPath = None,
) -> None:
    """Add an account (asks for a password on a terminal; none: token or proxy only)."""
    from replayable.web import UserDB

    db = UserDB(users)
    account = db.add(
        name,
        role,
        password=_password(os.environ.get("REPLAYABLE_PASSWORD"), password_stdin),
        tenant=tenant,
    )
    stdout().print(f"added {account.name} ({account.role}) to {db.path}", markup=False)


@users_app.command("remove")
def remove(name: Annotated[str, typer.Argument()], users: UsersPath = None) -> None:
    """Remove an account; its sessions and tokens stop working at once."""
    from replayable.web import UserDB

    db = UserDB(users)
    db.remove(name)
    stdout().print(f"removed {name} from {db.path}", markup=False)


@users_app.command("set-role")
def set_role(
    name: Annotated[str, typer.Argument()],
    role: Annotated[str, typer.Argument(help="engineer, analyst, auditor or admin.")],
    tenant: Annotated[str | None, typer.Option(help="Change the tenant too ('' for none).")] = None,
    users: UsersPath = None,
) -> None:
    """Change an account's role (and tenant)."""
    from replayable.web import UserDB

    account = UserDB(users).set_role(name, role, tenant=tenant)
    stdout().print(f"{account.name} is now {account.role}", markup=False)


@users_app.command("password")
def password(
    name: Annotated[str, typer.Argument()],
    password_stdin: Annotated[bool, typer.Option("--password-stdin")] = False,
    users: UsersPath = None,
) -> None:
    """Set an account's password."""
    from replayable.web import UserDB

    given = _password(os.environ.get("REPLAYABLE_PASSWORD"), password_stdin)
    if given is None:
        raise ConfigurationError(
            "no password given (a terminal, --password-stdin or $REPLAYABLE_PASSWORD)"
        )
    UserDB(users).set_password(name, given)
    stdout().print(f"password of {name} set", markup=False)


@users_app.command("token")
def token(name: Annotated[str, typer.Argument()], users: UsersPath = None) -> None:
    """Make an API token for ``name`` and print it (once: only its hash is kept)."""
    from replayable.web import UserDB

    _, secret = UserDB(users).new_token(name)
    typer.echo(secret)


@users_app.command("list")
def list_users(users: UsersPath = None) -> None:
    """List accounts: name, role, tenant, whether a password is set, tokens."""
    from replayable.web import UserDB

    for a in UserDB(users).accounts():
        typer.echo(
            f"{a.name}\t{a.role}\t{a.tenant or ''}\t"
            f"{'password' if a.password else '-'}\t{len(a.tokens)} token(s)"
        )


def register(app: typer.Typer) -> None:
    """Add ``serve`` and the ``users`` group to ``app``."""
    app.command("serve")(serve)
    app.add_typer(users_app, name="users")
