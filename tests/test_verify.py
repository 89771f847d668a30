"""verify_run: a recorded run's hash chain holds, and tampering behind the
store's back (with its triggers dropped) is named precisely."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import replayable
from replayable.events.canonical import event_hash
from replayable.store.sqlite import SQLiteStore


@replayable.tool
def lookup(city: str) -> dict[str, object]:
    return {"city": city, "temp_c": len(city) * 3, "tags": ("mild", city.lower())}


@replayable.tool
def convert(celsius: int) -> float:
    return celsius * 9 / 5 + 32


@replayable.workflow
def forecast(cities: list[str]) -> list[float]:
    return [convert(lookup(c)["temp_c"]) for c in cities]


CITIES = ["Oslo", "Lima", "Kyoto"]  # six events: lookup, convert per city


@contextlib.contextmanager
def tamper(path: Path, *drop: str) -> Iterator[sqlite3.Connection]:
    """A raw connection with the named triggers dropped, committed on exit."""
    conn = sqlite3.connect(path)
    try:
        for trigger in drop:
            conn.execute(f"DROP TRIGGER {trigger}")
        yield conn
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def run_id(sqlite_store: SQLiteStore) -> str:
    with replayable.recording(sqlite_store) as rec:
        forecast(CITIES)
    return rec.run_ids[0]


def test_recorded_run_verifies(sqlite_store: SQLiteStore, run_id: str) -> None:
    """A run recorded through the public API has an intact chain covering every event."""
    report = replayable.verify_run(sqlite_store, run_id)
    assert report.ok, report.message
    assert report.events_checked == len(sqlite_store.events(run_id)) == 6
    assert report.first_bad_seq is None
    assert "intact" in report.message


def test_failed_run_verifies(sqlite_store: SQLiteStore) -> None:
    """A failed run's chain, ending in the call that raised, verifies."""

    @replayable.tool
    def refuse() -> None:
        raise PermissionError("no")

    @replayable.workflow
    def cut_short() -> None:
        lookup("Rome")
        refuse()

    with replayable.recording(sqlite_store) as rec, contextlib.suppress(PermissionError):
        cut_short()
    rid = rec.run_ids[0]
    report = replayable.verify_run(sqlite_store, rid)
    assert sqlite_store.get_run(rid).status == "failed"
    assert sqlite_store.events(rid)[-1].error is not None
    assert report.ok
    assert report.events_checked == 2


def test_edited_response_named_by_seq(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """Editing one event's response is reported at exactly that event's seq."""
    with tamper(sqlite_path, "events_no_update") as conn:
        changed = conn.execute(
            'UPDATE events SET response = \'{"city":"Lima","temp_c":-40}\' '
            "WHERE run_id = ? AND seq = 3",
            (run_id,),
        ).rowcount
    assert changed == 1
    assert sqlite_store.events(run_id)[2].response == '{"city":"Lima","temp_c":-40}'
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq == 3
    assert report.events_checked == 2
    assert "altered" in report.reason
    assert "event 3" in report.message


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("request", '{"city":"Paris"}'),
        ("name", "convert"),
        ("started_at", 0.0),
        ("error", '{"type":"builtins:ValueError","message":"x","args":["x"]}'),
        ("metadata", '{"note":"added later"}'),
    ],
)
def test_any_edited_field_is_caught(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str, column: str, value: object
) -> None:
    """Every hashed field of an event is covered: editing any of them is caught there."""
    with tamper(sqlite_path, "events_no_update") as conn:
        conn.execute(
            f"UPDATE events SET {column} = ? WHERE run_id = ? AND seq = 5", (value, run_id)
        )
    report = replayable.verify_run(sqlite_store, run_id)
    assert (report.ok, report.first_bad_seq) == (False, 5)


