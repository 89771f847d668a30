"""Divergence messages point at the agent: the words that changed, the agent's own line,
and a moved call named as moved."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import replayable
from replayable.replay.divergence import Divergence, FieldDiff

PROMPT = (
    "You are a travel assistant. Look up the weather with the get_weather tool before "
    "you answer, quote the temperature in degrees, and answer in one short sentence."
)
SETTINGS: dict[str, Any] = {"prompt": PROMPT, "warm_up": False}


@pytest.fixture
def store() -> Iterator[Any]:
    s = replayable.open_store("memory://")
    yield s
    s.close()


@replayable.tool
def complete(system: str, question: str) -> str:
    return f"answer to {question}"


@replayable.workflow("messages.prompted")
def prompted(question: str) -> str:
    return complete(SETTINGS["prompt"], question)


def _record(store: Any, fn: Any, *args: Any) -> str:
    with replayable.recording(store) as rec:
        if asyncio.iscoroutinefunction(fn.__wrapped__):
            asyncio.run(fn(*args))
        else:
            fn(*args)
    return rec.run_ids[0]


@pytest.mark.parametrize(
    ("edited", "shown"),
    [
        (PROMPT + " Always answer in French.", "Always answer in French."),
        (PROMPT.replace("one short sentence", "three long paragraphs"), "three long paragraphs"),
        ("Be brief. " + PROMPT, "Be brief."),
    ],
    ids=["appended", "middle", "prepended"],
)
def test_a_changed_long_prompt_shows_the_words_that_changed(
    store: Any, monkeypatch: pytest.MonkeyPatch, edited: str, shown: str
) -> None:
    """The field diff cuts around the change, not after the shared beginning."""
    run_id = _record(store, prompted, "weather in Oslo")
    monkeypatch.setitem(SETTINGS, "prompt", edited)
    result = replayable.replay(run_id, store=store, fn=prompted)
    div = result.divergence
    assert div is not None
    assert div.reason == "request_changed"
    (line,) = [ln for ln in div.message.splitlines() if ln.strip().startswith("system:")]
    assert shown in line, line
    assert len(line) < 400


def test_a_long_rewrite_is_cut_in_its_middle_and_short_values_stay_whole() -> None:
    """A change longer than the limit keeps its start and end; short values are unchanged."""
    old, new = "x" * 50 + "a" * 500, "x" * 50 + "b" * 500
    div = Divergence(
        reason="request_changed",
        run_id="r",
        step=1,
        diff=[FieldDiff("p", old, new), FieldDiff("q", "ab", "ac")],
    )
    lines = div.message.splitlines()
    assert "…" in lines[-2]
    assert len(lines[-2]) < 500
    assert lines[-1] == "    q: recorded 'ab', now 'ac'"


SDK = """
import replayable

@replayable.tool
def fetch(city):
    return "sunny in " + city

def run_agent(city):
    return fetch(city)
"""


@pytest.fixture
def sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An installed package (under site-packages) whose own code crosses the boundary."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "fake_agent_sdk.py").write_text(textwrap.dedent(SDK))
    monkeypatch.syspath_prepend(str(site))
    import fake_agent_sdk

    yield fake_agent_sdk
    sys.modules.pop("fake_agent_sdk", None)


CITY = {"name": "Oslo"}


def test_at_names_the_agents_line_with_the_sdk_frame_beside_it(store: Any, sdk: Any) -> None:
    """A call made inside an SDK is reported at the agent's line, the SDK's frame beside it."""

    @replayable.workflow("messages.sdk")
    def agent() -> str:
        return sdk.run_agent(CITY["name"])  # type: ignore[no-any-return]

    run_id = _record(store, agent)
    assert "site-packages" in (store.events(run_id)[0].call_site or "")
    CITY["name"] = "Rome"
    try:
        result = replayable.replay(run_id, store=store, fn=agent)
    finally:
        CITY["name"] = "Oslo"
    div = result.divergence
    assert div is not None
    assert div.actual is not None
    (at,) = [ln for ln in div.message.splitlines() if ln.strip().startswith("at:")]
    user, _, library = at.partition("(in ")
    assert f"{__file__}:" in user, at
    assert "in agent" in user, at
    assert "site-packages" in library, at
    assert "fake_agent_sdk.py" in library, at
    assert "in run_agent" in library, at
    assert div.actual.user_site is not None
    assert __file__ in div.actual.user_site


@replayable.tool
async def lookup(city: str) -> str:
    return f"sunny in {city}"


async def _idle() -> None:
    await asyncio.sleep(0)


@replayable.workflow("messages.moved")
async def moved(city: str) -> str:
    if SETTINGS["warm_up"]:
        await asyncio.create_task(_idle())  # takes a task ordinal of its own
    return await asyncio.create_task(lookup(city))


def test_the_same_call_from_another_task_position_is_named_as_such(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "a call the recording does not hold" with itself as the nearest: the same call,
    asked from a different task position, both positions named."""
    run_id = _record(store, moved, "Oslo")
    recorded = store.events(run_id)[0]
    monkeypatch.setitem(SETTINGS, "warm_up", True)
    result = replayable.replay(run_id, store=store, fn=moved)
    div = result.divergence
    assert div is not None
    assert div.actual is not None
    assert div.same_request is True
    assert div.step == recorded.seq
    headline = div.message.splitlines()[0]
    assert "the same call, asked from a different task position" in headline
    assert recorded.key in headline
    assert div.actual.key in headline
    assert "nearest" not in div.message


def test_diff_shows_the_words_that_changed_in_a_long_prompt(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``diff``'s first divergence is cut around the change too."""
    first = _record(store, prompted, "weather in Oslo")
    monkeypatch.setitem(SETTINGS, "prompt", PROMPT + " Always answer in French.")
    second = _record(store, prompted, "weather in Oslo")
    d = replayable.diff(first, second, store=store)
    assert d.first is not None
    assert "Always answer in French." in d.first.describe(), d.first.describe()
