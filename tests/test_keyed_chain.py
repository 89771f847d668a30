"""Keyed chains: HMAC links with a key id, signed seals, an anchor, and the v1 format kept."""

from __future__ import annotations

import base64
import os
import sqlite3
from pathlib import Path

import msgspec
import orjson
import pytest

import replayable
from replayable.errors import ConfigurationError
from replayable.events.canonical import event_hash
from replayable.events.chain import (
    ChainFormatError,
    ChainKey,
    event_digest,
    genesis,
    parse_chain,
    seal_for,
    signed_entry,
    verify_entry,
)
from replayable.store.anchor import FileAnchor
from replayable.store.integrity import Integrity
from replayable.store.keys import FileKeyring, StaticKeys, keys_from_env, new_key_text, parse_key
from replayable.store.sqlite import _DB_VERSION, SQLiteStore
from replayable.store.verify import verify_run, verify_store

SECRET = bytes(range(32))
KEY_TEXT = "k1:" + base64.b64encode(SECRET).decode()


@replayable.tool
def lookup(city: str) -> dict[str, object]:
    return {"city": city, "temp_c": len(city) * 3}


@replayable.workflow
def forecast(cities: list[str]) -> list[object]:
    return [lookup(c)["temp_c"] for c in cities]


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A chain key and a file anchor configured through the environment."""
    anchor = tmp_path / "anchor" / "anchor.log"
    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", KEY_TEXT)
    monkeypatch.setenv("REPLAYABLE_ANCHOR", f"file://{anchor}")
    return anchor


def _record(store: SQLiteStore, cities: list[str]) -> str:
    with replayable.recording(store) as rec:
        forecast(cities)
    return rec.run_ids[0]


# -- test vectors: what the hashes depend on is pinned ---------------------------------


def test_key_derivation_and_hmac_vectors() -> None:
    """Derived keys, the v2 genesis and a link are fixed for a fixed secret."""
    key = ChainKey("k1", SECRET)
    # Pinned values (computed once; a library upgrade must not change them).
    assert genesis(key, "r1") == VECTORS["genesis"]
    assert key.mac(b"replayable") == VECTORS["mac"]
    assert key.public_key.public_bytes_raw().hex() == VECTORS["public"]
    assert genesis(None, "r1") == VECTORS["genesis_v1"]


VECTORS = {
    "genesis": "f292e77f44a27f30d41b9e58d3f18876082c552242969eccb982b6296d9ed23e",
    "mac": "1207eb622d07aa892021f64397e767380e2ceaa6215db6c271039aeb4aca3c80",
    "public": "5ea48b3c479bbebb6dbc4c21507e040e3b340c1a6d110377195b68a27911fa84",
    "genesis_v1": "455093c984c05e6716c9b5c00a64bfcb88fefa5ba02cd33d503562fa71966ca5",
}


def test_labels_are_parsed_never_guessed() -> None:
    """None is v1, '2:kid:mac' is v2; anything else is refused with the reason."""
    assert parse_chain(None).version == 1
    fmt = parse_chain("2:k1:" + "a" * 64)
    assert (fmt.version, fmt.key_id, fmt.keyed) == (2, "k1", True)
    for bad in ("3:k1:" + "a" * 64, "2:k1", "2:k 1:" + "a" * 64, "2:k1:xyz", 7):
        with pytest.raises(ChainFormatError):
            parse_chain(bad)


def test_short_or_badly_named_keys_refused() -> None:
    """A key shorter than 32 bytes, or a key id with odd characters, is a clear error."""
    with pytest.raises(ValueError, match="at least 32"):
        ChainKey("k1", b"short")
    with pytest.raises(ValueError, match="key id"):
        ChainKey("k:1", SECRET)
    with pytest.raises(ConfigurationError, match="REPLAYABLE_CHAIN_KEY"):
        parse_key("no-colon-here")
    with pytest.raises(ConfigurationError, match="base64"):
        parse_key("k1:!!!not base64!!!")


def test_new_key_text_round_trips() -> None:
    """``new_key_text`` makes a value ``parse_key`` reads back as a 32-byte key."""
    key = parse_key(new_key_text("prod-2026"))
    assert key.key_id == "prod-2026"
    assert len(key.secret) == 32


def test_keyring_file_must_be_private(tmp_path: Path) -> None:
    """A keyring readable by others is refused; a private one gives current and old keys."""
    path = tmp_path / "keyring.json"
    other = base64.b64encode(bytes(range(1, 33))).decode()
    path.write_bytes(
        orjson.dumps(
            {"current": "k2", "keys": {"k1": base64.b64encode(SECRET).decode(), "k2": other}}
        )
    )
    os.chmod(path, 0o644)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        FileKeyring(path)
    os.chmod(path, 0o600)
    ring = FileKeyring(path)
    current = ring.current()
    assert current is not None
    assert current.key_id == "k2"
    old = ring.get("k1")
    assert old is not None
    assert old.secret == SECRET
    both = keys_from_env({"REPLAYABLE_CHAIN_KEY": KEY_TEXT, "REPLAYABLE_KEYRING": str(path)})
    assert both is not None
    first = both.current()
    assert first is not None
    assert first.key_id == "k1"
    assert both.get("k2") is not None


def test_plugin_provider_loaded_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """REPLAYABLE_KEY_PROVIDER names a factory; something without the methods is refused."""
    provider = keys_from_env({"REPLAYABLE_KEY_PROVIDER": "tests.kms_plugin:provider"})
    assert provider is not None
    key = provider.current()
    assert key is not None
    assert key.key_id == "kms-1"
    with pytest.raises(ConfigurationError, match="current"):
        keys_from_env({"REPLAYABLE_KEY_PROVIDER": "tests.kms_plugin:not_a_provider"})
    with pytest.raises(ConfigurationError, match="cannot be loaded"):
        keys_from_env({"REPLAYABLE_KEY_PROVIDER": "tests.no_such_module:x"})


def test_anchor_entry_signatures() -> None:
    """A signed entry verifies; any edit of it, or another key, does not."""
    key = ChainKey("k1", SECRET)
    entry = signed_entry(key, {"type": "seal", "run": "r", "count": 3})
    keys = StaticKeys([key])
    assert verify_entry(keys, entry) is None
    assert verify_entry(keys, {**entry, "count": 2}) is not None
    other = StaticKeys([ChainKey("k1", bytes(range(1, 33)))])
    assert verify_entry(other, entry) is not None
    assert "not configured" in (verify_entry(StaticKeys([]), entry) or "")


# -- recording with a key --------------------------------------------------------------


def test_keyed_run_records_and_verifies(sqlite_store: SQLiteStore, keyed: Path) -> None:
    """With a key and an anchor, a run is chained v2, signed, anchored, and intact."""
    rid = _record(sqlite_store, ["Oslo", "Lima"])
    run = sqlite_store.get_run(rid)
    fmt = parse_chain(run.start.chain)
    assert (fmt.version, fmt.key_id) == (2, "k1")
    assert run.end is not None
    assert run.end.signature is not None
    key = ChainKey("k1", SECRET)
    events = sqlite_store.events(rid)
    assert events[0].prev_hash == genesis(key, rid)
    assert all(e.hash == event_digest(key, e) for e in events)
    # The unkeyed v1 hash of the same event is not what was stored.
    assert events[0].hash != event_hash(events[0])
    kinds = [orjson.loads(line)["type"] for line in keyed.read_bytes().splitlines()]
    assert kinds.count("start") == 1
    assert kinds.count("seal") == 1
    assert "head" in kinds
    report = verify_run(sqlite_store, rid)
    assert report.ok, report.message
    assert (report.keyed, report.key_id, report.anchored) == (True, "k1", True)
    assert "key 'k1'" in report.message


def test_rehash_without_the_key_is_caught(
    sqlite_store: SQLiteStore, sqlite_path: Path, keyed: Path
) -> None:
    """Rewriting an event and recomputing every hash the unkeyed way is caught."""
    rid = _record(sqlite_store, ["Oslo", "Lima", "Kyoto"])
    events = sqlite_store.events(rid)
    conn = sqlite3.connect(sqlite_path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("DROP TRIGGER run_ends_no_update")
    prev = genesis(None, rid)
    for e in events:
        edited = e.response if e.seq != 2 else '{"city":"Lima","temp_c":-40}'
        forged = msgspec.structs.replace(e, response=edited, prev_hash=prev)
        forged = msgspec.structs.replace(forged, hash=event_hash(forged))
        conn.execute(
            "UPDATE events SET response = ?, prev_hash = ?, hash = ? WHERE run_id = ? AND seq = ?",
            (forged.response, forged.prev_hash, forged.hash, rid, e.seq),
        )
        prev = forged.hash
    run = sqlite_store.get_run(rid)
    assert run.end is not None
    seal = seal_for(
        None, prev, run.start, run.end.status, run.end.output, None, run.end.ended_at, 3
    )
    conn.execute("UPDATE run_ends SET last_hash = ? WHERE run_id = ?", (seal, rid))
    conn.commit()
    conn.close()
    report = verify_run(sqlite_store, rid)
    assert report.status == "altered"
    assert report.first_bad_seq == 1  # the genesis itself is keyed


def test_unkeyed_runs_still_verify_and_say_so(sqlite_store: SQLiteStore) -> None:
    """Without a key the chain is v1 as before; verify passes and says it is unkeyed."""
    rid = _record(sqlite_store, ["Oslo"])
    run = sqlite_store.get_run(rid)
    assert run.start.chain is None
    assert run.end is not None
    assert run.end.signature is None
    report = verify_run(sqlite_store, rid, integrity=Integrity())
    assert report.ok
    assert not report.keyed
    assert "unkeyed" in report.message


def test_unkeyed_run_fails_once_a_key_is_set(
    sqlite_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v1 run met while a key is configured is named unkeyed, unless accepted."""
    rid = _record(sqlite_store, ["Oslo"])
    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", KEY_TEXT)
    report = verify_run(sqlite_store, rid)
    assert report.status == "unkeyed"
    assert verify_run(sqlite_store, rid, allow_unkeyed=True).ok


