"""Archive, drop, purge and search over the archive: one contract on the memory store,
SQLite and a real PostgreSQL server (its maintenance login and the steward's procedures)."""

from __future__ import annotations

import base64
import secrets
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from replayable.archive import purge as purge_module
from replayable.archive.parquet import RetentionPolicy, archive
from replayable.archive.purge import purge
from replayable.audit.actor import Actor
from replayable.errors import AccessDeniedError, StoreError
from replayable.events.model import Event
from replayable.store import verify_run
from replayable.store.base import EventStore
from replayable.store.crypto import ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER
from replayable.store.memory import MemoryStore
from replayable.store.postgres import PostgresStore, grant_tenant, init_roles
from replayable.store.search import EventQuery, Predicate
from replayable.store.sqlite import SQLiteStore
from tests.pg_helpers import PgServer, pg
from tests.test_store_contract import (
    ENV_DIGEST,
    ENV_SNAPSHOT,
    canonical,
    make_end,
    make_start,
    new_id,
    payload_events,
)

__all__ = ["pg"]

DOC = "the archived contract text " * 60
SHARED = "a system prompt every run sends " * 40
NOW = time.time()
OLD = 1000.0  # 1970: past hot_days and archive_years both
RECENT = NOW - 400 * 86_400.0  # past hot_days, well within archive_years


@dataclass
class Backend:
    name: str
    writer: EventStore
    maint: EventStore
    #: Hot rows of these runs still holding a payload (inline text or a reference).
    hot_payloads: Callable[[list[str]], int]
    #: Who the store records as the maintenance login.
    login: str
    #: The audit trail's entries of this kind (``what``), as (login, purpose).
    audit: Callable[[str], list[tuple[str, str]]]


def _memory_hot(store: MemoryStore) -> Callable[[list[str]], int]:
    def count(run_ids: list[str]) -> int:
        n = 0
        for rid in run_ids:
            for seq, e in store._events.get(rid, {}).items():
                if e.request != "null" or e.response is not None or (rid, seq) in store._refs:
                    n += 1
        return n

    return count


def _sqlite_hot(path: Path) -> Callable[[list[str]], int]:
    def count(run_ids: list[str]) -> int:
        with sqlite3.connect(path) as conn:
            row = conn.execute(
                "SELECT count(*) FROM events WHERE (request <> 'null' OR response IS NOT NULL "
                "OR request_ref IS NOT NULL OR response_ref IS NOT NULL) AND run_id IN "
                f"({','.join('?' * len(run_ids))})",
                run_ids,
            ).fetchone()
        return int(row[0])

    return count


def _store_audit(store: EventStore) -> Callable[[str], list[tuple[str, str]]]:
    def entries(kind: str) -> list[tuple[str, str]]:
        return [(e.login, e.purpose or "") for e in store.access_entries() if kind in e.what]

    return entries


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    if request.param == "memory":
        mem = MemoryStore()
        yield Backend("memory", mem, mem, _memory_hot(mem), mem.login_name(), _store_audit(mem))
        return
    if request.param == "sqlite":
        path = tmp_path / "runs.db"
        lite = SQLiteStore(path)
        try:
            yield Backend(
                "sqlite", lite, lite, _sqlite_hot(path), lite.login_name(), _store_audit(lite)
            )
        finally:
            lite.close()
        return
    server: PgServer = request.getfixturevalue("pg")
    world = _pg_world(server, monkeypatch)
    w = PostgresStore(server.url(world.schema, user=world.writer))
    m = PostgresStore(server.url(world.schema, user=world.maint))
    try:
        yield Backend("postgres", w, m, world.hot_payloads, world.maint, world.audit)
    finally:
        w.close()
        m.close()


@dataclass
class PgWorld:
    pg: PgServer
    schema: str
    owner: str
    writer: str
    maint: str

    def conn(self, user: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
        conn = self.pg.connect(user)
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(self.schema)))
        return conn

    def hot_payloads(self, run_ids: list[str]) -> int:
        with self.conn() as conn:
            row = conn.execute(
                "SELECT count(*) FROM agent_execution_events WHERE run_id = ANY(%s::uuid[]) "
                "AND (request_text <> 'null' OR response_text IS NOT NULL "
                "OR request_ref IS NOT NULL OR response_ref IS NOT NULL)",
                (run_ids,),
            ).fetchone()
        assert row is not None
        return int(str(row[0]))

    def audit(self, kind: str) -> list[tuple[str, str]]:
        with PostgresStore(self.pg.url(self.schema, user=self.owner)) as owner:
            return _store_audit(owner)(kind)


