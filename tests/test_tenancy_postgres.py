"""Tenant isolation on a real PostgreSQL server, tried as an attacker with tenant A's logins.

The schema is owned by a non-superuser login with CREATEROLE (the deployment
the README describes). Tenant A's writer, auditor and maintenance logins try
every way we know to read, count, change or plant tenant B's data; each
attempt must give zero rows or a refusal.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import replayable
from replayable.cli import app
from replayable.errors import RunNotFoundError, StoreError
from replayable.store import RunFilter
from replayable.store.postgres import PostgresStore, Roles, grant_tenant, init_roles
from replayable.store.postgres._schema import LATEST_VERSION, MIGRATIONS
from replayable.store.search import EventQuery
from tests.pg_helpers import PgServer, pg
from tests.test_store_contract import make_end, make_events, make_start, new_id

__all__ = ["pg"]

pytestmark = pytest.mark.slow

_TABLES = ("runs", "run_ends", "agent_execution_events", "blobs", "batches")
_LOG_TABLES = ("runs", "run_ends", "agent_execution_events", "blobs")


@dataclass
class World:
    """One schema with tenants A and B, their logins, and one run of each."""

    pg: PgServer
    schema: str
    owner: str
    roles: Roles
    logins: dict[str, str]  # a_writer, a_auditor, a_maint, b_writer, a_admin
    run_a: str
    run_b: str

    def url(self, login: str, tenant: str | None = None) -> str:
        return self.pg.url(self.schema, user=self.logins.get(login, login), tenant=tenant)

    def connect(self, login: str) -> psycopg.Connection[tuple[Any, ...]]:
        conn = self.pg.connect(self.logins.get(login, login))
        conn.execute(
            sql.SQL("SET search_path = {}, pg_catalog").format(sql.Identifier(self.schema))
        )
        return conn


def _record(store: PostgresStore, n: int) -> str:
    rid = new_id(n)
    events = make_events(rid, 3)
    start = make_start(rid, metadata={"team": "t"})
    store.append([start], events, [make_end(rid, events, start=start)])
    return rid


@pytest.fixture(scope="module")
def world(pg: PgServer) -> Iterator[World]:
    tag = secrets.token_hex(3)
    owner = pg.login(f"tn_owner_{tag}")
    with pg.connect() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} CREATEROLE").format(sql.Identifier(owner)))
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(pg.database), sql.Identifier(owner)
            )
        )
    schema = pg.new_schema("tn")
    prefix = f"tn_{tag}"
    pg.role_prefixes.append(prefix)
    PostgresStore(pg.url(schema, user=owner)).close()
    with pg.connect(owner) as conn:
        roles = init_roles(conn, schema, prefix=prefix)
    logins = {
        "a_writer": pg.login(f"tn_aw_{tag}", roles.writer),
        "a_auditor": pg.login(f"tn_aa_{tag}", roles.auditor),
        "a_maint": pg.login(f"tn_am_{tag}", roles.maintenance),
        "a_analyst": pg.login(f"tn_an_{tag}", roles.analyst),
        "b_writer": pg.login(f"tn_bw_{tag}", roles.writer),
        "a_admin": pg.login(f"tn_ad_{tag}", roles.admin),
    }
    with pg.connect(owner) as conn:
        grant_tenant(conn, schema, logins["a_writer"], "A", write=True)
        grant_tenant(conn, schema, logins["a_auditor"], "A", write=False)
        grant_tenant(conn, schema, logins["a_maint"], "A", write=True)
        grant_tenant(conn, schema, logins["a_analyst"], "A", write=False)
        grant_tenant(conn, schema, logins["b_writer"], "B", write=True)
    writer_a = PostgresStore(pg.url(schema, user=logins["a_writer"]))
    writer_b = PostgresStore(pg.url(schema, user=logins["b_writer"]))
    try:
        assert (writer_a.tenant, writer_b.tenant) == ("A", "B")
        run_a, run_b = _record(writer_a, 1), _record(writer_b, 2)
        writer_b.put_blob("bb" * 32, b"globex secret")
    finally:
        writer_a.close()
        writer_b.close()
    return World(pg, schema, owner, roles, logins, run_a, run_b)


_A_LOGINS = ("a_writer", "a_auditor", "a_maint", "a_analyst", "a_admin")


def _visible(conn: psycopg.Connection[tuple[Any, ...]], world: World, prefix: str = "") -> int:
    """How many of tenant B's rows the connection can see, summed over the log tables."""
    total = 0
    for table in _LOG_TABLES:
        statement = sql.SQL(prefix + "SELECT count(*) FROM {}.{} WHERE COALESCE(tenant, '') = 'B'")
        try:
            row = conn.execute(
                statement.format(sql.Identifier(world.schema), sql.Identifier(table))
            ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            continue
        total += int(row[0]) if row else 0
    return total


# -- the baseline: A sees A, never B ---------------------------------------------------


@pytest.mark.parametrize("login", _A_LOGINS)
def test_a_login_reads_its_tenant_and_nothing_of_b(world: World, login: str) -> None:
    """Each of A's logins counts A's rows (the admin none: it holds no tenant) and none of B's."""
    with world.connect(login) as conn:
        assert _visible(conn, world) == 0
        counts = conn.execute("SELECT count(*) FROM agent_execution_events").fetchone()
        assert counts == ((0,) if login == "a_admin" else (3,))
        by_id = conn.execute("SELECT * FROM runs WHERE run_id = %s", (world.run_b,)).fetchall()
        assert by_id == []
        assert conn.execute("SELECT data FROM blobs").fetchall() == []


# -- settings, roles, functions, CTEs and views -----------------------------------------

_TRICKS: dict[str, list[str]] = {
    "set tenant": ["SET replayable.tenant = 'B'"],
    "set session tenant": ["SET SESSION replayable.tenant TO 'B'"],
    "reset tenant": ["SET replayable.tenant = 'B'", "RESET replayable.tenant"],
    "set maintenance": ["SET replayable.maintenance = 'on'"],
    "reset all": ["SET replayable.tenant = ''", "RESET ALL"],
    "set_config": ["SELECT set_config('replayable.tenant', 'B', false)"],
    "set_config in a function": [
        "CREATE FUNCTION pg_temp.widen() RETURNS text LANGUAGE sql "
        "AS $$ SELECT set_config('replayable.tenant', 'B', false) $$",
        "SELECT pg_temp.widen()",
    ],
    "set_config in a security definer function": [
        "CREATE FUNCTION pg_temp.widen2() RETURNS text LANGUAGE sql SECURITY DEFINER "
        "AS $$ SELECT set_config('replayable.tenant', 'B', true) $$",
        "SELECT pg_temp.widen2()",
    ],
}


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
@pytest.mark.parametrize("trick", sorted(_TRICKS))
def test_no_setting_widens_a_login(world: World, login: str, trick: str) -> None:
    """SET, RESET and set_config() (also inside a function) never show B's rows."""
    with world.connect(login) as conn:
        for statement in _TRICKS[trick]:
            conn.execute(statement)  # type: ignore[arg-type]
        assert _visible(conn, world) == 0
        # the setting is taken as a narrowing filter at most: B's tenant shows nothing
        rows = conn.execute(
            sql.SQL("SELECT run_id::text FROM {}.runs WHERE run_id = %s").format(
                sql.Identifier(world.schema)
            ),
            (world.run_b,),
        ).fetchall()
        assert rows == []


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
def test_a_cte_or_a_subquery_shows_nothing_of_b(world: World, login: str) -> None:
    """A CTE, a recursive CTE and a sub-select see the same rows as a plain SELECT."""
    with world.connect(login) as conn:
        assert _visible(conn, world, prefix="WITH x AS (SELECT 1) ") == 0
        rows = conn.execute(
            "WITH RECURSIVE r AS (SELECT run_id FROM runs WHERE run_id = %s "
            "UNION SELECT e.run_id FROM agent_execution_events e JOIN r USING (run_id)) "
            "SELECT count(*) FROM r",
            (world.run_b,),
        ).fetchone()
        assert rows == (0,)
        assert conn.execute(
            "SELECT count(*) FROM (SELECT * FROM agent_execution_events) sub WHERE sub.tenant = 'B'"
        ).fetchone() == (0,)


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint", "a_analyst"])
@pytest.mark.parametrize(
    "statement",
    [
        "CREATE VIEW {s}.peek AS SELECT * FROM {s}.runs",
        "CREATE TABLE {s}.mine (x int)",
        "CREATE FUNCTION {s}.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    ],
)
def test_no_a_login_may_create_in_the_schema(world: World, login: str, statement: str) -> None:
    """Creating a view, table or function in the store's schema is refused."""
    with world.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL(statement).format(s=sql.Identifier(world.schema)))


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
def test_a_temporary_view_shows_nothing_of_b(world: World, login: str) -> None:
    """A view one may create (a temporary one) reads with its creator's rights: no B rows."""
    with world.connect(login) as conn:
        conn.execute(
            sql.SQL("CREATE TEMP VIEW peek AS SELECT * FROM {}.runs").format(
                sql.Identifier(world.schema)
            )
        )
        assert conn.execute("SELECT count(*) FROM peek WHERE tenant = 'B'").fetchone() == (0,)


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
def test_set_role_cannot_widen(world: World, login: str) -> None:
    """SET ROLE to B's login or the owner is refused; to a role A's login holds, no wider."""
    with world.connect(login) as conn:
        for target in (world.logins["b_writer"], world.owner, world.roles.steward):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(target)))
        held = {
            "a_writer": world.roles.writer,
            "a_auditor": world.roles.auditor,
            "a_maint": world.roles.maintenance,
        }[login]
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(held)))
        assert _visible(conn, world) == 0
        conn.execute("SET SESSION AUTHORIZATION DEFAULT")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("SET SESSION AUTHORIZATION {}").format(
                    sql.Identifier(world.logins["b_writer"])
                )
            )


