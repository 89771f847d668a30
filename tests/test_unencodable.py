"""Values that cannot be stored as they are: lone surrogates round-trip; a recursive
value or one nested too deeply raises SerializationError naming boundary, step, type
and path, and the step stays on the tape, marked unencodable."""

from __future__ import annotations

import os
from typing import Any

import orjson
import pytest

import replayable
from replayable.events.codec import MAX_DEPTH, decode_value, encode_request, encode_value
from replayable.store import MemoryStore
from replayable.store.sqlite import SQLiteStore


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def recursive() -> list[Any]:
    loop: list[Any] = [1, {"k": []}]
    loop[1]["k"].append(loop)
    return loop


def test_lone_surrogates_round_trip_through_the_codec() -> None:
    """os.fsdecode of a non-UTF-8 name comes back as the same str, keys included."""
    name = os.fsdecode(b"report-\xff\xfe.txt")
    assert "\udcff" in name
    for value in (name, [name], {"file": name}, {name: 1}, ("\ud800", name)):
        data, tagged = encode_value(value)
        assert tagged is True
        back = decode_value(data, "tagged")
        assert back == value
        assert type(back) is type(value)
    assert encode_request({"file": name}) == encode_request({"file": name})


def test_deep_value_within_the_limit_round_trips() -> None:
    """Nesting deeper than orjson writes (255) but within MAX_DEPTH is kept."""
    value = nested(MAX_DEPTH - 1)
    data, tagged = encode_value(value)
    assert decode_value(data, "tagged" if tagged else "json") == value
    assert orjson.loads(encode_request({"v": value}))["v"] == value


@pytest.mark.parametrize(
    ("make", "reason", "path"),
    [
        (recursive, "contains itself", "[1]['k'][0]"),
        (lambda: nested(MAX_DEPTH + 50), f"deeper than {MAX_DEPTH}", "[0]" * MAX_DEPTH),
        (lambda: nested(5000), f"deeper than {MAX_DEPTH}", "[0]" * MAX_DEPTH),
    ],
    ids=["recursive", "too-deep", "far-too-deep"],
)
def test_unencodable_result_is_recorded_and_raised(
    sqlite_store: SQLiteStore, make: Any, reason: str, path: str
) -> None:
    """The tool's step is stored with its error, marked unencodable; the agent gets
    SerializationError naming boundary, step, type and path (never RecursionError)."""

    @replayable.tool
    def listing() -> Any:
        return make()

    @replayable.tool
    def after() -> str:
        return "still recorded"

    caught: list[BaseException] = []

    @replayable.workflow
    def scan() -> str:
        try:
            listing()
        except replayable.SerializationError as exc:
            caught.append(exc)
        return after()

    with replayable.recording(sqlite_store) as rec:
        scan()
    assert len(caught) == 1
    assert caught[0].__cause__ is None
    events = sqlite_store.events(rec.run_ids[0])
    assert [e.name for e in events] == ["listing", "after"]
    marked = events[0]
    note = marked.metadata["unencodable"]
    assert note["part"] == "response"
    assert note["type"] == "builtins:list"
    assert note["path"] == path
    assert reason in note["reason"]
    error = orjson.loads(marked.error or "null")
    assert error["type"] == "replayable.errors:SerializationError"
    for part in ("'listing'", "step 1", "builtins:list", reason):
        assert part in error["message"]
    result = replayable.replay(rec.run_ids[0], store=sqlite_store, fn=scan)
    assert result.status == "identical", result.divergence
    assert result.output == "still recorded"


def test_unencodable_request_keeps_its_step(memory_store: MemoryStore) -> None:
    """A tool called with a recursive argument: the call is refused with SerializationError,
    the step is on the tape, and replay serves the same error at that step."""
    calls: list[int] = []

    @replayable.tool
    def store_tree(tree: Any) -> str:
        calls.append(1)
        return "stored"

    @replayable.tool
    def done() -> str:
        return "done"

    caught: list[replayable.SerializationError] = []

    @replayable.workflow
    def save() -> str:
        try:
            store_tree(recursive())
        except replayable.SerializationError as exc:
            caught.append(exc)
        return done()

    with replayable.recording(memory_store) as rec:
        assert save() == "done"
    assert calls == []
    (err,) = caught
    assert (err.step, err.boundary) == (1, "store_tree")
    assert "contains itself" in str(err)
    events = memory_store.events(rec.run_ids[0])
    assert [(e.seq, e.name) for e in events] == [(1, "store_tree"), (2, "done")]
    assert events[0].metadata["unencodable"]["part"] == "request"
    result = replayable.replay(rec.run_ids[0], store=memory_store, fn=save)
    assert result.status == "identical", result.divergence
    assert calls == []
    (again,) = caught[1:]
    assert type(again) is replayable.SerializationError
    assert (again.step, again.boundary) == (1, "store_tree")


