"""Erasure by crypto-shredding: destroy the data keys, keep the chains and the metadata."""

from __future__ import annotations

import time
from dataclasses import dataclass

from replayable.audit.access import log_reads
from replayable.audit.actor import Actor
from replayable.errors import AccessDeniedError, ConfigurationError
from replayable.store.base import EventStore
from replayable.store.payloads import (
    check_tenant,
    epoch_subject,
    erasure_times,
    space,
    split_space,
)

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
    check_tenant(tenant, "erase")
    who = actor or Actor.current(store)
    if who.role != "admin":
        raise AccessDeniedError(
            f"{who.user} (role {who.role}) may not erase payloads; that needs the role admin "
            "(and, on PostgreSQL, the maintenance login)"
        )
    at = time.time()
    key_tenant = tenant or ""
    if subject is None:
        ids: list[str] = store.erase_keys(key_tenant, None, who.login, at)
    else:
        # The subject's key space, and each epoch of it that an earlier erasure began
        # (see :func:`replayable.store.payloads.epoch_space`), at one time.
        base = space(key_tenant, subject)
        stored = split_space(base)[1]  # the subject as key spaces spell it
        epochs = len(erasure_times(store.erasures(key_tenant), base))
        subjects = [epoch_subject(stored, n) for n in range(epochs + 1)]
        ids = store.erase_keys(key_tenant, subjects, who.login, at)
    store.forget_payloads()
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