def test_group_role_grant_reaches_its_members_only(world: World, pg: PgServer) -> None:
    """A tenant granted to a group role is seen by logins holding it, and by no other."""
    group = pg.login(f"tn_grp_{secrets.token_hex(3)}")
    member = pg.login(f"tn_mem_{secrets.token_hex(3)}", group, world.roles.auditor)
    with pg.connect(world.owner) as conn:
        grant_tenant(conn, world.schema, group, "B", write=False)
    try:
        with world.connect(member) as conn:
            assert _visible(conn, world) > 0
        with world.connect("a_auditor") as conn:
            assert _visible(conn, world) == 0
    finally:
        with pg.connect(world.owner) as conn:
            conn.execute(
                sql.SQL("DELETE FROM {}.tenant_members WHERE member = %s").format(
                    sql.Identifier(world.schema)
                ),
                (group,),
            )
    with world.connect(member) as conn:
        assert _visible(conn, world) == 0  # revoked: the next statement no longer sees B


# -- writes into B ------------------------------------------------------------------------


def test_a_writer_cannot_plant_rows_or_batches_for_b(world: World) -> None:
    """INSERTs naming tenant B are refused by the policies, batches included."""
    with world.connect("a_writer") as conn:
        for statement, params in [
            (
                "INSERT INTO batches (tenant, digest) VALUES ('B', %s)",
                ("f" * 64,),
            ),
            (
                "INSERT INTO blobs (tenant, digest, data) VALUES ('B', %s, 'x')",
                ("e" * 64,),
            ),
            (
                "INSERT INTO run_ends (run_id, tenant, status, ended_at, event_count, "
                "last_hash, schema_version) VALUES (%s, 'B', 'failed', 1, 0, 'x', 1)",
                (new_id(40),),
            ),
        ]:
            conn.execute("SET replayable.tenant = 'B'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute(statement, params)  # type: ignore[arg-type]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM batches")  # the digests are not for reading


