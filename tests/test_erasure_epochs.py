"""An erasure ends an epoch of its key space: what is recorded after it reads back whole,
and what was in flight when it happened lands erased.

Blobs are stored once per key space, so a run recorded after its subject was erased
shares messages and the literals between them (``{"doc":``, ``,"n":``) with the erased
runs. Those stored blobs are ciphertext under destroyed keys: a new run that referenced
them would read "erased" without anyone having erased it. And a record that reaches the
store after the erasure (from a stream, a spool, a run still in progress) must not be
encrypted under a fresh key that makes it readable.
"""

from __future__ import annotations

import base64
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

import replayable
from replayable.archive.erasure import erase
from replayable.audit.actor import Actor
from replayable.errors import ConfigurationError, StoreError
from replayable.store import verify_run
from replayable.store.base import EventStore
from replayable.store.crypto import (
    ENV_DATA_KEY,
    ENV_DATA_KEYRING,
    ENV_DATA_PROVIDER,
    ErasureRow,
)
from replayable.store.memory import MemoryStore
from replayable.store.payloads import closed_by, epoch_space, erasure_times, space
from replayable.store.sqlite import SQLiteStore
from tests.pg_helpers import pg
from tests.test_store_contract import (
    ENV_DIGEST,
    ENV_SNAPSHOT,
    canonical,
    make_end,
    make_start,
    new_id,
    payload_events,
)
from tests.test_tiers_postgres import World, world

__all__ = ["pg", "world"]

ROOT = Actor(user="root", role="admin", login="root")
PROMPT = "You are the claims assistant of Example Mutual. Answer in one line. " * 12
PERSONAL = "policy holder Zanzibar-Q7 lives at 12 Harbour Road " * 12


@pytest.fixture
def kek(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, "kek1:" + base64.b64encode(b"\x07" * 32).decode())


def _payloads(n: int, personal: str) -> list[tuple[str, str | None]]:
    """A chat call that re-sends the same system prompt, and a document lookup."""
    chat = canonical(
        {
            "messages": [
                {"role": "system", "content": PROMPT},
                {"role": "user", "content": personal},
            ],
            "n": n,
        }
    )
    return [(chat, canonical({"answer": f"ok {n}"})), (canonical({"doc": personal}), None)]


def _record(
    store: EventStore,
    n: int,
    subject: str | None,
    *,
    tenant: str | None = None,
    started_at: float | None = None,
    personal: str = PERSONAL,
    events_from: int = 0,
    end: bool = True,
) -> tuple[str, Any, list[Any]]:
    rid = new_id(n)
    events = payload_events(rid, _payloads(n, personal))
    meta = {"data_subject": subject} if subject else {}
    start = make_start(rid, metadata=meta, started_at=started_at or time.time(), tenant=tenant)
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    store.append([start], events[events_from:], [make_end(rid, events, start=start)] if end else [])
    return rid, start, events


def _texts(store: EventStore, rid: str) -> list[tuple[str, str | None, str | None]]:
    return [(e.request, e.response, e.erased) for e in store.events(rid)]


def _assert_whole(store: EventStore, rid: str, events: list[Any]) -> None:
    got = store.events(rid)
    assert [(e.request, e.response) for e in got] == [(e.request, e.response) for e in events]
    assert all(e.erased is None and not e.problems for e in got), [e.problems for e in got]
    assert verify_run(store, rid).ok


def _assert_erased(store: EventStore, rid: str) -> None:
    got = store.events(rid)
    assert got
    assert all(e.erased is not None and e.erased.startswith("erased on ") for e in got)
    assert all(PERSONAL not in e.request for e in got)
    assert verify_run(store, rid).ok


def _new_runs_after_erasure(store: EventStore) -> None:
    old, _, _ = _record(store, 1, "cust-1")
    other, _, other_events = _record(store, 2, "cust-2")
    erase(store, subject="cust-1", actor=ROOT)
    _assert_erased(store, old)
    # The subject comes back: the same system prompt, the same personal text.
    new, _, events = _record(store, 3, "cust-1")
    _assert_whole(store, new, events)
    _assert_erased(store, old)  # re-recording the content does not bring the old run back
    _assert_whole(store, other, other_events)
    # A second erasure ends the second epoch too; a third run reads back again.
    erase(store, subject="cust-1", actor=ROOT)
    _assert_erased(store, new)
    _assert_erased(store, old)
    third, _, third_events = _record(store, 4, "cust-1")
    _assert_whole(store, third, third_events)
    _assert_whole(store, other, other_events)