def _pg_world(server: PgServer, monkeypatch: pytest.MonkeyPatch) -> PgWorld:
    for name in (ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, "kek1:" + base64.b64encode(b"\x07" * 32).decode())
    tag = secrets.token_hex(3)
    owner = server.login(f"ar_owner_{tag}")
    with server.connect() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} CREATEROLE").format(sql.Identifier(owner)))
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(server.database), sql.Identifier(owner)
            )
        )
    schema = server.new_schema("ar")
    prefix = f"ar_{tag}"
    server.role_prefixes.append(prefix)
    PostgresStore(server.url(schema, user=owner)).close()
    with server.connect(owner) as conn:
        roles = init_roles(conn, schema, prefix=prefix)
    writer = server.login(f"ar_w_{tag}", roles.writer)
    maint = server.login(f"ar_m_{tag}", roles.maintenance)
    with server.connect(owner) as conn:
        for login in (writer, maint):
            grant_tenant(conn, schema, login, "", write=True)
    return PgWorld(server, schema, owner, writer, maint)


def _record(store: EventStore, n: int, *, started_at: float, workflow: str = "triage") -> str:
    """A finished run: a large request (in the blob tier) sharing a prompt with every run,
    with a small response (inline), then a small call with no response."""
    rid = new_id(n)
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    doc = f"{DOC} of run {n}"
    big = canonical({"doc": doc, "n": n, "system": SHARED, "jurisdiction": f"GB-{n}"})
    events = payload_events(rid, [(big, canonical({"rows": [], "n": n})), ('{"q":1}', None)])
    start = make_start(rid, started_at=started_at, workflow=workflow)
    store.append([start], events, [make_end(rid, events, start=start)])
    return rid


def _same(got: list[Event], want: list[Event]) -> None:
    assert [(e.seq, e.request, e.response, e.hash) for e in got] == [
        (e.seq, e.request, e.response, e.hash) for e in want
    ]
    assert all(not e.problems for e in got), [e.problems for e in got]


# -- 1. dropping the archived payloads from hot storage ------------------------------------


def test_archive_drops_hot_payloads_and_reads_back_from_the_archive(
    backend: Backend, tmp_path: Path
) -> None:
    """After the archive's verified write, the hot copies of the archived runs' payloads
    are gone (the hot store keeps rows, metadata and hashes), every run reads back whole
    from the archive and verifies, a hot run is untouched, and the drop of each part is
    in the audit trail under the maintenance login."""
    old = [_record(backend.writer, n, started_at=OLD) for n in (1, 2, 3)]
    hot = _record(backend.writer, 4, started_at=NOW)
    before = {rid: backend.writer.events(rid) for rid in [*old, hot]}
    assert backend.hot_payloads(old) == 6
    report = archive(backend.maint, str(tmp_path / "arch"), older_than=30 * 86_400.0, part_runs=2)
    assert (report.runs, report.parts, report.dropped) == (3, 2, 6)
    assert not report.blobs_kept  # every backend deletes the blobs only archived runs used
    assert backend.hot_payloads(old) == 0
    assert backend.hot_payloads([hot]) == 2
    for store in (backend.writer, backend.maint):
        store.__dict__["cold"].forget()
        for rid, events in before.items():
            _same(store.events(rid), events)
            assert verify_run(store, rid).ok, verify_run(store, rid).message
        _same(store.events_range(old[0], 2, 2), before[old[0]][1:])
        event = store.event_at(old[1], 1)
        assert event is not None
        assert DOC in event.request
    # Metadata stays in the hot rows: kind, name, times and hashes.
    kept = backend.maint.hot_events(old[0])
    assert [(e.kind, e.name, e.started_at, e.hash) for e in kept] == [
        (e.kind, e.name, e.started_at, e.hash) for e in before[old[0]]
    ]
    assert all(DOC not in e.request for e in kept)
    drops = backend.audit("archive-drop")
    assert len(drops) == 2
    assert all(login == backend.login and "hot payloads of" in why for login, why in drops)
    again = archive(backend.maint, str(tmp_path / "arch"), older_than=30 * 86_400.0)
    assert (again.runs, again.dropped) == (0, 0)
    assert len(backend.audit("archive-drop")) == 2