def test_auditor_and_maintenance_cannot_read_batches(world: World) -> None:
    """Only the writer touches ``batches`` (and only its tenant's)."""
    for login in ("a_auditor", "a_maint", "a_analyst"):
        with (
            world.connect(login) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("SELECT count(*) FROM batches")


@pytest.mark.parametrize("login", _A_LOGINS)
def test_no_login_may_change_memberships(world: World, login: str) -> None:
    """Only the admin role changes tenant memberships; the others are refused outright."""
    me = world.logins[login]
    with world.connect(login) as conn:
        if login == "a_admin":
            grant_tenant(conn, world.schema, world.logins["a_auditor"], "C", write=False)
            conn.execute("DELETE FROM tenant_members WHERE tenant = 'C'")
            return
        for statement in (
            "INSERT INTO tenant_members (member, tenant, can_write) VALUES (%s, 'B', true)",
            "UPDATE tenant_members SET tenant = 'B' WHERE member = %s",
            "DELETE FROM tenant_members WHERE member = %s",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement, (me,))  # type: ignore[arg-type]
    with world.connect(login) as conn:
        assert _visible(conn, world) == 0


# -- the store and the command line as A ------------------------------------------------


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
def test_store_reads_as_a_show_nothing_of_b(world: World, login: str) -> None:
    """get_run, resolve, events, list_runs, search and replay of B's run: not found or empty."""
    for tenant in (None, "B"):
        store = PostgresStore(world.url(login, tenant=tenant))
        try:
            with pytest.raises(RunNotFoundError):
                store.get_run(world.run_b)
            with pytest.raises(RunNotFoundError):
                store.resolve(world.run_b[:13])
            assert store.events(world.run_b) == []
            assert all(r.run_id != world.run_b for r in store.list_runs(RunFilter()))
            assert all(h.run_id != world.run_b for h in store.search(EventQuery()).hits)
            assert store.get_blob("bb" * 32) is None
            with pytest.raises(RunNotFoundError):
                replayable.replay(world.run_b, store=store)
        finally:
            store.close()


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
def test_cli_as_a_shows_nothing_of_b(world: World, login: str, tmp_path: Path) -> None:
    """runs, show, query, report and replay through the CLI as A: B's run is never named."""
    url = world.url(login)
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(app, ["--store", url, *args], env={"COLUMNS": "200"})

    listed = run("runs", "--json")
    assert listed.exit_code == 0, listed.output
    assert world.run_a in listed.output
    assert world.run_b not in listed.output
    for args in (("show", world.run_b), ("replay", world.run_b)):
        result = run(*args)
        assert result.exit_code == 2, result.output
        assert "no run" in result.output
    found = run("query", "--json")
    assert world.run_b not in found.output
    assert world.run_a in found.output
    reports = tmp_path / "reports"
    assert run("report", "--out", str(reports)).exit_code == 0
    written = " ".join(p.read_text() for p in reports.iterdir())
    assert world.run_a in written
    assert world.run_b not in written


# -- changing recorded rows: owner and maintenance ---------------------------------------


@pytest.mark.parametrize("table", _TABLES)
@pytest.mark.parametrize(
    "statement", ["UPDATE {t} SET created_at = now()", "DELETE FROM {t}", "TRUNCATE {t}"]
)
@pytest.mark.parametrize("who", ["owner", "superuser"])
def test_owner_cannot_change_rows_even_with_the_old_setting(
    world: World, table: str, statement: str, who: str
) -> None:
    """The table owner (and a superuser) is refused UPDATE/DELETE/TRUNCATE, the
    ``replayable.maintenance`` setting of old included."""
    conn = world.connect(world.owner) if who == "owner" else world.connect("postgres")
    with conn:
        conn.execute("SET replayable.maintenance = 'on'")
        with pytest.raises(psycopg.Error, match="append-only") as info:
            conn.execute(sql.SQL(statement.format(t=table)))
        assert info.value.sqlstate == "RPL01"
        with conn.transaction():
            conn.execute("SELECT set_config('replayable.maintenance', 'on', true)")
            with pytest.raises(psycopg.Error, match="append-only"):
                conn.execute(sql.SQL(statement.format(t=table)))
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        if table != "batches":
            assert (count.fetchone() or (0,))[0] >= 1


def test_owner_cannot_call_the_procedure_into_a_bypass(world: World) -> None:
    """The owner may not become the steward, so the procedure's rights are not the owner's."""
    with world.connect(world.owner) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(world.roles.steward)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("ALTER FUNCTION erase_data_keys(text, text, float8) OWNER TO {}").format(
                    sql.Identifier(world.owner)
                )
            )