def test_v1_database_upgrades_and_its_runs_verify(tmp_path: Path) -> None:
    """A database of schema version 1 gains the new columns; its runs verify as before."""
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    rid = _record(store, ["Oslo", "Lima"])
    store.close()
    conn = sqlite3.connect(path)
    # Make it what version 1 wrote: no chain or signature column, version 1 in meta.
    conn.executescript(
        "DROP TRIGGER runs_no_update; DROP TRIGGER runs_no_delete;"
        "DROP TRIGGER run_ends_no_update; DROP TRIGGER run_ends_no_delete;"
        "ALTER TABLE runs DROP COLUMN chain; ALTER TABLE run_ends DROP COLUMN signature;"
        "UPDATE meta SET value = '1' WHERE key = 'schema_version';"
        "DELETE FROM meta WHERE key = 'store_id';"
    )
    conn.close()
    reopened = SQLiteStore(path)
    try:
        assert verify_run(reopened, rid, integrity=Integrity()).ok
        with sqlite3.connect(path) as raw:
            version = raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert version == (str(_DB_VERSION),)
    finally:
        reopened.close()


def test_deleted_run_and_cut_tail_named_by_the_anchor(
    sqlite_store: SQLiteStore, sqlite_path: Path, keyed: Path
) -> None:
    """Deleting a run is 'missing'; deleting its tail and end record is 'truncated'."""
    gone = _record(sqlite_store, ["Oslo"])
    cut = _record(sqlite_store, ["Oslo", "Lima", "Kyoto"])
    kept = _record(sqlite_store, ["Rome"])
    conn = sqlite3.connect(sqlite_path)
    for t in ("runs", "run_ends", "events", "run_tags"):
        conn.execute(f"DROP TRIGGER {t}_no_delete")
    for t in ("runs", "run_ends", "events", "run_tags"):
        conn.execute(f"DELETE FROM {t} WHERE run_id = ?", (gone,))
    conn.execute("DELETE FROM events WHERE run_id = ? AND seq > 1", (cut,))
    conn.execute("DELETE FROM run_ends WHERE run_id = ?", (cut,))
    conn.commit()
    conn.close()
    report = verify_store(sqlite_store)
    by_id = {r.run_id: r for r in report.runs}
    assert by_id[gone].status == "missing"
    assert by_id[cut].status == "truncated"
    assert by_id[kept].ok
    assert not report.ok
    # Without the anchor the same cut tail passes for a run cut short.
    blind = verify_run(sqlite_store, cut, integrity=Integrity(StaticKeys([ChainKey("k1", SECRET)])))
    assert blind.status == "unsealed"


