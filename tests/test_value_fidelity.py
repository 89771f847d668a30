"""A value comes back as it went in: equal, of the same type at every level, in the
same key order (``json.dumps`` of the replayed value is the live one's), through a
real recording and replay on SQLite and on the memory store."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replayable
from replayable.store import EventStore, MemoryStore
from replayable.store.sqlite import SQLiteStore


class Suit(enum.Enum):
    HEARTS = "hearts"
    SPADES = "spades"


class Rank(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Phase(enum.StrEnum):
    DRAFT = "draft"
    FINAL = "final"


@dataclasses.dataclass(frozen=True)
class Cell:
    row: int
    col: int


class Pair(NamedTuple):
    left: int
    right: str


class Tag(pydantic.BaseModel):
    label: str
    weight: float


# -- what hypothesis draws -------------------------------------------------------------

_surrogate_text = st.builds(
    lambda a, s, b: a + s + b,
    st.text(max_size=4),
    st.sampled_from(["\udc80", "\udcff", "\ud800", "\udfff", "\udce9\udc9f"]),
    st.text(max_size=4),
)
_text = st.one_of(st.text(max_size=12), _surrogate_text)
_hashable = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    _text,
    st.sampled_from([Suit.HEARTS, Rank.HIGH, Phase.FINAL]),
    st.uuids(),
    st.dates(),
    st.builds(Cell, st.integers(-5, 5), st.integers(-5, 5)),
)
_leaves = st.one_of(
    _hashable,
    st.floats(allow_nan=False),
    st.binary(max_size=8),
    st.datetimes(timezones=st.one_of(st.none(), st.timezones())),
    st.times(),
    st.timedeltas(),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.builds(Tag, label=_text, weight=st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(Pair, st.integers(-9, 9), _text),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        # Keys drawn in random order: the dict keeps that insertion order.
        st.dictionaries(_text, children, max_size=4),
        st.dictionaries(st.integers(-3, 3), children, max_size=3),
        st.frozensets(_hashable, max_size=3),
        st.sets(st.integers(-9, 9), max_size=3),
    )


VALUES = st.recursive(_leaves, _containers, max_leaves=16)


# -- comparing --------------------------------------------------------------------------


def assert_same(replayed: Any, live: Any, path: str = "") -> None:
    """Equal, the same type at every level, dict keys in the same order."""
    assert type(replayed) is type(live), f"{path or 'top'}: {type(replayed)} != {type(live)}"
    if isinstance(live, dict):
        assert list(replayed) == list(live), f"{path}: key order"
        for (kr, vr), (kl, vl) in zip(replayed.items(), live.items(), strict=True):
            assert_same(kr, kl, f"{path}<key>")
            assert_same(vr, vl, f"{path}[{kl!r}]")
    elif isinstance(live, (list, tuple)):
        assert len(replayed) == len(live)
        for i, (r, v) in enumerate(zip(replayed, live, strict=True)):
            assert_same(r, v, f"{path}[{i}]")
    elif isinstance(live, dt.datetime):
        assert replayed == live
        assert replayed.utcoffset() == live.utcoffset()
    elif isinstance(live, decimal.Decimal):
        assert str(replayed) == str(live)
    elif isinstance(live, pydantic.BaseModel):
        assert replayed.model_dump() == live.model_dump()
    else:
        assert replayed == live, path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(dumps(v) for v in obj)
    if isinstance(obj, pydantic.BaseModel):
        return obj.model_dump()
    return repr(obj)


def dumps(value: Any) -> str:
    """What an agent building its next prompt would write (key order included)."""
    return json.dumps(value, default=_jsonable)


# -- a real record and replay -----------------------------------------------------------

_live: dict[str, Any] = {}


@replayable.tool
def fetch(key: str) -> Any:
    return _live[key]


@replayable.workflow
def agent(key: str) -> Any:
    value = fetch(key)
    # The agent builds its next step from the text of the value, as agents do.
    echoed = fetch(f"{key}:{dumps(value)}") if isinstance(value, dict) else None
    return {"value": value, "echo": echoed}


def record_and_replay(store: EventStore, value: Any) -> tuple[Any, Any]:
    key = uuid.uuid4().hex
    _live[key] = value
    if isinstance(value, dict):
        _live[f"{key}:{dumps(value)}"] = "echoed"
    with replayable.recording(store) as rec:
        live = agent(key)
    result = replayable.replay(rec.run_ids[0], store=store, fn=agent)
    assert result.status == "identical", result.divergence
    return result.output, live


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EventStore]]:
    folder: Path = tmp_path_factory.mktemp("fidelity")
    sqlite = SQLiteStore(folder / "runs.db")
    memory = MemoryStore()
    yield {"sqlite": sqlite, "memory": memory}
    sqlite.close()
    memory.close()


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
@settings(
    max_examples=int(os.environ.get("REPLAYABLE_FIDELITY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=VALUES)
def test_replayed_value_is_the_live_value(
    stores: dict[str, EventStore], backend: str, value: Any
) -> None:
    """Recorded then replayed: equal, same types at every level, same json.dumps."""
    replayed, live = record_and_replay(stores[backend], value)
    assert replayed == live
    assert_same(replayed, live)
    assert dumps(replayed["value"]) == dumps(live["value"])


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_tool_result_keeps_insertion_order(stores: dict[str, EventStore], backend: str) -> None:
    """{"b": 1, "a": 2, "c": 3} is served back in that order, not sorted."""
    replayed, _ = record_and_replay(stores[backend], {"b": 1, "a": 2, "c": 3})
    assert json.dumps(replayed["value"]) == '{"b": 1, "a": 2, "c": 3}'
    assert list(replayed["value"]) == ["b", "a", "c"]


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_nested_enums_and_order_survive(stores: dict[str, EventStore], backend: str) -> None:
    """StrEnum and IntEnum members nested in containers come back as members."""
    value = {"z": [Phase.DRAFT, {"r": Rank.LOW}], "a": (Phase.FINAL,), "m": {Rank.HIGH: "x"}}
    replayed, live = record_and_replay(stores[backend], value)
    assert_same(replayed, live)
    assert replayed["value"]["z"][0] is Phase.DRAFT
    assert replayed["value"]["z"][1]["r"] is Rank.LOW


def test_run_input_keeps_its_order(sqlite_store: SQLiteStore) -> None:
    """A workflow's dict argument is handed back on replay in the order it was given."""
    seen: list[list[str]] = []

    @replayable.workflow
    def takes(options: dict[str, Any]) -> list[str]:
        seen.append(list(options))
        return list(options)

    with replayable.recording(sqlite_store) as rec:
        takes({"zeta": 1, "alpha": 2, "mid": 3})
    result = replayable.replay(rec.run_ids[0], store=sqlite_store, fn=takes)
    assert result.status == "identical"
    assert seen == [["zeta", "alpha", "mid"]] * 2


