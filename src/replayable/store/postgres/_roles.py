"""The three database roles of a PostgreSQL store.

``<prefix>_writer`` may INSERT and SELECT (what a recording agent needs),
``<prefix>_auditor`` may only SELECT, and ``<prefix>_maintenance`` may SELECT
and call the maintenance procedures, the one path allowed to change recorded
rows. No role receives UPDATE, DELETE or TRUNCATE. Roles are cluster-wide in
PostgreSQL, hence the prefix. They are created NOLOGIN (grant them to your
login users) unless ``login=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from replayable.errors import ConfigurationError
from replayable.store.postgres._schema import APPEND_ONLY_TABLES, valid_identifier

__all__ = ["Roles", "init_roles"]


@dataclass(frozen=True, slots=True)
class Roles:
    """The names of the three roles made by :func:`init_roles`."""

    writer: str
    auditor: str
    maintenance: str


def init_roles(
    conn: psycopg.Connection[tuple[object, ...]],
    schema: str,
    *,
    prefix: str = "replayable",
    login: bool = False,
) -> Roles:
    """Create (if missing) the writer, auditor and maintenance roles and grant them.

    Idempotent: running it again re-applies the same grants.
    """
    if not valid_identifier(prefix):
        raise ConfigurationError(
            f"role prefix {prefix!r} must be a lower-case identifier (letters, digits, _)"
        )
    roles = Roles(f"{prefix}_writer", f"{prefix}_auditor", f"{prefix}_maintenance")
    s = sql.Identifier(schema)
    w, a, m = (sql.Identifier(r) for r in (roles.writer, roles.auditor, roles.maintenance))
    tables = [sql.SQL("{}.{}").format(s, sql.Identifier(t)) for t in APPEND_ONLY_TABLES]
    all_tables = sql.SQL(", ").join([*tables, sql.SQL("{}.schema_version").format(s)])
    log_tables = sql.SQL(", ").join(tables)
    with conn.transaction():
        for name in (roles.writer, roles.auditor, roles.maintenance):
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            option = sql.SQL("LOGIN" if login else "NOLOGIN")
            verb = sql.SQL("ALTER" if exists else "CREATE")
            conn.execute(sql.SQL("{} ROLE {} {}").format(verb, sql.Identifier(name), option))
        statements = [
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}, {}, {}").format(s, w, a, m),
            sql.SQL("REVOKE ALL ON {} FROM {}, {}, {}").format(all_tables, w, a, m),
            sql.SQL("GRANT SELECT ON {} TO {}, {}, {}").format(all_tables, w, a, m),
            sql.SQL("GRANT INSERT ON {} TO {}").format(log_tables, w),
            sql.SQL("REVOKE ALL ON FUNCTION {}.purge_payloads(UUID) FROM PUBLIC").format(s),
            sql.SQL("GRANT EXECUTE ON FUNCTION {}.purge_payloads(UUID) TO {}").format(s, m),
        ]
        for statement in statements:
            conn.execute(statement)
    return roles
