"""Payload encryption, key rotation and erasure by crypto-shredding."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replayable.cli import app
from replayable.errors import AccessDeniedError, ConfigurationError
from replayable.store import verify_run
from replayable.store.crypto import ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER
from replayable.store.payloads import parse_codec
from replayable.store.sqlite import SQLiteStore
from tests.test_store_contract import (
    ENV_DIGEST,
    ENV_SNAPSHOT,
    canonical,
    make_end,
    make_start,
    new_id,
    payload_events,
)

SECRET = "the merger closes on friday " * 80


def _kek(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


@pytest.fixture
def kek(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, f"kek1:{_kek(1)}")


def _record(store: SQLiteStore, n: int, subject: str | None = None, text: str = SECRET) -> str:
    rid = new_id(n)
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    events = payload_events(rid, [(canonical({"doc": text, "n": n}), None), ('{"q":1}', None)])
    meta = {"data_subject": subject} if subject else {}
    start = make_start(rid, metadata=meta)
    store.append([start], events, [make_end(rid, events, start=start)])
    return rid


def _raw_blobs(path: Path) -> list[tuple[str, bytes]]:
    with sqlite3.connect(path) as conn:
        return [(r[0], bytes(r[1])) for r in conn.execute("SELECT codec, data FROM payload_blobs")]


def test_blobs_are_encrypted_at_rest_and_read_back(tmp_path: Path, kek: None) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    try:
        rid = _record(store, 1)
        assert SECRET in store.events(rid)[0].request
        assert verify_run(store, rid).ok
    finally:
        store.close()
    blobs = _raw_blobs(path)
    assert blobs
    for codec, data in blobs:
        assert parse_codec(codec)[1] is not None  # the key id travels in the blob
        assert b"merger" not in data
    with sqlite3.connect(path) as conn:
        (kek_id, wrapped) = conn.execute("SELECT kek_id, wrapped FROM data_keys").fetchone()
    assert kek_id == "kek1"
    assert len(wrapped) == 12 + 32 + 16  # nonce, key, tag: never the key in clear


def test_without_the_kek_payloads_are_named_unreadable(
    tmp_path: Path, kek: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        rid = _record(store, 2)
    monkeypatch.delenv(ENV_DATA_KEY)
    with SQLiteStore(path) as store:
        event = store.events(rid)[0]
        assert event.request == "null"
        assert "none of which is configured" in event.problems[0]
        assert not verify_run(store, rid).ok
    monkeypatch.setenv(ENV_DATA_KEY, f"kek1:{_kek(7)}")  # the right id, the wrong secret
    with SQLiteStore(path) as store:
        assert store.events(rid)[0].problems


def test_altered_ciphertext_is_named_by_the_reader(tmp_path: Path, kek: None) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        rid = _record(store, 3)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER payload_blobs_no_update")
        conn.execute(
            "UPDATE payload_blobs SET data = substr(data, 1, 20) || x'00' || substr(data, 22)"
        )
    with SQLiteStore(path) as store:
        problems = store.events(rid)[0].problems
        assert "does not decrypt" in problems[0]
        assert not verify_run(store, rid).ok


def test_rotation_rewraps_data_keys_without_rewriting_payloads(
    tmp_path: Path, kek: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    with SQLiteStore(path) as store:
        rid = _record(store, 4)
    before = _raw_blobs(path)
    ring = tmp_path / "ring.json"
    ring.write_text(json.dumps({"current": "kek2", "keys": {"kek1": _kek(1), "kek2": _kek(2)}}))
    os.chmod(ring, 0o600)
    monkeypatch.delenv(ENV_DATA_KEY)
    monkeypatch.setenv(ENV_DATA_KEYRING, str(ring))
    result = CliRunner().invoke(app, ["keys", "rotate", "--store", url])
    assert result.exit_code == 0, result.output
    assert "re-wrapped 1 data key" in result.output
    again = CliRunner().invoke(app, ["keys", "rotate", "--store", url])
    assert "re-wrapped 0 data key(s)" in again.output
    assert _raw_blobs(path) == before  # payloads untouched
    # The old KEK retired: the re-wrapped key still opens every payload.
    ring.write_text(json.dumps({"current": "kek2", "keys": {"kek2": _kek(2)}}))
    with SQLiteStore(path) as store:
        assert SECRET in store.events(rid)[0].request
        new = _record(store, 5, text="after rotation " * 100)
        assert verify_run(store, new).ok


def test_rotation_without_the_old_kek_is_refused(
    tmp_path: Path, kek: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        _record(store, 6)
    monkeypatch.setenv(ENV_DATA_KEY, f"kek9:{_kek(9)}")
    result = CliRunner().invoke(app, ["keys", "rotate", "--store", f"sqlite:///{path}"])
    assert result.exit_code != 0
    assert "wrapped by kek1" in result.output


def test_a_kms_plugin_wraps_data_keys(
    tmp_path: Path, kek: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_DATA_KEY)
    monkeypatch.setenv(ENV_DATA_PROVIDER, "tests.kms_plugin:wrapper")
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        rid = _record(store, 7)
        assert store.__dict__["data_keys"].wrapper.calls == 1
    with SQLiteStore(path) as store:
        assert SECRET in store.events(rid)[0].request
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT kek_id FROM data_keys").fetchone() == ("kms-kek-1",)
    monkeypatch.setenv(ENV_DATA_PROVIDER, "tests.kms_plugin:provider")  # a key provider works too
    with SQLiteStore(tmp_path / "other.db") as store:
        assert SECRET in store.events(_record(store, 8))[0].request
    monkeypatch.setenv(ENV_DATA_PROVIDER, "tests.kms_plugin:not_a_provider")
    with pytest.raises(ConfigurationError, match="neither a key wrapper"):
        SQLiteStore(tmp_path / "third.db")


def test_erasing_a_subject_shreds_its_payloads_only(tmp_path: Path, kek: None) -> None:
    """After `erase --subject`, that subject's payloads read "erased on DATE by WHO",
    its chains still verify and its metadata remains; other subjects are untouched."""
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    with SQLiteStore(path) as store:
        erased = _record(store, 10, subject="customer-123")
        kept = _record(store, 11, subject="customer-456")
        plain = _record(store, 12)
    refused = CliRunner().invoke(app, ["erase", "--subject", "customer-123", "--store", url])
    assert refused.exit_code != 0
    assert "--yes" in refused.output
    result = CliRunner().invoke(
        app, ["erase", "--subject", "customer-123", "--yes", "--purpose", "GDPR-7", "--store", url]
    )
    assert result.exit_code == 0, result.output
    assert "1 data key(s) destroyed" in result.output
    with SQLiteStore(path) as store:
        event = store.events(erased)[0]
        assert event.erased is not None
        assert event.erased.startswith("erased on 20")
        assert " by " in event.erased
        assert SECRET not in event.request
        assert event.erased in event.request
        assert (event.kind, event.name) == ("llm", "step_1")  # metadata remains
        # Encrypted stores keep no payload in clear, however small: this one is erased too.
        assert store.events(erased)[1].erased is not None
        report = verify_run(store, erased)
        assert report.ok, report
        assert SECRET in store.events(kept)[0].request
        assert SECRET in store.events(plain)[0].request
        entries = store.access_entries()
        assert any(e.what == ("erasure",) and e.purpose == "GDPR-7" for e in entries)
    shown = CliRunner().invoke(app, ["show", erased, "--store", url])
    assert shown.exit_code == 0, shown.output
    assert "erased on" in shown.output
    verified = CliRunner().invoke(app, ["verify", erased, "--store", url])
    assert verified.exit_code == 0, verified.output


def test_erasing_a_tenant_covers_its_subjects(tmp_path: Path, kek: None) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        a = _record(store, 20, subject="s1")
        b = _record(store, 21)
    from replayable.archive.erasure import erase

    with SQLiteStore(path) as store:
        done = erase(store, tenant="")
        assert len(done.key_ids) == 2
        for rid in (a, b):
            assert store.events(rid)[0].erased is not None
            assert verify_run(store, rid).ok


def test_only_an_admin_may_erase(tmp_path: Path, kek: None) -> None:
    from replayable.archive.erasure import erase
    from replayable.audit.actor import Actor

    with SQLiteStore(tmp_path / "runs.db") as store:
        rid = _record(store, 30, subject="s")
        with pytest.raises(AccessDeniedError):
            erase(store, subject="s", actor=Actor(user="eve", role="analyst", login="eve"))
        assert SECRET in store.events(rid)[0].request