def test_stored_value_keeps_order_and_fingerprint_stays_canonical(
    sqlite_store: SQLiteStore,
) -> None:
    """The store holds the value in its order; the request (fingerprinted) is canonical."""
    from replayable.events.canonical import fingerprint

    @replayable.tool
    def lookup(query: dict[str, Any]) -> dict[str, Any]:
        return {"b": 1, "a": 2}

    @replayable.workflow
    def ask() -> Any:
        return lookup({"y": 1, "x": 2})

    with replayable.recording(sqlite_store) as rec:
        ask()
    (event,) = sqlite_store.events(rec.run_ids[0])
    assert event.response == '{"b":1,"a":2}'
    assert event.request == '{"query":{"x":2,"y":1}}'
    assert event.fingerprint == fingerprint("tool", "lookup", event.request.encode())


def test_runs_recorded_sorted_before_still_verify_and_replay(
    sqlite_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written as earlier versions wrote them (values in sorted key order) verify
    intact and replay identical: the chain hashes the stored text, whatever its order."""
    import orjson

    from replayable.capture import record as record_module
    from replayable.events import codec

    def sorted_encode(value: Any) -> tuple[bytes, bool]:
        data, tagged = codec.encode_value(value)
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_SORT_KEYS), tagged

    @replayable.tool
    def lookup() -> dict[str, int]:
        return {"b": 1, "a": 2}

    @replayable.workflow
    def old_agent() -> dict[str, int]:
        return lookup()

    monkeypatch.setattr(record_module, "encode_value", sorted_encode)
    with replayable.recording(sqlite_store) as rec:
        old_agent()
    monkeypatch.undo()
    run_id = rec.run_ids[0]
    (event,) = sqlite_store.events(run_id)
    assert event.response == '{"a":2,"b":1}'
    assert replayable.verify_run(sqlite_store, run_id).ok
    result = replayable.replay(run_id, store=sqlite_store, fn=old_agent)
    assert result.status == "identical", result.divergence
    assert list(result.output) == ["a", "b"]
    with replayable.recording(sqlite_store) as rec:
        old_agent()
    new_run = rec.run_ids[0]
    assert sqlite_store.events(new_run)[0].response == '{"b":1,"a":2}'
    assert replayable.verify_run(sqlite_store, new_run).ok
