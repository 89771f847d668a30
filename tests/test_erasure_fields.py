"""Erasure reaches every recorded value of a data subject, not only event payloads.

With a data key configured, a run's input, output and error and each event's error
are stored encrypted under the run's key space, like its events' payloads; after
``erase --subject`` no byte of them is left in clear anywhere in the store (nor in an
archive written before), they read "erased on DATE by WHO", replay refuses the run
by name, and every chain and seal still verifies.
"""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from typer.testing import CliRunner

import replayable
from replayable.archive.erasure import erase
from replayable.audit.actor import Actor
from replayable.cli import app
from replayable.errors import ReplayError
from replayable.store import verify_run
from replayable.store.base import EventStore
from replayable.store.crypto import ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER
from replayable.store.sqlite import SQLiteStore
from tests.pg_helpers import PgServer, pg
from tests.test_tiers_postgres import World, world

__all__ = ["pg", "world"]

MARK = "Zanzibar-Q7-Person"
OTHER = "Kilimanjaro-Z3-Person"
ROOT = Actor(user="root", role="admin", login="root")


def _answer(messages: list[dict[str, str]]) -> dict[str, str]:
    return {"role": "assistant", "content": f"hello {messages[-1]['content']}"}


@replayable.tool
def lookup(name: str) -> dict[str, Any]:
    if name.endswith("x"):
        raise ValueError(f"no account for {name}")
    return {"name": name, "balance": 12}


@replayable.workflow("erasure.fields")
def agent(customer: str) -> str:
    lookup(customer)
    try:
        lookup(customer + "x")
    except ValueError:
        pass
    replayable.llm(_answer, messages=[{"role": "user", "content": customer}])
    return f"done for {customer}"


@replayable.workflow("erasure.fails")
def failing(customer: str) -> str:
    raise RuntimeError(f"cannot serve {customer}")


