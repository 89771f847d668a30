"""Tenancy bound to the login: the membership table, the policies and the maintenance guard.

Which tenants a connection may read or write is data in ``tenant_members``
(login or group role → tenant, read or read+write), which only the schema
owner and members of the ``<prefix>_admin`` role may change. The row-level
security policies ask :sql:`session_tenants(write)` for the tenants of the
*session user* (the role that logged in) and of every role it is a member
of, so:

- no setting widens it: ``replayable.tenant`` (set by ``?tenant=`` on the
  URL) can only narrow the list to one of the login's tenants; ``SET``,
  ``RESET`` and ``set_config()`` inside a function change nothing else;
- ``SET ROLE`` to a role the login does not hold is refused by PostgreSQL,
  and to a role it holds does not widen (its tenants were counted already);
- views and functions a role creates run with that role's rights; the
  writer, auditor, maintenance and analyst roles cannot create anything in
  the schema.

The function is ``STABLE`` and the policies call it in a sub-select, so it
runs once per statement (an InitPlan), not once per row.

Changing recorded rows is a privilege, not a setting: the append-only
triggers let an UPDATE or DELETE through only when ``current_user`` is the
owner of ``erase_data_keys`` *and* that owner is not the table owner (until
migration 11, of the retired ``purge_payloads``). That
owner is ``<prefix>_steward``, a role nobody logs in as or is a member of,
made by ``init-roles``; a SECURITY DEFINER maintenance procedure owned by it
is the one way to become it. The procedure checks, in the database, that the
session may write the run's tenant. A superuser can still bypass all of it
(``SET ROLE``, ``session_replication_role``), and the table owner can drop a
trigger: those are DDL, left to the keyed hash chain to reveal.
"""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg import sql

from replayable.errors import ConfigurationError
from replayable.store.payloads import check_tenant

__all__ = ["V2_TENANCY", "grant_tenant", "list_members", "revoke_tenant", "tenant_policy"]

_READ = "(SELECT {s}.session_tenants(false))::text[]"
_WRITE = "(SELECT {s}.session_tenants(true))::text[]"


def tenant_policy(table: str, column: str) -> list[str]:
    """Statements that put ``table`` under the tenant policy, ``column`` naming its tenant.

    For tables a later migration adds (annotations, access logs): a role then
    reads the rows of the tenants it may read and inserts into those it may write.
    """
    return [
        f"DROP POLICY IF EXISTS tenant_isolation ON {{s}}.{table}",
        f"ALTER TABLE {{s}}.{table} ENABLE ROW LEVEL SECURITY",
        f"CREATE POLICY tenant_isolation ON {{s}}.{table} "
        f"USING ({column} = ANY ({_READ})) WITH CHECK ({column} = ANY ({_WRITE}))",
    ]