def test_a_subject_recorded_again_after_its_erasure_reads_back_whole(
    tmp_path: Path, kek: None
) -> None:
    """SQLite: new runs of an erased subject share no blob with the erased ones."""
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        _new_runs_after_erasure(store)
    with SQLiteStore(path) as store:  # and from a new connection, nothing cached
        runs = {r.start.metadata.get("data_subject"): r.run_id for r in store.list_runs()}
        assert runs
        assert all(not e.erased for e in store.events(new_id(4)))
        assert all(e.erased for e in store.events(new_id(3)))
    with sqlite3.connect(path) as conn:
        subjects = sorted({r[0] for r in conn.execute("SELECT subject FROM data_keys")})
    # The subject's third epoch holds the one live key; the other subject's is untouched.
    assert subjects == ["cust-1\x1e2", "cust-2"]


def test_the_memory_store_keeps_epochs_too(kek: None) -> None:
    store = MemoryStore()
    _new_runs_after_erasure(store)


def test_a_tenant_erasure_ends_every_subjects_epoch(tmp_path: Path, kek: None) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        a, _, _ = _record(store, 1, "cust-1")
        b, _, _ = _record(store, 2, None)
        erase(store, tenant="", actor=ROOT)
        _assert_erased(store, a)
        _assert_erased(store, b)
        c, _, events_c = _record(store, 3, "cust-1")
        d, _, events_d = _record(store, 4, None)
        _assert_whole(store, c, events_c)
        _assert_whole(store, d, events_d)


def test_records_landing_after_their_runs_erasure_are_stored_erased(
    tmp_path: Path, kek: None
) -> None:
    """A run in progress at the erasure: its later events (from a spool or a stream)
    are stored without their bytes and read "erased", and no new data key makes them
    readable; its chain still verifies."""
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        rid = new_id(7)
        late = PERSONAL.replace("Zanzibar", "Kilimanjaro")
        events = payload_events(rid, _payloads(7, late))
        start = make_start(rid, metadata={"data_subject": "cust-9"}, started_at=time.time())
        store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
        store.append([start], events[:1], [])
        erase(store, subject="cust-9", actor=ROOT)
    with SQLiteStore(path) as store:  # the spool drains later, from another process
        store.append([], events[1:], [make_end(rid, events, start=start)])
        got = store.events(rid)
        assert [e.erased is not None for e in got] == [True, True]
        assert "Kilimanjaro" not in got[1].request
        assert got[1].erased is not None
        assert got[1].erased.endswith("by root")
        assert verify_run(store, rid).ok
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM data_keys").fetchone() == (0,)
        late_blobs = conn.execute(
            "SELECT length(data) FROM payload_blobs WHERE codec LIKE '%/erased'"
        ).fetchall()
        assert late_blobs
        assert all(n == (0,) for n in late_blobs)
        assert all(
            b"Kilimanjaro" not in bytes(r[0])
            for r in conn.execute("SELECT data FROM payload_blobs")
        )


def test_a_run_that_started_after_the_erasure_is_in_the_new_epoch(
    tmp_path: Path, kek: None
) -> None:
    """Epochs go by the run's start, not by when its records land: a run started after
    the erasure whose first batch lands later reads back whole."""
    with SQLiteStore(tmp_path / "runs.db") as store:
        _record(store, 1, "cust-1")
        erase(store, subject="cust-1", actor=ROOT)
        rid, start, events = _record(store, 2, "cust-1", end=False)
        store.append([], [], [make_end(rid, events, start=start)])
        _assert_whole(store, rid, events)


def _row(subject: str | None, at: float, tenant: str = "") -> ErasureRow:
    return ErasureRow(tenant, subject, at, "root", ())


