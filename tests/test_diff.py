"""Run diff: alignment, semantic comparison, the first meaningful divergence."""

from __future__ import annotations

import pytest

import replayable
from replayable.diff import Comparer
from tests import agents_replay as agents


@pytest.fixture
def store():
    s = replayable.open_store("memory://")
    yield s
    s.close()


RESULTS: dict[str, object] = {}


@replayable.tool
def lookup(item: str) -> object:
    return RESULTS.get(item, {"item": item, "price": 10})


@replayable.tool
def note(text: str) -> str:
    return text


@replayable.workflow("shop")
def shop(items: list[str]) -> dict[str, object]:
    total = 0
    for item in items:
        total += lookup(item)["price"]  # type: ignore[index]
    note(f"bought {len(items)} things")
    return {"total": total}


def run(store, items, results=None):
    RESULTS.clear()
    RESULTS.update(results or {})
    with replayable.recording(store) as rec:
        shop(items)
    return rec.run_ids[0]


def test_identical_runs_have_no_divergence(store):
    """Two runs with the same calls and outcomes are identical; every pair is 'same'."""
    a, b = run(store, ["x", "y"]), run(store, ["x", "y"])
    d = replayable.diff(a, b, store=store)
    assert d.identical
    assert d.counts() == {"same": 3}


def test_changed_response_is_the_first_divergence_with_field_and_values(store):
    """A tool answering differently is named: steps on both sides, field, old and new value."""
    a = run(store, ["x", "y"])
    b = run(store, ["x", "y"], {"y": {"item": "y", "price": 99}})
    d = replayable.diff(a, b, store=store)
    first = d.first
    assert (first.left_step, first.right_step) == (2, 2)
    assert first.name == "lookup"
    assert first.field == "response.price"
    assert (first.old, first.new) == (10, 99)
    assert first.rank == "significant"
    assert [c.where for c in d.output_changes] == ["output.total"]
    assert "response.price changed from 10 to 99" in first.describe()


def test_runs_of_different_length_align_inserted_steps(store):
    """An extra call in the middle is one inserted pair; the steps around it stay paired."""
    a = run(store, ["x", "z"])
    b = run(store, ["x", "y", "z"])
    d = replayable.diff(a, b, store=store)
    statuses = [p.status for p in d.pairs]
    assert statuses.count("inserted") == 1
    inserted = next(p for p in d.pairs if p.status == "inserted")
    assert inserted.right.request_value() == {"item": "y"}
    assert d.first.status == "inserted"
    assert d.first.right_step == 2
    removed = replayable.diff(b, a, store=store)
    assert [p.status for p in removed.pairs].count("removed") == 1


def test_key_order_whitespace_and_number_spelling_are_noise():
    """{'a':1,'b':2.0} vs {'b':2,'a':1} and 'x  y' vs 'x y' differ only in noise."""
    c = Comparer()
    assert c.compare("response", {"a": 1, "b": 2.0}, {"b": 2, "a": 1}) == []
    (change,) = c.compare("response", {"t": "hello   world"}, {"t": "hello world"})
    assert change.rank == "noise"


def test_text_ranks_below_structured_changes():
    """A reworded sentence is 'text'; a changed count is 'structural'."""
    c = Comparer()
    changes = {
        ch.path: ch.rank
        for ch in c.compare(
            "response",
            {"summary": "The contract looks fine to me overall.", "rows": 2},
            {"summary": "The contract has several problems in it.", "rows": 3},
        )
    }
    assert changes == {"summary": "text", "rows": "structural"}


def test_ignore_paths_make_changes_noise(store):
    """--ignore patterns turn matching fields into noise, so they never make a divergence."""
    a = run(store, ["x"], {"x": {"item": "x", "price": 10, "trace": "t1"}})
    b = run(store, ["x"], {"x": {"item": "x", "price": 10, "trace": "t2"}})
    assert not replayable.diff(a, b, store=store).identical
    assert replayable.diff(a, b, store=store, ignore=["response.trace"]).identical


def test_text_difference_is_reported_when_nothing_structured_changed(store):
    """If only prose changed, the first divergence is that text change."""
    a = run(store, ["x"], {"x": {"item": "x", "price": 10, "blurb": "a very nice thing to own"}})
    b = run(
        store,
        ["x"],
        {"x": {"item": "x", "price": 10, "blurb": "a rather poor thing to own, sadly"}},
    )
    d = replayable.diff(a, b, store=store)
    assert d.first.rank == "text"
    assert d.first.field == "response.blurb"


def test_diff_of_original_and_fork(store):
    """A fork's override at step 2 is the first divergence against the original."""
    with replayable.recording(store) as rec:
        agents.research("llamas")
    original = rec.run_ids[0]
    fork = replayable.replay(
        original, store=store, fork_at=2, overrides={2: "<p/>"}, on_side_effect="recorded"
    )
    d = replayable.diff(original, fork.new_run_id, store=store)
    assert d.first.left_step == 2
    assert d.first.field == "response"
    assert d.to_dict()["first_divergence"]["new"] == "<p/>"
    assert d.to_dict()["right"]["run_id"] == fork.new_run_id


SHAPES: dict[str, object] = {}


@replayable.tool(normalize=lambda raw: SHAPES["normalized"])
def shaped(item: str) -> object:
    return {"item": item}


@replayable.tool
def pair(item: str) -> object:
    return SHAPES["pair"]


@replayable.workflow("shapes")
def shapes() -> None:
    shaped("x")
    pair("x")


def shapes_run(store, normalized: object, pair_value: object) -> str:
    SHAPES.update(normalized=normalized, pair=pair_value)
    with replayable.recording(store) as rec:
        shapes()
    return rec.run_ids[0]


def test_a_tuple_and_a_list_of_the_same_values_are_the_same_response(store):
    """Stored texts that differ only by a type tag are compared as values: a tuple
    compares like a list."""
    a, b = shapes_run(store, 1, (1, 2)), shapes_run(store, 1, [1, 2])
    d = replayable.diff(a, b, store=store)
    assert [p.status for p in d.pairs] == ["same", "same"], [p.changes for p in d.pairs]
    assert d.pairs[1].left.response != d.pairs[1].right.response


def test_an_adapter_result_of_true_against_1_is_a_change(store):
    """Equal metadata in Python's eyes (True == 1) still holds a changed adapter result."""
    a, b = shapes_run(store, True, [1]), shapes_run(store, 1, [1])
    d = replayable.diff(a, b, store=store)
    assert d.pairs[0].status == "changed"
    assert [(c.side, c.old, c.new) for c in d.pairs[0].changes] == [("normalized", True, 1)]
    assert d.pairs[1].status == "same"
