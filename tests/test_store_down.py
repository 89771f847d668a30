"""Credentials reach the writer, a refused login is said at once, a store down at start
is an outage (spooled, drained once), and a writer that cannot store says so."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from psycopg import sql

import replayable
from replayable.capture.config import settings
from replayable.capture.writer import ProcessWriter, writer_for
from replayable.capture.writer.handoff import decode
from replayable.errors import StoreAuthenticationError
from replayable.store.postgres import PostgresStore
from tests.faultproxy import FaultProxy
from tests.pg_helpers import SERVER, PgServer, pg

__all__ = ["pg"]

pytestmark = pytest.mark.slow


@replayable.tool
def double(i: int) -> int:
    return i * 2


@replayable.workflow
def small_agent(n: int) -> int:
    return sum(double(i) for i in range(n))


@pytest.fixture
def agent_role(pg: PgServer) -> Iterator[tuple[str, str]]:
    """A password-protected login role that owns a fresh schema: (user, password)."""
    user = f"agent_{secrets.token_hex(4)}"
    password = f"s3cret-{secrets.token_hex(4)}"
    with pg.connect() as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(user), sql.Literal(password)
            )
        )
        admin.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(pg.database), sql.Identifier(user)
        ))  # fmt: skip
    try:
        yield user, password
    finally:
        with pg.connect() as admin:
            admin.execute(
                sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(
                    sql.Identifier(pg.database), sql.Identifier(user)
                )
            )
            admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(user)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))


def _url(pg: PgServer, user: str, password: str, schema: str) -> str:
    host = urlsplit(SERVER).hostname or "127.0.0.1"
    port = urlsplit(SERVER).port or 5432
    return f"postgresql://{user}:{password}@{host}:{port}/{pg.database}?schema={schema}"


def test_the_writer_process_is_handed_the_password_intact(
    pg: PgServer, agent_role: tuple[str, str], tmp_path: Path
) -> None:
    """The URL the writer process opens carries the password; what is shown masks it.

    The local server trusts 127.0.0.1, so a masked password would log in too: the
    test reads what crosses the pipe, and checks the events arrive as that role.
    """
    user, password = agent_role
    url = _url(pg, user, password, pg.new_schema("cred"))
    store = PostgresStore(url)
    try:
        assert password not in store.url
        assert password not in repr(store)
        assert password not in repr(store.target)
        assert password in store.connect_url()
        writer = ProcessWriter(store, redactor=settings.redactor, spool_dir=tmp_path)
        try:
            # The first record a store sends is its configuration, unless the
            # forwarder took it already; either way the URL it names is checked.
            config = writer._config
            assert config["url"] == store.url
            assert urlsplit(config["open"]).password == password
            reopened = PostgresStore(config["open"])
            try:
                assert reopened.target.schema == store.target.schema
                assert reopened.tenant == store.tenant
                assert password not in reopened.url
            finally:
                reopened.close()
            if writer._buf:
                kind, sent = decode(writer._buf[0])
                assert kind == "o"
                assert password in sent["open"]
        finally:
            writer.close()
        with replayable.recording(store, spool_dir=tmp_path) as rec:
            assert small_agent(4) == 12
        events = store.events(rec.run_ids[0])
        assert len(events) == 4
        owner = store.query(
            "SELECT tableowner FROM pg_tables WHERE tablename = 'agent_execution_events' "
            "AND schemaname = %s",
            (store.target.schema,),
        )
        assert owner == [(user,)]
        assert not list(tmp_path.glob("*.jsonl")), "nothing was left in a spool"
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert password.encode() not in path.read_bytes()
    finally:
        store.close()


def test_a_refused_login_is_a_clear_error_at_start(pg: PgServer, tmp_path: Path) -> None:
    """An unknown user is not an outage: recording() raises at once, naming the user."""
    user = f"nobody_{secrets.token_hex(3)}"
    url = _url(pg, user, "whatever", pg.new_schema("auth"))
    t0 = time.monotonic()
    with pytest.raises(StoreAuthenticationError, match=f"authentication failed for user {user}"):
        replayable.recording(url, spool_dir=tmp_path)
    assert time.monotonic() - t0 < 5
    assert not list(tmp_path.glob("*.jsonl")), "nothing was spooled for a refused login"


def test_a_role_without_login_is_refused_at_start(pg: PgServer, tmp_path: Path) -> None:
    """A role that may not log in is refused at start, not spooled forever."""
    user = f"nologin_{secrets.token_hex(3)}"
    with pg.connect() as admin:
        admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(user)))
    try:
        with pytest.raises(StoreAuthenticationError, match=f"user {user}"):
            replayable.recording(_url(pg, user, "pw", pg.new_schema("auth")), spool_dir=tmp_path)
    finally:
        with pg.connect() as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    parts = urlsplit(SERVER)
    with FaultProxy((parts.hostname or "127.0.0.1", parts.port or 5432), lifetime=60) as p:
        yield p


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_store_down_at_start_is_spooled_and_drained_once(
    writer: str, pg: PgServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Fail-open: PostgreSQL down when recording() starts; the agent runs, the records
    are spooled and reach the store exactly once when it is back."""
    schema = pg.new_schema("down")
    user = urlsplit(SERVER).username or "postgres"
    via = pg.url(schema, server=f"postgresql://{user}@127.0.0.1:{proxy.port}")
    via += "&connect_timeout=1"
    before = settings.writer
    replayable.configure(writer=writer)
    proxy.cut()
    try:
        with pytest.warns(RuntimeWarning, match="recording to the spool"):
            rec = replayable.recording(via, spool_dir=tmp_path, max_block_s=1.0)
        with rec:
            assert small_agent(6) == 30
            assert small_agent(3) == 6
        running = writer_for(rec.store)
        deadline = time.monotonic() + 10
        while not running.spooled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running.spooled, "the records wait in the spool"
        proxy.restore()
        assert running.drain(timeout=40), f"not drained: {running.last_error!r}"
        direct = PostgresStore(pg.url(schema))
        try:
            counts = [len(direct.events(r)) for r in rec.run_ids]
            assert counts == [6, 3]
            for run_id in rec.run_ids:
                assert direct.get_run(run_id).status == "completed"
                assert replayable.verify_run(direct, run_id).ok
            (total,) = direct.query("SELECT count(*) FROM agent_execution_events")[0]
            assert total == 9, "each event once"
        finally:
            direct.close()
    finally:
        settings.writer = before
        proxy.restore()
        rec_store = locals().get("rec")
        if rec_store is not None:
            rec_store.store.close()


