"""Replay modes, stepping, diff, tools and the run tree through the ``replayable`` CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import replayable
from replayable.capture.config import settings
from replayable.cli import app
from tests import agents_for_cli as agents


@pytest.fixture(autouse=True)
def _original_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "VARIANT", "original")
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def store(url: str) -> Iterator[replayable.EventStore]:
    s = replayable.open_store(url)
    yield s
    s.close()


def record(store: replayable.EventStore, fn: Any, *args: Any) -> str:
    with replayable.recording(store) as rec:
        fn(*args)
    return rec.run_ids[0]


def cli(url: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(app, ["--store", url, *args], input=input, env={"COLUMNS": "200"})


def as_json(result: Result) -> Any:
    return json.loads(result.stdout or "null")


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


# -- replay --stop-at ---------------------------------------------------------------


def test_stop_at_prints_the_paused_event_and_the_stack_with_locals(store, url):
    """``--stop-at 2`` pauses before the clock read, shows the stack and locals, exits 0."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "replay", run_id, "--stop-at", "2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "paused" in out
    assert "paused before step 2" in out
    assert "clock time" in out
    assert "#0 research" in out
    assert "topic =" in out
    assert "'alpha'" in out
    assert "alpha result 1" in out  # the hits local, served at step 1


def test_stop_at_json_holds_the_event_and_stack(store, url):
    """``--stop-at --json`` reports status paused with the step and each frame's locals."""
    run_id = record(store, agents.research, "alpha")
    data = as_json(cli(url, "replay", run_id, "--stop-at", "3", "--json"))
    assert data["status"] == "paused"
    assert data["events_served"] == 2
    assert data["paused"]["step"] == 3
    assert data["paused"]["name"] == "send_email"
    assert [f["function"] for f in data["paused"]["stack"]] == ["research"]
    assert data["paused"]["stack"][0]["locals"]["topic"] == "'alpha'"
    assert data["new_run_id"] is None


# -- replay --fork-at / --override ----------------------------------------------------