def test_maintenance_erases_its_tenant_only(world: World, pg: PgServer) -> None:
    """Erasure by A's maintenance login: B's keys are out of its reach; other logins refused.

    The steward's procedure is the one way to delete rows, and it checks the tenant in the
    database: no ``replayable.tenant`` setting and no read-only membership widens it.
    """
    call = "SELECT erase_data_keys(%s, %s, %s)"
    subject = f"subject-{secrets.token_hex(3)}"
    for login in ("a_writer", "a_auditor", "a_analyst"):
        with world.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(call, ("A", subject, 1.0))
    with world.connect("a_maint") as conn:
        conn.execute("SET replayable.tenant = 'B'")
        with pytest.raises(psycopg.Error, match="may not erase"):
            conn.execute(call, ("B", subject, 1.0))
        conn.execute("RESET replayable.tenant")
        with pytest.raises(psycopg.Error, match="may not erase"):
            conn.execute(call, ("B", subject, 1.0))
        for statement in (
            "UPDATE agent_execution_events SET name = 'x'",
            "DELETE FROM runs",
            "DELETE FROM data_keys",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[arg-type]
    read_only = pg.login(f"tn_ro_{secrets.token_hex(3)}", world.roles.maintenance)
    with pg.connect(world.owner) as conn:
        grant_tenant(conn, world.schema, read_only, "A", write=False)
    with world.connect(read_only) as conn, pytest.raises(psycopg.Error, match="may not erase"):
        conn.execute(call, ("A", subject, 1.0))
    owner = PostgresStore(world.url(world.owner), tenant="A")
    try:
        before_b = owner.events(world.run_b)
        with world.connect("a_maint") as conn:
            assert conn.execute(call, ("A", subject, 2.0)).fetchone() == ([],)
        erased = [e for e in owner.erasures("A") if e.subject == subject]
        assert [(e.erased_by, e.erased_at) for e in erased] == [(world.logins["a_maint"], 2.0)]
        assert owner.events(world.run_b) == before_b
    finally:
        owner.close()


def test_the_retired_purge_procedure_is_gone(world: World) -> None:
    """``purge_payloads`` overwrote payloads in place and broke the chain: no login may call it."""
    for login in ("a_maint", world.owner):
        with world.connect(login) as conn:
            found = conn.execute("SELECT to_regprocedure('purge_payloads(uuid)')").fetchone()
            assert found == (None,)


@replayable.tool(name="tenancy_lookup")
def _lookup(x: int) -> int:
    return x + 1


@replayable.workflow("tenancy_flow")
def _flow(n: int) -> int:
    return sum(_lookup(i) for i in range(n))


def test_a_tenant_login_records_and_replays_through_the_writer(world: World) -> None:
    """A recording by A's writer login (no ?tenant=) lands in A, replays, and B cannot see it."""
    store = replayable.open_store(world.url("a_writer"))
    try:
        with replayable.recording(store, durability="durable") as rec:
            assert _flow(5) == 15
        (rid,) = rec.run_ids
        assert replayable.replay(rid, store=store, fn=_flow).ok
    finally:
        store.close()
    with world.connect("a_auditor") as conn:
        row = conn.execute("SELECT tenant FROM runs WHERE run_id = %s", (rid,)).fetchone()
        assert row == ("A",)
    with world.connect("b_writer") as conn:
        assert conn.execute("SELECT count(*) FROM runs WHERE run_id = %s", (rid,)).fetchone() == (
            0,
        )


# -- cost and migration --------------------------------------------------------------------


def test_tenant_lookup_runs_once_per_statement(world: World) -> None:
    """The policies' tenant lookup is an InitPlan (once per statement), not a per-row call."""
    with world.connect("a_auditor") as conn:
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF) SELECT count(*) FROM agent_execution_events"
            ).fetchall()
        )
    assert "InitPlan" in plan
    assert "session_tenants" in plan.split("InitPlan", 1)[1]


