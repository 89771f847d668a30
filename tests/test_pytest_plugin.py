"""The pytest plugin in a user's project: loaded from its entry point, strict settings on.

Each test writes a small project (an agent, a test marked with a fixture file, a
pyproject with ``--strict-markers`` and ``filterwarnings = error``) and runs pytest
on it in a subprocess. The plugin is found only through a ``pytest11`` entry point
built from this repository's pyproject, as ``pip install replayable`` would register it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

AGENT = """
import os, socket
import replayable

@replayable.tool
def lookup(order: str) -> dict:
    return {"order": order, "status": "shipped"}

@replayable.tool(side_effect=True)
def notify(to: str, text: str) -> str:
    return "sent"

@replayable.workflow("orders")
def orders(order: str) -> dict:
    query = order if os.environ.get("AGENT_VARIANT") != "changed" else order.lower()
    found = lookup(query)
    if os.environ.get("TOUCH_NETWORK"):
        socket.create_connection(("127.0.0.1", int(os.environ["TOUCH_NETWORK"])), timeout=1)
    notify("ops@example.com", f"{order} is {found['status']}")
    return found
"""

TESTS = """
import pytest
import agent
from replayable import policy
from replayable.testing import SanitizeRules

KEEP = SanitizeRules(keep=("ops@example.com",))

@policy("no_notify")
def no_notify(run):
    calls = run.calls("notify")
    return run.violation("notified", *calls) if calls else None

def record():
    agent.orders("ORD-7")

@pytest.mark.replayable("fixtures/orders.replay", record=record, sanitize=KEEP)
def test_orders(replayable_run):
    assert replayable_run.result.status == "identical"
    assert replayable_run.result.output == {"order": "ORD-7", "status": "shipped"}
    [v] = replayable_run.check(no_notify)
    assert not v.passed and v.steps == (2,)

@pytest.mark.replayable("fixtures/orders.replay", record=record, sanitize=KEEP)
def test_marker_alone():
    pass

@pytest.mark.replayable("fixtures/orders.replay", record=record, policies=[no_notify],
                        sanitize=KEEP)
def test_policy_in_marker():
    pass
"""

PYPROJECT = """
[project]
name = "shop"
version = "0"
[tool.pytest.ini_options]
addopts = ["--strict-markers", "--strict-config"]
filterwarnings = ["error"]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project, and a site folder whose only dist registers the plugin."""
    proj = tmp_path / "shop"
    proj.mkdir()
    (proj / "pyproject.toml").write_text(PYPROJECT)
    (proj / "agent.py").write_text(AGENT)
    (proj / "test_orders.py").write_text(TESTS)
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = tmp_path / "site" / "replayable_entry-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: replayable-entry\nVersion: 0\n")
    lines = [f"{name} = {value}" for name, value in entry["pytest11"].items()]
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    return proj


def _pytest(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("REPLAYABLE_", "PYTEST_"))}
    environ.pop("CI", None)
    environ["PYTHONPATH"] = os.pathsep.join([str(project.parent / "site"), str(ROOT / "src")])
    environ["REPLAYABLE_WRITER"] = "thread"
    environ.update(env)
    # Other installed plugins (hypothesis, langsmith …) cost seconds per start: blocked by
    # their entry point names, so that only the entry point discovery of ours is exercised.
    others = [
        f"-pno:{ep.name}"
        for ep in importlib.metadata.entry_points(group="pytest11")
        if not ep.value.startswith("replayable")
    ]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *others, *args],
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_record_once_then_replay_then_fail_on_divergence(project):
    """once records the missing fixture; a replay reaches no network; under CI it replays;
    changed code fails with the divergence message; ``new`` re-records it; a policy in
    the marker fails the test."""
    fixture = project / "fixtures" / "orders.replay"
    first = _pytest(project, "test_orders.py::test_orders", "test_orders.py::test_marker_alone")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "recorded 1 fixture(s)" in first.stdout
    assert fixture.exists()
    recorded = fixture.read_bytes()

    # A connection the agent opens outside every boundary stops the replay, unanswered.
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        net = _pytest(project, "test_orders.py::test_marker_alone", TOUCH_NETWORK=str(port))
        with pytest.raises(TimeoutError):
            srv.accept()
    assert net.returncode == 1
    assert f"opened a connection to 127.0.0.1:{port}" in net.stdout
    assert "nothing reaches the network in a pure replay" in net.stdout

    ci = _pytest(project, "test_orders.py::test_orders", CI="true")
    assert ci.returncode == 0, ci.stdout + ci.stderr
    assert "recorded" not in ci.stdout
    assert fixture.read_bytes() == recorded

    changed = _pytest(project, "test_orders.py::test_marker_alone", AGENT_VARIANT="changed")
    assert changed.returncode == 1
    assert "orders.replay diverged from the current code" in changed.stdout
    assert "lookup" in changed.stdout
    assert "ord-7" in changed.stdout  # the field that differs, as asked

    renewed = _pytest(
        project, "test_orders.py::test_marker_alone", "--replayable-record=new",
        AGENT_VARIANT="changed",
    )  # fmt: skip
    assert renewed.returncode == 0, renewed.stdout + renewed.stderr
    assert fixture.read_bytes() != recorded

    policed = _pytest(project, "test_orders.py::test_policy_in_marker", AGENT_VARIANT="changed")
    assert policed.returncode == 1
    assert "violates:" in policed.stdout
    assert "no_notify" in policed.stdout


@pytest.mark.slow
def test_missing_fixture_under_ci_fails_and_rewrite_records_again(project):
    """With record mode none (CI's default) a missing fixture is a failure naming the
    fix; rewrite records even when the file exists."""
    ci = _pytest(project, "test_orders.py::test_marker_alone", CI="1")
    assert ci.returncode == 1
    assert "does not exist, and --replayable-record=none" in ci.stdout
    assert not (project / "fixtures" / "orders.replay").exists()
    once = _pytest(project, "test_orders.py::test_marker_alone", "--replayable-record=rewrite")
    assert once.returncode == 0, once.stdout + once.stderr
    before = (project / "fixtures" / "orders.replay").read_bytes()
    again = _pytest(project, "test_orders.py::test_marker_alone", "--replayable-record=rewrite")
    assert again.returncode == 0
    assert "recorded 1 fixture(s)" in again.stdout
    assert (project / "fixtures" / "orders.replay").read_bytes() != before  # new run ids
    bad = _pytest(project, "--replayable-record=sometimes")
    assert bad.returncode == 4
    assert "invalid choice: 'sometimes'" in bad.stderr