def test_fork_prints_the_new_run_and_its_lineage(store, url):
    """``--fork-at 1`` runs step 1 live, records a new run and names it with its lineage."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "replay", run_id, "--fork-at", "1")
    assert result.exit_code == 0, result.output
    [new_run] = [r for r in store.list_runs() if r.run_id != run_id]
    assert f"new run: {new_run.run_id}" in result.stdout
    assert f"forked from: {run_id} at step 1" in result.stdout
    assert "fork at step 1 of" in result.stdout
    assert new_run.start.lineage["forked_from"] == run_id
    assert new_run.start.lineage["fork_step"] == 1


def test_override_with_a_json_literal_replaces_the_step(store, url):
    """``--override 1=<json>`` serves that value at step 1 and marks the event."""
    run_id = record(store, agents.research, "alpha")
    data = as_json(cli(url, "replay", run_id, "--override", '1=["only hit"]', "--json"))
    assert data["status"] == "diverged"  # the mail body changed: the side effect is blocked
    assert data["divergence"]["reason"] == "side_effect_blocked"
    argv = ["replay", run_id, "--override", '1=["only hit"]', "--on-side-effect", "recorded"]
    data = as_json(cli(url, *argv, "--json"))
    assert data["status"] == "completed"
    assert data["output"]["hits"] == ["only hit"]
    assert data["lineage"]["overridden"] is True
    assert data["blocked"] == [3]
    events = store.events(data["new_run_id"])
    assert events[0].metadata["override"] is True
    assert events[2].metadata["side_effect_blocked"] is True


def test_override_from_a_file(store, url, tmp_path):
    """``--override 1=@file.json`` reads the value from the file."""
    run_id = record(store, agents.research, "alpha")
    value = tmp_path / "hits.json"
    value.write_text(json.dumps(["a", "b", "c"]))
    result = cli(url, "replay", run_id, "--override", f"1=@{value}", "--json")
    data = as_json(result)
    assert result.exit_code == 0, result.output
    assert data["status"] == "completed"
    assert data["output"]["hits"] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ('1={"text": "low"}', ["step 1 (llm", "lacks the keys 'status'", '"status":"ok"']),
        (
            '1={"status": "ok", "usage": [], "verdict": {"risk": 3, "score": 1}}',
            ["is a number at verdict.risk"],
        ),
        ('1=["ok"]', ["is a list, where an object was recorded"]),
        ('2={"risk": "low"}', ["step 2 (llm", "tests.agents_for_cli:Verdict", "'score'"]),
        ('9={"status": "ok"}', ["has no step 9 (its steps are 1 to 2)"]),
    ],
)
def test_an_override_of_the_wrong_shape_says_what_is_expected(store, url, override, needles):
    """A value that does not fit the recorded step is refused before the replay runs."""
    run_id = record(store, agents.graded, "contract")
    result = cli(url, "replay", run_id, "--override", override)
    assert_one_line_error(result, f"--override {override.split('=')[0]}", *needles)
    assert len(store.list_runs()) == 1  # nothing was replayed, so no new run


def test_an_override_of_the_right_shape_replaces_an_llm_step(store, url):
    """An override with the recorded keys (and more) is served; a typed step is rebuilt."""
    run_id = record(store, agents.graded, "contract")
    value = '1={"status": "retry", "verdict": {"risk": "low", "score": 1}, "usage": [], "x": 1}'
    data = as_json(cli(url, "replay", run_id, "--override", value, "--json"))
    assert data["status"] == "completed", data
    assert data["output"] == "retry:low:medium"
    typed = '2={"risk": "critical", "score": 0.1}'
    data = as_json(cli(url, "replay", run_id, "--override", typed, "--json"))
    assert data["status"] == "completed", data
    assert data["output"] == "ok:high:critical"


def test_piped_diff_keeps_each_line_whole(store, url):
    """Not a terminal: the diff is not folded or cut to 60 columns."""
    run_id = record(store, agents.graded, "contract")
    value = '1={"status": "retry", "verdict": {"risk": "low", "score": 1}, "usage": []}'
    fork = as_json(cli(url, "replay", run_id, "--override", value, "--json"))["new_run_id"]
    result = CliRunner().invoke(app, ["--store", url, "diff", run_id, fork], env={"COLUMNS": "60"})
    assert result.exit_code == 1, result.output  # the runs differ
    assert any(
        "step 1 ↔ 1: llm tests._model_api: response.verdict.score changed from 0.9 to 1" in line
        for line in result.stdout.splitlines()
    ), result.stdout
    assert f"A {run_id}" in result.stdout
    assert f"B {fork}" in result.stdout


def test_blocked_side_effect_is_named_and_exits_one(store, url):
    """A guarded tool with a new request stops the fork: exit 1, reason side_effect_blocked."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "replay", run_id, "--override", '1=["x"]')
    assert result.exit_code == 1, result.output
    assert "diverged" in result.stdout
    assert "send_email" in result.stdout


def test_allow_live_runs_the_side_effect_for_real(store, url):
    """``--allow-live send_email`` lets the changed mail go out live."""
    run_id = record(store, agents.research, "alpha")
    data = as_json(
        cli(url, "replay", run_id, "--override", '1=["x"]', "--allow-live", "send_email", "--json")
    )
    assert data["status"] == "completed", data
    mail = store.events(data["new_run_id"])[2]
    assert mail.metadata.get("live") is True
    assert data["blocked"] == []


# -- replay --live / --children -------------------------------------------------------


def test_live_runs_a_named_boundary_in_a_counterfactual(store, url, monkeypatch):
    """``--live search_web`` runs the changed search live and freezes the rest."""
    run_id = record(store, agents.research, "alpha")
    monkeypatch.setattr(agents, "VARIANT", "revised")
    result = cli(url, "replay", run_id, "--live", "search_web", "--json")
    data = as_json(result)
    assert result.exit_code == 0, result.output
    assert data["status"] == "completed"
    assert data["output"]["hits"][0] == "alpha (revised) result 1"
    assert data["lineage"]["mode"] == "counterfactual"
    assert data["lineage"]["live"] == ["search_web"]


def test_children_live_runs_child_workflows(store, url):
    """``--children live`` records new child runs under the new parent."""
    run_id = record(store, agents.fanout, ["a", "b"])
    data = as_json(cli(url, "replay", run_id, "--children", "live", "--json"))
    assert data["status"] == "completed", data
    kids = store.children(data["new_run_id"])
    assert [k.workflow for k in kids] == ["research", "research"]


# -- impossible requests ----------------------------------------------------------------


