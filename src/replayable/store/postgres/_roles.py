"""The database roles of a PostgreSQL store, and what each may do.

====================  ============================================================
``<prefix>_writer``   INSERT and SELECT on the log (what a recording agent needs)
``<prefix>_auditor``  SELECT on the log
``<prefix>_analyst``  SELECT on the log, and INSERT annotations (``_audit``)
``<prefix>_maintenance``  SELECT, and EXECUTE on the maintenance procedures
``<prefix>_admin``    changes tenant memberships (``replayable db grant-tenant``)
``<prefix>_steward``  NOLOGIN, no members: owns the maintenance procedures, the
                      one identity the append-only triggers let change a row
====================  ============================================================

No login role receives UPDATE, DELETE or TRUNCATE, nor CREATE on the schema.
Every read and write is further limited to the tenants the login was granted
(see ``_tenancy``): a role alone sees nothing. Roles are cluster-wide in
PostgreSQL, hence the prefix. They are created NOLOGIN (grant them to your
login users) unless ``login=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from replayable.errors import ConfigurationError
from replayable.store.postgres._audit import grant_audit
from replayable.store.postgres._schema import (
    APPEND_ONLY_TABLES,
    ARCHIVE_TABLES,
    DROP_TABLES,
    LOG_TABLES,
    PURGE_TABLES,
    TIER_TABLES,
    valid_identifier,
)

__all__ = ["Roles", "init_roles"]

#: The procedures only the maintenance role may call, owned by the steward.
MAINTENANCE_PROCEDURES = (
    "erase_data_keys(TEXT, TEXT, DOUBLE PRECISION)",
    "drop_archived_payloads(UUID[])",
    "record_archive_purge(TEXT, DOUBLE PRECISION, UUID[], INTEGER[], TEXT[], TEXT[])",
    "drop_archived_blobs()",
)


@dataclass(frozen=True, slots=True)
class Roles:
    """The names of the roles made by :func:`init_roles`."""

    writer: str
    auditor: str
    maintenance: str
    analyst: str
    admin: str
    steward: str

    @property
    def logins(self) -> tuple[str, ...]:
        """The roles meant to be granted to people and agents (all but the steward)."""
        return (self.writer, self.auditor, self.maintenance, self.analyst, self.admin)

    @classmethod
    def named(cls, prefix: str) -> Roles:
        """The role names for ``prefix`` (checked to be a plain identifier)."""
        if not valid_identifier(prefix) or len(prefix) > 50:
            raise ConfigurationError(
                f"role prefix {prefix!r} must be a lower-case identifier (letters, digits, _) "
                "of at most 50 characters"
            )
        return cls(
            writer=f"{prefix}_writer",
            auditor=f"{prefix}_auditor",
            maintenance=f"{prefix}_maintenance",
            analyst=f"{prefix}_analyst",
            admin=f"{prefix}_admin",
            steward=f"{prefix}_steward",
        )


def _ensure_role(conn: psycopg.Connection[tuple[object, ...]], name: str, login: bool) -> None:
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
    verb = sql.SQL("ALTER" if exists else "CREATE")
    option = sql.SQL("LOGIN" if login else "NOLOGIN")
    conn.execute(sql.SQL("{} ROLE {} {}").format(verb, sql.Identifier(name), option))


def init_roles(
    conn: psycopg.Connection[tuple[object, ...]],
    schema: str,
    *,
    prefix: str = "replayable",
    login: bool = False,
) -> Roles:
    """Create (if missing) the roles of :class:`Roles` and grant them on ``schema``.

    Run it as the schema's owner with CREATEROLE, or as a superuser, after
    ``replayable db upgrade`` (and again after each upgrade). Idempotent:
    running it again re-applies the same grants.
    """
    roles = Roles.named(prefix)
    s = sql.Identifier(schema)
    ident = {name: sql.Identifier(name) for name in (*roles.logins, roles.steward)}
    w, a, m, an, ad, st = (
        ident[r]
        for r in (
            roles.writer,
            roles.auditor,
            roles.maintenance,
            roles.analyst,
            roles.admin,
            roles.steward,
        )
    )
    readers = sql.SQL(", ").join([w, a, m, an, ad])
    everyone = sql.SQL(", ").join([w, a, m, an, ad, st])

    def tables(names: tuple[str, ...]) -> sql.Composable:
        return sql.SQL(", ").join(sql.SQL("{}.{}").format(s, sql.Identifier(t)) for t in names)

    everything = tables(
        (
            *APPEND_ONLY_TABLES,
            *TIER_TABLES,
            *ARCHIVE_TABLES,
            *PURGE_TABLES,
            *DROP_TABLES,
            "schema_version",
            "store_info",
            "tenant_members",
        )
    )
    members = tables(("tenant_members",))
    with conn.transaction():
        for name in roles.logins:
            _ensure_role(conn, name, login)
        _ensure_role(conn, roles.steward, False)
        statements = [
            sql.SQL("REVOKE ALL ON {} FROM {}").format(everything, everyone),
            sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(s, readers),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, everyone),
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                tables((*LOG_TABLES, *TIER_TABLES, *ARCHIVE_TABLES, *PURGE_TABLES)), everyone
            ),
            # Blob drops are the steward's to record (through drop_archived_blobs) and
            # name tenants: the maintenance role reads them, writers only their generation.
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(tables(DROP_TABLES), st),
            sql.SQL("GRANT SELECT ON {} TO {}").format(tables(DROP_TABLES), m),
            # Purge records are the steward's to write (through record_archive_purge).
            sql.SQL("GRANT INSERT ON {} TO {}").format(tables(PURGE_TABLES), st),
            # The archiver runs as the maintenance login: it plans and indexes parts.
            sql.SQL("GRANT INSERT ON {} TO {}").format(tables(ARCHIVE_TABLES), m),
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                tables(("schema_version", "store_info")), everyone
            ),
            # Erasure records are the steward's to write (through erase_data_keys).
            sql.SQL("GRANT INSERT ON {} TO {}").format(
                tables((*APPEND_ONLY_TABLES, *(t for t in TIER_TABLES if t != "erasures"))), w
            ),
            sql.SQL("GRANT INSERT ON {} TO {}").format(tables(("data_keys",)), m),
            sql.SQL("GRANT INSERT ON {} TO {}").format(tables(("erasures",)), st),
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(members, ad),
            sql.SQL("GRANT UPDATE, DELETE ON {} TO {}").format(
                tables((*LOG_TABLES, *TIER_TABLES)), st
            ),
            # ALTER … OWNER TO needs the new owner to hold CREATE on the schema;
            # nobody can act as the steward but through its own procedures.
            sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(s, st),
        ]
        for procedure in MAINTENANCE_PROCEDURES:
            fn = sql.SQL("{}.{}").format(s, sql.SQL(procedure))
            statements += [
                sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(fn),
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(fn, m),
                sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(fn, st),
            ]
        superuser = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        held = bool(superuser and superuser[0])
        if not held:
            # A CREATEROLE owner must hold the steward for a moment to give it
            # the procedures; the membership is taken back in this transaction.
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(st))
        for statement in statements:
            conn.execute(statement)
        grant_audit(
            conn,
            schema,
            writer=roles.writer,
            auditor=roles.auditor,
            analyst=roles.analyst,
            maintenance=roles.maintenance,
            admin=roles.admin,
        )
        if not held:
            conn.execute(sql.SQL("REVOKE {} FROM CURRENT_USER").format(st))
    return roles
