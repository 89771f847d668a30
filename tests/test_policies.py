"""Decision policies on recorded runs, on replays, forks and counterfactuals, and in the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import replayable
from replayable.audit.policies import Policy, PolicyRun, check_run, find_policy
from replayable.audit.policy_library import (
    argument_limits,
    confirmation_before,
    no_decision_on_empty_result,
    only_allowed_tools,
)
from replayable.cli import app
from tests import agents_policies

CONFIRM = confirmation_before("delete_event", "ask_confirmation", confirmed="approved")


@replayable.policy("test_delete_confirmed")
def delete_confirmed(run: PolicyRun):
    """Every deletion follows a confirmation (written with the helpers)."""
    for call in run.calls("delete_event"):
        if not run.before("ask_confirmation", call):
            return run.violation("deleted without asking", call)
    return True


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> replayable.EventStore:
    monkeypatch.setattr(agents_policies, "ASK_FIRST", False)
    return replayable.open_store(f"sqlite:///{tmp_path / 'runs.db'}")


def _record(store: replayable.EventStore, fn, *args) -> str:
    with replayable.recording(store) as rec:
        fn(*args)
    return rec.run_ids[0]


def test_confirmation_policy_names_the_deletion_and_the_counterfactual_blocks_it(
    store, monkeypatch
):
    """The recorded run deleted without asking: both forms of the rule name step 2. With
    the new code asking first, a counterfactual (only the confirmation live) passes."""
    run_id = _record(store, agents_policies.tidy_calendar, "ops")
    for result in check_run(store, run_id, [CONFIRM, delete_confirmed]):
        assert not result.passed
        assert result.steps == (2,)
        assert (
            result.fingerprint
            == (
                CONFIRM if result.policy != "test_delete_confirmed" else delete_confirmed
            ).fingerprint
        )

    monkeypatch.setattr(agents_policies, "ASK_FIRST", True)
    cf = replayable.replay(
        run_id, store=store, live={"ask_confirmation"}, policies=[CONFIRM, delete_confirmed]
    )
    assert cf.status == "completed", cf.divergence
    assert cf.output == {"deleted": None, "asked": True}
    assert [p.passed for p in cf.policies] == [True, True]
    assert {p.run_id for p in cf.policies} == {cf.new_run_id}


def test_pure_replay_judges_the_recorded_run_and_a_divergence_judges_nothing(store, monkeypatch):
    """An identical replay carries the verdicts on the run it reproduced; a diverged pure
    replay made no run, so it carries none."""
    run_id = _record(store, agents_policies.tidy_calendar, "ops")
    same = replayable.replay(run_id, store=store, policies=[CONFIRM])
    assert same.status == "identical"
    assert [(p.run_id, p.passed) for p in same.policies] == [(run_id, False)]
    monkeypatch.setattr(agents_policies, "ASK_FIRST", True)
    moved = replayable.replay(run_id, store=store, policies=[CONFIRM])
    assert moved.status == "diverged"
    assert moved.policies == ()


def test_fork_result_is_judged_on_the_new_run(store, monkeypatch):
    """A fork at step 1 with the corrected code is a new run; the rule passes on it."""
    run_id = _record(store, agents_policies.tidy_calendar, "ops")
    monkeypatch.setattr(agents_policies, "ASK_FIRST", True)
    fork = replayable.replay(run_id, store=store, fork_at=1, policies=[CONFIRM])
    assert fork.status == "completed"
    assert fork.policies[0].passed
    assert fork.policies[0].run_id == fork.new_run_id != run_id


def test_only_allowed_tools_and_argument_limits(store):
    """Tools off the list are named; an amount over the limit and a date out of range
    each name the refund step; within bounds passes."""
    run_id = _record(store, agents_policies.tidy_calendar, "ops")
    allowed = only_allowed_tools("list_events", "ask_confirmation")
    [r] = check_run(store, run_id, [allowed])
    assert (r.passed, r.steps) == (False, (2,))
    assert "delete_event" in r.message
    [ok] = check_run(store, run_id, [only_allowed_tools("list_events", "delete_event")])
    assert ok.passed

    big = _record(store, agents_policies.refunds, 900.0, "2026-06-01")
    late = _record(store, agents_policies.refunds, 100.0, "2027-02-01")
    fine = _record(store, agents_policies.refunds, 100.0, "2026-06-01")
    limits = argument_limits("refund", amount=(0, 500), date=("2026-01-01", "2026-12-31"))
    assert [r.passed for r in check_run(store, fine, [limits])] == [True]
    [over] = check_run(store, big, [limits])
    assert (over.passed, over.steps) == (False, (1,))
    assert "amount=900.0 is outside [0, 500]" in over.message
    [after] = check_run(store, late, [limits])
    assert "date='2027-02-01' is outside" in after.message


def test_no_decision_on_an_empty_result(store):
    """An empty calendar listing followed by a deletion is a violation naming both steps."""
    empty = _record(store, agents_policies.tidy_calendar, "empty")
    full = _record(store, agents_policies.tidy_calendar, "ops")
    rule = no_decision_on_empty_result("list_events")
    [bad] = check_run(store, empty, [rule])
    assert (bad.passed, bad.steps) == (False, (1, 2))
    assert "delete_event acted after list_events answered nothing" in bad.message
    assert check_run(store, full, [rule])[0].passed


def test_fingerprint_is_the_code_and_its_parameters():
    """Same code and parameters, same fingerprint; other parameters or other code, another."""
    a = argument_limits("refund", amount=(0, 500))
    b = argument_limits("refund", amount=(0, 500))
    c = argument_limits("refund", amount=(0, 1000))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    d = Policy("x", lambda run: True)
    e = Policy("x", lambda run: run.status == "completed")
    assert d.fingerprint != e.fingerprint
    assert len(a.fingerprint) == 64


def test_a_policy_that_raises_or_answers_nonsense_fails_with_the_reason(store):
    """A bug in a policy is a failed check with the error, never a pass."""
    run_id = _record(store, agents_policies.refunds, 10.0, "2026-06-01")
    boom = Policy("boom", lambda run: run.calls("refund")[5])
    odd = Policy("odd", lambda run: "yes")
    r1, r2 = check_run(store, run_id, [boom, odd])
    assert (r1.status, r2.status) == ("error", "error")
    assert r1.error is not None
    assert r1.error.startswith("IndexError")
    assert "returned str" in (r2.error or "")


def test_cli_check_on_a_run_and_on_a_query(store):
    """``check RUN`` and ``check --name … --where …`` print verdicts with fingerprints and
    exit 1 on a violation, 0 when all pass, 2 without a policy."""
    bad = _record(store, agents_policies.tidy_calendar, "ops")
    runner = CliRunner()
    spec = "tests.test_policies:delete_confirmed"
    res = runner.invoke(app, ["--store", store.url, "check", bad, "--policy", spec])
    assert res.exit_code == 1, res.output
    assert f"test_delete_confirmed [{delete_confirmed.fingerprint[:12]}] violation" in res.output
    assert "violation at step 2: deleted without asking" in res.output
    res = runner.invoke(
        app,
        [
            "--store", store.url, "check", "--name", "delete_event", "--json",
            "--policy", "tests.test_policies:test_delete_confirmed",
        ],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    [line] = [json.loads(x) for x in res.output.splitlines()]
    assert line["fingerprint"] == delete_confirmed.fingerprint
    assert (line["run_id"], line["status"], line["steps"]) == (bad, "violation", [2])
    ok = runner.invoke(
        app,
        [
            "--store", store.url, "check", bad,
            "--policy", "tests.test_policies:delete_confirmed",
            "--policy", "tests.agents_policies:nothing",
        ],
    )  # fmt: skip
    assert ok.exit_code == 2
    assert "has no policy 'nothing'" in ok.output
    none = runner.invoke(app, ["--store", store.url, "check", bad])
    assert none.exit_code == 2
    assert "at least one --policy" in none.output


def test_find_policy_by_attribute_registry_or_sole_policy():
    """``module:attr``, ``module:registered_name`` and a module with one policy all resolve."""
    assert find_policy("tests.test_policies:delete_confirmed") is delete_confirmed
    assert find_policy("tests.test_policies:test_delete_confirmed") is delete_confirmed
    with pytest.raises(ValueError, match="cannot import no_such_module"):
        find_policy("no_such_module:x")


def test_cli_check_is_written_to_the_access_log(store):
    """Policies read a run's payloads: ``check RUN`` and ``check --name …`` log each run
    judged (and the search that found it) as the acting user, through the CLI."""
    bad = _record(store, agents_policies.tidy_calendar, "ops")
    before = len(store.access_entries(run_id=bad))
    runner = CliRunner()
    spec = "tests.test_policies:delete_confirmed"
    env = {"REPLAYABLE_USER": "rita", "REPLAYABLE_ROLE": "engineer"}
    res = runner.invoke(
        app, ["--store", store.url, "check", bad, "--policy", spec, "--purpose", "INC-7"], env=env
    )
    assert res.exit_code == 1, res.output
    res = runner.invoke(
        app, ["--store", store.url, "check", "--name", "delete_event", "--policy", spec], env=env
    )
    assert res.exit_code == 1, res.output
    entries = store.access_entries(run_id=bad)[before:]
    assert [(e.user, e.channel, e.what) for e in entries] == [
        ("rita", "cli", ("request", "response", "policy")),
        ("rita", "cli", ("search",)),
        ("rita", "cli", ("request", "response", "policy")),
    ]
    assert entries[0].purpose == "INC-7"
    assert entries[0].steps == tuple(e.seq for e in store.events(bad))