def test_step_beyond_the_run_is_a_one_line_error(store, url):
    """``--stop-at 99`` on a three-step run is refused on one line, exit 2."""
    run_id = record(store, agents.research, "alpha")
    assert_one_line_error(cli(url, "replay", run_id, "--stop-at", "99"), "beyond run", run_id)


def test_fork_inside_a_child_run_is_a_one_line_error(store, url):
    """A step that exists only in a child run names the child to replay instead."""
    run_id = record(store, agents.fanout, ["a", "b"])
    kid = store.children(run_id)[0]
    assert_one_line_error(
        cli(url, "replay", run_id, "--fork-at", "3"), "inside child run", kid.run_id
    )


def test_unknown_tool_in_allow_live_is_a_one_line_error(store, url):
    """``--allow-live`` with a name the run does not know is refused."""
    run_id = record(store, agents.research, "alpha")
    assert_one_line_error(
        cli(url, "replay", run_id, "--fork-at", "1", "--allow-live", "launch_rocket"),
        "unknown tool 'launch_rocket'",
    )


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("x=1", "is not STEP=VALUE"),
        ("1", "is not STEP=VALUE"),
        ("1=not json", "is not JSON"),
        ("1=@/no/such/file.json", "cannot read"),
    ],
)
def test_bad_override_syntax_is_a_one_line_error(store, url, override, needle):
    """A malformed ``--override`` names the option and what is wrong with it."""
    run_id = record(store, agents.research, "alpha")
    assert_one_line_error(cli(url, "replay", run_id, "--override", override), needle)


def test_stop_at_with_fork_at_is_a_one_line_error(store, url):
    """Pausing and forking in one replay is refused before anything runs."""
    run_id = record(store, agents.research, "alpha")
    assert_one_line_error(
        cli(url, "replay", run_id, "--stop-at", "2", "--fork-at", "1"), "--stop-at", "--fork-at"
    )
    assert len(store.list_runs()) == 1


def test_bad_children_and_side_effect_choices_are_one_line_errors(store, url):
    """``--children`` and ``--on-side-effect`` take only their listed values."""
    run_id = record(store, agents.research, "alpha")
    assert_one_line_error(cli(url, "replay", run_id, "--children", "some"), "children")
    assert_one_line_error(
        cli(url, "replay", run_id, "--fork-at", "1", "--on-side-effect", "run"), "on_side_effect"
    )


# -- step -------------------------------------------------------------------------------


def test_step_reads_commands_from_a_pipe(store, url):
    """``step`` driven through stdin: next, where, locals, print, show, continue."""
    run_id = record(store, agents.research, "alpha")
    commands = "next\nwhere\nlocals\nprint len(hits)\nshow\ncontinue\n"
    result = cli(url, "step", run_id[:12], input=commands)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"stepping run {run_id} (research)" in out
    assert "step 1: tool search_web" in out
    assert "step 2: clock time" in out
    assert "#0 research at" in out
    assert "topic = 'alpha'" in out
    assert "\n3\n" in out.replace("(replayable) ", "")
    assert "replay finished: identical (3 events served)" in out


def test_step_quit_stops_early(store, url):
    """``quit`` ends the session before the replay finishes, exit 0."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "step", run_id, input="quit\n")
    assert result.exit_code == 0, result.output
    assert "replay stopped" in result.stdout
    assert "replay finished" not in result.stdout


# -- diff -------------------------------------------------------------------------------


def _fork_with_override(store: replayable.EventStore, run_id: str) -> str:
    forked = replayable.replay(
        run_id, store=store, overrides={1: ["other"]}, on_side_effect="recorded"
    )
    assert forked.new_run_id is not None
    return forked.new_run_id


def test_diff_of_a_run_with_itself_is_identical(store, url):
    """Two identical runs: exit 0 and say so."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "diff", run_id, run_id)
    assert result.exit_code == 0, result.output
    assert "identical" in result.stdout


def test_diff_shows_the_first_divergence_side_by_side(store, url):
    """The first divergence is on top and marked in the table; output changes follow; exit 1."""
    run_id = record(store, agents.research, "alpha")
    fork = _fork_with_override(store, run_id)
    result = cli(url, "diff", run_id, fork)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "first divergence" in out
    assert "step 1 ↔ 1: tool search_web" in out
    assert "▶ changed" in out
    assert "output changes" in out
    assert "output.hits" in out
    marked = [line for line in out.splitlines() if "▶" in line]
    assert len(marked) == 1
    assert "search_web" in marked[0]