@pytest.fixture
def kek(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # the writer's spool directory
    for name in (ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, "kek1:" + base64.b64encode(b"\x07" * 32).decode())


def _record(
    store: EventStore, who: str, subject: str, durability: str = "durable"
) -> tuple[str, str]:
    """A completed run and a failed one of ``subject``, both carrying ``who``."""
    with replayable.recording(store, subject=subject, durability=durability) as rec:  # type: ignore[arg-type]
        agent(who)
        with pytest.raises(RuntimeError):
            failing(who)
    done, failed = rec.run_ids
    return done, failed


def _assert_readable(store: EventStore, done: str, failed: str, who: str) -> None:
    run = store.get_run(done)
    assert not run.problems, run.problems
    assert who in run.start.input
    assert run.end is not None
    assert run.end.output == f'"done for {who}"'
    events = store.events(done)
    assert [e.kind for e in events] == ["tool", "tool", "llm"]
    assert not any(e.problems for e in events)
    assert events[1].error is not None
    assert who in events[1].error
    assert who in events[2].request
    assert who in (events[2].response or "")
    bad = store.get_run(failed)
    assert bad.end is not None
    assert bad.end.error is not None
    assert f"cannot serve {who}" in bad.end.error
    for rid in (done, failed):
        report = verify_run(store, rid)
        assert report.ok, report.message


def _assert_erased(store: EventStore, done: str, failed: str) -> None:
    run = store.get_run(done)
    assert run.erased is not None
    assert run.erased.startswith("erased on 20")
    assert run.erased in run.start.input
    assert run.end is not None
    assert run.end.output is not None
    assert run.erased in run.end.output
    for event in store.events(done):
        assert event.erased is not None, event
    error = store.events(done)[1].error_value()
    assert error is not None
    assert run.erased in str(error)
    bad = store.get_run(failed)
    assert bad.erased is not None
    assert bad.end is not None
    assert bad.erased in (bad.end.error or "")
    for rid in (done, failed):
        report = verify_run(store, rid)
        assert report.ok, report.message
    with pytest.raises(ReplayError, match=f"run {done}.*erased on 20"):
        replayable.replay(done, store=store)


def _sqlite_hits(path: Path, needle: str) -> list[str]:
    """Every table and column of the SQLite file holding ``needle``, and every file of
    the database (the WAL included) whose raw bytes hold it."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        hits = []
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            cols = [c[1] for c in conn.execute(f"PRAGMA table_info({table})")]
            for row in conn.execute(f"SELECT * FROM {table}"):
                for col, value in zip(cols, row, strict=True):
                    raw = value.encode() if isinstance(value, str) else value
                    if isinstance(raw, bytes) and needle.encode() in raw:
                        hits.append(f"{table}.{col}")
    finally:
        conn.close()
    for f in path.parent.iterdir():
        if not f.name.startswith(path.name):
            continue
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            continue  # a -shm or -wal file removed as the last connection closed
        if needle.encode() in data:
            hits.append(f"file {f.name}")
    return sorted(set(hits))


def _parquet_hits(root: Path, needle: str) -> list[str]:
    import pyarrow.parquet as pq

    hits = []
    for f in sorted(root.rglob("*.parquet")):
        table = pq.read_table(f)
        for name in table.column_names:
            for value in table.column(name).to_pylist():
                raw = value.encode() if isinstance(value, str) else value
                if isinstance(raw, bytes) and needle.encode() in raw:
                    hits.append(f"{f.relative_to(root)}:{name}")
    return sorted(set(hits))


def test_sqlite_erasure_leaves_no_trace_of_the_subject(tmp_path: Path, kek: None) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        done, failed = _record(store, MARK, "cust-1")
        kept_done, kept_failed = _record(store, OTHER, "cust-2")
        _assert_readable(store, done, failed, MARK)
    # Encrypted at rest from the start, not only after the erasure.
    assert _sqlite_hits(path, MARK) == []
    with SQLiteStore(path) as store:  # read back by a fresh store: nothing cached
        _assert_readable(store, done, failed, MARK)
        erase(store, subject="cust-1", actor=ROOT)
        _assert_erased(store, done, failed)
        _assert_readable(store, kept_done, kept_failed, OTHER)
    assert _sqlite_hits(path, MARK) == []
    with SQLiteStore(path) as store:
        _assert_erased(store, done, failed)
    url = f"sqlite:///{path}"
    shown = CliRunner().invoke(app, ["show", done, "--store", url])
    assert shown.exit_code == 0, shown.output
    assert "input" in shown.output
    assert "erased on 20" in shown.output
    assert MARK not in shown.output
    verified = CliRunner().invoke(app, ["verify", "--all", "--store", url])
    assert verified.exit_code == 0, verified.output
    replayed = CliRunner().invoke(app, ["replay", done, "--store", url])
    assert replayed.exit_code != 0
    assert done in replayed.output
    assert "erased on 20" in replayed.output


def test_an_archive_written_before_the_erasure_holds_only_ciphertext(
    tmp_path: Path, kek: None
) -> None:
    """Archived runs keep their event errors as references to encrypted blobs, which the
    archive copies; the hot run records keep theirs, which dropping archived blobs keeps."""
    from replayable.archive.parquet import archive

    path = tmp_path / "runs.db"
    dest = tmp_path / "archive"
    with SQLiteStore(path) as store:
        done, failed = _record(store, MARK, "cust-1")
        kept_done, kept_failed = _record(store, OTHER, "cust-2")
        report = archive(store, str(dest), older_than=0.0)
        assert report.runs == 4
        store.drop_archived_blobs()
        store.cold.forget()
    assert _parquet_hits(dest, MARK) == []
    assert _sqlite_hits(path, MARK) == []
    with SQLiteStore(path) as store:
        _assert_readable(store, done, failed, MARK)
        erase(store, subject="cust-1", actor=ROOT)
        store.cold.forget()
        _assert_erased(store, done, failed)
        _assert_readable(store, kept_done, kept_failed, OTHER)
    assert _parquet_hits(dest, MARK) == []


def test_without_a_data_key_records_are_stored_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key, no encryption: the run records keep their text in their own columns and
    their record formats (what the hash vectors and golden runs pin) are unchanged."""
    for name in (ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        done, failed = _record(store, MARK, "cust-1")
        _assert_readable(store, done, failed, MARK)
        run = store.get_run(done)
        assert run.start.schema_version == 1
        assert run.end is not None
        assert run.end.schema_version == 1
        assert {e.schema_version for e in store.events(done)} == {2}
    with sqlite3.connect(path) as conn:
        (text,) = conn.execute("SELECT input FROM runs WHERE run_id = ?", (done,)).fetchone()
    assert MARK in text


# -- PostgreSQL ---------------------------------------------------------------------


def _pg_hits(server: PgServer, schema: str, needle: str) -> list[str]:
    hits = []
    with server.connect() as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE'",
                (schema,),
            )
        ]
        for table in tables:
            q = sql.SQL("SELECT count(*) FROM {}.{} t WHERE strpos(t::text, %s) > 0").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            if conn.execute(q, (needle,)).fetchone() != (0,):
                hits.append(table)
            # bytea columns print as hex in t::text: look for the needle's bytes too.
            if conn.execute(q, (needle.encode().hex(),)).fetchone() != (0,):
                hits.append(f"{table} (bytes)")
    assert "runs" in tables
    assert "agent_execution_events" in tables
    return sorted(hits)


