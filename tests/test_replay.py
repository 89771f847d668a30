"""Full replay: identical runs, structured divergences, concurrency, child runs."""

from __future__ import annotations

import pytest

import replayable
from replayable import ReplayDivergenceError
from tests import agents_replay as agents


@pytest.fixture
def store():
    s = replayable.open_store("memory://")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _reset_agents(monkeypatch):
    monkeypatch.setattr(agents, "VARIANT", "original")
    agents.CALLS.clear()


def record(store, fn, *args):
    with replayable.recording(store) as rec:
        try:
            out = fn(*args)
        except Exception as exc:  # recorded failures are part of the tests
            out = exc
    return rec.run_ids[0], out


def test_replay_is_identical_and_calls_nothing_real(store):
    """A replay returns the recorded output without running any tool, clock or RNG."""
    run_id, out = record(store, agents.research, "llamas")
    agents.CALLS.clear()
    result = replayable.replay(run_id, store=store)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert result.events_served == 6
    assert agents.CALLS == []


def test_recorded_run_holds_every_boundary_in_order(store):
    """Every boundary becomes one event with its kind, name, request and causal key."""
    run_id, _ = record(store, agents.research, "llamas")
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [
        ("tool", "search"),
        ("tool", "fetch"),
        ("clock", "time"),
        ("uuid", "uuid4"),
        ("random", "randint"),
        ("tool", "send_email"),
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[0].request_value() == {"query": "llamas"}
    assert events[-1].side_effect is True
    assert events[0].key == "r:0"
    assert events[-1].key == "r:5"
    assert events[0].call_site
    assert "agents_replay.py" in events[0].call_site
    run = store.get_run(run_id)
    assert run.status == "completed"
    assert run.start.entrypoint == "tests.agents_replay:research"


def test_changed_argument_is_request_changed_with_field_diff(store):
    """Editing a tool argument reports the step, the asked call and the differing field."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "different_arg"
    result = replayable.replay(run_id, store=store)
    assert result.status == "diverged"
    div = result.divergence
    assert div.reason == "request_changed"
    assert div.step == 1
    assert [(d.path, d.expected, d.actual) for d in div.diff] == [("query", "llamas", "LLAMAS")]
    assert "query: recorded 'llamas', now 'LLAMAS'" in div.message
    assert div.call_site
    assert "agents_replay.py" in div.call_site


def test_reordered_calls_are_an_unexpected_call(store):
    """Calling tools in another order names the recorded call the code skipped past."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "reordered"
    div = replayable.replay(run_id, store=store).divergence
    assert div.reason == "unexpected_call"
    assert div.step == 1
    assert div.expected.name == "search"
    assert div.actual.name == "fetch"
    assert "called tool fetch where the recording has tool search" in div.message


def test_skipped_call_is_detected(store):
    """Skipping a recorded call surfaces as a mismatch at the step it would have been."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "skip_call"
    div = replayable.replay(run_id, store=store).divergence
    assert div.step == 2
    assert div.expected.name == "fetch"
    assert div.actual.kind == "clock"


def test_extra_call_is_detected(store):
    """An extra call the recording never made stops the replay at that step."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "extra_call"
    div = replayable.replay(run_id, store=store).divergence
    assert div.reason == "unexpected_call"
    assert div.step == 3
    assert div.actual.request == {"url": "https://example.test/extra"}


def test_changed_output_is_reported(store):
    """Same calls but a different return value: output_changed with the field that moved."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "output_changed"
    div = replayable.replay(run_id, store=store).divergence
    assert div.reason == "output_changed"
    assert [d.path for d in div.diff] == ["output.best"]


def test_strict_replay_raises_divergence_error(store):
    """strict=True turns a divergence into ReplayDivergenceError carrying it."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "different_arg"
    with pytest.raises(ReplayDivergenceError) as info:
        replayable.replay(run_id, store=store, strict=True)
    assert info.value.divergence.reason == "request_changed"


def test_calls_never_asked_are_reported():
    """A workflow that stops early leaves recorded calls unasked: calls_not_asked."""
    store = replayable.open_store("memory://")

    @replayable.workflow("two_calls")
    def two_calls(stop_early: bool) -> int:
        agents.search("a")
        if not stop_early:
            agents.search("b")
        return 1

    with replayable.recording(store) as rec:
        two_calls(False)

    def edited(stop_early: bool) -> int:
        agents.search("a")
        return 1

    result = replayable.replay(rec.run_ids[0], store=store, fn=edited)
    assert result.divergence.reason == "calls_not_asked"
    assert result.divergence.unasked == [2]


def test_tool_errors_are_replayed_as_the_same_exception(store):
    """A tool's exception is recorded and re-raised on replay; a failed run replays identically."""
    run_id, out = record(store, agents.fails, 1)
    assert isinstance(out, ValueError)
    assert store.get_run(run_id).status == "failed"
    agents.CALLS.clear()
    result = replayable.replay(run_id, store=store)
    assert result.status == "identical"
    assert type(result.error) is ValueError
    assert result.error.args == ("bad input 2",)
    assert agents.CALLS == []


def test_agent_except_exception_cannot_swallow_a_divergence(store):
    """Divergence unwinds past the agent's own `except Exception` handlers."""
    run_id, _ = record(store, agents.fails, 1)

    def edited(n: int) -> int:
        try:
            agents.flaky(n + 100)
        except Exception:
            return -1
        return 0

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    assert result.divergence.reason == "request_changed"


@pytest.mark.parametrize("attempt", range(3))
def test_parallel_async_calls_replay_deterministically(store, attempt):
    """gather() of one tool with different arguments matches by lineage, not completion order."""
    keys = ["a", "b", "c", "d", "e"]
    run_id, out = record(store, lambda k: __import__("asyncio").run(agents.fanout(k)), keys)
    events = store.events(run_id)
    assert len(events) == 10
    assert {e.key for e in events} == {f"r.{i}:{j}" for i in range(5) for j in range(2)}
    agents.CALLS.clear()
    result = replayable.replay(run_id, store=store)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert agents.CALLS == []


@pytest.mark.parametrize("wf", [agents.threaded, agents.threaded_carry])
def test_thread_pool_calls_replay_deterministically(store, wf):
    """Calls made from pool threads carry the run's context and match by submission order."""
    urls = [f"u{i}" for i in range(8)]
    run_id, out = record(store, wf, urls)
    assert len(store.events(run_id)) == 8
    for _ in range(3):
        result = replayable.replay(run_id, store=store)
        assert result.status == "identical", result.divergence
        assert result.output == out


def test_child_workflows_are_child_runs_replayed_from_their_tapes(store):
    """A workflow called inside another is a child run; replay serves it from its own tape."""
    run_id, out = record(store, agents.parent, ["x", "y"])
    kids = store.children(run_id)
    assert [k.workflow for k in kids] == ["child", "child"]
    assert all(k.parent_run_id == run_id and k.start.root_run_id == run_id for k in kids)
    parent_events = store.events(run_id)
    assert [e.kind for e in parent_events] == ["span", "subrun", "subrun", "tool"]
    assert parent_events[1].parent == parent_events[0].seq
    assert parent_events[1].metadata["child_run_id"] == kids[0].run_id
    agents.CALLS.clear()
    result = replayable.replay(run_id, store=store)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert result.events_served == 5  # 2 subruns + 1 tool + 2 child searches
    assert agents.CALLS == []


def test_workflow_outside_recording_just_runs():
    """Without a recording the decorators call straight through and record nothing."""
    out = agents.research("plain")
    assert out["best"] == "plain #0"
    assert "search:plain" in agents.CALLS


def test_unknown_run_and_bad_prefix_are_clear(store):
    """replay() of an unknown run raises RunNotFoundError naming what was asked."""
    with pytest.raises(replayable.RunNotFoundError, match="nope"):
        replayable.replay("nope", store=store)
