"""Golden runs: every record schema and chain format this project has written, replayed.

``events1-*`` were recorded before event records hashed their payloads' digests
(event schema 1), ``events2-*`` after; ``chain1`` unkeyed, ``chain2`` keyed.

The files in ``tests/golden/`` were recorded once (``python -m tests.golden.record``)
and are never rewritten: the suite replays them against today's code, so a change that
would stop old recordings from replaying, decoding or verifying fails here first.
"""

from __future__ import annotations

import dataclasses
import decimal
from pathlib import Path

import orjson
import pytest

import replayable
from replayable.events.chain import CHAIN_V1, CHAIN_V2, parse_chain
from replayable.events.model import EVENT_SCHEMA_VERSION, SCHEMA_VERSION
from replayable.store.integrity import Integrity
from replayable.testing import FIXTURE_VERSION, load_fixture
from tests.golden.record import GOLDEN_KEY

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.replay"))


def _header(path: Path) -> dict:
    return orjson.loads(path.read_bytes().split(b"\n", 1)[0])


def _records(path: Path, kind: bytes) -> list[dict]:
    lines = path.read_bytes().splitlines()[1:]
    return [orjson.loads(ln) for ln in lines if ln.startswith(b'{"record":"' + kind + b'"')]


def test_every_schema_and_chain_format_has_a_golden_run():
    """Bumping the run or event record schema, the chain format or the fixture layout
    without checking in a golden run of the new one fails here."""
    layouts = {_header(p)["version"] for p in FILES}
    starts = [r["start"] for p in FILES for r in _records(p, b"run")]
    run_schemas = {s["schema_version"] for s in starts}
    event_schemas = {e["schema_version"] for p in FILES for e in _records(p, b"event")}
    chains = {parse_chain(s["chain"]).version for s in starts}
    assert layouts >= set(range(1, FIXTURE_VERSION + 1))
    assert run_schemas >= set(range(1, SCHEMA_VERSION + 1))
    assert event_schemas >= set(range(1, EVENT_SCHEMA_VERSION + 1)), (
        "no golden run of the newest event schema: `python -m tests.golden.record "
        f"events{EVENT_SCHEMA_VERSION}-chain1` and `… -chain2`"
    )
    assert chains >= {CHAIN_V1, CHAIN_V2}
    # Each event schema with each chain format, so the keyed and unkeyed links of every
    # event layout are exercised.
    pairs = {
        (e["schema_version"], parse_chain(s["chain"]).version)
        for p in FILES
        for s in [r["start"] for r in _records(p, b"run")]
        for e in _records(p, b"event")
        if e["run_id"] == s["run_id"]
    }
    assert pairs >= {(v, c) for v in range(1, EVENT_SCHEMA_VERSION + 1) for c in (1, 2)}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_run_verifies_and_replays_identically(path, monkeypatch):
    """Each golden run's chain verifies (the keyed one under its test key) and the run,
    with its two child runs, replays identically with every value's type intact."""
    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", GOLDEN_KEY)
    fx, store = load_fixture(path)
    assert len(fx.starts) in (3, 4)
    for run_id in fx.run_ids:
        report = replayable.verify_run(
            store, run_id, integrity=Integrity.from_env(), anchor=None, allow_unkeyed=True
        )
        assert report.ok, report.message
    result = replayable.replay(fx.root, store=store)
    assert result.status == "identical", result.divergence and result.divergence.message
    output = result.output
    if isinstance(output, dict):  # a session (event schema 2 on): basket, then a chat
        assert [r.startswith("Noted: turn") for r in output["replies"]] == [True] * 3
        output = output["lines"]
    first = output[0]
    assert dataclasses.is_dataclass(first["quote"])
    assert first["quote"].price == decimal.Decimal("19.99")
    assert first["stock"]["alpha"]["skus"] == ("SKU-1", "extra")
    assert first["stock"]["alpha"]["tags"] == frozenset({"a", "b"})
    assert list(first["stock"]) == ["zeta", "alpha", "tier", "id", "when", "ratio", "big", "text"]
    assert first["note"] == "no supplier for SKU-1"
    for child in fx.run_ids[1:]:
        assert replayable.replay(child, store=store).status == "identical"


DATABASES = sorted(GOLDEN.glob("sqlite-v*.sql"))


def test_every_sqlite_schema_version_has_a_golden_database():
    """A new SQLite schema version without a database of it checked in fails here."""
    from replayable.store.sqlite import _DB_VERSION

    found = {int(p.stem.removeprefix("sqlite-v")) for p in DATABASES}
    missing = set(range(1, _DB_VERSION + 1)) - found
    assert not missing, (
        f"no golden database of SQLite schema {sorted(missing)}: run "
        "`python -m tests.golden.record_sqlite` with the version that writes it"
    )


@pytest.mark.parametrize("dump", DATABASES, ids=[p.stem for p in DATABASES])
def test_a_database_written_by_each_store_version_upgrades_verifies_and_replays(
    dump, tmp_path, monkeypatch
):
    """A SQLite database as each version of the store wrote it (``sqlite-v1`` and ``-v2``
    by the code of those versions, dumped to SQL) opens with today's store, is upgraded
    to the current schema, verifies, and its run replays identically."""
    import sqlite3

    from replayable.store.sqlite import _DB_VERSION, SQLiteStore

    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as db:
        db.executescript(dump.read_text())
    monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", GOLDEN_KEY)
    store = SQLiteStore(path)
    try:
        with sqlite3.connect(path) as db:
            [(version,)] = db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert int(version) == _DB_VERSION
        run_ids = list(store.iter_run_ids())
        assert len(run_ids) == 3
        for run_id in run_ids:
            report = replayable.verify_run(
                store, run_id, integrity=Integrity.from_env(), anchor=None, allow_unkeyed=True
            )
            assert report.ok, report.message
        [root] = [r for r in store.list_runs() if r.parent_run_id is None]
        result = replayable.replay(root.run_id, store=store)
        assert result.status == "identical", result.divergence and result.divergence.message
        assert result.output[1]["quote"].price == decimal.Decimal("39.98")
    finally:
        store.close()