def test_memory_store_drops_the_blobs_only_archived_runs_use(tmp_path: Path) -> None:
    store = MemoryStore()
    old = _record(store, 1, started_at=OLD)
    hot = _record(store, 2, started_at=NOW)
    before = {rid: store.events(rid) for rid in (old, hot)}
    blobs = store.tier_stats().blobs
    report = archive(store, str(tmp_path / "arch"), older_than=86_400.0)
    assert report.blobs_dropped >= 1  # the old run's own document
    assert store.tier_stats().blobs == blobs - report.blobs_dropped
    store.cold.forget()
    for rid, events in before.items():
        _same(store.events(rid), events)
        assert verify_run(store, rid).ok
    # A new run re-sending what only the archived run had stores it again.
    again = _record(store, 1_001, started_at=NOW)
    assert DOC in store.events(again)[0].request


def test_dropping_needs_the_maintenance_role(backend: Backend, tmp_path: Path) -> None:
    rid = _record(backend.writer, 1, started_at=OLD)
    clerk = Actor(user="clerk", role="auditor", login=backend.login)
    with pytest.raises(AccessDeniedError, match="may not drop hot payloads"):
        archive(backend.maint, str(tmp_path / "a"), older_than=0.0, actor=clerk)
    assert backend.hot_payloads([rid]) == 2
    if backend.name == "postgres":
        # The database refuses the writer login, whatever its process claims to be.
        with pytest.raises(StoreError):
            archive(backend.writer, str(tmp_path / "a"), older_than=0.0)
        assert backend.hot_payloads([rid]) == 2


def test_postgres_append_only_still_refuses_everyone_but_the_procedure(
    pg: PgServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """After an archive and a purge the log's guards are as they were: an ordinary
    UPDATE or DELETE is refused to the maintenance login and to the owner, on the log,
    the archive index and the purge records; the procedures touch archived runs only."""
    world = _pg_world(pg, monkeypatch)
    with PostgresStore(pg.url(world.schema, user=world.writer)) as w:
        old = _record(w, 1, started_at=OLD)
        hot = _record(w, 2, started_at=NOW)
    with PostgresStore(pg.url(world.schema, user=world.maint)) as m:
        archive(m, str(tmp_path / "arch"), older_than=30 * 86_400.0)
        assert purge(m, now=NOW).parts == 1
        assert m.drop_archived_payloads([hot]) == 0  # not archived: left alone
    assert world.hot_payloads([hot]) == 2
    statements = [
        "UPDATE agent_execution_events SET request_text = 'null' WHERE run_id = %s",
        "DELETE FROM agent_execution_events WHERE run_id = %s",
        "DELETE FROM archived_runs WHERE run_id = %s",
        "DELETE FROM purged_payloads WHERE run_id = %s",
        "UPDATE archive_purges SET purged_by = 'nobody' WHERE %s::text IS NOT NULL",
    ]
    for login in (world.maint, world.owner):
        for statement in statements:
            with world.conn(login) as conn, pytest.raises(psycopg.Error) as caught:
                conn.execute(statement, (hot if "agent" in statement else old,))
            assert "append-only" in str(caught.value) or "permission denied" in str(caught.value), (
                statement
            )
    with world.conn(world.writer) as conn, pytest.raises(psycopg.Error, match="permission"):
        conn.execute("SELECT drop_archived_payloads(%s::uuid[])", ([old],))
    with world.conn(world.writer) as conn, pytest.raises(psycopg.Error, match="permission"):
        conn.execute(
            "SELECT record_archive_purge('x', 0, '{}'::uuid[], '{}'::int[], '{}'::text[], "
            "'{}'::text[])"
        )
    assert world.hot_payloads([hot]) == 2


def _tier_counts(world: PgWorld) -> tuple[int, int]:
    with world.conn() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM payload_blobs), (SELECT count(*) FROM payload_nodes)"
        ).fetchone()
    assert row is not None
    return int(str(row[0])), int(str(row[1]))


