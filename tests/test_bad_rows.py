"""Readers report a bad row (run, seq, column, what is wrong) and go on; verify and runs
name orphaned events, gaps and missing end records, each distinctly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import typer
from click.testing import CliRunner, Result

import replayable
from replayable.cli import app
from replayable.store.rows import event_from_row, run_from_row
from replayable.store.sqlite import SQLiteStore
from tests import agents_for_cli as agents

_COMMAND = typer.main.get_command(app)


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "VARIANT", "original")
    for name in ("REPLAYABLE_STORE", "REPLAYABLE_CHAIN_KEY", "REPLAYABLE_ANCHOR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    with replayable.recording(store) as rec:
        agents.research("bad rows")
    store.close()
    return path, rec.run_ids[0]


def _raw(path: Path, statement: str, params: tuple[object, ...]) -> None:
    conn = sqlite3.connect(path)
    for (name,) in list(conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")):
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute(statement, params)
    conn.commit()
    conn.close()


def _cli(path: Path, *args: str) -> Result:
    return CliRunner().invoke(
        _COMMAND, ["--store", f"sqlite:///{path}", *args], env={"COLUMNS": "250"}
    )


def test_row_decoding_names_the_column_and_keeps_the_rest() -> None:
    """A bad column becomes a placeholder and a problem naming it; the others are read."""
    good = ["r", 3, "tool", "t", None, None, None, "{}", "f", "1", "json", None, 0, 1.0, 5]
    tail = ["{}", 2, "p", "h", 1]
    assert event_from_row(good + tail).problems == ()
    event = event_from_row([*good, "{broken", *tail[1:]])
    assert len(event.problems) == 1
    assert event.problems[0].startswith("metadata: is not valid JSON")
    assert (event.metadata, event.name, event.seq) == ({}, "t", 3)
    texty = event_from_row(["r", "x", *good[2:], *tail])
    assert texty.problems == ("seq: is str 'x', not an integer",)
    assert texty.seq == 3  # chain_index + 1 stands in for the unreadable seq
    run = run_from_row(
        ["r", "w", "e", None, None, "r", None, "[]", "{}", "{}", None, "{}", 1.0, 1, None]
    )
    assert run.problems == ("input: is JSON list, not an object",)


def test_invalid_event_metadata_reported_by_every_reader(recorded: tuple[Path, str]) -> None:
    """Invalid JSON in one event's metadata: verify names run, seq and column and exits 1,
    runs flags the run, show prints the row as unreadable, replay stops at that step."""
    path, run_id = recorded
    _raw(path, "UPDATE events SET metadata = '{oops' WHERE run_id = ? AND seq = 2", (run_id,))
    verify = _cli(path, "verify", "--all")
    assert verify.exit_code == 1
    assert f"run {run_id}: event 2: unreadable column metadata" in verify.stdout
    runs = _cli(path, "runs")
    assert runs.exit_code == 0
    assert f"run {run_id}: unreadable event seq 2: metadata" in runs.output
    show = _cli(path, "show", run_id)
    assert show.exit_code == 0
    assert f"seq 2 is unreadable: run {run_id}, metadata: is not valid JSON" in show.stdout
    replay = _cli(path, "replay", run_id)
    assert replay.exit_code == 1
    assert "step 2" in replay.output
    assert "unreadable" in replay.output
    assert "Traceback" not in replay.output


def test_text_seq_stops_replay_clearly(recorded: tuple[Path, str]) -> None:
    """A seq stored as text is reported; replay stops there instead of crashing."""
    path, run_id = recorded
    _raw(path, "UPDATE events SET seq = 'three' WHERE run_id = ? AND seq = 3", (run_id,))
    replay = _cli(path, "replay", run_id)
    assert replay.exit_code == 1, replay.output
    assert "unreadable" in replay.output
    assert "seq: is str 'three', not an integer" in replay.output
    assert "Traceback" not in replay.output


def test_invalid_run_metadata_listed_flagged(recorded: tuple[Path, str]) -> None:
    """A run whose metadata is not JSON is still listed, flagged, and fails verify."""
    path, run_id = recorded
    _raw(path, "UPDATE runs SET metadata = 'nope' WHERE run_id = ?", (run_id,))
    runs = _cli(path, "runs")
    assert runs.exit_code == 0
    assert run_id[:8] in runs.stdout
    assert "unreadable row: metadata: is not valid JSON" in runs.output
    assert _cli(path, "verify", run_id).exit_code == 1
    replay = _cli(path, "replay", run_id)
    assert replay.exit_code == 2
    assert "record is unreadable (metadata" in replay.output


def test_orphans_gaps_and_missing_ends_named_distinctly(recorded: tuple[Path, str]) -> None:
    """Events without a run row are orphaned; a missing seq is a gap; no end is unsealed."""
    path, run_id = recorded
    store = SQLiteStore(path)
    with replayable.recording(store) as rec:
        agents.research("second")
    store.close()
    other = rec.run_ids[0]
    _raw(path, "DELETE FROM runs WHERE run_id = ?", (run_id,))
    _raw(path, "DELETE FROM events WHERE run_id = ? AND seq = 2", (other,))
    verify = _cli(path, "verify", "--all", "--json")
    assert verify.exit_code == 1
    import orjson

    statuses = {r["run_id"]: r for r in orjson.loads(verify.stdout)}
    assert statuses[run_id]["status"] == "orphaned"
    assert statuses[other]["status"] == "altered"  # the chain breaks where the gap is
    assert statuses[other]["gaps"] == [[2, 2]]
    runs = _cli(path, "runs")
    assert "orphaned" in runs.output
    assert run_id in runs.output
    assert "gap in its sequence: seq 2 missing" in runs.output
    _raw(path, "DELETE FROM run_ends WHERE run_id = ?", (other,))
    text = _cli(path, "verify", other)
    assert text.exit_code == 1
    assert "incomplete" in _cli(path, "runs").stdout


# -- the one-pass reader of sound rows ------------------------------------------------

_SOUND = (
    "r-1", 17, "tool", "lookup", "0.17", None, "agent.py:12", '{"args":[17],"kwargs":{}}',
    "ab" * 32, '{"i":17}', "json", None, 0, 1764590000.5, 12345, '{"k":[1]}', 16,
    "cd" * 32, "ef" * 32, 1,
)  # fmt: skip


def _columnwise(row: tuple[object, ...]) -> object:
    from replayable.events.model import Event
    from replayable.store.rows import EVENT_COLUMNS, _decode

    values, problems = _decode(EVENT_COLUMNS, row)
    assert problems == ()
    return Event(**values)


@pytest.mark.parametrize(
    "change",
    [
        {},
        {4: None, 6: None, 9: None},  # no key, call site or response
        {5: 3, 11: '{"type":"ValueError","message":"x","args":[]}'},
        {12: True},  # PostgreSQL hands back a boolean
        {12: 1, 10: "tagged"},
        {13: 1764590000},  # an integral time
    ],
    ids=["plain", "nulls", "parent-error", "pg-bool", "tagged", "int-time"],
)
def test_sound_rows_read_in_one_pass_as_column_by_column(change: dict[int, object]) -> None:
    """The fast reader gives exactly the event the checking decoder gives."""
    from replayable.store.rows import _sound_event

    row = tuple(change.get(i, v) for i, v in enumerate(_SOUND))
    fast = _sound_event(row)
    assert fast is not None
    assert fast == _columnwise(row)
    assert event_from_row(row) == fast


@pytest.mark.parametrize(
    ("col", "bad"),
    [
        (0, None), (1, "17"), (2, 3), (4, 5), (5, "3"), (6, b"x"), (7, "{not json"),
        (7, None), (8, None), (9, "[1,"), (10, "msgpack"), (11, "[1]"), (11, "nope"),
        (12, 2), (12, "yes"), (13, float("nan")), (13, float("inf")), (13, "now"),
        (14, 1.5), (15, "[]"), (15, "{"), (15, None), (16, "16"), (17, None), (18, 7),
        (19, 0), (19, 99), (19, "1"),
    ],
)  # fmt: skip
def test_every_unsound_column_leaves_the_row_to_the_checking_decoder(col: int, bad: object) -> None:
    """No row the column-by-column decoder would fault gets past the fast reader, and
    event_from_row still names the column."""
    from replayable.store.rows import EVENT_COLUMNS, _sound_event

    row = tuple(bad if i == col else v for i, v in enumerate(_SOUND))
    assert _sound_event(row) is None
    event = event_from_row(row)
    assert any(p.startswith(EVENT_COLUMNS[col][0] + ":") for p in event.problems), event.problems


def test_short_and_long_rows_leave_the_fast_reader() -> None:
    from replayable.store.rows import _sound_event

    assert _sound_event(_SOUND[:-1]) is None
    assert _sound_event((*_SOUND, "extra")) is None
    assert event_from_row(_SOUND[:-1]).problems == ("schema_version: column is missing",)


# -- the column-wise reader of a batch of rows (SQLite's events) ------------------------


def _rows_with(col: int, value: object) -> list[tuple[object, ...]]:
    """Three rows of sound values, the middle one with ``value`` in column ``col``."""
    rows = []
    for i in range(3):
        row = list(_SOUND)
        row[1], row[16] = 17 + i, 16 + i
        if i == 1 and col >= 0:
            row[col] = value
        rows.append(tuple(row))
    return rows


@pytest.mark.parametrize(
    "change",
    [
        {},
        {4: None, 6: None, 9: None},
        {5: 3, 11: '{"type":"ValueError","message":"x","args":[]}'},
        {11: "@tier:error/ab"},  # an error kept in the tier: no JSON to check here
        {12: 1, 10: "tagged"},
        {13: 1764590000},
        {15: "{}"},
    ],
    ids=["plain", "nulls", "parent-error", "tier-error", "tagged", "int-time", "no-meta"],
)
def test_sound_columns_read_as_row_by_row(change: dict[int, object]) -> None:
    """Columns whose every value is sound give, at once, the events each row gives."""
    from replayable.store.rows import events_from_columns, sound_events

    rows = [tuple(change.get(i, v) for i, v in enumerate(r)) for r in _rows_with(-1, None)]
    columns = list(zip(*rows, strict=True))
    fast = sound_events(columns)
    assert fast is not None
    assert fast == [event_from_row(r) for r in rows]
    assert all(e.problems == () for e in fast)
    assert events_from_columns(columns) == fast
    assert [type(e.started_at) for e in fast] == [float] * 3
    assert [type(e.side_effect) for e in fast] == [bool] * 3


@pytest.mark.parametrize(
    ("col", "bad"),
    [
        (0, None), (0, b"r-1"), (1, "17"), (1, 17.0), (1, None), (2, 3), (2, b"tool"),
        (3, None), (4, 5), (4, b"k"), (5, "3"), (5, 3.0), (6, b"x"), (6, 1), (7, "{not json"),
        (7, None), (7, b"{}"), (7, ""), (8, None), (8, 8), (9, "[1,"), (9, b"{}"), (9, 1.5),
        (10, "msgpack"), (10, None), (10, b"json"), (11, "[1]"), (11, "nope"), (11, b"{}"),
        (11, 4), (12, 2), (12, -1), (12, "yes"), (12, 1.0), (12, None), (13, float("nan")),
        (13, float("inf")), (13, float("-inf")), (13, "now"), (13, None), (13, b"\x00"),
        (14, 1.5), (14, None), (14, "5"), (15, "[]"), (15, "{"), (15, None), (15, "null"),
        (15, b"{}"), (16, "16"), (16, 16.0), (17, None), (17, 7), (18, 7), (18, b"\x01"),
        (19, 0), (19, 99), (19, "1"), (19, 1.0), (19, None),
    ],
)  # fmt: skip
def test_one_unsound_value_sends_every_row_to_the_checking_decoder(col: int, bad: object) -> None:
    """No batch holding a value the row decoder would fault (of any type the sqlite3
    module gives) gets past the column-wise reader; the rows read as row by row."""
    from replayable.store.rows import EVENT_COLUMNS, events_from_columns, sound_events

    rows = _rows_with(col, bad)
    columns = list(zip(*rows, strict=True))
    assert sound_events(columns) is None
    events = events_from_columns(columns)
    assert events == [event_from_row(r) for r in rows]
    assert events[0].problems == events[2].problems == ()
    name = EVENT_COLUMNS[col][0]
    assert any(p.startswith(name + ":") for p in events[1].problems), events[1].problems


def test_column_reader_odd_shapes() -> None:
    from replayable.store.rows import events_from_columns, sound_events

    assert events_from_columns([() for _ in range(20)]) == []
    assert sound_events([() for _ in range(19)]) is None
    big = _rows_with(14, 2**62)  # a sum of the column past 64 bits stays an int
    assert sound_events(list(zip(*big, strict=True))) == [event_from_row(r) for r in big]
    huge = [(*r[:13], 1.7e308, *r[14:]) for r in _rows_with(-1, None)]
    # The times' sum overflows to inf: the rows are read one by one, and are sound.
    assert sound_events(list(zip(*huge, strict=True))) is None
    assert events_from_columns(list(zip(*huge, strict=True))) == [event_from_row(r) for r in huge]
    assert all(e.problems == () for e in events_from_columns(list(zip(*huge, strict=True))))


_TAMPERED = [
    ("kind", "x'746f6f6c'"),  # the blob of the text 'tool'
    ("name", "x'ff00'"),
    ("parent", "'three'"),
    ("parent", "2.5"),
    ("call_site", "x'61'"),
    ("site", "'x'"),
    ("site", "3.0"),
    ("site", "999999"),
    ("key", "12"),  # text affinity: the text '12', sound
    ("duration_ns", "1.5"),
    ("duration_ns", "0.30000000000000004"),
    ("chain_index", "1e300"),
    ("side_effect", "2"),
    ("started_at", "'now'"),
    ("started_at", "9e999"),
    ("error", "x'7b7d'"),
    ("error", "'[1]'"),
    ("encoding", "'msgpack'"),
    ("schema_version", "99"),
    ("metadata", "'[]'"),
    ("request", "'{not json'"),
    ("response", "x'7b7d'"),
    ("request_ref", "x'00'"),
    ("response_ref", "1.25"),
    ("fingerprint", "x'0102'"),
    ("prev_hash", "7"),
    ("hash", "'short'"),
    ("duration_ns", "9e999"),  # an infinity where JSON has no number for it
    ("seq", "seq + 0.5"),
]


@pytest.mark.parametrize(("column", "value"), _TAMPERED, ids=[f"{c}={v}" for c, v in _TAMPERED])
def test_sqlite_packed_read_gives_what_the_stored_read_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, column: str, value: str
) -> None:
    """The SQLite reader's packed select (small columns in one JSON array a row) reads
    exactly what the select of the stored columns reads, for a sound run and for one
    with a hostile value of any storage class in any column (then it leaves the read to
    the stored columns)."""
    from tests.test_store_contract import (
        ENV_DIGEST,
        ENV_SNAPSHOT,
        make_end,
        make_events,
        make_start,
        new_id,
    )

    rid = new_id(11)
    events = make_events(rid, 9)
    store = SQLiteStore(tmp_path / "runs.db")
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    try:
        store.append([make_start(rid)], events, [make_end(rid, events)])
        assert store._packed_events("WHERE run_id = ? ORDER BY seq", (rid,)) is not None
        assert store.events(rid) == events
        with sqlite3.connect(tmp_path / "runs.db") as db:
            db.execute("DROP TRIGGER events_no_update")
            db.execute(f"UPDATE events SET {column} = {value} WHERE seq IN (2, 3)")
            db.commit()
        read = (
            store.events(rid),
            store.events_until(rid, 4),
            store.events_range(rid, 2, 3),
            store.event_at(rid, 3),
        )
        monkeypatch.setattr(SQLiteStore, "_packed_events", lambda *a: None)
        stored = (
            store.events(rid),
            store.events_until(rid, 4),
            store.events_range(rid, 2, 3),
            store.event_at(rid, 3),
        )
    finally:
        store.close()
    assert read == stored
    assert read[0][0] == events[0]
    assert read[0][5:] == events[5:]


@pytest.mark.parametrize(
    ("table", "column", "where"),
    [("events", "metadata", "seq = 2"), ("events", "name", "seq = 2"), ("runs", "metadata", "1")],
)
def test_invalid_utf8_in_a_text_column_is_a_bad_row_not_a_failed_read(
    recorded: tuple[Path, str], table: str, column: str, where: str
) -> None:
    """Bytes that are not UTF-8 stored in a text column make that row unreadable, named
    by run, seq and column, and every other row is still read; the sqlite3 driver's own
    decoding failed the whole query (every reader of the run, or of the list of runs)."""
    path, run_id = recorded
    _raw(
        path,
        f"UPDATE {table} SET {column} = CAST(X'7bff22' AS TEXT) WHERE run_id = ? AND {where}",
        (run_id,),
    )
    verify = _cli(path, "verify", "--all")
    assert verify.exit_code == 1, verify.output
    assert "Traceback" not in verify.output
    assert "UTF-8" in verify.output, verify.output
    runs = _cli(path, "runs")
    assert runs.exit_code == 0, runs.output
    assert run_id[:8] in runs.stdout
    store = SQLiteStore(path)
    try:
        if table == "events":
            events = store.events(run_id)
            bad = [e for e in events if e.problems]
            assert [e.seq for e in bad] == [2]
            assert bad[0].problems[0].startswith(f"{column}: is not valid UTF-8")
            assert len(events) >= 3
            assert all(not e.problems for e in events if e.seq != 2)
            show = _cli(path, "show", run_id)
            assert show.exit_code == 0, show.output
            assert f"seq 2 is unreadable: run {run_id}, {column}: is not valid UTF-8" in show.stdout
        else:
            (run,) = store.list_runs()
            assert run.problems
            assert run.problems[0].startswith(f"{column}: is not valid UTF-8")
    finally:
        store.close()
