"""The PostgreSQL store, against a real server: contract, migrations, roles, tenants."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import msgspec
import psycopg
import pytest
from psycopg import sql

import replayable
from replayable.errors import (
    AppendOnlyError,
    ConfigurationError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreRefusedError,
)
from replayable.events.canonical import event_hash, genesis_hash
from replayable.events.model import Event
from replayable.store import EventStore, RunFilter, open_store, verify_run
from replayable.store.postgres import (
    LATEST_VERSION,
    PostgresStore,
    Roles,
    grant_tenant,
    init_roles,
)
from replayable.store.postgres._connect import connect
from replayable.store.search import EventQuery, Predicate
from tests.pg_helpers import PgServer, pg
from tests.test_store_contract import (
    ENV_DIGEST,
    ENV_SNAPSHOT,
    StoreContract,
    make_end,
    make_events,
    make_start,
    new_id,
)

__all__ = ["pg"]

pytestmark = pytest.mark.slow


class TestPostgresStore(StoreContract):
    """The shared contract against PostgreSQL, one fresh schema per store."""

    @pytest.fixture(autouse=True)
    def _server(self, pg: PgServer) -> None:
        self.pg = pg

    def create_store(self) -> EventStore:
        return open_store(self.pg.url(self.pg.new_schema("contract")))

    def tamper_blob(self, store: EventStore, digest: str, data: bytes) -> None:
        assert isinstance(store, PostgresStore)
        with connect(store.target) as conn:
            conn.execute("ALTER TABLE payload_blobs DISABLE TRIGGER USER")
            conn.execute("UPDATE payload_blobs SET data = %s WHERE digest = %s", (data, digest))
            conn.execute("ALTER TABLE payload_blobs ENABLE TRIGGER USER")


@pytest.fixture
def schema(pg: PgServer) -> str:
    """A fresh schema holding an upgraded, empty store."""
    name = pg.new_schema()
    PostgresStore(pg.url(name)).close()
    return name


@pytest.fixture
def owner(pg: PgServer, schema: str) -> Iterator[PostgresStore]:
    """The store as the table owner (no tenant)."""
    store = PostgresStore(pg.url(schema))
    yield store
    store.close()


@pytest.fixture
def roles(pg: PgServer, schema: str) -> Roles:
    """Login roles granted on ``schema``, each granted the runs recorded without a tenant."""
    prefix = f"rt_{secrets.token_hex(4)}"
    pg.role_prefixes.append(prefix)
    with pg.connect() as conn:
        made = init_roles(conn, schema, prefix=prefix, login=True)
        grant_tenant(conn, schema, made.writer, "", write=True)
        grant_tenant(conn, schema, made.auditor, "", write=False)
        grant_tenant(conn, schema, made.maintenance, "", write=True)
    return made


def _recorded(
    store: EventStore,
    n: int = 1,
    *,
    tenant: str | None = None,
    metadata: dict[str, object] | None = None,
) -> tuple[str, list[Event]]:
    rid = new_id(n)
    events = make_events(rid, 3)
    start = make_start(rid, tenant=tenant, metadata=metadata or {"team": "a"})
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    store.append([start], events, [make_end(rid, events, start=start)])
    return rid, events


# -- URLs, connections, migrations ------------------------------------------------


def test_open_store_gives_postgres_store(pg: PgServer, schema: str) -> None:
    """open_store with a postgresql:// URL returns a PostgresStore with its options applied."""
    store = open_store(pg.url(schema, tenant="acme"))
    try:
        assert isinstance(store, PostgresStore)
        assert store.tenant == "acme"
        assert store.target.schema == schema
    finally:
        store.close()