def test_surrogate_file_names_replay(memory_store: MemoryStore) -> None:
    """A tool listing non-UTF-8 file names is recorded and replays with the same names."""
    raw = [b"ok.txt", b"caf\xe9.txt", b"\xff\xfe"]

    @replayable.tool
    def list_dir(folder: str) -> list[str]:
        return [os.fsdecode(n) for n in raw]

    @replayable.workflow
    def files() -> list[str]:
        names = list_dir(os.fsdecode(b"/data/\xe9t\xe9"))
        return [n.upper() for n in names]

    with replayable.recording(memory_store) as rec:
        live = files()
    result = replayable.replay(rec.run_ids[0], store=memory_store, fn=files)
    assert result.status == "identical", result.divergence
    assert result.output == live


def test_error_naming_a_non_utf8_file_is_recorded_and_replays(sqlite_store: SQLiteStore) -> None:
    """A FileNotFoundError for a non-UTF-8 name (its message holds lone surrogates) is kept:
    the tool's step and the run's failure are stored, and replay raises it again."""
    missing = os.fsdecode(b"/nonexistent/\xff\xfe-report.txt")

    @replayable.tool
    def read(path: str) -> str:
        with open(path) as f:
            return f.read()

    @replayable.workflow
    def summarize() -> str:
        return read(missing)

    with replayable.recording(sqlite_store) as rec, pytest.raises(FileNotFoundError):
        summarize()
    run_id = rec.run_ids[0]
    (event,) = sqlite_store.events(run_id)
    assert "\\udcff" in orjson.loads(event.error or "null")["message"]
    assert sqlite_store.get_run(run_id).status == "failed"
    result = replayable.replay(run_id, store=sqlite_store, fn=summarize)
    assert result.status == "identical", (result.status, result.error)
    assert type(result.error) is FileNotFoundError
    assert result.error.filename == missing


def test_deeply_nested_tuples_replay(memory_store: MemoryStore) -> None:
    """Tagged values nested close to MAX_DEPTH are recorded and served back whole."""
    value: Any = ("leaf",)
    for i in range(MAX_DEPTH - 2):
        value = (value, {"level": i}) if i % 2 else (value,)

    @replayable.tool
    def tree() -> Any:
        return value

    @replayable.workflow
    def walk() -> Any:
        return tree()

    with replayable.recording(memory_store) as rec:
        walk()
    result = replayable.replay(rec.run_ids[0], store=memory_store, fn=walk)
    assert result.status == "identical", result.divergence
    assert result.output == value


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"metadata": {1: "a"}}, "metadata: key 1 is int, not text"),
        ({"metadata": {"team": {"x": {2: 3}}}}, "metadata.team.x: key 2 is int, not text"),
        ({"metadata": {"s": {3}}}, "metadata.s is set"),
        ({"metadata": {"n": float("nan")}}, "metadata.n is nan"),
        ({"metadata": {"big": 10**40}}, "metadata.big is an integer outside 64 bits"),
        ({"context": {"flags": [object()]}}, "metadata.context.flags[0] is object"),
    ],
)
def test_metadata_that_is_not_json_is_refused_where_it_is_given(
    tmp_path: Any, given: dict[str, Any], named: str
) -> None:
    """Run metadata (and ``context``) is stored as JSON: a key that is not text or a value
    JSON has no exact form for is refused by ``recording()``, naming where it is, before
    anything runs. It was accepted, and every run of the recording then went to the
    rejected spool with a warning (the writer process died on it first)."""
    with pytest.raises(replayable.ConfigurationError) as caught:
        replayable.recording(SQLiteStore(tmp_path / "runs.db"), **given)
    assert named in str(caught.value)


def test_workflow_metadata_that_is_not_json_is_refused_at_decoration() -> None:
    with pytest.raises(replayable.ConfigurationError, match=r"metadata: key 1 is int"):

        @replayable.workflow("odd", metadata={1: "a"})
        def odd() -> int:
            return 1


def test_json_metadata_is_stored_as_given(tmp_path: Any) -> None:
    """Tuples are JSON arrays; nested objects, unicode keys and 64-bit integers keep."""
    store = SQLiteStore(tmp_path / "runs.db")
    meta = {"t": (1, 2), "nested": {"é": [True, None, 2**63 - 1, -1.5]}}
    with replayable.recording(store, metadata=meta) as rec:
        _plain_workflow()
    (run,) = store.list_runs()
    assert run.run_id == rec.run_ids[0]
    assert run.metadata["t"] == [1, 2]
    assert run.metadata["nested"] == {"é": [True, None, 2**63 - 1, -1.5]}
    store.close()


@replayable.workflow("plain.meta")
def _plain_workflow() -> int:
    return 1