def test_epochs_count_one_erasure_once_and_only_those_before_the_run() -> None:
    base = space("", "s")
    rows = [_row("s", 10.0), _row("s\x1e1", 20.0), _row("s", 20.0), _row("t", 15.0)]
    assert erasure_times(rows, base) == [10.0, 20.0]
    assert epoch_space(base, 5.0, rows) == base
    assert epoch_space(base, 10.0, rows) == "\x1fs\x1e1"
    assert epoch_space(base, 25.0, rows) == "\x1fs\x1e2"
    assert closed_by(rows, base) == rows[0]
    assert closed_by(rows, "\x1fs\x1e1") in (rows[1], rows[2])
    assert closed_by(rows, "\x1fs\x1e2") is None
    # A tenant-wide erasure counts for every subject, and for runs without one.
    tenant_wide = [_row(None, 30.0, "A")]
    assert epoch_space(space("A", ""), 31.0, tenant_wide) == "A\x1f\x1e1"
    assert epoch_space(space("A", "s"), 31.0, tenant_wide) == "A\x1fs\x1e1"
    assert epoch_space(space("B", "s"), 31.0, tenant_wide) == space("B", "s")
    # An erasure of another subject whose name starts alike does not count.
    assert erasure_times([_row("s2", 1.0)], base) == []


@pytest.mark.slow
def test_postgres_keeps_epochs_through_its_roles(world: World) -> None:
    """PostgreSQL: the writer login records after the maintenance login erased."""
    with world.store(world.writer) as w:
        old, _, _ = _record(w, 1, "cust-1")
    with world.store(world.maint) as m:
        erase(m, tenant="A", subject="cust-1", actor=ROOT)
        _assert_erased(m, old)
    with world.store(world.writer) as w:
        new, _, events = _record(w, 2, "cust-1")
        _assert_whole(w, new, events)
        _assert_erased(w, old)
    with world.store(world.maint) as m:
        erase(m, tenant="A", subject="cust-1", actor=ROOT)
        _assert_erased(m, new)
    with world.store(world.writer) as w:
        third, _, third_events = _record(w, 3, "cust-1")
        _assert_whole(w, third, third_events)


def test_a_long_running_reader_stops_showing_what_another_process_erased(
    tmp_path: Path, kek: None
) -> None:
    """A web server's store object read the run (and holds its texts decrypted); the
    erasure runs in another process: its next read shows the run erased."""
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as reader:
        rid, _, events = _record(reader, 1, "cust-1")
        _assert_whole(reader, rid, events)
        with SQLiteStore(path) as other:
            erase(other, subject="cust-1", actor=ROOT)
        _assert_erased(reader, rid)


def test_an_archived_run_read_before_the_erasure_is_not_shown_after_it(
    tmp_path: Path, kek: None
) -> None:
    from replayable.archive.parquet import archive

    path = tmp_path / "runs.db"
    with SQLiteStore(path) as reader:
        rid, _, events = _record(reader, 1, "cust-1", started_at=time.time() - 90 * 86400)
        archive(reader, str(tmp_path / "archive"), older_than=0.0)
        assert reader.archived_ids() == {rid}
        _assert_whole(reader, rid, events)  # read from the archive, and held
        with SQLiteStore(path) as other:
            erase(other, subject="cust-1", actor=ROOT)
        _assert_erased(reader, rid)


@pytest.mark.slow
def test_a_postgres_reader_stops_showing_what_maintenance_erased(world: World) -> None:
    with world.store(world.writer) as reader:
        rid, _, events = _record(reader, 1, "cust-1")
        _assert_whole(reader, rid, events)
        with world.store(world.maint) as m:
            erase(m, tenant="A", subject="cust-1", actor=ROOT)
        _assert_erased(reader, rid)


def test_a_subject_cannot_name_another_subjects_epoch(tmp_path: Path, kek: None) -> None:
    """Key-space separators in a subject's own text do not reach the key space: subject
    "cust-1\\x1e1" is not epoch 1 of "cust-1", and erasing it leaves "cust-1" alone."""
    assert space("", "a\x1e1") != space("", "a") + "\x1e1"
    assert len({space("", s) for s in ("a\x1e1", "a\x1f1", "\x1da", "a")}) == 4
    with SQLiteStore(tmp_path / "runs.db") as store:
        plain, _, plain_events = _record(store, 1, "cust-1")
        odd, _, _ = _record(store, 2, "cust-1\x1e1")
        erase(store, subject="cust-1\x1e1", actor=ROOT)
        _assert_erased(store, odd)
        _assert_whole(store, plain, plain_events)
        later, _, later_events = _record(store, 3, "cust-1")
        _assert_whole(store, later, later_events)
        assert epoch_space(space("", "cust-1"), time.time(), store.erasures("")) == space(
            "", "cust-1"
        )