def test_rehashed_edit_caught_at_next_link(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """An edit whose own hash is recomputed still breaks the next event's link."""
    target = sqlite_store.events(run_id)[1]
    forged = msgspec.structs.replace(target, response="999.0")
    forged = msgspec.structs.replace(forged, hash=event_hash(forged))
    with tamper(sqlite_path, "events_no_update") as conn:
        conn.execute(
            "UPDATE events SET response = ?, hash = ? WHERE run_id = ? AND seq = 2",
            (forged.response, forged.hash, run_id),
        )
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq == 3
    assert "link" in report.reason


def test_rehashed_edit_of_last_event_caught_by_end_record(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """Rehashing an edited last event leaves the end record naming another chain head."""
    last = sqlite_store.events(run_id)[-1]
    forged = msgspec.structs.replace(last, response="0.0")
    forged = msgspec.structs.replace(forged, hash=event_hash(forged))
    with tamper(sqlite_path, "events_no_update") as conn:
        conn.execute(
            "UPDATE events SET response = ?, hash = ? WHERE run_id = ? AND seq = ?",
            (forged.response, forged.hash, run_id, last.seq),
        )
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq is None
    assert "end record" in report.reason


def test_deleted_last_event_caught(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """Deleting the last event is caught: the end record expects more events and another head."""
    with tamper(sqlite_path, "events_no_delete") as conn:
        conn.execute("DELETE FROM events WHERE run_id = ? AND seq = 6", (run_id,))
    assert len(sqlite_store.events(run_id)) == 5
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq is None
    assert "expects 6 events" in report.reason
    assert "found 5" in report.reason
    assert "run record" in report.message


def test_deleted_middle_event_caught(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """Deleting an event from the middle is reported at the event that follows the gap."""
    with tamper(sqlite_path, "events_no_delete") as conn:
        conn.execute("DELETE FROM events WHERE run_id = ? AND seq = 3", (run_id,))
    report = replayable.verify_run(sqlite_store, run_id)
    assert (report.ok, report.first_bad_seq) == (False, 4)
    assert "removed" in report.reason


def test_reordered_events_caught(sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str) -> None:
    """Swapping two events' chain positions is caught at the first one out of place."""
    with tamper(sqlite_path, "events_no_update") as conn:
        conn.execute(
            "UPDATE events SET chain_index = CASE seq WHEN 2 THEN 2 WHEN 3 THEN 1 END "
            "WHERE run_id = ? AND seq IN (2, 3)",
            (run_id,),
        )
    report = replayable.verify_run(sqlite_store, run_id)
    assert (report.ok, report.first_bad_seq) == (False, 3)


def test_swapped_seq_numbers_caught(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """Swapping two events' seq numbers (the order replay serves them in) is caught."""
    with tamper(sqlite_path, "events_no_update") as conn:
        conn.execute("UPDATE events SET seq = -1 WHERE run_id = ? AND seq = 4", (run_id,))
        conn.execute("UPDATE events SET seq = 4 WHERE run_id = ? AND seq = 5", (run_id,))
        conn.execute("UPDATE events SET seq = 5 WHERE run_id = ? AND seq = -1", (run_id,))
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq in (4, 5)


@pytest.mark.parametrize(
    ("column", "value"),
    [("event_count", 7), ("last_hash", "0" * 64)],
)
def test_edited_end_record_head_caught(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str, column: str, value: object
) -> None:
    """An end record whose count or chain head was edited no longer matches the events."""
    with tamper(sqlite_path, "run_ends_no_update") as conn:
        conn.execute(f"UPDATE run_ends SET {column} = ? WHERE run_id = ?", (value, run_id))
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq is None
    assert "end record" in report.reason


def test_other_runs_unaffected_by_tampering(
    sqlite_store: SQLiteStore, sqlite_path: Path, run_id: str
) -> None:
    """Tampering with one run leaves the verdict on another run's chain unchanged."""
    with replayable.recording(sqlite_store) as rec:
        forecast(["Cairo"])
    with tamper(sqlite_path, "events_no_update") as conn:
        conn.execute("UPDATE events SET response = 'null' WHERE run_id = ? AND seq = 1", (run_id,))
    assert not replayable.verify_run(sqlite_store, run_id).ok
    assert replayable.verify_run(sqlite_store, rec.run_ids[0]).ok


@pytest.mark.parametrize(
    ("table", "trigger", "column", "value"),
    [
        ("run_ends", "run_ends_no_update", "output", "[1.0,2.0,3.0]"),
        ("run_ends", "run_ends_no_update", "status", "failed"),
        ("run_ends", "run_ends_no_update", "ended_at", 0.0),
        ("runs", "runs_no_update", "input", '{"args":[["Paris"]],"kwargs":{}}'),
        ("runs", "runs_no_update", "metadata", '{"approved":true}'),
        ("runs", "runs_no_update", "workflow", "other"),
        ("runs", "runs_no_update", "tenant", "acme"),
    ],
)
def test_edited_run_record_caught(
    sqlite_store: SQLiteStore,
    sqlite_path: Path,
    run_id: str,
    table: str,
    trigger: str,
    column: str,
    value: object,
) -> None:
    """Editing a finished run's start or end record (input, metadata, outcome) is caught."""
    with tamper(sqlite_path, trigger) as conn:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE run_id = ?", (value, run_id))
    report = replayable.verify_run(sqlite_store, run_id)
    assert not report.ok
    assert report.first_bad_seq is None
    assert report.events_checked == 6