def test_fail_closed_at_start_still_raises(pg: PgServer, proxy: FaultProxy) -> None:
    """With on_store_failure='raise', a store down at start is an error at start."""
    user = urlsplit(SERVER).username or "postgres"
    via = pg.url(pg.new_schema("down"), server=f"postgresql://{user}@127.0.0.1:{proxy.port}")
    proxy.cut()
    with pytest.raises(replayable.StoreUnavailableError):
        replayable.recording(via + "&connect_timeout=1", on_store_failure="raise")


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_writer_that_cannot_store_says_so_within_seconds(
    writer: str, pg: PgServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Cut mid-run: a RuntimeWarning names the store within seconds, and `replayable
    status` shows it down with its pending spool and last error; then up again."""
    from typer.testing import CliRunner

    from replayable.cli import app

    schema = pg.new_schema("say")
    user = urlsplit(SERVER).username or "postgres"
    via = pg.url(schema, server=f"postgresql://{user}@127.0.0.1:{proxy.port}")
    via += "&connect_timeout=1&options=-cstatement_timeout%3D2000"
    store = PostgresStore(via)
    before = settings.writer
    replayable.configure(writer=writer)
    runner = CliRunner()
    try:
        # A first run while the store is up (the writer process connects at leisure).
        with replayable.recording(store, spool_dir=tmp_path, max_block_s=10.0):
            small_agent(2)
        running = writer_for(store)
        assert running.drain(timeout=30)
        proxy.cut()
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"cannot store records") as caught:  # noqa: PT031
            with replayable.recording(store, spool_dir=tmp_path, max_block_s=1.0):
                small_agent(3)
            while not caught.list and time.monotonic() - t0 < 8:
                time.sleep(0.05)
        assert time.monotonic() - t0 < 8
        assert store.url in str(caught.list[0].message)
        shown = runner.invoke(app, ["status", "--spool-dir", str(tmp_path), "--json"])
        assert shown.exit_code == 1, shown.output
        import json

        (row,) = json.loads(shown.output)["stores"]
        assert row["store"] == store.url
        assert row["state"] == "down"
        assert row["pending_spool_files"] >= 1
        assert row["last_error"]
        assert row["last_commit_at"] is not None
        proxy.restore()
        assert running.drain(timeout=40)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            shown = runner.invoke(app, ["status", "--spool-dir", str(tmp_path)])
            if shown.exit_code == 0:
                break
            time.sleep(0.1)
        assert shown.exit_code == 0, shown.output
        assert "up" in shown.output
        assert store.url in shown.output
    finally:
        settings.writer = before
        proxy.restore()
        store.close()
