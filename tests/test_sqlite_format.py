"""The SQLite event row as stored (schema 4): hashes as 32-byte blobs, call sites named once.

The stored form is a detail of the file: every reader gets the event as it was hashed,
from rows of this schema and of every older one, and a value the compact form cannot
hold exactly is kept as it came.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

import replayable
from replayable.errors import AppendOnlyError
from replayable.events.canonical import event_hash
from replayable.events.model import Event
from replayable.store.integrity import Integrity
from replayable.store.rows import event_from_row, event_to_row
from replayable.store.sqlite import _DB_VERSION, SQLiteStore, _hash_form
from replayable.store.verify import verify_store
from tests.golden.record import GOLDEN_KEY
from tests.test_store_contract import (
    ENV_DIGEST,
    ENV_SNAPSHOT,
    make_end,
    make_events,
    make_start,
    new_id,
)

GOLDEN = Path(__file__).parent / "golden"
OLD_DUMPS = [p for p in sorted(GOLDEN.glob("sqlite-v*.sql")) if p.stem != f"sqlite-v{_DB_VERSION}"]
#: The dumps written before the compact event row (schema 4), whose rows stay as they were.
LOOSE_DUMPS = [p for p in OLD_DUMPS if int(p.stem.removeprefix("sqlite-v")) < 4]
_LOGICAL = (
    "run_id, seq, kind, name, key, parent, call_site, request, fingerprint, response, "
    "encoding, error, side_effect, started_at, duration_ns, metadata, chain_index, "
    "prev_hash, hash, schema_version"
)


@replayable.tool
def bump(n: int) -> int:
    return n + 1


@replayable.workflow("format.bump")
def bumping(n: int) -> int:
    return bump(n)


def _rehashed(events: list[Event]) -> list[Event]:
    out, prev = [], events[0].prev_hash
    for e in events:
        e = msgspec.structs.replace(e, prev_hash=prev)
        e = msgspec.structs.replace(e, hash=event_hash(e))
        out.append(e)
        prev = e.hash
    return out


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("ab" * 32, bytes([0xAB]) * 32),
        ("0123456789abcdef" * 4, bytes.fromhex("0123456789abcdef" * 4)),
        ("AB" * 32, "AB" * 32),  # upper case would read back lower: kept as text
        ("ab" * 31 + "a ", "ab" * 31 + "a "),
        ("ab " * 21 + "a", "ab " * 21 + "a"),  # fromhex skips the spaces: not 32 bytes
        ("zz" * 32, "zz" * 32),
        ("ab" * 31, "ab" * 31),
        ("", ""),
    ],
)
def test_a_hash_is_stored_compact_only_when_it_reads_back_exactly(text, stored):
    assert _hash_form(text) == stored
    back = stored.hex() if isinstance(stored, bytes) else stored
    assert back == text


def test_rows_are_stored_compact_and_read_back_as_hashed(tmp_path: Path) -> None:
    """A recorded event's three hashes take 32 bytes each, its call site is a reference
    to one row of ``call_sites`` shared by every event from that line, and what the store
    reads back is the event the writer hashed."""
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        rid = new_id(1)
        events = make_events(rid, 9)
        store.append([make_start(rid)], events, [make_end(rid, events)])
        assert store.events(rid) == events
        with sqlite3.connect(tmp_path / "runs.db") as db:
            rows = db.execute(
                "SELECT typeof(fingerprint), length(fingerprint), typeof(prev_hash), "
                "length(prev_hash), typeof(hash), length(hash), call_site, site FROM events "
                "ORDER BY seq"
            ).fetchall()
            sites = dict(db.execute("SELECT site_id, text FROM call_sites"))
            indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        assert {r[:6] for r in rows} == {("blob", 32, "blob", 32, "blob", 32)}
        assert all(r[6] is None for r in rows)
        assert [None if r[7] is None else sites[r[7]] for r in rows] == [
            e.call_site for e in events
        ]
        assert "events_kind_name" not in indexes
    finally:
        store.close()


def test_a_value_the_compact_form_cannot_hold_is_kept_as_it_came(tmp_path: Path) -> None:
    """A fingerprint in upper case and a hash of another length are stored as text and
    read back unchanged, so the event's hash over them still verifies."""
    rid = new_id(2)
    events = make_events(rid, 3)
    odd = [
        msgspec.structs.replace(events[0], fingerprint="AB" * 32),
        msgspec.structs.replace(events[1], fingerprint="not-a-digest"),
        events[2],
    ]
    odd = _rehashed(odd)
    store = SQLiteStore(tmp_path / "runs.db")
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    try:
        store.append([make_start(rid)], odd, [make_end(rid, odd)])
        assert store.events(rid) == odd
        assert verify_store(store, integrity=Integrity()).ok
        with sqlite3.connect(tmp_path / "runs.db") as db:
            kinds = db.execute("SELECT typeof(fingerprint) FROM events ORDER BY seq").fetchall()
        assert kinds == [("text",), ("text",), ("blob",)]
    finally:
        store.close()


