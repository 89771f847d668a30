"""The blob tier's append path: batches compressed off the writing thread, stored blobs
not sent again, and a batch with no large payload written as before the tier."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import msgspec
import orjson
import pytest

from replayable.events.canonical import event_hash, fingerprint, genesis_hash
from replayable.events.ids import uuid7
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store import payloads, verify_run
from replayable.store.payloads import _LONG, PayloadTier, _has_long_string, _Seen, split_payload
from replayable.store.sqlite import SQLiteStore


def _start(run_id: str) -> RunStart:
    return RunStart(
        run_id=run_id,
        workflow="tiers.ingest",
        entrypoint="tests:ingest",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata={},
        code={},
        env_hash=None,
        lineage={},
        started_at=1000.0,
    )


def _events(run_id: str, requests: list[str]) -> list[Event]:
    out: list[Event] = []
    prev = genesis_hash(run_id)
    for i, request in enumerate(requests):
        e = Event(
            run_id=run_id,
            seq=i + 1,
            kind="llm",
            name="chat.completions.create",
            key=f"r:{i}",
            parent=None,
            call_site=None,
            request=request,
            fingerprint=fingerprint("llm", "chat.completions.create", request.encode()),
            response='{"ok":true}',
            encoding="json",
            error=None,
            side_effect=False,
            started_at=1000.0 + i,
            duration_ns=1000,
            metadata={},
            chain_index=i,
            prev_hash=prev,
            hash="",
        )
        e = msgspec.structs.replace(e, hash=event_hash(e))
        out.append(e)
        prev = e.hash
    return out


def _end(events: list[Event]) -> RunEnd:
    return RunEnd(
        run_id=events[0].run_id,
        status="completed",
        output="1",
        error=None,
        ended_at=2000.0,
        event_count=len(events),
        last_hash=events[-1].hash,
    )


def _big(i: int) -> str:
    rows = [{"id": i, "sku": f"SKU-{k:04d}", "qty": k, "note": "x" * 40} for k in range(14)]
    return orjson.dumps({"id": i, "rows": rows}, option=orjson.OPT_SORT_KEYS).decode()


def _count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        [(n,)] = db.execute(f"SELECT count(*) FROM {table}")
    return int(n)


def test_a_large_batch_is_compressed_on_another_thread_and_reads_back(tmp_path: Path) -> None:
    """A batch with more new blobs than the threaded minimum: every payload reads back
    exactly, the chain verifies, and a second run of the same payloads adds no blob."""
    n = payloads._THREADED_BATCH * 3
    texts = [_big(i) for i in range(n)]
    assert all(len(t) > payloads.DEFAULT_THRESHOLD for t in texts)
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    try:
        first, second = (
            uuid7(1_700_000_000_000, b"\x01" * 10),
            uuid7(1_700_000_000_001, b"\x02" * 10),
        )
        events = _events(first, texts)
        store.append([_start(first)], events, [_end(events)])
        assert _count(path, "payload_blobs") == n
        events = _events(second, texts)
        store.append([_start(second)], events, [_end(events)])
        assert _count(path, "payload_blobs") == n
    finally:
        store.close()
    fresh = SQLiteStore(path)  # nothing cached
    try:
        for run_id in (first, second):
            assert [e.request for e in fresh.events(run_id)] == texts
            # Every event's hash, over the payload put back together, matches its chain.
            report = verify_run(fresh, run_id)
            assert (report.events_checked, report.first_bad_seq) == (n, None), report.message
    finally:
        fresh.close()


def test_a_failure_while_compressing_leaves_nothing_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compressing fails on the background thread: append raises that error, and neither
    the events nor the blobs of the batch are stored; the next append works."""
    texts = [_big(i) for i in range(payloads._THREADED_BATCH)]
    store = SQLiteStore(tmp_path / "runs.db")
    run_id = uuid7(1_700_000_000_000, b"\x03" * 10)
    original = PayloadTier._pack

    def broken(self, backend, rows, compressors=None):  # type: ignore[no-untyped-def]
        raise MemoryError("zstd could not allocate")

    try:
        store.append([_start(run_id)], [])
        monkeypatch.setattr(PayloadTier, "_pack", broken)
        with pytest.raises(MemoryError, match="zstd could not allocate"):
            store.append([], _events(run_id, texts))
        assert store.events(run_id) == []
        assert store.tier_stats().blobs == 0
        monkeypatch.setattr(PayloadTier, "_pack", original)
        store.append([], _events(run_id, texts))
        assert [e.request for e in store.events(run_id)] == texts
    finally:
        store.close()


