"""The README's "incident → fixture → test" workflow, command by command."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import replayable
from replayable.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _readme_test() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(
        r"<!-- incident-test -->\n```python\n(.*?)```\n<!-- /incident-test -->", text, re.S
    )
    assert block is not None, "the README's incident test block is missing"
    return block.group(1)


@pytest.mark.slow
def test_the_five_commands_turn_the_incident_into_a_passing_test(tmp_path, monkeypatch):
    """Record the incident, then: query finds it, check fails it, export writes the
    sanitized fixture, the README's test file passes under pytest with strict settings."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)
    from contract_review import agent
    from contract_review.model_server import serve

    monkeypatch.setattr(agent, "MATCH_MODE", "exact")
    monkeypatch.setenv("CONTRACT_REVIEW_REPORTS", str(tmp_path / "reports.jsonl"))
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with serve(seed=7) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        with replayable.recording(url, metadata={"contract_id": "C-1042"}) as rec:
            agent.review_contract("C-1042")
    run_id = rec.run_ids[0]
    runner = CliRunner()

    found = runner.invoke(
        app,
        [
            "--store",
            url,
            "query",
            "--name",
            "query_compliance_rules",
            "--where",
            "response empty",
            "--meta",
            "contract_id=C-1042",
        ],
    )
    assert found.exit_code == 0, found.output
    assert run_id in found.output
    spec = "contract_review.policies:no_low_risk_without_rules"
    checked = runner.invoke(app, ["--store", url, "check", run_id, "--policy", spec])
    assert checked.exit_code == 1, checked.output
    assert "violation at step 3, 7: rated low although" in checked.output
    project = tmp_path / "project"
    fixture = project / "tests" / "incidents" / "gb-sct.replay"
    exported = runner.invoke(
        app, ["--store", url, "export", run_id, "--sanitize", "default", "-o", str(fixture)]
    )
    assert exported.exit_code == 0, exported.output
    (project / "tests" / "test_gb_sct.py").write_text(_readme_test())
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["--strict-markers", "--strict-config"]\n'
        'filterwarnings = ["error"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPLAYABLE_", "PYTEST_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(ROOT / "src")]),
        # The agent lives in this repository's examples/, outside the temporary project.
        REPLAYABLE_ENTRYPOINTS="contract_review",
        CONTRACT_REVIEW_REPORTS=str(tmp_path / "reports-ci.jsonl"),
        CI="true",
    )
    others = [
        f"-pno:{ep.name}"
        for ep in importlib.metadata.entry_points(group="pytest11")
        if not ep.value.startswith("replayable")
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "replayable.testing.plugin", *others,
         "tests/test_gb_sct.py"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert not (tmp_path / "reports-ci.jsonl").exists()  # the fork filed nothing