#: Migration 2: tenancy by login, tenant-scoped batches, maintenance by role.
V2_TENANCY: Final[list[str]] = [
    "REVOKE ALL ON SCHEMA {s} FROM PUBLIC",
    """
    CREATE TABLE {s}.tenant_members (
        member     TEXT NOT NULL,
        tenant     TEXT NOT NULL,
        can_write  BOOLEAN NOT NULL,
        granted_by TEXT NOT NULL DEFAULT session_user,
        granted_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (member, tenant)
    )
    """,
    "REVOKE ALL ON {s}.tenant_members FROM PUBLIC",
    # SECURITY DEFINER so that the policies can read the membership table the
    # querying role may not read; session_user, not current_user, so that a
    # SET ROLE (or a SECURITY DEFINER caller) never changes the answer.
    """
    CREATE FUNCTION {s}.session_tenants(p_write BOOLEAN) RETURNS TEXT[]
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        SELECT COALESCE(array_agg(DISTINCT m.tenant), '{{}}')
          FROM {s}.tenant_members m
          JOIN pg_catalog.pg_roles r ON r.rolname = m.member
         WHERE (m.can_write OR NOT p_write)
           AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
           AND m.tenant = COALESCE(
                   NULLIF(pg_catalog.current_setting('replayable.tenant', true), ''), m.tenant)
    $$
    """,
    *tenant_policy("runs", "COALESCE(tenant, '')"),
    *tenant_policy("run_ends", "COALESCE(tenant, '')"),
    *tenant_policy("agent_execution_events", "COALESCE(tenant, '')"),
    *tenant_policy("blobs", "tenant"),
    # A batch's digest is kept per tenant: a writer of one tenant can no longer
    # see another tenant's digests, nor plant one to have its batch skipped.
    "ALTER TABLE {s}.batches ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE {s}.batches DROP CONSTRAINT batches_pkey",
    "ALTER TABLE {s}.batches ADD PRIMARY KEY (tenant, digest)",
    *tenant_policy("batches", "tenant"),
    """
    CREATE OR REPLACE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
        IF TG_OP <> 'TRUNCATE' AND EXISTS (
            SELECT 1 FROM pg_proc p JOIN pg_class c ON c.oid = TG_RELID
             WHERE p.oid = to_regprocedure('{s}.purge_payloads(uuid)')
               AND p.proowner <> c.relowner
               AND p.proowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
        ) THEN
            IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'replayable: % on %.% refused: the log is append-only',
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = 'RPL01';
    END $$
    """,
    """
    CREATE OR REPLACE FUNCTION {s}.purge_payloads(p_run_id UUID) RETURNS INTEGER
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE
        n INTEGER;
        run_tenant TEXT;
    BEGIN
        -- Read under the policies (the steward is not the table owner): a run of
        -- a tenant the session cannot read is not found at all.
        SELECT COALESCE(r.tenant, '') INTO run_tenant FROM {s}.runs r WHERE r.run_id = p_run_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'replayable: no run % among the tenants % may read',
                p_run_id, session_user USING ERRCODE = 'RPL02';
        END IF;
        IF NOT run_tenant = ANY ({s}.session_tenants(true)) THEN
            RAISE EXCEPTION 'replayable: % may not change runs of tenant %',
                session_user, quote_literal(run_tenant) USING ERRCODE = '42501';
        END IF;
        UPDATE {s}.agent_execution_events
           SET request_text = '{{"$purged":true}}',
               response_text = CASE WHEN response_text IS NULL THEN NULL
                                    ELSE '{{"$purged":true}}' END
         WHERE run_id = p_run_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN n;
    END $$
    """,
    "REVOKE ALL ON FUNCTION {s}.purge_payloads(UUID) FROM PUBLIC",
]


def _members(schema: str) -> sql.Composable:
    return sql.SQL("{}.tenant_members").format(sql.Identifier(schema))


def _check_role(conn: psycopg.Connection[tuple[object, ...]], role: str) -> None:
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
        raise ConfigurationError(f"no database role {role!r}; create it first (CREATE ROLE …)")


def grant_tenant(
    conn: psycopg.Connection[tuple[object, ...]],
    schema: str,
    role: str,
    tenant: str,
    *,
    write: bool,
) -> None:
    """Let ``role`` (and every login holding it) read ``tenant``, and write it if ``write``.

    Granting again replaces the right (``write=False`` takes writing back).
    psycopg errors (a refusal for a non-admin) are left to the caller to translate.
    """
    check_tenant(tenant, "grant-tenant")
    _check_role(conn, role)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (member, tenant, can_write) VALUES (%s, %s, %s) "
            "ON CONFLICT (member, tenant) DO UPDATE SET can_write = EXCLUDED.can_write, "
            "granted_by = session_user, granted_at = now()"
        ).format(_members(schema)),
        (role, tenant, write),
    )


def revoke_tenant(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, role: str, tenant: str
) -> bool:
    """Take ``tenant`` away from ``role``; whether it had been granted."""
    cur = conn.execute(
        sql.SQL("DELETE FROM {} WHERE member = %s AND tenant = %s").format(_members(schema)),
        (role, tenant),
    )
    return cur.rowcount > 0


def list_members(
    conn: psycopg.Connection[tuple[object, ...]], schema: str
) -> list[tuple[str, str, bool]]:
    """Every ``(role, tenant, may_write)`` membership, sorted."""
    rows = conn.execute(
        sql.SQL("SELECT member, tenant, can_write FROM {} ORDER BY member, tenant").format(
            _members(schema)
        )
    ).fetchall()
    return [(str(m), str(t), bool(w)) for m, t, w in rows]