def test_unreachable_server_names_host_and_port() -> None:
    """A server that cannot be reached raises StoreError naming host and port."""
    with pytest.raises(StoreError, match=r"127\.0\.0\.1:1\b"):
        open_store("postgresql://postgres@127.0.0.1:1/test?connect_timeout=1")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("postgresql://postgres@127.0.0.1/test?schema=Bad-Name", "schema"),
        ("postgresql://postgres@127.0.0.1/test?migrate=maybe", "migrate"),
        ("postgresql://u:hunter2@127.0.0.1/test?schema=x;drop", "***"),
    ],
)
def test_bad_url_options_named(url: str, fragment: str) -> None:
    """A bad replayable option in the URL raises ConfigurationError naming it (password masked)."""
    with pytest.raises(ConfigurationError) as info:
        open_store(url)
    assert fragment in str(info.value)
    assert "hunter2" not in str(info.value)


def test_upgrade_is_idempotent(owner: PostgresStore) -> None:
    """Upgrading an up-to-date schema applies nothing and keeps the data."""
    rid, events = _recorded(owner)
    assert owner.upgrade() == []
    assert owner.upgrade() == []
    assert owner.schema_version() == LATEST_VERSION
    assert owner.events(rid) == events


def test_fresh_schema_upgraded_from_nothing(pg: PgServer) -> None:
    """A store opened on an empty schema applies every migration, recorded by version."""
    name = pg.new_schema()
    store = PostgresStore(pg.url(name))
    try:
        with pg.connect() as conn:
            rows = conn.execute(
                sql.SQL("SELECT version FROM {}.schema_version ORDER BY version").format(
                    sql.Identifier(name)
                )
            ).fetchall()
        assert [r[0] for r in rows] == list(range(1, LATEST_VERSION + 1))
    finally:
        store.close()


def test_upgrade_retires_the_purge_procedure(pg: PgServer) -> None:
    """A version-10 database loses ``purge_payloads``; its triggers then know the steward by
    ``erase_data_keys``, whose deletes (the tier tests run them) still pass."""
    from replayable.store.postgres._schema import MIGRATIONS

    name = pg.new_schema()
    ident = sql.Identifier(name)
    with pg.connect() as conn, conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.schema_version (version INTEGER PRIMARY KEY, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ).format(ident)
        )
        for number, statements in enumerate(MIGRATIONS[:10], start=1):
            for statement in statements:
                conn.execute(sql.SQL(statement).format(s=ident))
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)").format(ident),
                (number,),
            )
    procedure = f"{name}.purge_payloads(uuid)"
    body = (
        "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure(%s)",
        (f"{name}.refuse_change()",),
    )
    with pg.connect() as conn:
        assert conn.execute("SELECT to_regprocedure(%s)", (procedure,)).fetchone() != (None,)
        assert "purge_payloads" in str((conn.execute(*body).fetchone() or ("",))[0])
    store = PostgresStore(pg.url(name))
    try:
        assert store.schema_version() == LATEST_VERSION
    finally:
        store.close()
    with pg.connect() as conn:
        assert conn.execute("SELECT to_regprocedure(%s)", (procedure,)).fetchone() == (None,)
        trigger = str((conn.execute(*body).fetchone() or ("",))[0])
        assert "erase_data_keys" in trigger
        assert "purge_payloads" not in trigger


def test_migrate_false_refuses_unmigrated_schema(pg: PgServer) -> None:
    """With migrate=false an empty schema is refused with the command that fixes it."""
    with pytest.raises(StoreError, match="replayable db upgrade"):
        PostgresStore(pg.url(pg.new_schema()), migrate=False)


def test_newer_schema_refused_not_downgraded(pg: PgServer, schema: str) -> None:
    """A database at a newer version than the code is refused by open and by upgrade."""
    with pg.connect() as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.schema_version (version) VALUES (99)").format(
                sql.Identifier(schema)
            )
        )
    with pytest.raises(SchemaVersionError, match="99"):
        PostgresStore(pg.url(schema))
    from replayable.store.postgres import upgrade

    with pg.connect() as conn:
        with pytest.raises(SchemaVersionError, match="never downgrades"):
            upgrade(conn, schema, "test")
        left = conn.execute(
            sql.SQL("SELECT max(version) FROM {}.schema_version").format(sql.Identifier(schema))
        ).fetchone()
    assert left == (99,)