def test_postgres_drops_the_blob_rows_only_archived_runs_use(
    pg: PgServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On PostgreSQL the archive deletes the blob and node rows only archived runs used:
    the rows a hot run needs (its own and the prompt every run shares) are all that is
    left, the hot run reads whole, the archived runs read and verify from the archive;
    a second writer that cached an archived run's blobs as stored sends them again with
    its next batch after the drop; the writer login cannot call the procedure and
    UPDATE or DELETE on the tier's tables stays refused."""
    world = _pg_world(pg, monkeypatch)
    with PostgresStore(pg.url(world.schema, user=world.writer)) as w:
        hot = _record(w, 4, started_at=NOW)
        hot_only = _tier_counts(world)
        old = [_record(w, n, started_at=OLD) for n in (1, 2)]
    second = PostgresStore(pg.url(world.schema, user=world.writer))
    try:
        old.append(_record(second, 3, started_at=OLD))  # caches run 3's blobs as stored
        with_old = _tier_counts(world)
        assert with_old[0] > hot_only[0]
        assert with_old[1] > hot_only[1]
        with PostgresStore(pg.url(world.schema, user=world.owner)) as owner:
            before = {rid: owner.events(rid) for rid in [*old, hot]}
        with PostgresStore(pg.url(world.schema, user=world.maint)) as m:
            report = archive(m, str(tmp_path / "arch"), older_than=30 * 86_400.0)
            assert not report.blobs_kept
            assert (report.blobs_dropped, report.nodes_dropped) == (
                with_old[0] - hot_only[0],
                with_old[1] - hot_only[1],
            )
            assert _tier_counts(world) == hot_only
            assert m.drop_archived_blobs() == (0, 0)  # nothing more to drop
            for rid, events in before.items():
                _same(m.events(rid), events)
                assert verify_run(m, rid).ok, verify_run(m, rid).message
        # Run 3's request again, in a new run of the writer that had it stored.
        rid = new_id(3_001)
        big = canonical(
            {"doc": f"{DOC} of run 3", "n": 3, "system": SHARED, "jurisdiction": "GB-3"}
        )
        events = payload_events(rid, [(big, None)])
        start = make_start(rid, started_at=NOW)
        second.append([start], events, [make_end(rid, events, start=start)])
        assert _tier_counts(world)[0] > hot_only[0]
        with PostgresStore(pg.url(world.schema, user=world.writer)) as fresh:
            _same(fresh.events(rid), events)
            assert verify_run(fresh, rid).ok, verify_run(fresh, rid).message
            _same(fresh.events(hot), before[hot])
    finally:
        second.close()
    with world.conn(world.writer) as conn, pytest.raises(psycopg.Error, match="permission"):
        conn.execute("SELECT drop_archived_blobs()")
    statements = [
        "DELETE FROM payload_blobs",
        "DELETE FROM payload_nodes",
        "UPDATE payload_blobs SET data = ''::bytea",
        "DELETE FROM blob_drops",
        "UPDATE blob_drops SET blobs = 0",
    ]
    for login in (world.writer, world.maint, world.owner):
        for statement in statements:
            with world.conn(login) as conn, pytest.raises(psycopg.Error) as caught:
                conn.execute(statement)
            assert "append-only" in str(caught.value) or "permission denied" in str(caught.value), (
                login,
                statement,
            )
    with world.conn(world.maint) as conn:
        drops = conn.execute("SELECT dropped_by, blobs, nodes FROM blob_drops").fetchall()
    assert drops == [(world.maint, report.blobs_dropped, report.nodes_dropped)]
    with world.conn(world.writer) as conn, pytest.raises(psycopg.Error, match="permission"):
        conn.execute("SELECT tenants FROM blob_drops")  # which tenants were swept
    assert _tier_counts(world)[0] > hot_only[0]


def test_postgres_blob_drop_waits_for_a_batch_being_written(
    pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that may reference stored blobs holds the drop lock from its generation
    check to its commit: a drop started meanwhile waits for it, and the batch after the
    drop reads the new generation."""
    world = _pg_world(pg, monkeypatch)
    with world.conn(world.writer) as writer, world.conn(world.maint) as maint:
        writer.execute("BEGIN")
        row = writer.execute("SELECT tier_generation()").fetchone()
        assert row is not None
        assert row[0] == 0
        done = threading.Event()

        def drop() -> None:
            maint.execute("SELECT drop_archived_blobs()")
            done.set()

        thread = threading.Thread(target=drop)
        thread.start()
        try:
            assert not done.wait(1.0)  # the drop waits for the batch's commit
        finally:
            writer.execute("COMMIT")
            thread.join(30)
        assert done.is_set()


# -- 2. the archive command: verified write, killed mid-way ---------------------------------


def test_a_part_that_does_not_read_back_is_neither_indexed_nor_dropped(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replayable.archive import parquet

    rid = _record(backend.writer, 1, started_at=OLD)
    real = parquet._check_part

    def lossy(part, written, tier):  # type: ignore[no-untyped-def]
        import pyarrow.parquet as pq

        path = part.events_url  # a local path: the file loses its last row on the way
        table = pq.read_table(path)
        pq.write_table(table.slice(0, table.num_rows - 1), path)
        real(part, written, tier)

    monkeypatch.setattr(parquet, "_check_part", lossy)
    with pytest.raises(StoreError, match="does not hold what was written"):
        archive(backend.maint, str(tmp_path / "arch"), older_than=0.0)
    assert backend.maint.archived_ids() == set()
    assert backend.hot_payloads([rid]) == 2
    monkeypatch.setattr(parquet, "_check_part", real)
    report = archive(backend.maint, str(tmp_path / "arch"), older_than=0.0)
    assert (report.resumed, report.dropped) == (1, 2)


def test_a_drop_cut_short_is_finished_by_the_rerun(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job dies after indexing a part, inside its drop: the rerun archives nothing
    twice, drops what was left, and every run reads back whole."""
    runs = [_record(backend.writer, n, started_at=OLD) for n in range(1, 5)]
    before = {rid: backend.writer.events(rid) for rid in runs}
    store = backend.maint
    real = type(store).drop_archived_payloads
    calls = []

    def dying(self, run_ids):  # type: ignore[no-untyped-def]
        calls.append(list(run_ids))
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed inside the second part's drop
        return real(self, run_ids)

    monkeypatch.setattr(type(store), "drop_archived_payloads", dying)
    with pytest.raises(KeyboardInterrupt):
        archive(store, str(tmp_path / "arch"), older_than=0.0, part_runs=1)
    monkeypatch.setattr(type(store), "drop_archived_payloads", real)
    indexed = store.archived_ids()
    assert len(indexed) == 2
    assert backend.hot_payloads(sorted(set(runs) - indexed)) == 4  # not archived: hot
    report = archive(store, str(tmp_path / "arch"), older_than=0.0, part_runs=1)
    assert (report.runs, report.resumed) == (2, 0)
    assert store.archived_ids() == set(runs)
    assert backend.hot_payloads(runs) == 0
    store.__dict__["cold"].forget()
    for rid, events in before.items():
        _same(store.events(rid), events)


# -- 3. retention's purge ------------------------------------------------------------------


def test_purge_removes_expired_archives_and_leaves_verifiable_notices(
    backend: Backend, tmp_path: Path
) -> None:
    """Parts past hot_days + archive_years are purged: their files go, their runs keep
    rows, metadata and hashes and verify, and their payloads read "purged on DATE by
    WHO"; a run within its archive years stays readable; a rerun purges nothing more;
    the purge is in the audit trail."""
    dest = tmp_path / "arch"
    old = [_record(backend.writer, n, started_at=OLD) for n in (1, 2)]
    recent = _record(backend.writer, 3, started_at=RECENT)
    before = {rid: backend.writer.events(rid) for rid in [*old, recent]}
    archive(backend.maint, str(dest), older_than=30 * 86_400.0)
    files = sorted(dest.rglob("*.parquet"))
    assert len(files) == 6  # two parts (1970 and last year), events, blobs and runs each
    report = purge(backend.maint, now=NOW)
    assert (report.parts, report.runs, report.events) == (1, 2, 4)
    assert report.by == backend.login
    left = sorted(dest.rglob("*.parquet"))
    assert len(left) == 3
    assert all("date=1970-01-01" not in str(p) for p in left)
    day = time.strftime("%Y-%m-%d", time.gmtime(NOW))
    notice = f"purged on {day} by {backend.login}"
    for store in (backend.writer, backend.maint):
        store.__dict__["cold"].forget()
        for rid in old:
            got = store.events(rid)
            assert [(e.seq, e.kind, e.name, e.started_at, e.hash) for e in got] == [
                (e.seq, e.kind, e.name, e.started_at, e.hash) for e in before[rid]
            ]
            assert all(e.erased == notice for e in got)
            assert all(DOC not in e.request for e in got)
            assert got[0].request == f'"{notice}"'
            assert got[0].response == f'"{notice}"'
            assert got[1].response is None  # it had none
            assert any(p == f"request: {notice}" for p in got[0].problems)
            result = verify_run(store, rid)
            assert result.ok, result.message
        _same(store.events(recent), before[recent])
    purges = backend.audit("archive-purge")
    assert len(purges) == 1
    assert purges[0][0] == backend.login
    assert "retention" in purges[0][1]
    assert purge(backend.maint, now=NOW).parts == 0
    if backend.name == "sqlite":
        # The purge records are append-only like the log.
        with sqlite3.connect(tmp_path / "runs.db") as conn:
            for statement in (
                "UPDATE archive_purges SET purged_by = 'nobody'",
                "DELETE FROM purged_payloads",
            ):
                with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                    conn.execute(statement)


def test_purge_follows_the_policy_per_tenant_and_workflow(tmp_path: Path) -> None:
    store = MemoryStore()
    short = _record(store, 1, started_at=RECENT, workflow="chat")
    long = _record(store, 2, started_at=RECENT, workflow="billing")
    archive(store, str(tmp_path / "arch"), older_than=0.0, part_runs=1)
    policy = RetentionPolicy.from_config(
        {"retention": {"archive_years": 7, "workflows": {"chat": {"archive_years": 0.5}}}}
    )
    report = purge(store, policy=policy, now=NOW)
    assert report.runs == 1
    assert store.events(short)[0].erased is not None
    assert DOC in store.events(long)[0].request
    by_tenant = RetentionPolicy.from_config(
        {"retention": {"tenants": {"": {"archive_years": 0.1}}}}
    )
    assert by_tenant.kept_seconds("billing", None) < policy.kept_seconds("billing", None)
    assert purge(store, policy=by_tenant, now=NOW).runs == 1
    assert store.events(long)[0].erased is not None


def test_purge_needs_the_maintenance_role(backend: Backend, tmp_path: Path) -> None:
    rid = _record(backend.writer, 1, started_at=OLD)
    archive(backend.maint, str(tmp_path / "arch"), older_than=0.0)
    clerk = Actor(user="clerk", role="analyst", login=backend.login)
    with pytest.raises(AccessDeniedError, match="may not purge"):
        purge(backend.maint, now=NOW, actor=clerk)
    if backend.name == "postgres":
        with pytest.raises(StoreError):
            purge(backend.writer, now=NOW)
    assert DOC in backend.maint.events(rid)[0].request
    assert len(list((tmp_path / "arch").rglob("*.parquet"))) == 3


def test_a_purge_killed_before_deleting_files_is_finished_by_the_rerun(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = _record(backend.writer, 1, started_at=OLD)
    dest = tmp_path / "arch"
    archive(backend.maint, str(dest), older_than=0.0)
    monkeypatch.setattr(
        purge_module, "_delete_files", lambda part: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    with pytest.raises(KeyboardInterrupt):
        purge(backend.maint, now=NOW)
    monkeypatch.undo()
    assert len(list(dest.rglob("*.parquet"))) == 3  # recorded, files still there
    assert backend.maint.events(rid)[0].erased is not None
    report = purge(backend.maint, now=NOW)
    assert (report.parts, report.finished) == (0, 1)
    assert list(dest.rglob("*.parquet")) == []
    assert verify_run(backend.maint, rid).ok


def test_purge_refuses_a_part_whose_file_is_unreadable(backend: Backend, tmp_path: Path) -> None:
    rid = _record(backend.writer, 1, started_at=OLD)
    dest = tmp_path / "arch"
    archive(backend.maint, str(dest), older_than=0.0)
    for path in dest.rglob("*.parquet"):
        path.write_bytes(b"not parquet")
    with pytest.raises(StoreError, match=r"cannot purge archive part .* nothing of the part"):
        purge(backend.maint, now=NOW)
    assert backend.maint.archive_index()[0][1] is None
    assert len(list(dest.rglob("*.parquet"))) == 3
    assert backend.hot_payloads([rid]) == 0


# -- 4. search over archived runs ----------------------------------------------------------


def test_search_never_silently_skips_archived_payloads(backend: Backend, tmp_path: Path) -> None:
    """A query that tests payloads leaves archived runs out and says how many, or with
    include_archived searches them, fetched from the archive; a query on metadata only
    finds archived runs and shows their whole events."""
    old = [_record(backend.writer, n, started_at=OLD + n) for n in (1, 2)]
    hot = _record(backend.writer, 3, started_at=NOW)
    archive(backend.maint, str(tmp_path / "arch"), older_than=86_400.0)
    assert backend.hot_payloads(old) == 0
    where = (Predicate.parse("request.jurisdiction ^= GB"), Predicate.parse("response.rows empty"))
    for store in (backend.writer, backend.maint):
        page = store.search(EventQuery(where=where))
        assert [h.run_id for h in page.hits] == [hot]
        assert page.archived_skipped == 2
        full = store.search(EventQuery(where=where, include_archived=True))
        assert [h.run_id for h in full.hits] == [hot, old[1], old[0]]
        assert full.archived_skipped == 0
        assert all(DOC in h.events[0].request for h in full.hits)
        paged = store.search(EventQuery(where=where, include_archived=True, limit=2))
        assert [h.run_id for h in paged.hits] == [hot, old[1]]
        assert paged.next_offset == 2
        rest = store.search(EventQuery(where=where, include_archived=True, limit=2, offset=2))
        assert [h.run_id for h in rest.hits] == [old[0]]
        assert rest.next_offset is None
        one = store.search(
            EventQuery(
                where=(Predicate.parse("request.jurisdiction == GB-1"),), include_archived=True
            )
        )
        assert [h.run_id for h in one.hits] == [old[0]]
        # On metadata only: archived runs are found and their events come whole.
        meta = store.search(EventQuery(name="step_1"))
        assert [h.run_id for h in meta.hits] == [hot, old[1], old[0]]
        assert meta.archived_skipped == 0
        assert all(DOC in h.events[0].request for h in meta.hits)


def test_search_tests_payloads_an_archive_kept_hot(backend: Backend, tmp_path: Path) -> None:
    """--keep-hot leaves the payloads in the hot store: nothing is left out."""
    old = _record(backend.writer, 1, started_at=OLD)
    archive(backend.maint, str(tmp_path / "arch"), older_than=0.0, drop=False)
    assert old in backend.maint.archived_ids()
    assert backend.maint.dropped_ids() == set()
    page = backend.writer.search(EventQuery(where=(Predicate.parse("request.n == 1"),)))
    assert [h.run_id for h in page.hits] == [old]
    assert page.archived_skipped == 0
    assert DOC in page.hits[0].events[0].request
    backend.maint.drop_archived_payloads([old])
    assert backend.maint.dropped_ids() == {old}
    page = backend.writer.search(EventQuery(where=(Predicate.parse("request.n == 1"),)))
    assert (page.hits, page.archived_skipped) == ([], 1)


def test_query_command_says_what_it_did_not_search(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from replayable.cli import app

    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        old = _record(store, 1, started_at=OLD)
        hot = _record(store, 2, started_at=NOW)
        archive(store, str(tmp_path / "arch"), older_than=86_400.0)
    url = f"sqlite:///{path}"
    args = ["query", "--where", "request.jurisdiction ^= GB", "--store", url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert hot in result.output
    assert old not in result.output
    text = " ".join(result.output.split())
    assert "1 archived run(s) meeting the run filters were not searched" in text
    assert "--include-archived" in text
    result = CliRunner().invoke(app, [*args, "--include-archived"])
    assert result.exit_code == 0, result.output
    assert hot in result.output
    assert old in result.output
    assert "not searched" not in result.output


# -- readers when the archive cannot be reached ---------------------------------------------


def test_an_unreachable_archive_is_named_never_shown_empty(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from replayable.cli import app

    path = tmp_path / "runs.db"
    dest = tmp_path / "arch"
    with SQLiteStore(path) as store:
        rid = _record(store, 1, started_at=OLD)
        archive(store, str(dest), older_than=0.0)
    shutil.move(dest, tmp_path / "elsewhere")
    with SQLiteStore(path) as store:
        with pytest.raises(StoreError, match=f"archived in {dest}.*cannot be read"):
            store.events(rid)
        with pytest.raises(StoreError, match="cannot be read"):
            store.search(
                EventQuery(where=(Predicate.parse("request.n == 1"),), include_archived=True)
            )
        with pytest.raises(StoreError, match="cannot be read"):
            verify_run(store, rid)
    url = f"sqlite:///{path}"
    for args in (["show", rid], ["replay", rid], ["show", rid, "--json"], ["verify", rid]):
        result = CliRunner().invoke(app, [*args, "--store", url])
        assert result.exit_code == 2, (args, result.output)
        assert "cannot be read" in " ".join(result.output.split()), (args, result.output)
    result = CliRunner().invoke(app, ["archive", "purge", "--yes", "--store", url])
    assert result.exit_code != 0
    assert "cannot purge archive part" in result.output


def test_archive_and_purge_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from replayable.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REPLAYABLE_ROLE", raising=False)
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        rid = _record(store, 1, started_at=OLD)
    url = f"sqlite:///{path}"
    dest = str(tmp_path / "arch")

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--store", url])
        return result.exit_code, " ".join(result.output.split())

    code, text = run("archive", "--older-than", "30d", "--to", dest, "--keep-hot")
    assert code == 0, text
    assert "hot payloads kept (--keep-hot)" in text
    assert _sqlite_hot(path)([rid]) == 2
    # Already archived: this run drops what the first kept hot.
    code, text = run("archive", "--older-than", "30d", "--to", dest)
    assert code == 0, text
    assert "hot payloads dropped for 2 event(s)" in text
    assert _sqlite_hot(path)([rid]) == 0
    code, text = run("archive", "purge")
    assert code != 0
    assert "--yes" in text
    code, text = run("archive", "purge", "--dry-run")
    assert code == 0, text
    assert "would purge 1 archive part(s): 1 run(s)" in text
    assert len(list(Path(dest).rglob("*.parquet"))) == 3
    code, text = run("archive", "purge", "--yes")
    assert code == 0, text
    assert "purged 1 archive part(s): 1 run(s), 2 event(s)" in text
    assert list(Path(dest).rglob("*.parquet")) == []
    code, text = run("show", rid)
    assert code == 0, text
    assert "purged on" in text
    code, text = run("verify", rid)
    assert code == 0, text


# -- the web app says what a search left out --------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_web_runs_and_reports_say_what_they_did_not_search(tmp_path: Path) -> None:
    import httpx

    from tests.test_web import _app, _build, bearer

    world = _build(tmp_path)
    try:
        report = archive(world.store, str(tmp_path / "arch"), older_than=0.0)
        assert world.run in world.store.archived_ids()
        assert report.dropped
        app = _app(world)
        filters = "name=query_compliance_rules&where=response+empty"
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
                h = bearer(world, "auditor")
                left = (await c.get(f"/api/runs?{filters}", headers=h)).json()
                assert left["archived_not_searched"] >= 1
                assert world.run not in [r["run_id"] for r in left["runs"]]
                page = await c.get(f"/runs?{filters}", headers=h)
                assert 'id="archived-not-searched"' in page.text
                assert "archived=true" in page.text
                full = (await c.get(f"/api/runs?{filters}&archived=true", headers=h)).json()
                assert full["archived_not_searched"] == 0
                assert world.run in [r["run_id"] for r in full["runs"]]
                reports = await c.get(f"/reports?{filters}", headers=h)
                assert 'id="archived-not-searched"' in reports.text
                reports = await c.get(f"/reports?{filters}&archived=true", headers=h)
                assert 'id="archived-not-searched"' not in reports.text
                assert world.run[:13] in reports.text
        # The archive out of reach: the run's page says so, it shows no empty run.
        shutil.move(tmp_path / "arch", tmp_path / "elsewhere")
        app = _app(world)  # nothing cached
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
                gone = await c.get(f"/runs/{world.run}", headers=h)
                assert gone.status_code == 503
                assert "cannot be read" in gone.text
                api = await c.get(f"/api/runs/{world.run}", headers=h)
                assert api.status_code == 503
                assert f"archived in {tmp_path / 'arch'}" in api.text
    finally:
        world.store.close()
