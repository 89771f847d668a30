"""``replayable.deterministic()``: clock, uuid4 and random served from the tape."""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import threading
import time
import types
import uuid
from collections.abc import Iterator
from datetime import datetime as imported_datetime
from typing import Any

import pytest

import replayable
from replayable.store import MemoryStore


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    """A fresh in-memory store."""
    s = MemoryStore()
    yield s
    s.close()


@replayable.tool
def lookup(key: str) -> float:
    # A clock read inside a boundary belongs to that boundary.
    return time.time() * 0 + len(key)


@replayable.workflow
def agent(n: int) -> dict[str, Any]:
    with replayable.deterministic():
        deck = list(range(n))
        random.shuffle(deck)
        return {
            "t": time.time(),
            "now": datetime.datetime.now(datetime.UTC).isoformat(),
            "imported": imported_datetime.now().isoformat(),
            "today": datetime.date.today().isoformat(),
            "id": str(uuid.uuid4()),
            "r": random.random(),
            "i": random.randint(1, 10**9),
            "choice": random.choice("abcdefghij"),
            "choices": random.choices(range(100), k=3),
            "sample": random.sample(range(100), 3),
            "deck": deck,
            "tool": lookup("abc"),
        }


def _record(store: MemoryStore, fn: Any, *args: Any) -> tuple[str, Any]:
    with replayable.recording(store) as rec:
        out = asyncio.run(fn(*args)) if asyncio.iscoroutinefunction(fn.__wrapped__) else fn(*args)
    return rec.run_ids[0], out


def test_values_are_recorded_and_replayed_identically(store: MemoryStore) -> None:
    """Every wrapped source is one event, and a replay returns the recorded values."""
    run_id, out = _record(store, agent, 8)
    names = [e.name for e in store.events(run_id)]
    assert names == [
        "random.shuffle",
        "time.time",
        "datetime.now",
        "datetime.now",
        "datetime.now",
        "uuid.uuid4",
        "random.random",
        "random.randint",
        "random.choice",
        "random.choices",
        "random.sample",
        "lookup",
    ]
    assert sorted(out["deck"]) == list(range(8))
    time.sleep(0.002)
    result = replayable.replay(run_id, store=store, fn=agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_datetime_keeps_its_type_and_timezone(store: MemoryStore) -> None:
    """Served datetimes are real datetime objects in the asked timezone, subclasses too."""

    class Stamp(datetime.datetime):
        pass

    tz = datetime.timezone(datetime.timedelta(hours=5))

    @replayable.workflow("stamps")
    @replayable.deterministic()
    def stamps() -> list[Any]:
        stamp = Stamp.now()
        return [
            datetime.datetime.now(tz),
            type(stamp) is Stamp,
            stamp.isoformat(),
            datetime.datetime.utcnow(),
        ]

    run_id, out = _record(store, stamps)
    assert type(out[0]) is datetime.datetime
    assert out[0].utcoffset() == datetime.timedelta(hours=5)
    assert out[1] is True
    assert out[3].tzinfo is None
    result = replayable.replay(run_id, store=store, fn=stamps)
    assert result.status == "identical", result.divergence
    assert result.output[1] is True
    assert result.output[0] == out[0]


def test_outside_the_block_or_outside_a_run_nothing_is_recorded(store: MemoryStore) -> None:
    """The wrappers call straight through without deterministic() or without a run."""

    @replayable.workflow("plain")
    def plain() -> float:
        return time.time() + random.random()

    run_id, _ = _record(store, plain)
    assert store.events(run_id) == []
    with replayable.deterministic():
        first, second = uuid.uuid4(), uuid.uuid4()
    assert first != second


def test_library_frames_and_other_threads_stay_live(store: MemoryStore) -> None:
    """Standard library callers, skipped packages and threads outside the context are live."""
    lib = types.ModuleType("fakesdk.retry")
    exec("import random\ndef jitter():\n    return random.random()\n", lib.__dict__)
    seen: list[float] = []

    def background() -> None:
        seen.append(time.time())

    @replayable.workflow("mixed")
    def mixed() -> float:
        with replayable.deterministic(skip=("fakesdk",)):
            logging.getLogger("replayable.test").warning("a log record reads the clock")
            thread = threading.Thread(target=background)
            thread.start()
            thread.join()
            lib.jitter()
            return random.random()

    run_id, _ = _record(store, mixed)
    assert [e.name for e in store.events(run_id)] == ["random.random"]
    assert len(seen) == 1


@replayable.workflow
@replayable.deterministic()
async def async_agent() -> list[str]:
    async def one() -> str:
        await asyncio.sleep(0.001)
        return str(uuid.uuid4())

    return list(await asyncio.gather(one(), one(), one()))


def test_async_tasks_match_by_causal_position(store: MemoryStore) -> None:
    """uuid4 from parallel tasks replays per task, and asyncio's own clock stays untouched."""
    run_id, out = _record(store, async_agent)
    assert len(set(out)) == 3
    assert [e.kind for e in store.events(run_id)] == ["uuid"] * 3
    result = replayable.replay(run_id, store=store, fn=async_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_an_extra_read_is_a_divergence(store: MemoryStore) -> None:
    """Code that asks the clock one more time than recorded diverges."""
    run_id, _ = _record(store, agent, 3)

    @replayable.workflow(agent.__replayable_workflow__.name)  # type: ignore[attr-defined]
    def edited(n: int) -> Any:
        with replayable.deterministic():
            random.random()
            return agent.__wrapped__(n)  # type: ignore[attr-defined]

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    assert result.divergence is not None
    assert result.divergence.step == 1
    assert result.divergence.actual is not None
    assert result.divergence.actual.name == "random.random"


def test_fork_at_the_clock_overrides_it(store: MemoryStore) -> None:
    """fork_at a clock step with an override serves that instant, the rest runs live."""
    run_id, out = _record(store, agent, 3)
    step = next(e.seq for e in store.events(run_id) if e.name == "time.time")
    result = replayable.replay(
        run_id, store=store, fn=agent, fork_at=step, overrides={step: 1234.5}
    )
    assert result.status == "completed", result.divergence
    assert result.output["t"] == 1234.5
    assert result.output["deck"] == out["deck"]
    assert result.output["id"] != out["id"]
