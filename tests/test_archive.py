"""The Parquet archive: local directory and a real S3 API (moto's server), kill and rerun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import replayable
from replayable.archive.parquet import RetentionPolicy, archive, parse_age
from replayable.cli import app
from replayable.errors import ConfigurationError
from replayable.store import verify_run
from replayable.store.cold import ENV_ARCHIVE_OPTIONS, filesystem
from replayable.store.sqlite import SQLiteStore
from tests import agents_chat
from tests.test_store_contract import (
    ENV_DIGEST,
    ENV_SNAPSHOT,
    canonical,
    make_end,
    make_start,
    new_id,
    payload_events,
)

ROOT = Path(__file__).resolve().parents[1]


def _record(store: SQLiteStore, n: int, *, started_at: float = 1000.0, events: int = 3) -> str:
    rid = new_id(n)
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    payloads = [
        (canonical({"doc": "context " * 300, "i": i}), f'{{"i":{i}}}') for i in range(events)
    ]
    evs = payload_events(rid, payloads)
    start = make_start(rid, started_at=started_at, workflow="triage" if n % 2 else "billing")
    store.append([start], evs, [make_end(rid, evs, start=start)])
    return rid


def _archived_rows(fs, root: str) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    out: list[tuple[str, int]] = []
    for path in fs.glob(root.rstrip("/") + "/events/**/*.parquet"):
        table = pq.read_table(path, filesystem=fs, columns=["run_id", "seq"])
        out += list(
            zip(table.column("run_id").to_pylist(), table.column("seq").to_pylist(), strict=False)
        )
    return out


def _check_archive(store: SQLiteStore, dest: str, runs: dict[str, list]) -> None:  # type: ignore[type-arg]
    for rid, events in runs.items():
        assert store.events(rid) == events
        assert store.event_at(rid, 2) == events[1]
        assert store.events_until(rid, 1) == events[:1]
        assert verify_run(store, rid).ok
    fs, root = filesystem(dest)
    rows = _archived_rows(fs, root)
    assert len(rows) == len(set(rows)) == sum(len(e) for e in runs.values())


def test_archive_to_a_local_directory_reads_back_transparently(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    dest = tmp_path / "archive"
    store = SQLiteStore(path)
    try:
        runs = {}
        for n in range(1, 6):
            rid = _record(store, n)
            runs[rid] = store.events(rid)
        recent = _record(store, 9, started_at=4_000_000_000.0)  # the future: stays hot
        report = archive(store, str(dest), older_than=parse_age("30d"), part_runs=2)
        assert (report.runs, report.parts) == (5, 3)
        assert recent not in store.archived_ids()
        store.cold.forget()
        _check_archive(store, str(dest), runs)
    finally:
        store.close()
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.parquet"))
    assert files[0].startswith("blobs/tenant=_/date=1970-01-01/part-")
    assert any(f.startswith("events/tenant=_/date=1970-01-01/part-") for f in files)
    meta = pq.ParquetFile(dest / next(f for f in files if f.startswith("events/"))).metadata
    assert meta.row_group(0).column(7).compression == "ZSTD"
    with sqlite3.connect(path) as conn:
        hot = conn.execute(
            "SELECT count(*) FROM events WHERE request <> 'null' AND run_id IN "
            f"({','.join('?' * len(runs))})",
            list(runs),
        ).fetchone()
    assert hot == (0,)  # the hot copies are gone; the rows (metadata, hashes) remain
    again = SQLiteStore(path)  # a new store object reads through the index
    try:
        for rid, events in runs.items():
            assert again.events(rid) == events
        assert again.events(recent)[0].request.startswith('{"doc"')
    finally:
        again.close()


def test_archived_recorded_run_replays_shows_and_diffs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = replayable.open_store(url)
    try:
        with replayable.recording(store) as rec:
            agents_chat.chat_agent(4)
            agents_chat.chat_agent(4, topic=" again")
        first, second = rec.run_ids
    finally:
        store.close()
    result = CliRunner().invoke(
        app, ["archive", "--older-than", "0s", "--to", str(tmp_path / "arch"), "--store", url]
    )
    assert result.exit_code == 0, result.output
    assert "archived 2 run(s)" in result.output
    store = replayable.open_store(url)
    try:
        assert store.archived_ids() == {first, second}
        replayed = replayable.replay(first, store=store)
        assert replayed.status == "identical", replayed.divergence
    finally:
        store.close()
    for args in (["show", first], ["verify", first]):
        shown = CliRunner().invoke(app, [*args, "--store", url])
        assert shown.exit_code == 0, shown.output
    diff = CliRunner().invoke(app, ["diff", first, second, "--store", url])
    assert diff.exit_code == 1, diff.output  # they differ, as recorded
    assert "Question 0 again" in diff.output
    shown = CliRunner().invoke(app, ["show", first, "--store", url, "--json"])
    assert "careful contract reviewer" in shown.output


def test_retention_policy_per_workflow(tmp_path: Path) -> None:
    policy = RetentionPolicy.from_config(
        {"retention": {"hot_days": 30, "workflows": {"triage": {"hot_days": 1}}}}
    )
    now = 1000.0 + 5 * 86_400
    with SQLiteStore(tmp_path / "runs.db") as store:
        triage, billing = _record(store, 1), _record(store, 2)
        archive(store, str(tmp_path / "a"), policy=policy, now=now)
        assert store.archived_ids() == {triage}
        assert billing not in store.archived_ids()
    with pytest.raises(ConfigurationError, match="non-negative number"):
        RetentionPolicy.from_config({"retention": {"hot_days": "soon"}})
    with pytest.raises(ConfigurationError, match="number and a unit"):
        parse_age("30 days")


def test_archive_needs_a_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAYABLE_ARCHIVE", raising=False)
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    SQLiteStore(tmp_path / "runs.db").close()
    result = CliRunner().invoke(app, ["archive", "--store", url])
    assert result.exit_code != 0
    assert "name the archive" in result.output


def test_killed_archiver_rerun_loses_nothing_and_archives_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    dest = tmp_path / "archive"
    with SQLiteStore(path) as store:
        runs = {}
        for n in range(1, 121):
            rid = _record(store, n, events=2)
            runs[rid] = store.events(rid)
    argv = [
        sys.executable, "-m", "replayable.cli", "archive", "--older-than", "1d", "--to",
        str(dest), "--part-runs", "1", "--store", f"sqlite:///{path}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "300"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout is not None
    # Each part prints its write, then its drop: kill after the third part's write, so
    # the job dies between writing, indexing and dropping parts.
    lines: list[str] = []
    while sum(line.startswith("part ") for line in lines) < 3:
        lines.append(proc.stdout.readline())
        assert lines[-1].startswith(("part ", "dropped the hot payloads of part ")), lines
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert sum(line.startswith("dropped ") for line in lines) >= 2
    with SQLiteStore(path) as store:
        indexed = store.archived_ids()
        assert 2 <= len(indexed) < len(runs)  # cut off mid-way
        # Nothing lost: a run whose hot payloads are gone is indexed, and reads back.
        dropped = _hot_dropped(path)
        assert len(dropped) >= 2
        assert dropped <= indexed
        for rid in dropped:
            assert store.events(rid) == runs[rid]
    rerun = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    with SQLiteStore(path) as store:
        assert store.archived_ids() == set(runs)
        assert store.archive_pending() == []
        assert _hot_dropped(path) == set(runs)
        _check_archive(store, str(dest), runs)


def _hot_dropped(path: Path) -> set[str]:
    """The runs none of whose hot rows holds a payload any more."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT run_id FROM events GROUP BY run_id HAVING sum(request <> 'null' OR "
            "response IS NOT NULL OR request_ref IS NOT NULL OR response_ref IS NOT NULL) = 0"
        ).fetchall()
    return {str(r[0]) for r in rows}


