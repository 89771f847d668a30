"""The seed's debugging workflow on the contract-review agent: low risk, fixed tool, fork, diff."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

import replayable
from replayable.audit import Actor, AuditReader, Scanner
from replayable.audit.annotations import annotate_run
from replayable.audit.report import build_report
from replayable.cli import app
from replayable.errors import AccessDeniedError
from replayable.store.postgres import PostgresStore, grant_tenant, init_roles
from tests.pg_helpers import PgServer, pg

__all__ = ["pg"]

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


# -- the impact audit: thirty days, fourteen affected runs ---------------------------------


@dataclass
class Month:
    """Thirty days of recorded reviews (one a day), fourteen of GB sub-jurisdictions."""

    url: str
    history: Any


def _record_month(url: str, tmp: Path) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLES))
        from contract_review import agent as agent_module
        from contract_review.history import record_history

        mp.setattr(agent_module, "MATCH_MODE", "exact")
        store = replayable.open_store(url)
        try:
            return record_history(
                store, days=30, per_day=1, affected=14, reports_path=tmp / "filed.jsonl"
            )
        finally:
            store.close()


@pytest.fixture(scope="module")
def month(tmp_path_factory: pytest.TempPathFactory) -> Month:
    tmp = tmp_path_factory.mktemp("month")
    url = f"sqlite:///{tmp / 'runs.db'}"
    return Month(url, _record_month(url, tmp))


def test_month_of_runs_the_scan_flags_the_fourteen(month: Month) -> None:
    """The anomaly scan over the last 30 days flags exactly the 14 GB sub-jurisdiction
    runs under rule 5, nothing else under it, and the impact query agrees."""
    runner = CliRunner()
    env = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}
    assert len(month.history.run_ids) == 30
    assert len(month.history.affected) == 14
    scanned = runner.invoke(
        app, ["--store", month.url, "anomalies", "scan", "--since", "30d"], env=env
    )
    assert scanned.exit_code == 0, scanned.output
    assert "scanned 30 run(s)" in scanned.stdout
    assert "empty_data_decision 14" in scanned.stdout
    listed = runner.invoke(
        app, ["--store", month.url, "anomalies", "--rule", "5", "--json"], env=env
    )
    flags = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(f["run_id"] for f in flags) == sorted(month.history.affected)
    assert {f["steps"][0] for f in flags} == {3}
    assert all(f["evidence"]["request"]["jurisdiction"].startswith("GB-") for f in flags)
    query = runner.invoke(
        app,
        [
            "--store", month.url, "query", "--name", "query_compliance_rules", "--since", "30d",
            "--where", "response empty", "--where", "request.jurisdiction ^= GB", "--json",
        ],
        env=env,
    )  # fmt: skip
    assert query.exit_code == 0, query.output
    found = {json.loads(line)["run_id"] for line in query.stdout.splitlines()}
    assert found == set(month.history.affected)


def test_analyst_annotates_auditor_reads_and_cannot_annotate(month: Month, tmp_path: Path) -> None:
    """An analyst reads one affected run and annotates it as a violation, closing its flag;
    the auditor's report carries the annotation; the auditor cannot annotate; the access
    log shows both reads."""
    runner = CliRunner()
    env = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}

    def cli(*args: str) -> Any:
        return runner.invoke(app, ["--store", month.url, *args], env=env)

    scan = cli("anomalies", "scan", "--since", "30d")
    assert scan.exit_code == 0, scan.output
    run_id = month.history.affected[0]
    flag = json.loads(cli("anomalies", "--run", run_id, "--rule", "5", "--json").stdout)
    analyst = ("--as", "dana", "--role", "analyst")
    shown = cli("show", run_id, *analyst, "--purpose", "INC-204")
    assert shown.exit_code == 0, shown.output
    note = (
        "Reviewed: the compliance lookup at step 3 returned no rules for "
        f"{flag['evidence']['request']['jurisdiction']}; rated low without them."
    )
    made = cli(
        "annotate", run_id, "--step", "3", "--verdict", "violation", "--policy", "CR-7",
        "--note", note, "--closes", flag["flag_id"], *analyst, "--json",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    auditor = ("--as", "olu", "--role", "auditor")
    out = tmp_path / "reports"
    report = cli("report", "--run", run_id, "--out", str(out), *auditor, "--purpose", "audit")
    assert report.exit_code == 0, report.output
    data = json.loads((out / f"{run_id}.json").read_text())
    assert [a["verdict"] for a in data["annotations"]["history"]] == ["violation"]
    assert data["flags"][0]["closed_by"] == json.loads(made.stdout)["annotation_id"]
    assert data["chain"]["ok"] is True
    assert data["timeline"][2]["response"] == []
    assert "violation" in (out / f"{run_id}.html").read_text()
    refused = cli("annotate", run_id, "--verdict", "ok", "--note", "fine", *auditor)
    assert refused.exit_code == 2
    assert "olu (role auditor) may not annotate" in refused.stderr
    log = cli("access-log", "--run", run_id, *auditor, "--json")
    reads = [json.loads(line) for line in log.stdout.splitlines()]
    who = [(e["user"], e["channel"]) for e in reads if "request" in e["what"]]
    assert who == [("dana", "cli"), ("olu", "report")]
    assert [e["purpose"] for e in reads if "request" in e["what"]] == ["INC-204", "audit"]
    assert reads[-1]["what"] == ["access_log"]
    still_open = cli("anomalies", "--open", "--rule", "5", "--json").stdout.splitlines()
    assert len(still_open) == 13


@pytest.mark.slow
def test_month_on_postgres_with_database_roles(pg: PgServer, tmp_path: Path) -> None:
    """The same story on PostgreSQL, each step as its database login: the writer records,
    maintenance scans, the analyst annotates, the auditor reads the report, and the
    database refuses the auditor's annotation even when it claims the analyst role."""
    schema = pg.new_schema("story")
    PostgresStore(pg.url(schema)).close()
    prefix = f"st_{secrets.token_hex(4)}"
    pg.role_prefixes.append(prefix)
    with pg.connect() as conn:
        roles = init_roles(conn, schema, prefix=prefix, login=True)
        grant_tenant(conn, schema, roles.writer, "", write=True)
        grant_tenant(conn, schema, roles.maintenance, "", write=True)
        for login in (roles.analyst, roles.auditor):
            grant_tenant(conn, schema, login, "", write=False)
    history = _record_month(pg.url(schema, user=roles.writer), tmp_path)
    with PostgresStore(pg.url(schema, user=roles.maintenance)) as maint:
        result = Scanner(maint).scan(since=time.time() - 30 * 86400)
    assert sorted(f.run_id for f in result.flags if f.rule == "empty_data_decision") == sorted(
        history.affected
    )
    run_id = history.affected[0]
    with PostgresStore(pg.url(schema, user=roles.analyst)) as store:
        analyst = AuditReader(
            store, Actor.current(store, user="dana", role="analyst"), channel="cli"
        )
        analyst.events(run_id)
        analyst.annotate(run_id, step=3, verdict="violation", note="empty rules", policy="CR-7")
    with PostgresStore(pg.url(schema, user=roles.auditor)) as store:
        auditor = AuditReader(store, Actor.current(store, user="olu", role="auditor"))
        report = build_report(auditor, run_id)
        assert [a["verdict"] for a in report["annotations"]["history"]] == ["violation"]
        pretender = Actor(user="olu", role="analyst", login=store.login_name())
        with pytest.raises(AccessDeniedError, match="refused"):
            annotate_run(store, pretender, run_id, verdict="ok", note="nothing to see")
        reads = auditor.access_log(run=run_id)
    assert [(e.user, e.login) for e in reads if "request" in e.what] == [
        ("dana", roles.analyst),
        ("olu", roles.auditor),
    ]