def test_version_1_database_upgrades_to_login_tenancy(pg: PgServer) -> None:
    """A version-1 schema (tenant by setting) is upgraded in place: the rows stay, the
    setting no longer opens them, and a grant does."""
    schema = pg.new_schema("v1")
    ident = sql.Identifier(schema)
    with pg.connect() as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.schema_version (version INTEGER PRIMARY KEY, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ).format(ident)
        )
        for statement in MIGRATIONS[0]:
            conn.execute(sql.SQL(statement).format(s=ident))
        conn.execute(sql.SQL("INSERT INTO {}.schema_version VALUES (1)").format(ident))
    with pg.connect() as conn:
        conn.execute("SELECT set_config('replayable.tenant', 'B', false)")
        conn.execute(sql.SQL("SET search_path = {}").format(ident))
        rid = new_id(3)
        conn.execute(
            "INSERT INTO runs (run_id, workflow, entrypoint, root_run_id, tenant, input_text, "
            "metadata_text, tags, code_text, lineage_text, started_at, schema_version) VALUES "
            "(%s, 'w', 'm:f', %s, 'B', '{}', '{}', '{}', '{}', '{}', 1, 1)",
            (rid, rid),
        )
        conn.execute("INSERT INTO batches (digest) VALUES ('d')")
    store = PostgresStore(pg.url(schema))
    try:
        assert store.schema_version() == LATEST_VERSION
        assert store.get_run(rid).run_id == rid
    finally:
        store.close()
    prefix = f"v1_{secrets.token_hex(3)}"
    pg.role_prefixes.append(prefix)
    with pg.connect() as conn:
        roles = init_roles(conn, schema, prefix=prefix)
    auditor = pg.login(f"v1_aud_{secrets.token_hex(3)}", roles.auditor)

    def seen() -> list[tuple[Any, ...]]:
        with pg.connect(auditor) as conn:
            conn.execute("SET replayable.tenant = 'B'")
            return conn.execute(sql.SQL("SELECT run_id FROM {}.runs").format(ident)).fetchall()

    assert seen() == []
    with pg.connect() as conn:
        grant_tenant(conn, schema, auditor, "B", write=False)
    assert len(seen()) == 1


