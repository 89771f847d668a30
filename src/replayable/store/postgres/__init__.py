"""The PostgreSQL production store: ``open_store("postgresql://user@host/db?tenant=…")``.

Schema and migrations live in ``_schema``, roles in ``_roles``, tenancy (the
membership table, policies and maintenance guard) in ``_tenancy``, the store in
``_store`` and impact queries in ``_search``.
"""

from __future__ import annotations

from replayable.store.postgres._connect import PgTarget, connect, parse_url
from replayable.store.postgres._roles import Roles, init_roles
from replayable.store.postgres._schema import LATEST_VERSION, current_version, upgrade
from replayable.store.postgres._store import PostgresStore
from replayable.store.postgres._tenancy import grant_tenant, list_members, revoke_tenant

__all__ = [
    "LATEST_VERSION",
    "PgTarget",
    "PostgresStore",
    "Roles",
    "connect",
    "current_version",
    "grant_tenant",
    "init_roles",
    "list_members",
    "parse_url",
    "revoke_tenant",
    "upgrade",
]
