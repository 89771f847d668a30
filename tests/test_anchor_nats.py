"""The JetStream anchor against the real NATS server on 127.0.0.1:4222.

Skipped when the server cannot be reached, except under ``CI=true``, where a missing
server fails the build (as the PostgreSQL tests do).
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayable
from replayable.store.anchor import open_anchor
from replayable.store.anchor_nats import JetStreamAnchor
from replayable.store.sqlite import SQLiteStore
from replayable.store.verify import verify_store

SERVER = os.environ.get("REPLAYABLE_TEST_NATS", "127.0.0.1:4222")


@replayable.tool
def lookup(city: str) -> int:
    return len(city)


@replayable.workflow
def towns(cities: list[str]) -> list[int]:
    return [lookup(c) for c in cities]


@pytest.fixture
def subject() -> str:
    host, port = SERVER.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError as exc:
        message = f"NATS at {SERVER} is not reachable: {exc}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: the NATS tests must run)")
        pytest.skip(message)
    return f"replayable.test.{secrets.token_hex(4)}"


@pytest.fixture
def anchor(subject: str) -> Iterator[JetStreamAnchor]:
    a = open_anchor(f"nats://{SERVER}/{subject}")
    assert isinstance(a, JetStreamAnchor)
    yield a
    a.close()


def test_entries_published_and_read_back(anchor: JetStreamAnchor) -> None:
    """Entries published to the subject come back in order, whole."""
    entries = [{"type": "start", "run": f"r{i}", "store": "s", "n": i} for i in range(5)]
    anchor.publish(entries[:2])
    anchor.publish(entries[2:])
    assert list(anchor.entries()) == entries


def test_stream_refuses_deletes(anchor: JetStreamAnchor) -> None:
    """The stream is made with deletes and purges denied."""
    anchor.publish([{"type": "start", "run": "r", "store": "s"}])

    async def config() -> tuple[bool, bool]:
        js = await anchor._connect()
        info = await js.stream_info(anchor.stream)
        return bool(info.config.deny_delete), bool(info.config.deny_purge)

    assert anchor._run(config()) == (True, True)


def test_recorded_runs_anchored_on_jetstream(
    subject: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a JetStream anchor, a deleted run is named missing and the rest verify."""
    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", "k1:" + base64.b64encode(bytes(32)).decode())
    monkeypatch.setenv("REPLAYABLE_ANCHOR", f"nats://{SERVER}/{subject}")
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    try:
        with replayable.recording(store) as rec:
            towns(["Oslo", "Lima"])
            towns(["Rome"])
        gone, kept = rec.run_ids
        assert verify_store(store).ok
        conn = sqlite3.connect(path)
        for t in ("runs", "run_ends", "events", "run_tags"):
            conn.execute(f"DROP TRIGGER {t}_no_delete")
            conn.execute(f"DELETE FROM {t} WHERE run_id = ?", (gone,))
        conn.commit()
        conn.close()
        statuses = {r.run_id: r.status for r in verify_store(store).runs}
        assert statuses == {gone: "missing", kept: "intact"}
    finally:
        store.close()