def test_seed_indexes_exist(owner: PostgresStore) -> None:
    """The event table has UNIQUE (run_id, sequence) and indexes on parent and event type."""
    rows = owner.query(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = %s "
        "AND tablename = 'agent_execution_events'",
        (owner.target.schema,),
    )
    defs = " | ".join(r[0] for r in rows)
    assert "UNIQUE INDEX agent_execution_events_run_seq" in defs
    assert "(run_id, sequence)" in defs
    assert "(parent_run_id)" in defs
    assert "(event_type, name)" in defs


def test_metadata_lookup_uses_index(owner: PostgresStore) -> None:
    """A metadata key=value filter is answered by the GIN index on run tags."""
    _recorded(owner)
    with psycopg.connect(owner.target.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(owner.target.schema)))
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            "EXPLAIN SELECT run_id FROM runs WHERE tags @> %s::text[]", (['"team"=a'],)
        ).fetchall()
    assert "idx_runs_tags" in " ".join(r[0] for r in plan)


# -- exactness and idempotent retry ---------------------------------------------------


def test_json_text_kept_exactly_and_chain_verifies(owner: PostgresStore) -> None:
    """Payload text JSONB would normalize (1.0, 1e-7, escapes, key order) is stored as written."""
    rid = new_id(1)
    draft = Event(
        run_id=rid,
        seq=1,
        kind="tool",
        name="t",
        key=None,
        parent=None,
        call_site=None,
        request='{"b":1.0,"a":1e-7,"c":"\\u00e9 \\ud83d\\ude00"}',
        fingerprint="f" * 64,
        response='{"big":12345678901234567890,"z":[]}',
        encoding="json",
        error=None,
        side_effect=False,
        started_at=1.1,
        duration_ns=7,
        metadata={"f": 1e16, "g": 1.0, "h": -0.0},
        chain_index=0,
        prev_hash=genesis_hash(rid),
        hash="",
    )
    event = msgspec.structs.replace(draft, hash=event_hash(draft))
    owner.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    owner.append([make_start(rid)], [event], [make_end(rid, [event])])
    (stored,) = owner.events(rid)
    assert msgspec.structs.asdict(stored) == msgspec.structs.asdict(event)
    assert [type(v) for v in stored.metadata.values()] == [float, float, float]
    assert verify_run(owner, rid).ok
    (payload,) = owner.query(
        "SELECT input_payload ->> 'a' FROM agent_execution_events WHERE run_id = %s", (rid,)
    )
    assert float(payload[0]) == 1e-7


def test_retried_batch_is_idempotent(owner: PostgresStore) -> None:
    """A batch appended again (a retry after a lost COMMIT acknowledgement) writes nothing new."""
    rid = new_id(1)
    events = make_events(rid, 5)
    batch = ([make_start(rid)], events, [make_end(rid, events)])
    owner.append(*batch, durable=True)
    owner.append(*batch, durable=True)
    assert owner.events(rid) == events
    (count,) = owner.query("SELECT count(*) FROM agent_execution_events WHERE run_id = %s", (rid,))
    assert count == (5,)
    with pytest.raises(AppendOnlyError):
        owner.append([], events[:2])


def test_a_batch_with_the_same_keys_but_other_content_is_refused(owner: PostgresStore) -> None:
    """Only the very same batch is skipped as a retry: other content under the same keys
    (so another hash) is refused, and what is stored stays as it was."""
    rid = new_id(1)
    events = make_events(rid, 3)
    owner.append([make_start(rid)], durable=True)
    owner.append([], events, durable=True)
    owner.append([], events, durable=True)  # the same batch again: a retry, skipped
    changed = [
        msgspec.structs.replace(events[0], response='{"other":1}', hash="0" * 64),
        *events[1:],
    ]
    with pytest.raises(AppendOnlyError):
        owner.append([], changed, durable=True)
    assert owner.events(rid) == events