def test_anchor_written_private(sqlite_store: SQLiteStore, keyed: Path) -> None:
    """The anchor file is created 0600 in a 0700 directory."""
    _record(sqlite_store, ["Oslo"])
    assert keyed.stat().st_mode & 0o777 == 0o600
    assert FileAnchor(keyed).path == keyed


def test_cli_keys_new_prints_a_usable_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """``replayable keys new`` prints a line the environment variable takes as it is."""
    from typer.testing import CliRunner

    from replayable.cli import app

    result = CliRunner().invoke(app, ["keys", "new", "--id", "prod-1"])
    assert result.exit_code == 0, result.output
    name, _, value = result.stdout.strip().partition("=")
    assert name == "REPLAYABLE_CHAIN_KEY"
    assert parse_key(value).key_id == "prod-1"
    monkeypatch.setenv(name, value)
    status = CliRunner().invoke(app, ["keys", "status"])
    assert "key 'prod-1'" in status.stdout
    bad = CliRunner().invoke(app, ["keys", "new", "--id", "no:colons"])
    assert bad.exit_code == 2


def test_mac_is_standard_hmac_sha256() -> None:
    """The precomputed-state MAC equals the standard library's HMAC-SHA256 of the key."""
    import hmac

    key = ChainKey("k1", SECRET)
    for data in (b"", b"x", b"y" * 200, bytes(range(256))):
        assert key.mac(data) == hmac.digest(key.mac_key, data, "sha256").hex()