# -- a real S3 API: moto's server on 127.0.0.1 ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _close_s3_clients()
        server.stop()


def _close_s3_clients() -> None:
    """Drop the cached S3 filesystems and collect their pooled connections now, so that
    no socket to the server is left for a later test to be blamed for."""
    import gc
    import warnings

    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def s3_archive(s3: str, monkeypatch: pytest.MonkeyPatch) -> str:
    options = {
        "s3": {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": s3, "region_name": "us-east-1"},
        }
    }
    monkeypatch.setenv(ENV_ARCHIVE_OPTIONS, json.dumps(options))
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    if "replayable-archive" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="replayable-archive")
    fs, _ = filesystem("s3://replayable-archive/")
    fs.invalidate_cache()
    return "s3://replayable-archive/runs"


def test_archive_to_s3_reads_back_transparently(tmp_path: Path, s3_archive: str) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        runs = {}
        for n in range(1, 4):
            rid = _record(store, n)
            runs[rid] = store.events(rid)
        report = archive(store, s3_archive, older_than=0.0)
        assert report.runs == 3
        assert report.urls[0].startswith("s3://replayable-archive/runs/events/tenant=_/")
        store.cold.forget()
        _check_archive(store, s3_archive, runs)
    finally:
        store.close()


def test_row_groups_hold_whole_runs_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of mixed sizes, read from the store a few runs at a time: each row group
    holds whole runs and, but for the last, at least ROW_GROUP_ROWS rows; the rows are in
    (run, seq) order, and every run reads back from the archive."""
    from replayable.archive import parquet

    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 12)
    store = SQLiteStore(tmp_path / "runs.db")
    dest = tmp_path / "archive"
    try:
        runs = {}
        for n, size in enumerate([2, 9, 2, 2, 30, 2, 2, 3, 5, 13, 4], start=1):
            rid = _record(store, n, events=size)
            runs[rid] = store.events(rid)
        report = archive(store, str(dest), older_than=0.0, part_runs=100)
        assert (report.parts, report.events) == (1, sum(len(e) for e in runs.values()))
        store.cold.forget()
        _check_archive(store, str(dest), runs)
    finally:
        store.close()
    for path in sorted(dest.glob("events/**/*.parquet")):
        meta = pq.ParquetFile(path)
        groups = [
            meta.read_row_group(i, columns=["run_id", "seq"]).to_pylist()
            for i in range(meta.num_row_groups)
        ]
        assert len(groups) >= 3
        owners: dict[str, int] = {}
        for i, group in enumerate(groups):
            if i < len(groups) - 1:
                assert len(group) >= 12
            for row in group:
                assert owners.setdefault(row["run_id"], i) == i, "a run split across row groups"
        flat = [(r["run_id"], r["seq"]) for g in groups for r in g]
        assert flat == sorted(flat)


def _run_with(store: SQLiteStore, n: int, docs: list[str], *, started_at: float) -> str:
    rid = new_id(n)
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    evs = payload_events(rid, [(canonical({"doc": d}), '{"ok":true}') for d in docs])
    start = make_start(rid, started_at=started_at)
    store.append([start], evs, [make_end(rid, evs, start=start)])
    return rid


def _blob_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM payload_blobs").fetchone()[0])


def test_blobs_only_archived_runs_use_are_dropped_and_shared_ones_kept(tmp_path: Path) -> None:
    """After the archive drops its runs' hot payloads, `drop_archived_blobs` deletes the
    blobs no hot run references: the archived run still reads back whole from its
    archive and verifies, the hot run sharing a blob with it keeps that blob, and a
    second store object on the file (another process's writer) that saw the dropped
    blob stored writes it again when a new run needs it."""
    path = tmp_path / "runs.db"
    shared, only_old, later = "shared " * 300, "archived only " * 300, "later " * 300
    store = SQLiteStore(path)
    other = SQLiteStore(path)
    try:
        old = _run_with(store, 1, [shared, only_old], started_at=1000.0)
        hot = _run_with(store, 2, [shared], started_at=4_000_000_000.0)
        # The other object stores the archived-only payload too: it now takes it as stored.
        seen = _run_with(other, 3, [only_old, later], started_at=4_000_000_000.0)
        before = {rid: store.events(rid) for rid in (old, hot, seen)}
        assert _blob_count(path) == 3
        report = archive(store, str(tmp_path / "archive"), older_than=parse_age("30d"))
        assert report.blobs_dropped == 0  # the third run still uses it
        assert store.drop_archived_blobs() == (0, 0)
        assert verify_run(store, seen).ok
    finally:
        store.close()
        other.close()
    # Only runs archived with its blob: archive the third run too, then collect.
    store = SQLiteStore(path)
    other = SQLiteStore(path)
    try:
        report = archive(store, str(tmp_path / "archive"), older_than=0.0, now=4_000_000_001.0)
        assert store.archived_ids() == {old, hot, seen}
        assert report.blobs_dropped == 3
        assert _blob_count(path) == 0
        store.cold.forget()
        for rid, events in before.items():
            assert store.events(rid) == events
            assert verify_run(store, rid).ok
        # The other object remembers "archived only" as stored; its next run needs it.
        again = _run_with(other, 4, [only_old], started_at=4_000_000_000.0)
        assert _blob_count(path) == 1
    finally:
        store.close()
        other.close()
    fresh = SQLiteStore(path)
    try:
        [event] = fresh.events(again)
        assert event.request_value() == {"doc": only_old}
        assert verify_run(fresh, again).ok
    finally:
        fresh.close()


def test_a_hot_run_keeps_the_blob_it_shares_with_an_archived_one(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    try:
        shared, mine = "shared " * 300, "mine " * 300
        old = _run_with(store, 1, [shared, mine], started_at=1000.0)
        hot = _run_with(store, 2, [shared], started_at=4_000_000_000.0)
        events = {rid: store.events(rid) for rid in (old, hot)}
        report = archive(store, str(tmp_path / "archive"), older_than=parse_age("30d"))
        assert (report.blobs_dropped, report.nodes_dropped) == (1, 1)  # its blob and node
        assert _blob_count(path) == 1
        store.cold.forget()
        for rid, evs in events.items():
            assert store.events(rid) == evs
            assert verify_run(store, rid).ok
    finally:
        store.close()
    fresh = SQLiteStore(path)  # nothing cached: the hot run's blob is read from the file
    try:
        assert fresh.events(hot) == events[hot]
    finally:
        fresh.close()


def test_an_altered_node_stops_the_blob_drop_before_anything_goes(tmp_path: Path) -> None:
    """A hot node whose body no longer matches its digest: which blobs it needs is
    unknown, so nothing is dropped and the error names the node."""
    from replayable.errors import StoreError

    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    try:
        old = _run_with(store, 1, ["gone " * 300], started_at=1000.0)
        _run_with(store, 2, ["kept " * 300], started_at=4_000_000_000.0)
        archive(store, str(tmp_path / "archive"), older_than=parse_age("30d"), drop=False)
        assert old in store.archived_ids()
        assert store.drop_archived_payloads([old]) == 1
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER payload_nodes_no_update")
            conn.execute('UPDATE payload_nodes SET body = \'[["x","y"]]\'')
        before = _blob_count(path)
        with pytest.raises(StoreError, match=r"payload node \w{12} is altered"):
            store.drop_archived_blobs()
        assert _blob_count(path) == before == 2
    finally:
        store.close()


def test_a_part_read_back_with_one_hash_changed_is_neither_indexed_nor_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-back compares digests of the run ids, seqs and hashes, not only counts: a
    file with every row present but one hash altered (or two rows swapped) is refused."""
    import pyarrow as pa

    from replayable.archive import parquet
    from replayable.errors import StoreError

    store = SQLiteStore(tmp_path / "runs.db")
    rids = [_record(store, n, events=4) for n in (1, 2)]
    real = parquet._check_part

    for damage in ("hash", "swap"):

        def damaged(part, written, tier, damage=damage):  # type: ignore[no-untyped-def]
            table = pq.read_table(part.events_url)
            if damage == "hash":
                hashes = table.column("hash").to_pylist()
                hashes[5] = "0" * 64
                table = table.set_column(
                    table.schema.get_field_index("hash"), "hash", pa.array(hashes)
                )
            else:
                order = list(range(table.num_rows))
                order[1], order[2] = order[2], order[1]
                table = table.take(order)
            pq.write_table(table, part.events_url)
            real(part, written, tier)

        monkeypatch.setattr(parquet, "_check_part", damaged)
        with pytest.raises(StoreError, match="does not hold what was written"):
            archive(store, str(tmp_path / "arch"), older_than=0.0)
        assert store.archived_ids() == set()
    monkeypatch.setattr(parquet, "_check_part", real)
    before = {rid: store.events(rid) for rid in rids}
    report = archive(store, str(tmp_path / "arch"), older_than=0.0)
    assert report.resumed == 1
    assert store.archived_ids() == set(rids)
    assert {rid: store.events(rid) for rid in rids} == before
    store.close()


def test_the_read_back_digests_do_not_depend_on_how_rows_are_cut() -> None:
    """The same rows in one table, in slices, or in other chunks (as row groups read back)
    give the same digests; nulls count by row number; one changed value differs."""
    import pyarrow as pa

    from replayable.archive.parquet import _Rows

    table = pa.table(
        {
            "run_id": ["a", "bb", "ccc", None, "e", ""],
            "seq": pa.array([1, 2, None, 4, 5, 6], pa.int64()),
            "hash": ["x", "", "zz", "w", "v", "u"],
        }
    )

    def digest(*parts) -> _Rows:  # type: ignore[no-untyped-def]
        rows = _Rows()
        for part in parts:
            rows.add(part)
        return rows

    whole = digest(table)
    assert whole == digest(table.slice(0, 1), table.slice(1, 2), table.slice(3))
    assert whole == digest(pa.Table.from_batches(table.to_batches(max_chunksize=4)))
    assert whole == digest(table.slice(0, 3), pa.Table.from_batches(table.slice(3).to_batches(2)))
    moved_null = table.set_column(0, "run_id", pa.array(["a", "bb", None, "ccc", "e", ""]))
    assert whole != digest(moved_null)
    assert whole != digest(table.set_column(1, "seq", pa.array([1, 2, None, 4, 5, 7])))
    assert whole != digest(table.slice(0, 5))


def _fast_and_general(store: SQLiteStore, run_ids: list[str]):  # type: ignore[no-untyped-def]
    """The events table of ``run_ids`` by the SQLite fast path and by the general one (the
    store's ``stored_columns``), each with the tier references it found, or the type of
    the error it raised; the fast path's ``None`` (it left the rows to the general one)."""
    import pyarrow as pa

    from replayable.archive import parquet, sqlite_table

    schema = pa.schema([(n, parquet._EVENT_TYPES[n]) for n in parquet.EVENT_FIELDS])
    spaces = store.run_spaces(run_ids)

    def outcome(fn):  # type: ignore[no-untyped-def]
        try:
            return fn()
        except Exception as exc:
            return type(exc)

    def fast():  # type: ignore[no-untyped-def]
        return sqlite_table.event_table(store, sqlite_table.read_rows(store, run_ids), schema)

    def general():  # type: ignore[no-untyped-def]
        refs: dict[str, set[str]] = {}
        columns = store.stored_columns(run_ids)
        return parquet._event_table(pa, schema, columns, spaces, refs), refs

    def through_batches():  # type: ignore[no-untyped-def]
        refs: dict[str, set[str]] = {}
        tables = list(parquet._event_tables(store, run_ids, schema, spaces, refs))
        return pa.concat_tables(tables), refs

    return outcome(fast), outcome(general), outcome(through_batches)


#: Rows as no writer of this version stores them, each archived as the general path does
#: (or refused with the same error): older text hashes, odd flags, call sites by text,
#: missing or odd site ids, blobs and NULs in text, numbers of the wrong kind.
ODD_ROWS = [
    "UPDATE events SET hash = x'0102' WHERE seq = 2",
    "UPDATE events SET prev_hash = 'ABCDEF', fingerprint = lower(hex(fingerprint)) WHERE seq = 1",
    "UPDATE events SET hash = zeroblob(33) WHERE seq = 3",
    "UPDATE events SET fingerprint = 7 WHERE seq = 3",
    "UPDATE events SET side_effect = 2 WHERE seq = 1",
    "UPDATE events SET side_effect = 0.5 WHERE seq = 2",
    "UPDATE events SET side_effect = 1.0 WHERE seq = 2",
    "UPDATE events SET side_effect = -0.0 WHERE seq = 2",
    "UPDATE events SET side_effect = 'yes' WHERE seq = 2",
    "UPDATE events SET call_site = 'old.py:1', site = NULL WHERE seq = 1",
    "UPDATE events SET call_site = 'old.py:2' WHERE site IS NOT NULL",
    "UPDATE events SET site = 9999 WHERE seq = 2",
    "UPDATE events SET site = 'x' WHERE seq = 2",
    "UPDATE events SET kind = x'6c6c6d' WHERE seq = 1",
    "UPDATE events SET kind = x'ff' WHERE seq = 1",
    "UPDATE events SET key = 'a' || char(0) || 'é', metadata = '' WHERE seq = 1",
    "UPDATE events SET parent = 2.5 WHERE seq = 3",
    "UPDATE events SET started_at = 'noon' WHERE seq = 3",
    "UPDATE events SET schema_version = 2147483648 WHERE seq = 1",
    "UPDATE events SET chain_index = 9223372036854775807, duration_ns = -1 WHERE seq = 1",
    "UPDATE events SET request = CAST(x'ff' AS TEXT) WHERE seq = 2",
    "UPDATE events SET request_ref = 'b:nowhere', error = 'plain' WHERE seq = 2",
]


@pytest.mark.parametrize("change", ["", *ODD_ROWS])
def test_the_sqlite_fast_path_reads_what_the_general_path_reads(
    tmp_path: Path, change: str
) -> None:
    """The archive reads an SQLite store's rows into Arrow in C; for every row, usual or
    odd, that gives the table (and tier references) the store's stored_columns do, or
    the same error. Usual rows never fall back."""
    from tests.test_store_contract import make_events

    store = SQLiteStore(tmp_path / "runs.db")
    rids = []
    for n in (1, 2):
        rid = new_id(n)
        events = make_events(rid, 7)
        store.append([make_start(rid)], events, [make_end(rid, events)])
        rids.append(rid)
    rids.append(_record(store, 3, events=4))  # payloads in the tier: references
    store.close()
    if change:
        with sqlite3.connect(tmp_path / "runs.db") as db:
            db.execute("DROP TRIGGER events_no_update")
            db.execute(change)
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        fast, general, batches = _fast_and_general(store, sorted(rids))
    finally:
        store.close()
    if isinstance(general, type):
        assert batches is general
        assert fast is None or fast is general
        return
    table, refs = general
    assert refs, "the test's rows reference the tier"
    assert batches[1] == refs
    assert batches[0].equals(table)
    if fast is not None:
        assert fast.equals(table)
    # Only what this path cannot give exactly as the general one sends it there.
    falls_back = ("fingerprint = 7", "'yes'", "site = 'x'", "2147483648", "'noon'")
    assert (fast is None) == any(odd in change for odd in falls_back)


def test_an_archive_by_the_fast_path_holds_what_the_general_path_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same store archived with the SQLite fast path and without it (every batch by
    stored_columns): the same events files, row for row, and the same blobs."""
    from replayable.archive import parquet
    from tests.test_store_contract import make_events

    store = SQLiteStore(tmp_path / "runs.db")
    for n in range(1, 8):
        rid = new_id(n)
        events = make_events(rid, 5 + n)
        store.append([make_start(rid)], events, [make_end(rid, events)])
    for n in range(8, 11):
        _record(store, n, events=n)
    store.close()
    db = sqlite3.connect(tmp_path / "runs.db")
    db.execute("DROP TRIGGER events_no_update")
    db.execute("UPDATE events SET hash = lower(hex(hash)), side_effect = 2 WHERE seq = 3")
    db.commit()
    db.close()  # the last connection: the WAL goes into the file copied next
    shutil.copy(tmp_path / "runs.db", tmp_path / "general.db")
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 10)
    tables = {}
    for name in ("runs", "general"):
        if name == "general":
            monkeypatch.setattr(parquet, "event_table", lambda *_: None)
        store = SQLiteStore(tmp_path / f"{name}.db")
        try:
            archive(store, str(tmp_path / f"arch-{name}"), older_than=0.0)
        finally:
            store.close()
        tables[name] = {
            kind: pq.read_table(str(tmp_path / f"arch-{name}" / kind)).sort_by(
                [("run_id", "ascending"), ("seq", "ascending")]
                if kind == "events"
                else [("kind", "ascending"), ("digest", "ascending")]
            )
            for kind in ("events", "blobs")
        }
    assert tables["runs"]["events"].num_rows == sum(range(6, 13)) + sum(range(8, 11))
    assert tables["runs"]["blobs"].num_rows > 0
    for kind in ("events", "blobs"):
        assert tables["runs"][kind].equals(tables["general"][kind])
    assert None in tables["runs"]["events"].column("side_effect").to_pylist()


def test_a_parts_local_files_are_on_stable_storage_before_it_is_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot payloads go once their part is indexed: by then its three files, and the
    directories that name them, were fsynced."""
    from replayable.archive import parquet

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    seen: list[list[str]] = []
    real_commit = parquet._commit

    def commit(store, part):  # type: ignore[no-untyped-def]
        seen.append(list(synced))
        real_commit(store, part)

    monkeypatch.setattr(parquet.os, "fsync", fsync)
    monkeypatch.setattr(parquet, "_commit", commit)
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        _record(store, 1)
        archive(store, str(tmp_path / "arch"), older_than=0.0)
    finally:
        store.close()
    (files,) = seen
    written = sorted(str(p) for p in (tmp_path / "arch").glob("*/*/*/*.parquet"))
    assert len(written) == 3
    for path in written:
        assert path in files
        parent = Path(path).parent
        for directory in (parent, parent.parent, parent.parent.parent, tmp_path / "arch"):
            assert str(directory) in files
