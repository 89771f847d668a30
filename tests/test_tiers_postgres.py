"""The blob tier, encryption and erasure on a real PostgreSQL server, with its roles."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from replayable.archive.erasure import erase
from replayable.errors import StoreError
from replayable.store import verify_run
from replayable.store.crypto import ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER
from replayable.store.postgres import PostgresStore, grant_tenant, init_roles
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

pytestmark = pytest.mark.slow

SECRET = "the merger closes on friday " * 80


@dataclass
class World:
    pg: PgServer
    schema: str
    writer: str
    maint: str

    def store(self, login: str) -> PostgresStore:
        return PostgresStore(self.pg.url(self.schema, user=login))


@pytest.fixture
def world(pg: PgServer, monkeypatch: pytest.MonkeyPatch) -> World:
    for name in (ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, "kek1:" + base64.b64encode(b"\x05" * 32).decode())
    tag = secrets.token_hex(3)
    owner = pg.login(f"tt_owner_{tag}")
    with pg.connect() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} CREATEROLE").format(sql.Identifier(owner)))
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(pg.database), sql.Identifier(owner)
            )
        )
    schema = pg.new_schema("tt")
    prefix = f"tt_{tag}"
    pg.role_prefixes.append(prefix)
    PostgresStore(pg.url(schema, user=owner)).close()
    with pg.connect(owner) as conn:
        roles = init_roles(conn, schema, prefix=prefix)
    writer = pg.login(f"tt_w_{tag}", roles.writer)
    maint = pg.login(f"tt_m_{tag}", roles.maintenance)
    with pg.connect(owner) as conn:
        grant_tenant(conn, schema, writer, "A", write=True)
        grant_tenant(conn, schema, maint, "A", write=True)
    return World(pg, schema, writer, maint)


def _record(store: PostgresStore, n: int, subject: str | None) -> str:
    rid = new_id(n)
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    big = canonical({"doc": SECRET, "n": n})
    events = payload_events(rid, [(big, big), ('{"q":1}', None)])
    start = make_start(rid, metadata={"data_subject": subject} if subject else {})
    store.append([start], events, [make_end(rid, events, start=start)])
    return rid


def test_writer_tiers_and_encrypts_and_only_maintenance_erases(world: World) -> None:
    with world.store(world.writer) as w:
        gone = _record(w, 1, "customer-1")
        kept = _record(w, 2, "customer-2")
        assert SECRET in w.events(gone)[0].request
        # Encrypted: the small payloads are blobs too, and so is the text around the
        # long string (``{"doc":`` and ``,"n":N}``), kept in clear nowhere.
        assert w.tier_stats().blobs == 8
        with pytest.raises(StoreError):
            erase(w, tenant="A", subject="customer-1")
    with world.pg.connect() as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(world.schema)))
        rows = conn.execute("SELECT codec, data FROM payload_blobs").fetchall()
        assert rows
        assert all(b"merger" not in bytes(r[1]) and not r[0].endswith("/-") for r in rows)
        with pytest.raises(psycopg.Error, match="append-only"):
            conn.execute("DELETE FROM data_keys")
    with world.store(world.maint) as m:
        done = erase(m, tenant="A", subject="customer-1")
        assert len(done.key_ids) == 1
        event = m.events(gone)[0]
        assert event.erased is not None
        assert f"by {world.maint}" in event.erased
        assert SECRET not in event.request
        assert SECRET not in (event.response or "")
        assert verify_run(m, gone).ok
        assert SECRET in m.events(kept)[0].request
        assert m.erasures("A")[0].erased_by == world.maint
    with world.store(world.writer) as w:
        assert w.events(gone)[0].erased is not None
        assert verify_run(w, kept).ok


def test_archive_from_postgresql_by_the_maintenance_login(world: World, tmp_path: Path) -> None:
    """The maintenance login archives (plans, indexes, drops hot payloads); every login
    then reads the archived runs transparently. The writer may not drop payloads."""
    from replayable.archive.parquet import archive

    with world.store(world.writer) as w:
        rid = _record(w, 10, None)
        before = w.events(rid)
        with pytest.raises(StoreError):
            archive(w, str(tmp_path / "arch"), older_than=0.0)
    with world.store(world.maint) as m:
        report = archive(m, str(tmp_path / "arch"), older_than=0.0)
        assert report.runs == 1
        assert report.dropped == len(before)
    with world.pg.connect() as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(world.schema)))
        hot = conn.execute(
            "SELECT count(*) FROM agent_execution_events WHERE run_id = %s "
            "AND (request_ref IS NOT NULL OR request_text <> 'null')",
            (rid,),
        ).fetchone()
        assert hot == (0,)
    with world.store(world.writer) as w:
        assert w.events(rid) == before
        assert verify_run(w, rid).ok
