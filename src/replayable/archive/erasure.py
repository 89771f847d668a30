"""Erasure by crypto-shredding: destroy the data keys, keep the chains and the metadata."""

from __future__ import annotations

import time
from dataclasses import dataclass

from replayable.audit.access import log_reads
from replayable.audit.actor import Actor
from replayable.errors import AccessDeniedError, ConfigurationError
from replayable.store.base import EventStore

__all__ = ["Erasure", "erase"]


@dataclass(frozen=True)
class Erasure:
    """What an erasure destroyed."""

    tenant: str
    subject: str | None
    key_ids: list[str]
    at: float
    by: str


def erase(
    store: EventStore,
    *,
    tenant: str | None = None,
    subject: str | None = None,
    actor: Actor | None = None,
    purpose: str | None = None,
) -> Erasure:
    """Destroy the data keys of ``tenant`` (every subject in it) or of one ``subject``
    (within ``tenant``, default: runs without a tenant), record the erasure, and log it
    in the audit trail. From then on those payloads read as "erased on DATE by WHO";
    runs, events' metadata and hash chains stay, and verify.

    On PostgreSQL only the maintenance role may (the database refuses anyone else).
    """
    if tenant is None and subject is None:
        raise ConfigurationError("erase needs --tenant or --subject (or both)")
    if subject is not None and not subject:
        raise ConfigurationError("--subject must not be empty")
    who = actor or Actor.current(store)
    if who.role != "admin":
        raise AccessDeniedError(
            f"{who.user} (role {who.role}) may not erase payloads; that needs the role admin "
            "(and, on PostgreSQL, the maintenance login)"
        )
    at = time.time()
    key_tenant = tenant or ""
    ids = store.erase_keys(key_tenant, subject, who.login, at)
    keys = store.__dict__.get("data_keys")
    if keys is not None:
        keys.forget()
    store.tier.forget_texts()
    cold = store.__dict__.get("cold")
    if cold is not None:
        # Archived runs read before are cached whole, payloads decrypted: not any more.
        cold.forget()
    what = "subject " + subject if subject is not None else "tenant"
    log_reads(
        store,
        who,
        channel="cli",
        what=("erasure",),
        reads=[(None, tenant, ())],
        purpose=purpose or f"erase {what} of tenant {key_tenant or '(none)'}: {len(ids)} key(s)",
        now=at,
    )
    return Erasure(key_tenant, subject, ids, at, who.login)