def test_buffered_and_durable_both_visible_to_other_connections(
    pg: PgServer, owner: PostgresStore
) -> None:
    """Buffered and durable batches are both committed and visible to another connection."""
    a, b = new_id(1), new_id(2)
    owner.append([make_start(a)], make_events(a, 2), durable=False)
    owner.append([make_start(b)], make_events(b, 3), durable=True)
    other = PostgresStore(pg.url(owner.target.schema))
    try:
        assert len(other.events(a)) == 2
        assert len(other.events(b)) == 3
    finally:
        other.close()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"seq": 2**32 + 2}, "seq 4294967298 is not an INTEGER"),
        ({"seq": -(2**31) - 1}, "seq -2147483649 is not an INTEGER"),
        ({"parent": 2**31}, "parent 2147483648 is not an INTEGER"),
        ({"chain_index": 2**40}, "chain_index 1099511627776 is not an INTEGER"),
        ({"schema_version": 2**33}, "schema_version 8589934592 is not an INTEGER"),
        ({"seq": "2"}, "seq '2' is not an INTEGER"),
        ({"duration_ns": 2**64}, "duration_ns 18446744073709551616 is not a BIGINT"),
        ({"name": 7}, "name is int, not text"),
        ({"request": '"\ud800"'}, "request is not UTF-8 text"),
        ({"started_at": "noon"}, "started_at 'noon' is not a number"),
        ({"metadata": {"s": {1}}}, "metadata is not JSON"),
    ],
)
def test_a_value_the_columns_cannot_hold_is_refused_naming_it(
    owner: PostgresStore, change: dict[str, object], named: str
) -> None:
    """Binary COPY would store 2**32 + 2 as 2 (psycopg truncates an int4): an integer out
    of range, or a value of the wrong type, refuses the batch naming the event and the
    field, and nothing of the batch is stored."""
    rid = new_id(1)
    owner.append([make_start(rid)], durable=True)
    events = make_events(rid, 3)
    bad = msgspec.structs.replace(events[1], **change)
    with pytest.raises(StoreRefusedError, match=re.escape(named)) as caught:
        owner.append([], [events[0], bad, events[2]], durable=True)
    assert f"of run {rid}" in str(caught.value)
    assert owner.events(rid) == []
    owner.append([], events, durable=True)
    assert owner.events(rid) == events


def test_non_uuid_run_id_refused(owner: PostgresStore) -> None:
    """A run id that is not a canonical UUID is refused with a message naming it."""
    with pytest.raises(ConfigurationError, match="not-a-uuid"):
        owner.append([make_start("not-a-uuid")])
    assert owner.find_run_ids("not") == []
    assert owner.events("not-a-uuid") == []


def test_capture_and_replay_through_postgres(pg: PgServer, schema: str) -> None:
    """A workflow recorded into PostgreSQL by the background writer replays exactly."""

    @replayable.tool(name="lookup_pg")
    def lookup(x: int) -> dict[str, int]:
        return {"double": 2 * x}

    @replayable.workflow("pg_wf")
    def flow(n: int) -> int:
        return sum(lookup(i)["double"] for i in range(n))

    store = open_store(pg.url(schema))
    try:
        with replayable.recording(store, durability="durable") as rec:
            assert flow(20) == 380
        (rid,) = rec.run_ids
        assert store.get_run(rid).status == "completed"
        assert len(store.events(rid)) == 20
        assert verify_run(store, rid).ok
        result = replayable.replay(rid, store=store, fn=flow)
        assert result.output == 380
        assert result.ok
        assert result.divergence is None
    finally:
        store.close()


# -- roles and append-only ------------------------------------------------------------

