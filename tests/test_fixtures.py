"""Fixture files: export, sanitize, import, and refusal of what this version cannot read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

import replayable
from replayable.cli import app
from replayable.errors import FixtureError
from replayable.events.model import SEALED_EVENT_VERSION, SEALED_SCHEMA_VERSION
from replayable.store import open_store, verify_run
from replayable.store.integrity import Integrity
from replayable.testing import (
    SanitizeRules,
    export_fixture,
    import_fixture,
    load_fixture,
    read_fixture,
)
from replayable.testing import fixture as fixture_mod
from replayable.testing.sanitize import DETECTORS, luhn_ok, mod97_ok
from tests import agents_pii

RULES: dict[str, Any] = {
    "names": ["Fiona MacLeod", "José García"],
    "regexes": [{"name": "ticket", "pattern": r"TKT-\d{6}"}],
    "paths": [{"name": "customer_ref", "path": "input.args[0]"}],
    "salt": "fixed for the test",
}


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[replayable.EventStore, str, str]:
    """A support run full of personal data, and a batch run with two child runs."""
    store = replayable.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    with replayable.recording(store, metadata={"agent_email": "ops.lead@caledonia-freight.co.uk"}):
        agents_pii.support("CUST-77-ALPHA", "Where is my refund?")
        agents_pii.support_batch(["CUST-77-ALPHA", "CUST-88-BETA"])
    runs = store.list_runs()
    single = next(r for r in runs if r.workflow == "support" and r.parent_run_id is None)
    batch = next(r for r in runs if r.workflow == "support_batch")
    return store, single.run_id, batch.run_id


def _forms(value: str) -> set[str]:
    """A planted value as it could appear in the file: raw, JSON-escaped, digits only."""
    forms = {value, json.dumps(value)[1:-1], value.lower()}
    digits = re.sub(r"\D", "", value)
    if len(digits) >= 9 and not re.search(r"[A-Za-z]", value):
        forms.add(digits)
    return forms


def test_sanitized_fixture_holds_no_planted_value_and_replays_identically(recorded, tmp_path):
    """Every planted value, in every form it could take, is gone from the file; the
    fixture still replays identical; the manifest counts every rule and holds no value."""
    store, run_id, _ = recorded
    path = tmp_path / "support.replay"
    fx = export_fixture(store, run_id, path, sanitize=SanitizeRules.from_mapping(RULES))
    data = path.read_bytes()
    text = data.decode()
    planted = [v for values in agents_pii.PLANTED.values() for v in values]
    planted += [str(agents_pii.CARD_AS_NUMBER), "ops.lead@caledonia-freight.co.uk"]
    for value in planted:
        for form in _forms(value):
            assert form.encode() not in data, f"{form!r} is still in the fixture"
    assert fx.manifest is not None
    by_rule = fx.manifest["by_rule"]
    for rule in agents_pii.PLANTED:
        assert by_rule[rule]["replaced"] >= 1, rule
        assert by_rule[rule]["where"], rule
    assert by_rule["card"]["values"] == 4  # three as text, the number quoted in a prompt
    assert any("response.billing.card_on_file" in w for w in by_rule["card"]["where"])
    assert any(w.endswith("metadata.agent_email") for w in by_rule["email"]["where"])
    manifest_text = json.dumps(fx.manifest)
    for value in planted:
        assert value not in manifest_text
    # Pseudonyms are consistent: one token per value, wherever it appears.
    tokens = set(re.findall(r"user-[0-9a-f]{10}@example\.invalid", text))
    assert len(tokens) == 3  # two planted emails and the metadata one

    loaded, mem = load_fixture(path)
    result = replayable.replay(loaded.root, store=mem)
    assert result.status == "identical", result.divergence and result.divergence.message
    assert result.output["card_on_file"] != agents_pii.CARD_AS_NUMBER
    assert isinstance(result.output["card_on_file"], int)
    assert verify_run(mem, loaded.root, integrity=Integrity(), anchor=None).ok


def test_same_salt_same_tokens_and_a_random_salt_differs(recorded, tmp_path):
    """Tokens are deterministic under one salt and unguessable across exports without one."""
    store, run_id, _ = recorded
    rules = SanitizeRules.from_mapping(RULES)
    a = export_fixture(store, run_id, tmp_path / "a.replay", sanitize=rules)
    b = export_fixture(store, run_id, tmp_path / "b.replay", sanitize=rules)
    assert [e.response for e in a.events] == [e.response for e in b.events]
    c = export_fixture(store, run_id, tmp_path / "c.replay", sanitize=SanitizeRules())
    d = export_fixture(store, run_id, tmp_path / "d.replay", sanitize=SanitizeRules())
    assert [e.response for e in c.events] != [e.response for e in d.events]


def test_unsanitized_fixture_keeps_the_recorded_chain_and_replays(recorded, tmp_path):
    """Without --sanitize the records go out as stored: same hashes, same fingerprints."""
    store, run_id, _ = recorded
    fx = export_fixture(store, run_id, tmp_path / "raw.replay")
    assert [e.hash for e in fx.events] == [e.hash for e in store.events(run_id)]
    assert fx.manifest is None
    loaded, mem = load_fixture(tmp_path / "raw.replay")
    assert replayable.replay(loaded.root, store=mem).status == "identical"


def test_child_runs_travel_with_their_parent_and_tree_starts_at_the_root(recorded, tmp_path):
    """A batch run exports with its two child runs; --tree from a child exports the batch."""
    store, _, batch = recorded
    fx = export_fixture(store, batch, tmp_path / "batch.replay", sanitize=SanitizeRules())
    assert len(fx.starts) == 3
    loaded, mem = load_fixture(tmp_path / "batch.replay")
    assert replayable.replay(loaded.root, store=mem).status == "identical"
    child = store.children(batch)[0].run_id
    alone = export_fixture(store, child, tmp_path / "child.replay")
    assert [s.run_id for s in alone.starts] == [child]
    whole = export_fixture(store, child, tmp_path / "tree.replay", tree=True)
    assert whole.root == batch
    assert len(whole.starts) == 3


def test_cli_export_import_round_trip(recorded, tmp_path):
    """``export --sanitize`` then ``import`` into another store: the run verifies there,
    importing twice is a no-op, and the printed summary counts the replacements."""
    store, run_id, _ = recorded
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    path = tmp_path / "incident.replay"
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["--store", store.url, "export", run_id, "--sanitize", str(rules), "-o", str(path)],
    )
    assert res.exit_code == 0, res.output
    assert "sanitized:" in res.output
    assert "email" in res.output
    target = f"sqlite:///{tmp_path / 'other.db'}"
    for _ in range(2):
        res = runner.invoke(app, ["--store", target, "import", str(path)])
        assert res.exit_code == 0, res.output
        assert "imported 1 run(s)" in res.output
    other = open_store(target)
    try:
        assert verify_run(other, run_id, integrity=Integrity(), anchor=None).ok
        assert len(other.events(run_id)) == len(store.events(run_id))
    finally:
        other.close()


def test_import_refuses_a_run_id_the_store_holds_with_other_content(recorded, tmp_path):
    """A fixture never overwrites: the same run id with other content is refused, named."""
    store, run_id, _ = recorded
    path = tmp_path / "s.replay"
    export_fixture(store, run_id, path, sanitize=SanitizeRules())
    with pytest.raises(FixtureError, match=f"run {run_id} is already in .* with other content"):
        import_fixture(path, store)


def _rewrite_header(path: Path, **changes: Any) -> None:
    lines = path.read_bytes().splitlines()
    header = orjson.loads(lines[0])
    header.update(changes)
    path.write_bytes(b"\n".join([orjson.dumps(header), *lines[1:]]) + b"\n")


def test_newer_unknown_and_malformed_fixtures_are_refused_with_a_clear_message(recorded, tmp_path):
    """A newer layout, a newer record schema, another format and a bad line each say what."""
    store, run_id, _ = recorded
    path = tmp_path / "f.replay"
    export_fixture(store, run_id, path)
    good = path.read_bytes()

    _rewrite_header(path, version=7, written_by="replayable 9.0")
    with pytest.raises(FixtureError, match=r"fixture version 7, written by replayable 9\.0;.*up"):
        read_fixture(path)
    path.write_bytes(good)
    # Newer than the newest this replayable reads (the formats of encrypting stores).
    newer = SEALED_EVENT_VERSION + 1
    _rewrite_header(path, event_schema=newer)
    with pytest.raises(FixtureError, match=f"event records are schema version {newer}; this"):
        read_fixture(path)
    path.write_bytes(good)
    _rewrite_header(path, run_schema=SEALED_SCHEMA_VERSION + 1)
    with pytest.raises(FixtureError, match=r"run records are schema version \d+; .*: upgrade"):
        read_fixture(path)
    path.write_bytes(good.replace(b'"schema_version":2', f'"schema_version":{newer}'.encode(), 1))
    with pytest.raises(FixtureError, match=rf"line \d+: event schema version {newer}"):
        read_fixture(path)
    path.write_bytes(good)
    _rewrite_header(path, format="vcr-cassette")
    with pytest.raises(FixtureError, match="is not a replayable fixture"):
        read_fixture(path)
    path.write_bytes(good.replace(b'"record":"event"', b'"record":"evnt"', 1))
    with pytest.raises(FixtureError, match=r"line \d+: unknown record 'evnt'"):
        read_fixture(path)
    path.write_bytes(good.replace(b'"seq":1,', b'"seq":"one",', 1))
    with pytest.raises(FixtureError, match=r"line \d+: bad event record: Expected `int`"):
        read_fixture(path)
    res = CliRunner().invoke(app, ["--store", "memory://x", "import", str(path)])
    assert res.exit_code == 2
    assert "bad event record" in res.output


def test_an_edited_fixture_is_refused_naming_the_event(recorded, tmp_path):
    """Editing a recorded result in the file breaks its chain: loading names the event."""
    store, run_id, _ = recorded
    path = tmp_path / "f.replay"
    export_fixture(store, run_id, path, sanitize=SanitizeRules())
    lines = path.read_bytes().splitlines()
    at = next(i for i, ln in enumerate(lines) if b'"record":"event"' in ln and b"Dear" in ln)
    lines[at] = lines[at].replace(b"Dear customer", b"Dear client")
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(FixtureError, match=f"run {run_id}: event 2: "):
        load_fixture(path)


def test_older_versions_are_upgraded_by_explicit_functions_in_order(
    recorded, tmp_path, monkeypatch
):
    """With the layout at version 3, a version-1 file passes through the 1→2 and 2→3
    upcasters in order; a version with no upcaster is refused by name."""
    store, run_id, _ = recorded
    path = tmp_path / "f.replay"
    export_fixture(store, run_id, path)
    calls: list[int] = []

    def up(n: int) -> Any:
        def step(header: dict[str, Any], records: list[Any]) -> tuple[dict[str, Any], list[Any]]:
            calls.append(n)
            header[f"upgraded_from_{n}"] = True
            return header, records

        return step

    monkeypatch.setattr(fixture_mod, "FIXTURE_VERSION", 3)
    monkeypatch.setitem(fixture_mod.UPCASTERS, 1, up(1))
    monkeypatch.setitem(fixture_mod.UPCASTERS, 2, up(2))
    assert read_fixture(path).root == run_id
    assert calls == [1, 2]
    monkeypatch.delitem(fixture_mod.UPCASTERS, 2)
    with pytest.raises(FixtureError, match="fixture version 2 has no upgrade to 3"):
        read_fixture(path)


def test_detectors_check_their_checksums_and_leave_ids_and_times_alone():
    """Luhn and mod-97 decide; UUIDs, ISO times, hex ids and epoch seconds are not data."""
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")
    assert mod97_ok("GB82WEST12345698765432")
    assert not mod97_ok("GB82WEST12345698765433")
    benign = (
        "a3f9c1e2-7b4d-4e8a-9c21-5f6e7d8c9b0a 2026-11-30T10:15:00+00:00 1796129486.6904473 "
        "RPT-4655d3dc48ce chatcmpl-6513270e269e0d37 sha 8efa0fd9ed98e70aac8f6cd46e041ae953d1 "
        "4111111111111112 GB82WEST12345698765433 version 1.2.3 port 5432 GBP 18,500"
    )
    for name, detect in DETECTORS.items():
        assert list(detect(benign)) == [], name


def test_bad_rules_are_refused_naming_the_rule(tmp_path):
    """An unknown detector, a bad regex, a bad path and an unknown key each name themselves."""
    with pytest.raises(ValueError, match="unknown detector 'passport'"):
        SanitizeRules.from_mapping({"detectors": ["passport"]})
    with pytest.raises(ValueError, match="rule 'x': pattern '\\(' is not a regex"):
        SanitizeRules.from_mapping({"regexes": [{"name": "x", "pattern": "("}]})
    with pytest.raises(ValueError, match=r"path 'body\.x' must start with one of"):
        SanitizeRules.from_mapping({"paths": [{"name": "p", "path": "body.x"}]})
    with pytest.raises(ValueError, match="unknown key 'name'"):
        SanitizeRules.from_mapping({"name": ["x"]})
    with pytest.raises(ValueError, match="no sanitize rules file"):
        SanitizeRules.load(tmp_path / "missing.toml")
    toml = tmp_path / "r.toml"
    toml.write_text('names = ["Ann Lee"]\n[[regexes]]\nname = "ref"\npattern = "R-\\\\d+"\n')
    rules = SanitizeRules.load(toml)
    assert rules.names == ("Ann Lee",)
    assert rules.regexes == (("ref", r"R-\d+"),)
