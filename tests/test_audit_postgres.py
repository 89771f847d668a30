"""The audit tables on a real PostgreSQL: the shared contract, then each role connecting."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from replayable.audit import Actor, AuditReader, verify_annotations
from replayable.audit.annotations import annotate_run
from replayable.errors import AccessDeniedError
from replayable.store import EventStore, open_store
from replayable.store.postgres import PostgresStore, Roles, grant_tenant, init_roles
from tests.pg_helpers import PgServer, pg
from tests.test_audit_store import ANALYST, AuditContract, recorded, sample_flag

__all__ = ["pg"]

pytestmark = pytest.mark.slow

AUDIT_TABLES = ("annotations", "access_log", "anomaly_flags", "anomaly_scanned")


class TestPostgresAudit(AuditContract):
    """The audit contract against PostgreSQL, one fresh schema per store."""

    @pytest.fixture(autouse=True)
    def _server(self, pg: PgServer) -> None:
        self.pg = pg

    def create_store(self) -> EventStore:
        return open_store(self.pg.url(self.pg.new_schema("audit")))


@pytest.fixture
def owner(pg: PgServer) -> Iterator[PostgresStore]:
    store = PostgresStore(pg.url(pg.new_schema("aroles")))
    yield store
    store.close()


@pytest.fixture
def roles(pg: PgServer, owner: PostgresStore) -> Roles:
    """Login roles on the schema; each reads the runs recorded without a tenant (and
    tenants A and B), the writer writes them."""
    prefix = f"ra_{secrets.token_hex(4)}"
    pg.role_prefixes.append(prefix)
    schema = owner.target.schema
    with pg.connect() as conn:
        made = init_roles(conn, schema, prefix=prefix, login=True)
        for tenant in ("", "A"):
            grant_tenant(conn, schema, made.writer, tenant, write=True)
            grant_tenant(conn, schema, made.analyst, tenant, write=False)
        for tenant in ("", "A", "B"):
            grant_tenant(conn, schema, made.auditor, tenant, write=False)
    return made


def _as(pg: PgServer, owner: PostgresStore, login: str) -> PostgresStore:
    return PostgresStore(pg.url(owner.target.schema, user=login))


def test_analyst_login_annotates_and_the_database_records_the_login(
    pg: PgServer, owner: PostgresStore, roles: Roles
) -> None:
    """The analyst login may insert annotations; the row carries the database login."""
    rid = recorded(owner)
    analyst = _as(pg, owner, roles.analyst)
    try:
        actor = Actor.current(analyst, user="dana", role="analyst")
        assert actor.login == roles.analyst
        made = annotate_run(analyst, actor, rid, step=2, verdict="violation", note="empty lookup")
        assert owner.annotations(rid) == [made]
        assert verify_annotations(analyst, rid).ok
    finally:
        analyst.close()
    with pg.connect() as conn:
        row = conn.execute(
            sql.SQL("SELECT db_login FROM {}.annotations").format(
                sql.Identifier(owner.target.schema)
            )
        ).fetchone()
    assert row == (roles.analyst,)


def test_auditor_login_reads_but_the_database_refuses_its_annotation(
    pg: PgServer, owner: PostgresStore, roles: Roles
) -> None:
    """Even claiming the analyst role in the application, the auditor login cannot insert
    an annotation: the database refuses it. It reads annotations and the access log."""
    rid = recorded(owner)
    made = annotate_run(owner, ANALYST, rid, verdict="concern", note="n")
    auditor = _as(pg, owner, roles.auditor)
    try:
        pretender = Actor(user="olu", role="analyst", login=auditor.login_name())
        with pytest.raises(AccessDeniedError, match="refused"):
            annotate_run(auditor, pretender, rid, verdict="ok", note="cover it up")
        reader = AuditReader(auditor, Actor("olu", "auditor", roles.auditor), channel="report")
        assert list(reader.annotations(rid)) == [made]
        log = reader.access_log(run=rid)
        assert [e.what for e in log] == [("annotations",), ("access_log",)]
    finally:
        auditor.close()
    assert owner.annotations(rid) == [made]


def test_writer_login_cannot_touch_annotations(
    pg: PgServer, owner: PostgresStore, roles: Roles
) -> None:
    """The writer login can neither read nor write annotations or flags, nor read the
    access log; its own reads are still logged."""
    rid = recorded(owner)
    annotate_run(owner, ANALYST, rid, verdict="ok", note="n")
    writer = _as(pg, owner, roles.writer)
    try:
        with pytest.raises(AccessDeniedError):
            writer.annotations(rid)
        with pytest.raises(AccessDeniedError):
            annotate_run(writer, ANALYST, rid, verdict="ok", note="mine")
        with pytest.raises(AccessDeniedError):
            writer.access_entries()
        with pytest.raises(AccessDeniedError):
            writer.append_flags([], [rid])
        AuditReader(writer, Actor("agent", "engineer", roles.writer)).events(rid)
    finally:
        writer.close()
    assert [e.user for e in owner.access_entries()] == ["agent"]


@pytest.mark.parametrize("table", AUDIT_TABLES)
def test_owner_cannot_change_audit_rows(pg: PgServer, owner: PostgresStore, table: str) -> None:
    """The append-only trigger refuses UPDATE, DELETE and TRUNCATE on every audit table."""
    rid = recorded(owner)
    annotate_run(owner, ANALYST, rid, verdict="ok", note="n")
    AuditReader(owner, ANALYST).events(rid)
    owner.append_flags([sample_flag(rid)], [rid])
    with pg.connect() as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(owner.target.schema)))
        for statement in (f"UPDATE {table} SET run_id = run_id", f"DELETE FROM {table}"):
            with pytest.raises(psycopg.Error, match="append-only"):
                conn.execute(statement)  # type: ignore[arg-type]
        with pytest.raises(psycopg.Error, match="append-only"):
            conn.execute(f"TRUNCATE {table}")  # type: ignore[arg-type]


def test_audit_rows_are_per_tenant(pg: PgServer, owner: PostgresStore, roles: Roles) -> None:
    """An auditor of tenant B sees none of tenant A's annotations or access-log entries."""
    schema = owner.target.schema
    writer = PostgresStore(pg.url(schema, user=roles.writer, tenant="A"))
    analyst = PostgresStore(pg.url(schema, user=roles.analyst, tenant="A"))
    auditor_a = PostgresStore(pg.url(schema, user=roles.auditor, tenant="A"))
    auditor_b = PostgresStore(pg.url(schema, user=roles.auditor, tenant="B"))
    try:
        rid = recorded(writer)
        annotate_run(analyst, ANALYST, rid, verdict="ok", note="n")
        AuditReader(analyst, ANALYST).events(rid)
        assert len(auditor_a.annotations(rid)) == 1
        assert auditor_b.annotations(rid) == []
        assert auditor_b.access_entries() == []
        assert len(auditor_a.access_entries()) == 1
    finally:
        for store in (writer, analyst, auditor_a, auditor_b):
            store.close()