_TABLES = ("runs", "run_ends", "agent_execution_events", "blobs")


@pytest.mark.parametrize("table", _TABLES)
def test_writer_update_and_delete_refused_by_privilege(
    pg: PgServer, owner: PostgresStore, roles: Roles, table: str
) -> None:
    """The writer role may not UPDATE or DELETE any recorded table: permission denied."""
    rid, events = _recorded(owner)
    owner.put_blob("ab" * 32, b"x")
    with pg.connect(roles.writer) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(owner.target.schema)))
        for statement in (f"UPDATE {table} SET created_at = now()", f"DELETE FROM {table}"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[arg-type]
    assert owner.events(rid) == events
    assert verify_run(owner, rid).ok


def test_writer_appends_and_reads(pg: PgServer, schema: str, roles: Roles) -> None:
    """The writer role can record and read back runs through the store."""
    store = PostgresStore(pg.url(schema, user=roles.writer))
    try:
        rid, events = _recorded(store)
        assert store.events(rid) == events
        assert store.get_run(rid).status == "completed"
        assert verify_run(store, rid).ok
        with pytest.raises(StoreError):
            store.upgrade()  # the writer may not change the schema
    finally:
        store.close()


def test_auditor_reads_but_cannot_insert(pg: PgServer, owner: PostgresStore, roles: Roles) -> None:
    """The auditor role reads every run but any append is refused by the database."""
    rid, events = _recorded(owner)
    auditor = PostgresStore(pg.url(owner.target.schema, user=roles.auditor))
    try:
        assert auditor.events(rid) == events
        other = new_id(2)
        with pytest.raises(StoreError, match="refused"):
            auditor.append([make_start(other)])
        with pytest.raises(RunNotFoundError):
            owner.get_run(other)
    finally:
        auditor.close()


@pytest.mark.parametrize("table", _TABLES)
@pytest.mark.parametrize(
    "statement", ["UPDATE {t} SET created_at = now()", "DELETE FROM {t}", "TRUNCATE {t}"]
)
def test_owner_refused_by_trigger(
    pg: PgServer, owner: PostgresStore, table: str, statement: str
) -> None:
    """Even the table owner's UPDATE, DELETE or TRUNCATE is refused by a trigger."""
    rid, events = _recorded(owner)
    owner.put_blob("ab" * 32, b"x")
    with pg.connect() as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(owner.target.schema)))
        with pytest.raises(psycopg.Error, match="append-only") as info:
            conn.execute(statement.format(t=table))  # type: ignore[arg-type]
        assert info.value.sqlstate == "RPL01"
    assert owner.events(rid) == events
    assert owner.get_blob("ab" * 32) == b"x"