def test_diff_json_for_machines(store, url):
    """``diff --json`` names the first divergence and lists changed pairs (all with --all)."""
    run_id = record(store, agents.research, "alpha")
    fork = _fork_with_override(store, run_id)
    data = as_json(cli(url, "diff", run_id, fork, "--json"))
    assert data["identical"] is False
    assert data["first_divergence"]["left_step"] == 1
    assert data["first_divergence"]["name"] == "search_web"
    assert {p["status"] for p in data["pairs"]} == {"changed"}
    every = as_json(cli(url, "diff", run_id, fork, "--json", "--all"))
    assert len(every["pairs"]) == 3


def test_diff_ignore_and_significant_paths(store, url):
    """``--ignore`` turns a change into noise; ``--significant`` promotes one."""
    run_id = record(store, agents.research, "alpha")
    fork = _fork_with_override(store, run_id)
    data = as_json(cli(url, "diff", run_id, fork, "--json", "--ignore", "response*"))
    assert data["first_divergence"]["left_step"] != 1
    ranked = as_json(cli(url, "diff", run_id, fork, "--json", "--significant", "response*"))
    assert ranked["first_divergence"]["rank"] == "significant"


# -- tools ------------------------------------------------------------------------------


@pytest.fixture
def configured_side_effects() -> Iterator[None]:
    saved = settings.side_effects
    replayable.configure(side_effects=["charge_card"])
    yield
    settings.side_effects = saved


def test_tools_lists_guarded_tools_from_code_store_and_config(store, url, configured_side_effects):
    """``tools`` merges decorated, recorded and configured tools with a guarded flag."""
    record(store, agents.research, "alpha")
    result = cli(url, "tools", "--module", "tests.agents_for_cli", "--json")
    assert result.exit_code == 0, result.output
    found = {t["name"]: t for t in json.loads(result.stdout)}
    assert found["send_email"]["guarded"] is True
    assert found["send_email"]["side_effect"] is True
    assert found["search_web"]["guarded"] is False
    assert found["search_web"]["recorded_runs"] == 1
    assert "store" in found["search_web"]["sources"]
    assert found["charge_card"]["configured"] is True
    assert found["charge_card"]["guarded"] is True
    table = cli(url, "tools", "--module", "tests.agents_for_cli")
    row = next(line for line in table.stdout.splitlines() if "send_email" in line)
    assert "yes" in row
    assert "guarded" in table.stdout


def test_tools_with_an_unimportable_module_is_a_one_line_error(url):
    """A ``--module`` that cannot be imported is refused on one line."""
    assert_one_line_error(cli(url, "tools", "--module", "no_such_module_xyz"), "no_such_module_xyz")


# -- show: run tree, lineage, marks ---------------------------------------------------------


def test_show_marks_replayed_override_and_blocked_events(store, url):
    """A fork's timeline marks each event replayed, override, live or blocked."""
    run_id = record(store, agents.research, "alpha")
    fork = _fork_with_override(store, run_id)
    out = cli(url, "show", fork).stdout
    assert f"forked from  {run_id} at step 1 (override)" in out
    rows = {line.split("│")[0].strip(): line for line in out.splitlines() if "│" in line}
    assert "override" in rows["1"]
    assert "live" in rows["2"]
    assert "blocked" in rows["3"]
    original = cli(url, "show", run_id).stdout
    assert "via" not in original.split("events")[-1].splitlines()[1]


def test_show_prints_the_run_tree_from_any_node(store, url):
    """``show`` of a child run draws its parent and siblings, marking the run shown."""
    run_id = record(store, agents.fanout, ["a", "b"])
    kids = store.children(run_id)
    out = cli(url, "show", kids[1].run_id).stdout
    assert "run tree" in out
    tree = out.split("run tree", 1)[1]
    assert run_id in tree
    assert kids[0].run_id in tree
    marked = [line for line in tree.splitlines() if "◀ this run" in line]
    assert len(marked) == 1
    assert kids[1].run_id in marked[0]
    data = as_json(cli(url, "show", kids[0].run_id, "--json"))
    assert data["tree"]["run_id"] == run_id
    assert [c["run_id"] for c in data["tree"]["children"]] == [k.run_id for k in kids]