@pytest.fixture
def pg_world(world: World, kek: None) -> World:
    return world


@pytest.mark.slow
def test_postgres_erasure_leaves_no_trace_of_the_subject(pg_world: World) -> None:
    w = pg_world
    with w.store(w.writer) as store:
        done, failed = _record(store, MARK, "cust-1")
        kept_done, kept_failed = _record(store, OTHER, "cust-2")
        _assert_readable(store, done, failed, MARK)
    assert _pg_hits(w.pg, w.schema, MARK) == []
    assert _pg_hits(w.pg, w.schema, OTHER) == []
    with w.store(w.maint) as store:
        _assert_readable(store, done, failed, MARK)
        erase(store, tenant="A", subject="cust-1", actor=ROOT)
        _assert_erased(store, done, failed)
        _assert_readable(store, kept_done, kept_failed, OTHER)
    assert _pg_hits(w.pg, w.schema, MARK) == []
    with w.store(w.writer) as store:
        _assert_erased(store, done, failed)
        # The query path: an event error predicate still finds the other subject's run.
        from replayable.store.search import EventQuery, Predicate

        page = store.search(EventQuery(where=(Predicate.parse(f"error.message ~= {OTHER}"),)))
        assert [h.run_id for h in page.hits] == [kept_done]
        page = store.search(EventQuery(where=(Predicate.parse(f"error.message ~= {MARK}"),)))
        assert page.hits == []


# -- the record formats ---------------------------------------------------------------


def test_sealed_record_formats_hash_the_digests_and_pin_their_vectors() -> None:
    """Version 3 events and version 2 run records (written where payloads are encrypted)
    cover the sha256 of the error, the event metadata, the input and the output; the
    digest alone gives the same hashes, and each differs from the older version's over
    the same fields."""
    import hashlib

    import msgspec

    from replayable.events.canonical import event_fields, event_hash, genesis_hash, run_seal
    from replayable.events.chain import chain_label, event_digest, seal_for, start_mac
    from tests.test_hash_vectors import KEY, RUN, START, _event

    error = '{"args":["x"],"message":"x","type":"builtins:ValueError"}'
    digest = hashlib.sha256(error.encode()).hexdigest()
    ev = msgspec.structs.replace(_event(genesis_hash(RUN), schema_version=3), error=error)
    assert event_fields(ev)[12] == digest
    h = event_hash(ev)
    assert h == "9211f49ad5f199aef6278bfd17b9286d4d85df1f8d76611930e2075da98e62d8"
    assert event_fields(ev)[16] == hashlib.sha256(b"{}").hexdigest()  # the metadata's
    gone = msgspec.structs.replace(
        ev,
        error=None,
        error_digest=digest,
        metadata={"gone": True},
        metadata_digest=hashlib.sha256(b"{}").hexdigest(),
    )
    assert event_hash(gone) == h
    assert event_hash(msgspec.structs.replace(ev, schema_version=2)) != h
    keyed = msgspec.structs.replace(ev, prev_hash="p")
    assert event_digest(KEY, keyed) == (
        "f076b2edbb58695e6c8ff1ab7dedd009a8a804646c619ddcf9fb46c74de73eb9"
    )

    start = msgspec.structs.replace(START, schema_version=2)
    assert start_mac(KEY, start) == (
        "17f891784fbf740b3ecc9e1853676a842f555d7a02eb048d115baeb4560d769d"
    )
    shredded = msgspec.structs.replace(
        start, input='"erased"', input_digest=hashlib.sha256(START.input.encode()).hexdigest()
    )
    assert start_mac(KEY, shredded) == start_mac(KEY, start)
    output = '{"risk":"low"}'
    seal = run_seal(h, start, "completed", output, None, 1796129486.69, 1, version=2)
    assert seal == "66108076c76ba24a306b4ca70c348ffa1b45691f0f3ea267c5bfd685c68d8e0e"
    out_digest = hashlib.sha256(output.encode()).hexdigest()
    assert seal == run_seal(
        h, shredded, "completed", '"erased"', None, 1796129486.69, 1, version=2,
        output_digest=out_digest,
    )  # fmt: skip
    # A version 1 end over the digest's text is not the same seal (the version is sealed).
    assert run_seal(h, start, "completed", out_digest, None, 1796129486.69, 1) != seal
    chained = msgspec.structs.replace(start, chain=chain_label(KEY, start))
    assert (
        seal_for(KEY, "h", chained, "failed", None, '{"message":"m"}', 1796129486.69, 1, version=2)
        == "48044e8884528c86f59050a3b6c1cdd2f3880000d82f66658c9c4916870c4cda"
    )


