"""The seed's debugging workflow on the contract-review agent: low risk, fixed tool, fork, diff."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

import replayable
from replayable.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GB_RULES = ["GB-DPA-03", "GB-LIA-01", "GB-REN-02"]


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)
    import contract_review.agent

    monkeypatch.setattr(contract_review.agent, "MATCH_MODE", "exact")
    return contract_review.agent


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch, agent: ModuleType) -> Iterator[Any]:
    from contract_review.model_server import serve

    with serve(seed=7) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "demo-key")
        yield server


@pytest.fixture
def reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "reports.jsonl"
    monkeypatch.setenv("CONTRACT_REVIEW_REPORTS", str(path))
    return path


@pytest.fixture
def incident(
    agent: ModuleType, model: Any, reports: Path, tmp_path: Path
) -> Iterator[tuple[replayable.EventStore, str, str]]:
    """The production run: the Scottish contract rated low, recorded into a SQLite store."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = replayable.open_store(url)
    with replayable.recording(store, metadata={"contract_id": "C-1042"}) as rec:
        output = agent.review_contract("C-1042")
    assert output["risk"] == "low"
    assert output["jurisdiction"] == "GB-SCT"
    yield store, rec.run_ids[0], url
    store.close()


def _compliance_step(store: replayable.EventStore, run_id: str) -> int:
    return next(e.seq for e in store.events(run_id) if e.name == "query_compliance_rules")


def test_fork_with_the_fixed_tool_rates_high_blocks_the_filing_and_diff_names_the_step(
    incident, agent, model, reports, monkeypatch
):
    """Fork at the compliance step with the fixed lookup: the tool and the risk model run
    live, the run ends high, the report is not filed, and the diff names the step."""
    store, run_id, _ = incident
    step = _compliance_step(store, run_id)
    recorded_step = store.events(run_id)[step - 1]
    assert recorded_step.request_value() == {"jurisdiction": "GB-SCT"}
    assert recorded_step.response_tree() == []  # the silent failure: no rules found

    filed_before = reports.read_bytes()
    requests_before = model.requests
    monkeypatch.setattr(agent, "MATCH_MODE", "prefix")  # the fix, in the current code
    forked = replayable.replay(run_id, store=store, fork_at=step, on_side_effect="recorded")

    assert forked.status == "completed", forked.divergence
    assert forked.output["risk"] == "high"
    assert forked.output["rules_applied"] == GB_RULES
    assert model.requests - requests_before == 1  # only the risk call; extraction came from tape
    assert reports.read_bytes() == filed_before  # the report was not filed for real

    new_run = store.run(forked.new_run_id)
    assert new_run.start.lineage["forked_from"] == run_id
    assert new_run.start.lineage["fork_step"] == step
    events = store.events(new_run.run_id)
    assert all(e.metadata.get("replayed_from") for e in events[: step - 1])
    assert events[step - 1].metadata.get("live") is True
    assert [r["rule_id"] for r in events[step - 1].response_tree()] == GB_RULES
    filing = next(e for e in events if e.name == "file_report")
    assert filing.side_effect
    assert filing.metadata["side_effect_blocked"] is True
    assert forked.blocked == (filing.seq,)
    assert filing.request_value()["risk"] == "high"

    result = replayable.diff(run_id, new_run.run_id, store=store)
    first = result.first
    assert first is not None
    assert (first.left_step, first.right_step) == (step, step)
    assert first.name == "query_compliance_rules"
    assert first.field is not None
    assert first.field.startswith("response")
    assert first.new["rule_id"] in GB_RULES  # the rows that now exist
    risk = [c for c in result.output_changes if c.path == "risk"]
    assert [(c.old, c.new, c.rank) for c in risk] == [("low", "high", "significant")]
    risk_call = next(p for p in result.pairs if p.left is not None and p.left.seq == step + 1)
    assert risk_call.left is not None
    assert risk_call.left.kind == "llm"
    assert risk_call.status == "changed"
    assert any('"high"' in str(c.new) for c in risk_call.changes)


def test_fork_without_recorded_receipt_stops_at_the_side_effect(
    incident, agent, reports, monkeypatch
):
    """With the default guard the fork stops before filing a report with a new request."""
    store, run_id, _ = incident
    filed_before = reports.read_bytes()
    monkeypatch.setattr(agent, "MATCH_MODE", "prefix")
    forked = replayable.replay(run_id, store=store, fork_at=_compliance_step(store, run_id))
    assert forked.status == "diverged"
    assert forked.divergence is not None
    assert forked.divergence.reason == "side_effect_blocked"
    assert "file_report" in forked.divergence.message
    assert reports.read_bytes() == filed_before


def test_seed_story_through_the_cli(incident, agent, reports, monkeypatch):
    """``replay --fork-at`` then ``diff``: the same story, as a person would type it."""
    store, run_id, url = incident
    step = _compliance_step(store, run_id)
    filed_before = reports.read_bytes()
    monkeypatch.setattr(agent, "MATCH_MODE", "prefix")
    runner = CliRunner()
    env = {"COLUMNS": "200"}
    forked = runner.invoke(
        app,
        ["--store", url, "replay", run_id, "--fork-at", str(step), "--on-side-effect", "recorded"],
        env=env,
    )
    assert forked.exit_code == 0, forked.output
    assert "completed" in forked.stdout
    assert f"forked from: {run_id} at step {step}" in forked.stdout
    assert "side effect blocked at step 7: file_report was not executed" in forked.stdout
    assert reports.read_bytes() == filed_before
    new_run_id = forked.stdout.split("new run: ", 1)[1].split()[0]
    assert json.loads(store.run(new_run_id).end.output)["risk"] == "high"

    shown = runner.invoke(app, ["--store", url, "show", new_run_id], env=env)
    assert "blocked" in shown.stdout
    assert f"forked from  {run_id} at step {step}" in shown.stdout

    diffed = runner.invoke(app, ["--store", url, "diff", run_id, new_run_id], env=env)
    assert diffed.exit_code == 1, diffed.output
    assert f"step {step} ↔ {step}: tool query_compliance_rules: response" in diffed.stdout
    assert "output.risk" in diffed.stdout
    risk_row = next(line for line in diffed.stdout.splitlines() if "output.risk" in line)
    assert "low" in risk_row
    assert "high" in risk_row


def test_demo_shows_the_fork_and_the_diff(agent, tmp_path):
    """``run_demo`` ends with the fork (risk high, filing blocked) and the diff's first step."""
    import io

    from rich.console import Console

    import contract_review.demo

    out = io.StringIO()
    result = contract_review.demo.run_demo(
        f"sqlite:///{tmp_path / 'demo.db'}",
        Console(file=out, width=160),
        seed=7,
        reruns=1,
        reports_path=tmp_path / "reports.jsonl",
    )
    assert result.ok
    assert result.fork_output["risk"] == "high"
    assert result.reports_filed_during_fork == 0
    assert result.fork_step == 3
    text = out.getvalue()
    assert "5. Fix the lookup, fork at the compliance step" in text
    assert "fork at step 3 with the fixed tool → risk high; report filing blocked" in text
    assert "diff: first divergence at step 3: query_compliance_rules response" in text
    assert "(GB-DPA-03, GB-LIA-01, GB-REN-02)" in text
    assert "1-2 replayed · 3-6 live · 7 blocked (file_report)" in text
