"""The contract-review demo end to end: real openai SDK, local scripted model, SQLite store."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console
from typer.testing import CliRunner

import replayable
from replayable.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def contract_review(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)
    import contract_review
    import contract_review.agent
    import contract_review.demo
    import contract_review.model_server

    monkeypatch.setattr(contract_review.agent, "MATCH_MODE", "exact")
    return contract_review


def test_demo_records_the_low_risk_run_and_replays_it_without_touching_the_world(
    contract_review, tmp_path
):
    """The recorded run holds the empty rules lookup and a "low" verdict; replay is identical,
    sends no model request and files no report; the chain verifies."""
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    reports = tmp_path / "reports.jsonl"
    out = io.StringIO()
    result = contract_review.demo.run_demo(
        url, Console(file=out, width=140), seed=7, reruns=3, reports_path=reports
    )

    assert result.ok
    assert result.recorded_output["risk"] == "low"
    assert result.recorded_output["jurisdiction"] == "GB-SCT"
    assert result.recorded_output["rules_applied"] == []
    assert result.replay_status == "identical"
    assert result.replay_output == result.recorded_output
    assert result.model_requests_during_replay == 0
    assert result.reports_filed_during_replay == 0
    # One report from the recorded run and one per live re-run; none from the replay.
    filed = [json.loads(line) for line in reports.read_text().splitlines()]
    assert len(filed) == 4
    assert filed[0]["report_id"] == result.recorded_output["report_id"]
    # Sampling noise: live re-runs do not all repeat the recorded answer.
    recorded = (result.recorded_output["risk"], result.recorded_output["summary"])
    assert any((o["risk"], o["summary"]) != recorded for o in result.live_outputs)
    assert len({o["report_id"] for o in result.live_outputs}) == 3

    with replayable.open_store(url) as store:
        run = store.run(result.run_id)
        events = store.events(run.run_id)
        assert run.status == "completed"
        assert run.start.entrypoint == "contract_review.agent:review_contract"
        assert run.metadata == {"contract_id": "C-1042"}
        assert [(e.kind, e.name if e.kind != "llm" else "") for e in events] == [
            ("tool", "read_contract"),
            ("llm", ""),
            ("tool", "query_compliance_rules"),
            ("llm", ""),
            ("clock", "time"),
            ("uuid", "uuid4"),
            ("tool", "file_report"),
        ]
        rules = events[2]
        assert rules.request_value() == {"jurisdiction": "GB-SCT"}
        assert rules.response_tree() == []
        assert events[6].side_effect
        assert not any(e.side_effect for e in events[:6])
        assert events[1].name == "openai.chat.completions.create"
        assert events[1].request_value()["model"] == "contract-analyst-1"
        assert replayable.verify_run(store, run.run_id).ok

    text = out.getvalue()
    for heading in ("1. Record", "2. Re-run it live", "3. Replay", "4. Verify"):
        assert heading in text
    assert "jurisdiction='GB-SCT' → 0 results" in text
    assert "model requests during replay: 0" in text
    assert "chain intact (7 events)" in text
    # The impact audit: a month of reviews, 14 flagged under rule 5 (13 + the incident).
    assert "6. Audit the impact: 30 days of reviews" in text
    assert "14 decided on an empty compliance lookup (rule 5)" in text
    assert result.run_id in result.audit_flagged
    assert "auditor olu tries to annotate: refused" in text
    assert "dana (analyst) ×1" in text


def test_fixed_rules_lookup_finds_the_parent_jurisdiction_and_rates_high(
    contract_review, tmp_path, monkeypatch
):
    """With prefix matching, GB-SCT gets the GB rules and the model rates the contract high."""
    agent = contract_review.agent
    assert agent.find_rules("GB-SCT", "exact") == []
    assert {r["rule_id"] for r in agent.find_rules("GB-SCT", "prefix")} == {
        "GB-LIA-01",
        "GB-DPA-03",
        "GB-REN-02",
    }
    monkeypatch.setattr(agent, "MATCH_MODE", "prefix")
    monkeypatch.setenv("CONTRACT_REVIEW_REPORTS", str(tmp_path / "reports.jsonl"))
    with contract_review.model_server.serve(seed=1) as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        output = agent.review_contract("C-1042")
        assert model.requests == 2
    assert output["risk"] == "high"
    assert "GB-LIA-01" in output["rules_applied"]


def test_scripted_model_noise_is_seeded(contract_review):
    """The same seed gives the same answers; the noise shows up across calls."""
    server = contract_review.model_server.ModelServer
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "TASK: assess risk\nTERMS:\n{}\nRULES:\n[]"}],
    }
    first, second = server(seed=3), server(seed=3)
    try:
        a = [first.answer(body)["choices"][0]["message"]["content"] for _ in range(12)]
        b = [second.answer(body)["choices"][0]["message"]["content"] for _ in range(12)]
    finally:
        first.stop()
        second.stop()
    assert a == b
    assert len(set(a)) > 1
    assert {json.loads(c)["risk"] for c in a} <= {"low", "medium"}


def test_demo_command_runs_end_to_end(contract_review, tmp_path, monkeypatch):
    """``replayable demo`` records, replays identically, verifies, forks, diffs, and exits 0."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'cli-demo.db'}"
    result = CliRunner().invoke(app, ["--store", url, "demo"], env={"COLUMNS": "140"})
    assert result.exit_code == 0, result.output
    assert "status identical" in result.stdout
    assert "model requests during replay: 0   reports filed during replay: 0" in result.stdout
    assert "demo ok" in result.stdout
    assert (tmp_path / ".replayable" / "demo-reports.jsonl").is_file()
    assert "risk high; report filing blocked (not executed)" in result.stdout
    listed = CliRunner().invoke(app, ["--store", url, "runs", "--json"])
    # Newest first: the fork, then the recording, then the month the impact audit recorded.
    fork, run, *month = json.loads(listed.stdout)
    assert len(month) == 30
    assert run["workflow"] == fork["workflow"] == "contract_review"
    assert run["event_count"] == fork["event_count"] == 7
    shown = CliRunner().invoke(app, ["--store", url, "show", fork["run_id"], "--json"])
    assert json.loads(shown.stdout)["run"]["lineage"]["forked_from"] == run["run_id"]


def test_demo_closing_commands_work_as_printed_in_a_new_shell(
    contract_review, tmp_path, monkeypatch
):
    """The 'explore it' commands run as printed from another directory, .venv not activated."""
    import shlex
    import subprocess

    work = tmp_path / "work"
    work.mkdir()
    url = f"sqlite:///{work / 'demo.db'}"
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, ["--store", url, "demo"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("explore it: "))
    commands = [lines[start].removeprefix("explore it: "), lines[start + 1].strip()]
    assert shlex.split(commands[0])[-2] == "show"
    assert shlex.split(commands[1])[-3] == "diff"
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    shell_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(elsewhere),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    runs = []
    for command in commands:
        runs.append(
            subprocess.run(
                command, shell=True, cwd=elsewhere, env=shell_env, capture_output=True, text=True
            )
        )
    shown, diffed = runs
    assert shown.returncode == 0, (commands[0], shown.stdout, shown.stderr)
    assert shlex.split(commands[0])[-1] in shown.stdout
    assert diffed.returncode == 1, (commands[1], diffed.stdout, diffed.stderr)  # 1: they differ
    assert diffed.stderr == ""
    assert "aligned steps" in diffed.stdout