def test_keyed_chain_sealed_records_export_and_erase(
    tmp_path: Path, kek: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a chain key the start MAC and the signed seal cover the digests as well; a
    sealed run exports (whole values, its own record formats), sanitizes and loads into
    another store, where it verifies; erased, it is refused for export by name."""
    from replayable.errors import FixtureError
    from replayable.store.integrity import Integrity
    from replayable.testing import load_fixture
    from replayable.testing.fixture import export_fixture
    from replayable.testing.sanitize import SanitizeRules
    from tests.golden.record import GOLDEN_KEY

    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", GOLDEN_KEY)
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        done, failed = _record(store, MARK, "cust-1")
        run = store.get_run(done)
        assert run.start.chain is not None
        assert run.start.chain.startswith("2:")
        assert (run.start.schema_version, run.end and run.end.schema_version) == (2, 2)
        assert {e.schema_version for e in store.events(done)} == {3}
        _assert_readable(store, done, failed, MARK)
        for name, rules in (("plain", None), ("clean", SanitizeRules())):
            export_fixture(store, failed, tmp_path / f"{name}.replay", sanitize=rules)
            _, loaded = load_fixture(tmp_path / f"{name}.replay")
            report = replayable.verify_run(loaded, failed, integrity=Integrity(), anchor=None,
                                           allow_unkeyed=True)  # fmt: skip
            assert report.ok or name == "plain", report.message
            if name == "plain":
                assert (tmp_path / "plain.replay").read_text().count(MARK) > 0
                keyed = replayable.verify_run(loaded, failed, integrity=Integrity.from_env())
                assert keyed.ok, keyed.message
        erase(store, subject="cust-1", actor=ROOT)
        for rid in (done, failed):
            report = replayable.verify_run(store, rid, integrity=Integrity.from_env())
            assert report.ok, report.message
            assert report.keyed, report.message
        with pytest.raises(FixtureError, match=failed):
            export_fixture(store, failed, tmp_path / "gone.replay")
    assert _sqlite_hits(path, MARK) == []


def test_the_shared_writer_process_encrypts_as_the_opening_process_says(
    tmp_path: Path, kek: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer process is shared by every store the agent's process opens; each store
    is written with the data keys configured when it was opened, not those the writer
    process was started with."""
    from replayable.capture.writer.channel import current_channel

    channel = current_channel()  # the writer process, started now with a data key
    assert channel.ready.wait(60)
    monkeypatch.delenv(ENV_DATA_KEY)
    path = tmp_path / "b.db"
    with SQLiteStore(path) as store:
        # Buffered: through the writer process (a durable commit is the caller's own).
        done, failed = _record(store, OTHER, "cust-2", durability="buffered")
        _assert_readable(store, done, failed, OTHER)
        assert store.get_run(done).start.schema_version == 1
    with sqlite3.connect(path) as conn:
        codecs = {r[0] for r in conn.execute("SELECT codec FROM payload_blobs")}
        keys = conn.execute("SELECT count(*) FROM data_keys").fetchone()
    assert all(c.endswith("/-") for c in codecs), codecs
    assert keys == (0,)