# -- the db commands ---------------------------------------------------------------------


def _db(url: str, *args: str) -> Any:
    return CliRunner().invoke(app, ["--store", url, "db", *args], env={"COLUMNS": "200"})


def test_grant_and_revoke_tenant_commands(world: World, pg: PgServer) -> None:
    """grant-tenant / revoke-tenant by the owner change what a login sees; tenants lists it."""
    login = pg.login(f"tn_cli_{secrets.token_hex(3)}", world.roles.auditor)
    owner_url = world.url(world.owner)

    def visible() -> int:
        with world.connect(login) as conn:
            return _visible(conn, world)

    assert visible() == 0
    granted = _db(owner_url, "grant-tenant", login, "B", "--read")
    assert granted.exit_code == 0, granted.output
    assert visible() > 0
    listed = _db(owner_url, "tenants")
    assert f"{login}\tB\tread" in listed.output
    revoked = _db(owner_url, "revoke-tenant", login, "B")
    assert revoked.exit_code == 0, revoked.output
    assert visible() == 0
    again = _db(owner_url, "revoke-tenant", login, "B")
    assert again.exit_code == 2
    assert "had not been granted" in again.output
    unknown = _db(owner_url, "grant-tenant", "no_such_role_x", "B")
    assert unknown.exit_code == 2
    assert "no database role 'no_such_role_x'" in unknown.output


@pytest.mark.parametrize("login", ["a_writer", "a_auditor", "a_maint"])
def test_grant_tenant_by_a_non_admin_is_refused(world: World, login: str) -> None:
    """grant-tenant run with a writer's, auditor's or maintenance login says who may."""
    result = _db(world.url(login), "grant-tenant", world.logins[login], "B", "--write")
    assert result.exit_code == 2
    assert "only the schema owner or a member of the admin role" in result.output
    with world.connect(login) as conn:
        assert _visible(conn, world) == 0


def test_init_roles_command_lists_every_role(pg: PgServer) -> None:
    """db init-roles makes writer, auditor, analyst, maintenance, admin and steward."""
    prefix = f"ir_{secrets.token_hex(3)}"
    pg.role_prefixes.append(prefix)
    url = pg.url(pg.new_schema("ir"))
    result = _db(url, "init-roles", "--prefix", prefix)
    assert result.exit_code == 0, result.output
    with pg.connect() as conn:
        names = {
            r[0]
            for r in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (prefix + "_%",)
            ).fetchall()
        }
    suffixes = ("writer", "auditor", "analyst", "maintenance", "admin", "steward")
    assert names == {f"{prefix}_{s}" for s in suffixes}


def test_store_with_several_writable_tenants_needs_one_named(world: World, pg: PgServer) -> None:
    """A login with two writable tenants and no ?tenant= writes none by default."""
    login = pg.login(f"tn_two_{secrets.token_hex(3)}", world.roles.writer)
    with pg.connect(world.owner) as conn:
        grant_tenant(conn, world.schema, login, "A", write=True)
        grant_tenant(conn, world.schema, login, "B", write=True)
    store = PostgresStore(world.url(login))
    try:
        assert store.tenant is None
        rid = new_id(50)
        with pytest.raises(StoreError, match="refused") as info:
            store.append([make_start(rid)])
        assert "replayable db grant-tenant LOGIN TENANT --write" in str(info.value)
    finally:
        store.close()
    named = PostgresStore(world.url(login, tenant="B"))
    try:
        assert named.tenant == "B"
        assert named.get_run(world.run_b).run_id == world.run_b
        with pytest.raises(RunNotFoundError):
            named.get_run(world.run_a)  # ?tenant= narrows reads to that tenant
    finally:
        named.close()