def test_a_blob_deleted_under_a_store_is_written_again_once_forgotten(tmp_path: Path) -> None:
    """The in-memory set of stored blobs skips sending them again; after ``forget_stored``
    (what maintenance calls when it deletes blobs) a payload needing one stores it again."""
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    texts = [_big(1)]
    try:
        a, b = uuid7(1_700_000_000_000, b"\x04" * 10), uuid7(1_700_000_000_001, b"\x05" * 10)
        store.append([_start(a)], _events(a, texts))
        with sqlite3.connect(path) as db:
            db.execute("DROP TRIGGER payload_blobs_no_delete")
            db.execute("DELETE FROM payload_blobs")
        store.tier.forget_stored()
        store.append([_start(b)], _events(b, texts))
        assert [e.request for e in SQLiteStore(path).events(b)] == texts
    finally:
        store.close()


def test_new_databases_keep_blobs_in_a_rowid_table_keyed_by_digest_head(tmp_path: Path) -> None:
    """Blob bytes are appended in write order; only the index on the digest's first 56
    bits (not on its 64 hex digits and the key space) is in digest order."""
    store = SQLiteStore(tmp_path / "runs.db")
    store.close()
    with sqlite3.connect(tmp_path / "runs.db") as db:
        [(sql,)] = db.execute("SELECT sql FROM sqlite_master WHERE name = 'payload_blobs'")
        [(index,)] = db.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = 'payload_blobs' AND type = 'index'"
        )
    assert "WITHOUT ROWID" not in sql.upper()
    assert "PRIMARY KEY" not in sql.upper()
    assert "(digest_head)" in index


def test_a_blob_another_store_object_stored_is_not_stored_twice(tmp_path: Path) -> None:
    """With no unique key on the digest, a blob stored already (by another store object,
    which this one cannot know of) is found by its head and skipped: one row per blob and
    key space, and both runs read back."""
    path = tmp_path / "runs.db"
    texts = [_big(i) for i in range(payloads._THREADED_BATCH + 5)]
    a, b = uuid7(1_700_000_000_000, b"\x06" * 10), uuid7(1_700_000_000_001, b"\x07" * 10)
    one, two = SQLiteStore(path), SQLiteStore(path)
    try:
        one.append([_start(a)], _events(a, texts))
        two.append([_start(b)], _events(b, [*texts, _big(10_000)]))
        assert _count(path, "payload_blobs") == len(texts) + 1
        fresh = SQLiteStore(path)
        try:
            assert [e.request for e in fresh.events(a)] == texts
            assert [e.request for e in fresh.events(b)] == [*texts, _big(10_000)]
        finally:
            fresh.close()
    finally:
        one.close()
        two.close()


def test_the_same_blob_in_two_tenants_is_stored_once_per_tenant(tmp_path: Path) -> None:
    """Two key spaces share a digest and so a head: each has its row, and each reads its own."""
    path = tmp_path / "runs.db"
    text = _big(3)
    store = SQLiteStore(path)
    try:
        ids = []
        for n, tenant in enumerate(("acme", "globex")):
            rid = uuid7(1_700_000_000_000 + n, bytes([8 + n]) * 10)
            store.append(
                [msgspec.structs.replace(_start(rid), tenant=tenant)], _events(rid, [text])
            )
            ids.append(rid)
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT tenant, digest_head FROM payload_blobs").fetchall()
        assert sorted(t for t, _ in rows) == ["acme", "globex"]
        assert len({h for _, h in rows}) == 1
        fresh = SQLiteStore(path)
        try:
            assert [fresh.events(rid)[0].request for rid in ids] == [text, text]
        finally:
            fresh.close()
    finally:
        store.close()


def test_a_blob_whose_head_was_altered_reads_as_missing(tmp_path: Path) -> None:
    """A row whose digest_head no longer matches its digest is not found under it: the
    payload is named unreadable, not read from some other row or silently empty; a
    reference that is not hex finds nothing either, without an error."""
    path = tmp_path / "runs.db"
    rid = uuid7(1_700_000_000_000, b"\x0a" * 10)
    store = SQLiteStore(path)
    try:
        store.append([_start(rid)], _events(rid, [_big(1), _big(2)]))
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER payload_blobs_no_update")
        (digest,) = db.execute("SELECT request_ref FROM events WHERE seq = 1").fetchone()
        db.execute(
            "UPDATE payload_blobs SET digest_head = digest_head + 1 WHERE digest = ?", (digest,)
        )
    fresh = SQLiteStore(path)
    try:
        first, second = fresh.events(rid)
        assert any("missing" in p for p in first.problems), first.problems
        assert second.request == _big(2)
        assert not second.problems
        assert fresh.tier_blobs("", ["zz" * 32, "+1" + "0" * 62]) == []
    finally:
        fresh.close()