class _FlakyAnchor:
    """An anchor that is down until told otherwise; keeps what it accepted."""

    url = "test://flaky"

    def __init__(self) -> None:
        self.down = True
        self.kept: list[dict[str, object]] = []

    def publish(self, entries: list[dict[str, object]]) -> None:
        if self.down:
            raise OSError("anchor unreachable")
        self.kept.extend(entries)

    def entries(self) -> list[dict[str, object]]:
        return list(self.kept)

    def close(self) -> None:
        pass


def test_anchor_outage_warns_keeps_recording_and_catches_up() -> None:
    """An anchor that is down does not stop the store write; its entries wait and go out
    once it is back, and verify then finds the run anchored."""
    from replayable.capture.writer.linker import Linker
    from replayable.events.model import RunStart
    from replayable.events.redaction import Redactor
    from replayable.store import MemoryStore

    store = MemoryStore()
    anchor = _FlakyAnchor()
    integrity = Integrity(StaticKeys([ChainKey("k1", SECRET)]), anchor)  # type: ignore[arg-type]
    linker = Linker(store, Redactor(), integrity)
    start = RunStart(
        run_id="r1",
        workflow="w",
        entrypoint="m:f",
        parent_run_id=None,
        parent_seq=None,
        root_run_id="r1",
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata={},
        code={},
        env_hash=None,
        lineage={},
        started_at=1.0,
    )
    chains: dict[str, object] = {}
    linked = linker.start(start)
    linker.starts["r1"] = linked
    event = linker.event(
        ("r1", 1, "tool", "t", "k", None, None, b"{}", b"1", False, None, False, 1.0, 1, None),
        chains,  # type: ignore[arg-type]
    )
    with pytest.warns(RuntimeWarning, match="cannot publish to anchor test://flaky"):
        linker.commit(chains, [])  # type: ignore[arg-type]
    store.append([linked], [event])
    assert anchor.kept == []
    anchor.down = False
    end = linker.end(("r1", "completed", b"1", None, 2.0), {})
    linker.commit({}, ["r1"])
    store.append(ends=[end])
    assert [e["type"] for e in anchor.kept] == ["start", "head", "seal"]
    report = verify_run(store, "r1", integrity=integrity)
    assert report.ok, report.message
    assert report.anchored