def test_a_tenant_cannot_name_another_tenants_subject(tmp_path: Path, kek: None) -> None:
    """A tenant whose name holds the key-space separator is refused where tenants are
    named (a recording, an erasure); a stored run with one (a hostile or damaged row)
    gets a key space of its own, not subject "cust-1" of tenant "acme": erasing that
    subject leaves it readable, and erasing it by name is refused, not done to nothing."""
    odd_tenant = "acme\x1fcust-1"
    assert space(odd_tenant, None) != space("acme", "cust-1")
    assert len({space(t, None) for t in ("acme\x1fb", "\x1dacme", "acme")}) == 3
    with pytest.raises(ConfigurationError, match=r"tenant 'acme\\x1fcust-1'.*control"):
        replayable.recording(MemoryStore(), tenant=odd_tenant)
    with SQLiteStore(tmp_path / "runs.db") as store:
        subject_run, _, _ = _record(store, 1, "cust-1", tenant="acme")
        odd_run, _, odd_events = _record(store, 2, None, tenant=odd_tenant)
        erase(store, tenant="acme", subject="cust-1", actor=ROOT)
        _assert_erased(store, subject_run)
        _assert_whole(store, odd_run, odd_events)
        with pytest.raises(ConfigurationError, match="control"):
            erase(store, tenant=odd_tenant, actor=ROOT)
        _assert_whole(store, odd_run, odd_events)


def _erase_with_second_epoch_failing(store: EventStore, tenant: str | None) -> None:
    """Erase subject cust-1 (two epochs: one erasure before) and expect it to fail on the
    second epoch's record; the first epoch's keys must still be there."""
    with pytest.raises(StoreError, match="epoch 1 refused"):
        erase(store, tenant=tenant, subject="cust-1", actor=ROOT)


def test_a_subject_erasure_that_fails_part_way_destroys_nothing(tmp_path: Path, kek: None) -> None:
    """A subject's epochs are erased in one transaction: a failure on the last epoch (a
    disk, a refusal) leaves every epoch's keys as they were and no erasure recorded, not
    the old runs unreadable and the newest still readable with the command failed."""
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        first, _, _ = _record(store, 1, "cust-1")
        erase(store, subject="cust-1", actor=ROOT)
        second, _, second_events = _record(store, 2, "cust-1")
        before = store.erasures("")
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TRIGGER fail_epoch_1 BEFORE INSERT ON erasures WHEN NEW.subject = "
        "'cust-1' || char(30) || '1' BEGIN SELECT RAISE(ABORT, 'epoch 1 refused'); END"
    )
    conn.commit()
    conn.close()
    with SQLiteStore(path) as store:
        _erase_with_second_epoch_failing(store, None)
        assert store.erasures("") == before
        _assert_whole(store, second, second_events)
        _assert_erased(store, first)
        # Put right, the same command finishes the job.
        sqlite3.connect(path, isolation_level=None).execute("DROP TRIGGER fail_epoch_1")
        erase(store, subject="cust-1", actor=ROOT)
        _assert_erased(store, second)


@pytest.mark.slow
def test_a_postgres_subject_erasure_that_fails_part_way_destroys_nothing(
    world: World,
) -> None:
    with world.store(world.writer) as w:
        _record(w, 1, "cust-1")
    with world.store(world.maint) as m:
        erase(m, tenant="A", subject="cust-1", actor=ROOT)
    with world.store(world.writer) as w:
        second, _, second_events = _record(w, 2, "cust-1")
    with world.pg.connect() as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.fail_epoch_1() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF NEW.subject = 'cust-1' || chr(30) || '1' THEN "
                "RAISE EXCEPTION 'epoch 1 refused'; END IF; RETURN NEW; END $$"
            ).format(sql.Identifier(world.schema))
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER fail_epoch_1 BEFORE INSERT ON {}.erasures "
                "FOR EACH ROW EXECUTE FUNCTION {}.fail_epoch_1()"
            ).format(sql.Identifier(world.schema), sql.Identifier(world.schema))
        )
    with world.store(world.maint) as m:
        before = m.erasures("A")
        _erase_with_second_epoch_failing(m, "A")
        assert m.erasures("A") == before
    with world.store(world.writer) as w:
        _assert_whole(w, second, second_events)