def test_a_file_with_the_older_blob_key_is_read_and_written(tmp_path: Path) -> None:
    """A file whose payload_blobs has the (tenant, subject, digest) key of schema 3 and 4
    keeps it: blobs are written (a stored one skipped by the key), read and deduplicated."""
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE payload_blobs (tenant TEXT NOT NULL, subject TEXT NOT NULL, "
            "digest TEXT NOT NULL, codec TEXT NOT NULL, size INTEGER NOT NULL, data BLOB NOT "
            "NULL, PRIMARY KEY (tenant, subject, digest))"
        )
    texts = [_big(i) for i in range(payloads._THREADED_BATCH + 1)]
    a, b = uuid7(1_700_000_000_000, b"\x0b" * 10), uuid7(1_700_000_000_001, b"\x0c" * 10)
    one, two = SQLiteStore(path), SQLiteStore(path)
    try:
        one.append([_start(a)], _events(a, texts))
        two.append([_start(b)], _events(b, texts))
        assert _count(path, "payload_blobs") == len(texts)
        with sqlite3.connect(path) as db:
            cols = {r[1] for r in db.execute("PRAGMA table_info(payload_blobs)")}
        assert "digest_head" not in cols
        fresh = SQLiteStore(path)
        try:
            for rid in (a, b):
                assert [e.request for e in fresh.events(rid)] == texts
                assert verify_run(fresh, rid).first_bad_seq is None
        finally:
            fresh.close()
    finally:
        one.close()
        two.close()


def test_the_long_string_screen_agrees_with_the_pattern() -> None:
    """The block screen before the long-string pattern never changes its answer."""
    rnd = random.Random(7)
    for _ in range(3000):
        size = rnd.randrange(0, 2500)
        density = rnd.random() * 0.03
        text = "".join('"' if rnd.random() < density else "é" for _ in range(size))
        assert _has_long_string(text) == (_LONG.search(text) is not None), (size, density)


def test_the_stored_set_is_bounded() -> None:
    seen = _Seen(10)
    seen.update(range(8))
    seen.update(range(8, 12))
    assert len(seen) == 5  # full: the newer half kept
    assert 11 in seen
    assert 7 in seen
    assert 6 not in seen
    seen.clear()
    assert 11 not in seen


def test_a_message_is_found_past_an_object_that_starts_like_it() -> None:
    """A segment is located by its first characters, then compared whole: an earlier
    object with the same first 64 characters (no role, so not a segment) is passed over,
    the message is cut where it really is, and the pieces give the payload back."""
    content = "A" * 100
    decoy = {"content": content + "z"}
    message = {"content": content + "x", "role": "user"}
    text = orjson.dumps({"a": decoy, "b": message}, option=orjson.OPT_SORT_KEYS).decode()
    wanted = orjson.dumps(message, option=orjson.OPT_SORT_KEYS).decode()
    assert text.find(wanted[:64]) < text.find(wanted)  # the decoy comes first
    pieces, tail = split_payload(text)
    assert pieces == [(text[: text.find(wanted)], wanted)]
    assert "".join(literal + segment for literal, segment in pieces) + tail == text


@pytest.mark.parametrize("sealing", [False, True])
def test_a_split_payloads_reference_holds_its_whole_sha256(sealing: bool) -> None:
    """The payload digest a reference starts with, built from its pieces' bytes, is the
    sha256 of the payload's text, non-ASCII text between and inside the messages too,
    and with every literal made a blob of its own (encrypting)."""
    from replayable.events.canonical import payload_digest

    rnd = random.Random(11)
    tier = PayloadTier()
    if sealing:
        tier.seal = lambda tenant, data, digest: ("k", data)
    words = ["hé", "naïve", "日本", "ok", "\\u2028", "x" * 70, "🙂", '\\"q\\"']
    for _ in range(300):
        messages = [
            {
                "role": rnd.choice(["user", "assistant"]),
                "content": " ".join(rnd.choices(words, k=rnd.randrange(1, 40))),
            }
            for _ in range(rnd.randrange(1, 6))
        ]
        body: dict[str, object] = {"messages": messages, "model": rnd.choice(words)}
        if rnd.random() < 0.5:
            body["doc"] = "ü" * rnd.randrange(500, 900)
        text = orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()
        ref = tier.externalize(None, "", text, payloads.TierRows())  # type: ignore[arg-type]
        assert ref[:64] == payload_digest(text), text
