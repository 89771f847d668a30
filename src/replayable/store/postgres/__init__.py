"""The PostgreSQL production store: ``open_store("postgresql://user@host/db?tenant=…")``.

Schema and migrations live in ``_schema``, roles in ``_roles``, the store in
``_store`` and impact queries in ``_search``.
"""

from __future__ import annotations

from replayable.store.postgres._connect import PgTarget, connect, parse_url
from replayable.store.postgres._roles import Roles, init_roles
from replayable.store.postgres._schema import LATEST_VERSION, current_version, upgrade
from replayable.store.postgres._store import PostgresStore

__all__ = [
    "LATEST_VERSION",
    "PgTarget",
    "PostgresStore",
    "Roles",
    "connect",
    "current_version",
    "init_roles",
    "parse_url",
    "upgrade",
]
