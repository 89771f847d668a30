"""``replayable erase``: crypto-shred a tenant's or a data subject's payloads."""

from __future__ import annotations

from typing import Annotated

import typer

from replayable.cli._context import state, stdout
from replayable.errors import ConfigurationError

__all__ = ["register"]


def erase(
    ctx: typer.Context,
    tenant: Annotated[
        str | None, typer.Option(help="Erase this tenant's payloads (every subject in it).")
    ] = None,
    subject: Annotated[
        str | None,
        typer.Option(help="Erase this data subject's payloads (within --tenant, if given)."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be undone.")] = False,
    purpose: Annotated[
        str | None, typer.Option(help="Why (a ticket, a request id): kept in the audit trail.")
    ] = None,
) -> None:
    """Destroy the data keys of a tenant or a data subject (crypto-shredding).

    The payloads become unreadable for good ("erased on DATE by WHO" wherever
    they are shown); runs, events' metadata and hash chains stay and verify.
    Maintenance only: on PostgreSQL the database lets only the maintenance
    login do it. The erasure is recorded and written to the audit trail.
    """
    from replayable.archive.erasure import erase as run_erase

    if tenant is None and subject is None:
        raise ConfigurationError("name what to erase: --tenant T, --subject S, or both")
    if not yes:
        what = f"subject {subject!r}" if subject is not None else f"tenant {tenant!r}"
        raise ConfigurationError(
            f"erasing {what} destroys its data keys and cannot be undone; add --yes"
        )
    store = state(ctx).store()
    done = run_erase(store, tenant=tenant, subject=subject, purpose=purpose)
    what = f"subject {done.subject!r} of " if done.subject is not None else ""
    stdout().print(
        f"erased {what}tenant {done.tenant or '(none)'!r}: {len(done.key_ids)} data key(s) "
        f"destroyed by {done.by}"
    )


def register(app: typer.Typer) -> None:
    app.command("erase")(erase)