def test_a_refused_batch_leaves_no_call_site_behind(tmp_path: Path) -> None:
    """A batch that is refused rolls back the call sites it added; the next batch from
    the same line adds it again rather than naming an id no row holds."""
    store = SQLiteStore(tmp_path / "runs.db")
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    try:
        rid = new_id(3)
        first = make_events(rid, 2)
        store.append([make_start(rid)], first, [])
        again = msgspec.structs.replace(first[1], call_site="new.py:1 in fresh")
        with pytest.raises(AppendOnlyError):
            store.append([], [again], [])  # seq 2 is stored already
        more = make_events(rid, 1, first_seq=3, after=first[1])
        more = _rehashed([msgspec.structs.replace(more[0], call_site="new.py:1 in fresh")])
        store.append([], more, [make_end(rid, [*first, *more])])
        assert [e.call_site for e in store.events(rid)] == [
            *(e.call_site for e in first),
            "new.py:1 in fresh",
        ]
        assert verify_store(store, integrity=Integrity()).ok
    finally:
        store.close()


def test_two_writers_of_one_file_agree_on_call_site_ids(tmp_path: Path) -> None:
    """Two store objects on one file (two writer processes) meet the same call sites in
    different orders; each reads every event's call site right."""
    path = tmp_path / "runs.db"
    one, two = SQLiteStore(path), SQLiteStore(path)
    try:
        a, b = new_id(4), new_id(5)
        ea = _rehashed(
            [msgspec.structs.replace(e, call_site=f"x.py:{e.seq}") for e in make_events(a, 4)]
        )
        eb = _rehashed(
            [msgspec.structs.replace(e, call_site=f"x.py:{5 - e.seq}") for e in make_events(b, 4)]
        )
        one.append([make_start(a)], ea[:2], [])
        two.append([make_start(b)], eb[:2], [])
        one.append([], ea[2:], [make_end(a, ea)])
        two.append([], eb[2:], [make_end(b, eb)])
        for store in (one, two):
            assert store.events(a) == ea
            assert store.events(b) == eb
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM call_sites").fetchone() == (4,)
    finally:
        one.close()
        two.close()


