"""Replay modes: partial (stop_at), fork, counterfactual, live children, the side-effect guard."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import uuid

import pytest

import replayable
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
        out = fn(*args)
    agents.CALLS.clear()
    return rec.run_ids[0], out


# -- partial --------------------------------------------------------------------


def test_stop_at_pauses_before_the_step_with_stack_and_locals(store):
    """stop_at=N serves N-1 events, then pauses with the event about to be served and the stack."""
    run_id, _ = record(store, agents.research, "llamas")
    result = replayable.replay(run_id, store=store, stop_at=3)
    assert result.status == "paused"
    assert result.events_served == 2
    paused = result.paused
    assert paused.event.seq == 3
    assert paused.event.kind == "clock"
    assert [f.function for f in paused.frames] == ["research"]
    local_vars = paused.frames[0].locals
    assert local_vars["topic"] == "'llamas'"
    assert "llamas #0" in local_vars["hits"]
    assert "paused before step 3: clock time" in paused.render()
    assert agents.CALLS == []


def test_stop_at_inside_a_tool_helper_shows_the_whole_stack(store):
    """The stack runs from the workflow entry down to the frame that made the call."""
    run_id, _ = record(store, agents.parent, ["x", "y"])
    result = replayable.replay(run_id, store=store, stop_at=4)
    assert result.status == "paused"
    assert result.paused.event.name == "fetch"
    assert [f.function for f in result.paused.frames] == ["parent"]


def test_stop_at_renders_unprintable_locals_safely(store):
    """A local whose repr raises or is huge is summarized, never raising."""

    class Nasty:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    @replayable.workflow("nasty")
    def nasty() -> int:
        bad = Nasty()  # noqa: F841 - inspected through the paused frame
        big = "x" * 10_000  # noqa: F841
        agents.search("a")
        agents.search("b")
        return 1

    with replayable.recording(store) as rec:
        nasty()
    result = replayable.replay(rec.run_ids[0], store=store, fn=nasty, stop_at=2)
    local_vars = result.paused.frames[0].locals
    assert local_vars["bad"].startswith("<Nasty instance at")
    assert len(local_vars["big"]) < 300


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (99, "stop_at=99 is beyond run"),
        (0, "stop_at=0 is beyond run"),
    ],
)
def test_stop_at_beyond_the_run_is_a_clear_error(store, step, message):
    """Asking for a step the run does not have names the run and its range."""
    run_id, _ = record(store, agents.research, "llamas")
    with pytest.raises(replayable.ConfigurationError, match=message):
        replayable.replay(run_id, store=store, stop_at=step)


def test_stop_at_a_span_is_a_clear_error_and_the_next_call_pauses(store):
    """The tape of a partial replay ends at its step; a step that is a span (no call to
    pause before) is refused, naming the step, even though it is the last event read,
    and the call after it pauses as any other."""
    run_id, _ = record(store, agents.parent, ["a"])
    events = store.events(run_id)
    span = next(e for e in events if e.kind == "span")
    with pytest.raises(replayable.ConfigurationError, match=f"stop_at={span.seq}: "):
        replayable.replay(run_id, store=store, stop_at=span.seq)
    after = next(e for e in events if e.seq > span.seq and e.key is not None)
    result = replayable.replay(run_id, store=store, stop_at=after.seq)
    assert result.status == "paused"
    assert result.paused.event.seq == after.seq


# -- fork -----------------------------------------------------------------------


def test_fork_with_override_records_a_new_run_with_lineage(store):
    """fork_at=N with an override: prefix from tape, the value at N, the rest live."""
    run_id, out = record(store, agents.research, "llamas")
    result = replayable.replay(
        run_id,
        store=store,
        fork_at=2,
        overrides={2: "<html>fixed</html>"},
        allow_live={"send_email"},
    )
    assert result.status == "completed", result.divergence
    assert result.output["len"] == len("<html>fixed</html>")
    assert result.output["best"] == out["best"]  # step 1 came from the tape
    assert result.new_run_id
    assert result.new_run_id != run_id
    assert "search:llamas" not in agents.CALLS
    assert "send_email:ops@example.test" in agents.CALLS
    fork = store.get_run(result.new_run_id)
    assert fork.start.lineage == {
        "replay_of": run_id,
        "forked_from": run_id,
        "fork_step": 2,
        "mode": "fork",
        "overridden": True,
    }
    events = store.events(result.new_run_id)
    assert [e.name for e in events] == ["search", "fetch", "time", "uuid4", "randint", "send_email"]
    assert events[0].metadata["replayed_from"] == 1
    assert events[1].metadata["override"] is True
    assert events[2].metadata["live"] is True
    assert replayable.verify_run(store, result.new_run_id).ok


def test_fork_blocks_an_unrecorded_side_effect(store):
    """After the fork a side-effect tool with a new request stops the replay as blocked."""
    run_id, _ = record(store, agents.research, "llamas")
    result = replayable.replay(run_id, store=store, fork_at=2, overrides={2: "<html>other</html>"})
    assert result.status == "diverged"
    assert result.divergence.reason == "side_effect_blocked"
    assert result.divergence.actual.name == "send_email"
    assert "side effect blocked" in result.divergence.message
    assert not any(c.startswith("send_email") for c in agents.CALLS)


def test_fork_serves_a_side_effect_whose_request_was_recorded(store):
    """A guarded call with a recorded request gets the recorded response, and does not run."""
    run_id, out = record(store, agents.research, "llamas")
    # Overriding step 2 with the same-length page keeps send_email's request identical.
    recorded_page = agents.fetch.__wrapped__  # noqa: F841 - the real tool is not called
    page = store.events(run_id)[1].response_tree()
    result = replayable.replay(run_id, store=store, fork_at=2, overrides={2: page})
    assert result.status == "completed", result.divergence
    assert result.output["receipt"] == out["receipt"]
    assert agents.CALLS == []


def test_fork_with_recorded_side_effects_finishes_without_running_them(store):
    """on_side_effect='recorded' answers a blocked side effect with its recorded response."""
    run_id, out = record(store, agents.research, "llamas")
    result = replayable.replay(
        run_id, store=store, fork_at=2, overrides={2: "short"}, on_side_effect="recorded"
    )
    assert result.status == "completed", result.divergence
    assert result.output["receipt"] == out["receipt"]
    assert not any(c.startswith("send_email") for c in agents.CALLS)
    assert len(result.blocked) == 1
    blocked = [e for e in store.events(result.new_run_id) if e.metadata.get("side_effect_blocked")]
    assert [e.name for e in blocked] == ["send_email"]


def test_fork_live_runs_the_current_code(store, monkeypatch):
    """Without an override the fork step itself runs live, exercising the current tool code."""
    run_id, _ = record(store, agents.research, "llamas")
    result = replayable.replay(run_id, store=store, fork_at=2, allow_live={"send_email"})
    assert result.status == "completed", result.divergence
    assert agents.CALLS[0] == "fetch:https://example.test/llamas"


def test_fork_errors_are_clear(store):
    """Impossible fork requests are one-line ConfigurationErrors."""
    run_id, _ = record(store, agents.research, "llamas")
    with pytest.raises(replayable.ConfigurationError, match="unknown tool 'nope' in allow_live"):
        replayable.replay(run_id, store=store, fork_at=2, allow_live={"nope"})
    with pytest.raises(replayable.ConfigurationError, match="side-effect tool 'send_email'"):
        replayable.replay(run_id, store=store, fork_at=6)
    with pytest.raises(replayable.ConfigurationError, match="beyond run"):
        replayable.replay(run_id, store=store, fork_at=60)
    with pytest.raises(replayable.ConfigurationError, match="must name the fork step"):
        replayable.replay(run_id, store=store, fork_at=2, overrides={3: 1.0})


@replayable.workflow("long_child")
def long_child(q: str) -> int:
    for i in range(3):
        agents.search(f"{q}{i}")
    return 3


@replayable.workflow("short_parent")
def short_parent() -> int:
    return long_child("q") + len(agents.fetch("u"))


def test_fork_inside_a_child_run_must_name_it(store):
    """A step that exists only inside a child run is refused, naming the child to replay."""
    run_id, _ = record(store, short_parent)
    (kid,) = store.children(run_id)
    with pytest.raises(replayable.ConfigurationError, match=f"inside child run {kid.run_id}"):
        replayable.replay(run_id, store=store, fork_at=3)
    forked = replayable.replay(kid.run_id, store=store, fork_at=3, overrides={3: []})
    assert forked.status == "completed", forked.divergence


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.mark.parametrize(
    "value",
    [
        {"k": [1, 2]},
        (1, "a"),
        b"\x00bytes",
        dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC),
        decimal.Decimal("1.10"),
        uuid.UUID(int=7),
        Color.RED,
        Point(1, 2),
        {1, 2},
        None,
        3.5,
    ],
)
def test_overrides_accept_every_codec_type(store, value):
    """An override of any encodable type reaches the agent as that type and is recorded."""

    @replayable.tool
    def produce() -> object:
        return "recorded"

    @replayable.workflow("override_types")
    def override_types() -> object:
        return produce()

    with replayable.recording(store) as rec:
        override_types()
    result = replayable.replay(
        rec.run_ids[0], store=store, fn=override_types, fork_at=1, overrides={1: value}
    )
    assert result.status == "completed", result.divergence
    assert result.output == value
    assert type(result.output) is type(value)
    fork_event = store.events(result.new_run_id)[0]
    assert fork_event.metadata["override"] is True


# -- counterfactual -------------------------------------------------------------


def test_counterfactual_runs_named_boundaries_live_and_freezes_the_rest(store):
    """live={'search'} re-runs search for real; fetch, clock and the side effect stay frozen."""
    run_id, out = record(store, agents.research, "llamas")
    result = replayable.replay(run_id, store=store, live={"search"})
    assert result.status == "completed", result.divergence
    assert agents.CALLS == ["search:llamas"]
    assert result.output["best"] == out["best"]
    assert result.output["stamp"] == out["stamp"]
    lineage = store.get_run(result.new_run_id).start.lineage
    assert lineage["mode"] == "counterfactual"
    assert lineage["live"] == ["search"]


def test_counterfactual_stops_when_a_live_change_reaches_a_frozen_side_effect(store, monkeypatch):
    """A live fetch with new content changes the e-mail body; the frozen side effect stops it."""
    run_id, _ = record(store, agents.research, "llamas")
    monkeypatch.setattr(agents._random, "random", lambda: 0.5)  # a page of another length
    result = replayable.replay(run_id, store=store, live={"fetch"})
    assert result.status == "diverged"
    assert result.divergence.reason == "side_effect_blocked"
    assert not any(c.startswith("send_email") for c in agents.CALLS)


def test_counterfactual_frozen_call_without_a_match_diverges(store):
    """A frozen call whose request was never recorded stops instead of improvising."""
    run_id, _ = record(store, agents.research, "llamas")
    agents.VARIANT = "different_arg"
    result = replayable.replay(run_id, store=store, live={"fetch"})
    assert result.status == "diverged"
    assert result.divergence.actual.name == "search"


def test_counterfactual_by_kind(store):
    """live={'clock'} refreshes every clock read; other boundaries come from the tape."""
    run_id, out = record(store, agents.research, "llamas")
    result = replayable.replay(run_id, store=store, live={"clock"})
    assert result.status == "completed", result.divergence
    assert result.output["stamp"] != out["stamp"]
    assert result.output["token"] == out["token"]


# -- sub-agents -----------------------------------------------------------------


def test_children_live_runs_child_workflows_for_real(store):
    """children='live' re-runs child workflows live as new child runs of the replay run."""
    run_id, out = record(store, agents.parent, ["x", "y"])
    result = replayable.replay(run_id, store=store, children="live")
    assert result.status == "completed", result.divergence
    assert sorted(agents.CALLS) == ["search:x", "search:y"]
    kids = store.children(result.new_run_id)
    assert [k.workflow for k in kids] == ["child", "child"]
    assert result.output == out


def test_fork_keeps_the_run_tree(store):
    """Forking a parent after its children keeps the recorded children (shared, not re-run)."""
    run_id, out = record(store, agents.parent, ["x", "y"])
    fetch_step = next(e.seq for e in store.events(run_id) if e.name == "fetch")
    result = replayable.replay(run_id, store=store, fork_at=fetch_step, overrides={fetch_step: ""})
    assert result.status == "completed", result.divergence
    assert result.output == out
    subruns = [e for e in store.events(result.new_run_id) if e.kind == "subrun"]
    originals = [k.run_id for k in store.children(run_id)]
    assert [e.metadata["child_run_id"] for e in subruns] == originals
    assert agents.CALLS == []


def test_async_fork_with_parallel_calls(store):
    """A fork of an async run with gather() serves the prefix by lineage and records the rest."""
    run_id, _out = record(store, lambda k: asyncio.run(agents.fanout(k)), ["a", "b", "c"])
    first = store.events(run_id)[0]
    result = replayable.replay(
        run_id,
        store=store,
        fork_at=first.seq,
        overrides={first.seq: {"key": "a", "value": "forked"}},
    )
    assert result.status == "completed", result.divergence
    assert "forked" not in result.output[1]
    assert "forked" not in result.output[2]
    assert len(store.events(result.new_run_id)) == 6


# -- async agents -----------------------------------------------------------------


@replayable.tool
async def alookup(key: str) -> dict[str, str]:
    await asyncio.sleep(0)
    agents.CALLS.append(f"alookup:{key}")
    return {"key": key, "value": f"{key}-{agents._random.random()}"}


@replayable.tool(side_effect=True)
async def apublish(text: str) -> str:
    agents.CALLS.append("apublish")
    return f"published {len(text)}"


@replayable.workflow("async_child")
async def async_child(key: str) -> str:
    return (await alookup(key))["value"]


@replayable.workflow("async_agent")
async def async_agent(keys: list[str]) -> dict[str, object]:
    values = await asyncio.gather(*(alookup(k) for k in keys))
    extra = await async_child("child")
    receipt = await apublish(",".join(v["key"] for v in values))
    return {"values": [v["value"] for v in values], "extra": extra, "receipt": receipt}


def record_async(store, keys):
    with replayable.recording(store) as rec:
        out = asyncio.run(async_agent(keys))
    agents.CALLS.clear()
    return rec.run_ids[0], out


def test_async_stop_at_pauses_inside_a_gather_branch(store):
    """stop_at works on async agents: the pause names the step and the coroutine's frame."""
    run_id, _ = record_async(store, ["a", "b", "c"])
    result = replayable.replay(run_id, store=store, stop_at=2)
    assert result.status == "paused"
    assert result.paused.event.name == "alookup"
    # The gathered task has no agent frame above the call; the stack shows the
    # coroutine that started it.
    assert [f.function for f in result.paused.frames] == ["async_agent"]
    assert result.paused.frames[0].locals["keys"] == "['a', 'b', 'c']"
    assert all("asyncio" not in f.file for f in result.paused.frames)
    assert agents.CALLS == []


