"""``replay(progress=)``: the step a replay has reached, at a bounded rate."""

from __future__ import annotations

import pytest

import replayable
from replayable.errors import ConfigurationError
from tests import agents_for_cli as agents
from tests import agents_replay


@pytest.fixture
def store():
    s = replayable.open_store("memory://")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _original(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "VARIANT", "original")
    monkeypatch.setattr(agents_replay, "VARIANT", "original")


def _record(store, fn, *args) -> str:
    with replayable.recording(store) as rec:
        fn(*args)
    return rec.run_ids[0]


def test_a_full_replay_reports_its_steps_about_every_hundredth(store) -> None:
    """1,000 steps: about 100 calls, steps growing to 1,000 of 1,000, never per step."""
    rid = _record(store, agents.long_search, 1000)
    seen: list[tuple[int, int]] = []
    result = replayable.replay(rid, store=store, progress=lambda n, m: seen.append((n, m)))
    assert result.status == "identical", result.divergence
    steps = [n for n, _ in seen]
    assert {m for _, m in seen} == {1000}
    assert steps == sorted(set(steps)), "progress went back or repeated"
    assert 90 <= len(seen) <= 102, len(seen)
    assert steps[0] <= 10
    assert seen[-1] == (1000, 1000)


def test_a_short_run_reports_every_step_and_the_end_once(store) -> None:
    rid = _record(store, agents.long_search, 3)
    seen: list[tuple[int, int]] = []
    replayable.replay(rid, store=store, progress=lambda n, m: seen.append((n, m)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_a_partial_replay_reports_up_to_its_pause(store) -> None:
    rid = _record(store, agents.long_search, 200)
    seen: list[tuple[int, int]] = []
    result = replayable.replay(
        rid, store=store, stop_at=150, progress=lambda n, m: seen.append((n, m))
    )
    assert result.status == "paused"
    assert seen[-1] == (149, 200)
    assert all(n < 150 for n, _ in seen)


def test_a_diverging_replay_reports_where_it_stopped(store, monkeypatch) -> None:
    rid = _record(store, agents.long_search, 100)
    monkeypatch.setattr(agents, "VARIANT", "changed")  # step 31 asks something else
    seen: list[tuple[int, int]] = []
    result = replayable.replay(rid, store=store, progress=lambda n, m: seen.append((n, m)))
    assert result.status == "diverged"
    assert result.divergence is not None
    assert result.divergence.step == 31
    assert seen[-1] == (30, 100)
    assert [n for n, _ in seen] == list(range(1, 31))


def test_a_fork_reports_the_new_runs_steps(store) -> None:
    """Before the fork from the tape, after it live: the new run's steps, to its end."""
    rid = _record(store, agents.long_search, 300)
    seen: list[tuple[int, int]] = []
    result = replayable.replay(
        rid,
        store=store,
        fork_at=150,
        overrides={150: ["forked"]},
        progress=lambda n, m: seen.append((n, m)),
    )
    assert result.new_run_id is not None, result.divergence
    steps = [n for n, _ in seen]
    assert steps == sorted(set(steps))
    assert any(n < 150 for n in steps)
    assert any(n > 150 for n in steps)
    assert seen[-1] == (len(store.events(result.new_run_id)), 300)


def test_a_parent_counts_its_own_steps_not_its_childrens(store) -> None:
    rid = _record(store, agents_replay.parent, ["a", "b", "c"])
    total = store.get_run(rid).end.event_count
    seen: list[tuple[int, int]] = []
    result = replayable.replay(rid, store=store, progress=lambda n, m: seen.append((n, m)))
    assert result.status == "identical", result.divergence
    assert seen[-1] == (total, total)
    assert all(n <= total for n, _ in seen)


def test_a_callback_that_raises_is_dropped_not_the_replay(store) -> None:
    rid = _record(store, agents.long_search, 300)
    calls: list[int] = []

    def broken(n: int, m: int) -> None:
        calls.append(n)
        raise KeyError("dashboard gone")

    with pytest.warns(RuntimeWarning, match="progress callback raised KeyError"):
        result = replayable.replay(rid, store=store, progress=broken)
    assert result.status == "identical"
    assert calls == [3]


def test_a_progress_that_is_not_callable_is_refused(store) -> None:
    rid = _record(store, agents.long_search, 2)
    with pytest.raises(ConfigurationError, match="progress must be a callable"):
        replayable.replay(rid, store=store, progress=5)  # type: ignore[arg-type]