def test_only_maintenance_may_erase(pg: PgServer, owner: PostgresStore, roles: Roles) -> None:
    """The steward's procedure deletes data keys for the maintenance role and no other.

    The maintenance role may not UPDATE or DELETE itself, and what the procedure does
    leaves every hash chain verifying (it deletes keys, it does not rewrite events).
    """
    rid, _ = _recorded(owner)
    schema = sql.Identifier(owner.target.schema)
    call = sql.SQL("SELECT {}.erase_data_keys(%s, %s, %s)").format(schema)
    for role in (roles.writer, roles.auditor):
        with pg.connect(role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(call, ("", None, 1.0))
    with pg.connect(roles.maintenance) as conn:
        for statement in (
            "UPDATE {}.agent_execution_events SET name = 'x'",
            "DELETE FROM {}.data_keys",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL(statement).format(schema))
        assert conn.execute(call, ("", "someone", 1.0)).fetchone() == ([],)
    assert [e.subject for e in owner.erasures("")] == ["someone"]
    assert verify_run(owner, rid).ok


# -- tenants ------------------------------------------------------------------------------


def test_tenant_cannot_see_another_tenants_runs(pg: PgServer, schema: str, roles: Roles) -> None:
    """Tenant B cannot read, count, list, search or replay tenant A's run, even by id."""
    with pg.connect() as conn:
        for tenant in ("A", "B"):
            grant_tenant(conn, schema, roles.writer, tenant, write=True)
        grant_tenant(conn, schema, roles.auditor, "B", write=False)
    a = PostgresStore(pg.url(schema, user=roles.writer, tenant="A"))
    b = open_store(pg.url(schema, user=roles.writer, tenant="B"))
    auditor_b = PostgresStore(pg.url(schema, user=roles.auditor), tenant="B")
    try:
        rid, events = _recorded(a, metadata={"team": "x"})
        a.put_blob("cd" * 32, b"secret")
        assert a.events(rid) == events
        assert a.get_run(rid).start.tenant is None
        for store in (b, auditor_b):
            with pytest.raises(RunNotFoundError):
                store.get_run(rid)
            with pytest.raises(RunNotFoundError):
                store.resolve(rid[:13])
            assert store.events(rid) == []
            assert store.list_runs(RunFilter(metadata={"team": "x"})) == []
            assert list(store.iter_run_ids()) == []
            assert store.search(EventQuery(kind="tool")).hits == []
            assert store.get_blob("cd" * 32) is None
            assert isinstance(store, PostgresStore)
            counts = store.query(
                "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM run_ends), "
                "(SELECT count(*) FROM agent_execution_events)"
            )
            assert counts == [(0, 0, 0)]
        with pytest.raises(RunNotFoundError):
            replayable.replay(rid, store=b)
        assert [r.run_id for r in a.list_runs(RunFilter(metadata={"team": "x"}))] == [rid]
    finally:
        for s in (a, b, auditor_b):
            s.close()


def test_tenant_cannot_write_into_another_tenants_run(
    pg: PgServer, schema: str, roles: Roles
) -> None:
    """Events for a run the tenant cannot see are refused; forging another tenant is refused."""
    with pg.connect() as conn:
        for tenant in ("A", "B"):
            grant_tenant(conn, schema, roles.writer, tenant, write=True)
    a = PostgresStore(pg.url(schema, user=roles.writer, tenant="A"))
    b = PostgresStore(pg.url(schema, user=roles.writer, tenant="B"))
    try:
        rid, events = _recorded(a)
        more = make_events(rid, 1, first_seq=4, after=events[-1])
        with pytest.raises(StoreError, match="no run"):
            b.append([], more)
        with pytest.raises(ConfigurationError, match="tenant"):
            b.append([make_start(new_id(7), tenant="A")])
        assert a.events(rid) == events
        with psycopg.connect(b.target.dsn, autocommit=True) as conn:
            conn.execute("SELECT set_config('replayable.tenant', 'B', false)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.run_ends (run_id, tenant, status, ended_at, "
                        "event_count, last_hash, schema_version) VALUES "
                        "(%s, 'A', 'failed', 1, 0, 'x', 1)"
                    ).format(sql.Identifier(schema)),
                    (new_id(8),),
                )
    finally:
        a.close()
        b.close()


def test_search_with_predicates_in_sql(owner: PostgresStore) -> None:
    """JSON-path predicates are evaluated by PostgreSQL as by the Python reference."""
    rid, _events = _recorded(owner)
    query = EventQuery(where=(Predicate.parse("request.q ^= question 2"),))
    page = owner.search(query)
    assert [h.run_id for h in page.hits] == [rid]
    assert [e.seq for e in page.hits[0].events] == [2]


def test_libpq_options_with_spaces_reach_the_server(pg: PgServer) -> None:
    """options=-c statement_timeout=1500 is passed to libpq intact (a space is not a '+')."""
    from replayable.store.postgres._connect import parse_url

    url = pg.url(pg.new_schema()) + "&options=-c%20statement_timeout%3D1500"
    target = parse_url(url)
    with psycopg.connect(target.dsn) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1500ms",)