def test_async_counterfactual_and_live_children(store):
    """live={'alookup'} re-runs the lookups (in the child too) and keeps the side effect frozen."""
    run_id, out = record_async(store, ["a", "b"])
    result = replayable.replay(run_id, store=store, live={"alookup"})
    assert result.status == "completed", result.divergence
    assert sorted(agents.CALLS) == ["alookup:a", "alookup:b", "alookup:child"]
    assert result.output["values"] != out["values"]
    assert result.output["receipt"] == out["receipt"]  # apublish('a,b') served from the tape
    kids = store.children(result.new_run_id)
    assert [k.workflow for k in kids] == ["async_child"]


def test_async_full_replay_with_child_and_gather(store):
    """An async run with gather and a child run replays identically, running nothing."""
    run_id, out = record_async(store, ["x", "y", "z"])
    result = replayable.replay(run_id, store=store)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert agents.CALLS == []


def test_async_stepper(store):
    """The stepper drives an async agent one boundary at a time."""
    from replayable.replay.stepper import Stepper

    run_id, _ = record_async(store, ["a", "b"])
    stepper = Stepper(run_id, store=store)
    first = stepper.start()
    seen = [(first.event.run_id, first.event.seq)]
    while (point := stepper.next()) is not None:
        seen.append((point.event.run_id, point.event.seq))
    (kid,) = store.children(run_id)
    # The child run's step is served right after the parent's step that started it.
    assert seen == [(run_id, 1), (run_id, 2), (run_id, 3), (kid.run_id, 1), (run_id, 4)]
    assert stepper.result.status == "identical"