def test_call_sites_are_append_only(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        rid = new_id(6)
        events = make_events(rid, 2)
        store.append([make_start(rid)], events, [])
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "runs.db") as db:
        for statement in ("UPDATE call_sites SET text = 'x'", "DELETE FROM call_sites"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(statement)


def test_stored_rows_give_the_archive_the_events_as_hashed(tmp_path: Path) -> None:
    """The archive export reads rows, not events: they carry the hashes and call site
    as text, as the event's own columns."""
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        rid = new_id(7)
        events = make_events(rid, 5)
        store.append([make_start(rid)], events, [make_end(rid, events)])
        assert store.stored_rows([rid]) == [(*event_to_row(e), None, None) for e in events]
    finally:
        store.close()


@pytest.mark.parametrize("dump", LOOSE_DUMPS, ids=[p.stem for p in LOOSE_DUMPS])
def test_an_older_database_migrates_in_place_and_reads_as_before(
    dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of each schema before 4 opens at today's without rewriting its rows: each
    old event reads back exactly as the old schema stored it, and runs recorded into it
    after the migration are stored compact; every run verifies."""
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as db:
        db.executescript(dump.read_text())
        before = [event_from_row(r) for r in db.execute(f"SELECT {_LOGICAL} FROM events")]
        old_ids = {str(r[0]) for r in db.execute("SELECT run_id FROM runs")}
    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", GOLDEN_KEY)
    store = SQLiteStore(path)
    try:
        assert sorted((e.run_id, e.seq) for e in before)
        for run_id in old_ids:
            assert store.events(run_id) == sorted(
                (e for e in before if e.run_id == run_id), key=lambda e: e.seq
            )
        with replayable.recording(store) as rec:
            bumping(41)
        new_id_ = rec.run_ids[0]
        integrity = Integrity.from_env()
        report = verify_store(store, integrity=integrity, allow_unkeyed=True)
        assert report.ok, [r.message for r in report.runs if not r.ok]
        with sqlite3.connect(path) as db:
            [(version,)] = db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
            forms = dict(
                db.execute(
                    "SELECT run_id = ?, group_concat(DISTINCT typeof(hash)) FROM events "
                    "GROUP BY run_id = ?",
                    (new_id_, new_id_),
                )
            )
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            columns = [r[1] for r in db.execute("PRAGMA table_info(events)")]
        assert int(version) == _DB_VERSION
        assert forms == {0: "text", 1: "blob"}  # the old rows as they were
        assert "events_kind_name" not in names
        assert {"call_sites", "call_sites_no_update", "call_sites_no_delete"} <= names
        assert columns[-1] == "site"
    finally:
        store.close()
    # Opened again: the migration is not run twice.
    again = SQLiteStore(path)
    try:
        assert verify_store(again, integrity=Integrity.from_env(), allow_unkeyed=True).ok
    finally:
        again.close()


def test_the_hashes_of_old_and_new_rows_are_the_same_digests(tmp_path: Path) -> None:
    """The chain is computed over the event, not the row: the same events stored in the
    compact form and in the text form of older schemas carry the same hashes."""
    rid = new_id(8)
    events = make_events(rid, 4)
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    try:
        store.append([make_start(rid)], events, [make_end(rid, events)])
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        stored = db.execute("SELECT hash FROM events ORDER BY seq").fetchall()
    assert [bytes(h).hex() for (h,) in stored] == [e.hash for e in events]
    assert [e.hash for e in events] == [event_hash(e) for e in events]


def test_missing_values_are_stored_as_null_and_read_back_as_none(tmp_path: Path) -> None:
    """Events with no key, parent, response, error or call site are bound with a NaN
    (which SQLite stores as NULL): the file holds NULL, the store reads back None, and
    the chain verifies. A real float in a nullable column stays a float."""
    from replayable.store.sqlite import _NULL

    store = SQLiteStore(tmp_path / "runs.db")
    try:
        assert store._null is _NULL
        rid = new_id(2)
        events = make_events(rid, 4)
        bare = [
            msgspec.structs.replace(
                e,
                key=None,
                parent=None,
                call_site=None,
                response=None,
                error='{"message":"boom","type":"ValueError"}' if i % 2 else None,
            )
            for i, e in enumerate(events)
        ]
        bare = _rehashed(bare)
        store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
        store.append([make_start(rid)], bare, [make_end(rid, bare)])
        assert store.events(rid) == bare
        with sqlite3.connect(tmp_path / "runs.db") as db:
            types = db.execute(
                "SELECT typeof(key), typeof(parent), typeof(response), typeof(error), "
                "typeof(site), typeof(call_site) FROM events ORDER BY seq"
            ).fetchall()
        assert types == [
            ("null", "null", "null", "text" if i % 2 else "null", "null", "null") for i in range(4)
        ]
        assert verify_store(store, integrity=Integrity()).ok
    finally:
        store.close()


def test_reading_in_python_gives_what_the_sql_text_form_gives(tmp_path: Path) -> None:
    """The readers build the text form of a row in Python (hashes as hex, the call site's
    text by its id); for every stored form, hostile ones included (a blob of another
    length, a number where a hash belongs, a site id no row of call_sites holds), that
    is what the SQL form gives, column for column."""
    from replayable.store.sqlite import _EVENT_SELECT, _EVENT_STORED, _text_columns

    rid = new_id(7)
    events = [
        msgspec.structs.replace(e, call_site=f"a.py:{e.seq % 2} in f") for e in make_events(rid, 4)
    ]
    events = _rehashed([msgspec.structs.replace(events[0], fingerprint="AB" * 32), *events[1:]])
    store = SQLiteStore(tmp_path / "runs.db")
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    try:
        store.append([make_start(rid)], events, [make_end(rid, events)])
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute("DROP TRIGGER events_no_update")
        db.execute("UPDATE events SET hash = x'0102', call_site = 'old.py:1' WHERE seq = 2")
        db.execute("UPDATE events SET prev_hash = 7, site = 9999 WHERE seq = 3")
        db.commit()
        by_sql = db.execute(f"SELECT {_EVENT_SELECT} FROM events ORDER BY seq").fetchall()
        stored = db.execute(f"SELECT {_EVENT_STORED} FROM events ORDER BY seq").fetchall()
        sites = dict(db.execute("SELECT site_id, text FROM call_sites"))
    asked: list[set[int]] = []

    def site_texts(ids: set[int]) -> dict[int, str]:
        asked.append(ids)
        return {i: sites[i] for i in ids if i in sites}

    columns = _text_columns(stored, site_texts)
    assert list(zip(*columns, strict=True)) == by_sql
    assert by_sql[1][18] == "0102"
    assert by_sql[2][17] == 7
    assert by_sql[2][6] is None
    assert len(asked) == 1  # one lookup for the whole batch
    reopened = SQLiteStore(tmp_path / "runs.db")
    try:
        assert reopened.stored_rows([rid]) == by_sql
        got = reopened.events(rid)
        assert [e.call_site for e in got] == [r[6] for r in by_sql]
        assert got[0] == events[0]
        assert got[3] == events[3]
    finally:
        reopened.close()
