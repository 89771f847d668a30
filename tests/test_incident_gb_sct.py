"""The seed's incident as a regression test: the GB-SCT run, exported and sanitized.

``tests/fixtures/gb-sct.replay`` is the production run of the contract-review
agent that rated the Scottish contract low after the compliance lookup found no
rules. With the recorded (exact-match) tool the run replays identically and the
policy "no low-risk rating without compliance data" fails; forked at the
compliance step with the fixed tool, the run rates the contract high and the
policy passes. Re-record with ``pytest tests/test_incident_gb_sct.py
--replayable-record=rewrite``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FIXTURE = Path(__file__).parent / "fixtures" / "gb-sct.replay"
RULES = Path(__file__).parent / "fixtures" / "gb-sct.sanitize.json"


@pytest.fixture(autouse=True)
def _agent_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def record_incident() -> Any:
    """The incident as it happened: the shipped (exact-match) lookup, the scripted model."""
    import tempfile

    from contract_review import agent
    from contract_review.model_server import serve

    saved = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "CONTRACT_REVIEW_REPORTS")}
    with tempfile.TemporaryDirectory() as tmp, serve(seed=7) as server:
        os.environ["OPENAI_BASE_URL"] = server.base_url
        os.environ["CONTRACT_REVIEW_REPORTS"] = str(Path(tmp) / "reports.jsonl")
        agent.MATCH_MODE = "exact"
        try:
            return agent.review_contract("C-1042")
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """The scripted model, for the parts of a fork that run live."""
    from contract_review.model_server import serve

    monkeypatch.setenv("CONTRACT_REVIEW_REPORTS", str(tmp_path / "reports.jsonl"))
    with serve(seed=7) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        yield server


@pytest.mark.replayable("fixtures/gb-sct.replay", record=record_incident, sanitize=RULES)
def test_gb_sct_old_behaviour_fails_the_policy_and_the_fixed_tool_passes(
    replayable_run, model, monkeypatch, tmp_path
):
    """Recorded tool: identical replay, policy violated at the empty lookup. Fork at the
    compliance step with the fixed tool: rated high, policy passes, nothing filed."""
    from contract_review import agent
    from contract_review.policies import no_low_risk_without_rules

    result = replayable_run.result
    assert result.status == "identical"
    assert result.output["risk"] == "low"
    [verdict] = replayable_run.check(no_low_risk_without_rules)
    step = replayable_run.step("query_compliance_rules")
    assert not verdict.passed
    assert step in verdict.steps
    assert "found no rules for 'GB-SCT'" in verdict.message
    assert verdict.fingerprint == no_low_risk_without_rules.fingerprint

    monkeypatch.setattr(agent, "MATCH_MODE", "prefix")  # the fix
    fork = replayable_run.fork(step, policies=[no_low_risk_without_rules])
    assert fork.status == "completed", fork.divergence
    assert fork.output["risk"] == "high"
    assert fork.output["rules_applied"] == ["GB-DPA-03", "GB-LIA-01", "GB-REN-02"]
    assert [p.passed for p in fork.policies] == [True]
    replayable_run.assert_policies(no_low_risk_without_rules, run_id=fork.new_run_id)
    assert fork.blocked  # the report filing was held back
    assert not (tmp_path / "reports.jsonl").exists()


def test_the_shipped_fixture_holds_no_personal_data_and_says_what_was_replaced():
    """The incident's uploader email and the customer's name are not in the file; its
    manifest names the rules and places, not the values."""
    data = FIXTURE.read_bytes()
    for planted in ("procurement@caledonia-freight.example", "Caledonia Freight plc"):
        assert planted.encode() not in data
    import orjson

    header = orjson.loads(data.splitlines()[0])
    by_rule = header["sanitized"]["by_rule"]
    assert by_rule["email"]["replaced"] >= 1
    assert by_rule["name"]["replaced"] >= 1
    assert "Caledonia" not in str(header["sanitized"])
