"""Values crossing a boundary keep their types: through ``encode_value`` and
``decode_value``, and through a real record-then-replay cycle."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import threading
import uuid
from typing import Any, NamedTuple

import orjson
import pydantic
import pytest
from openai.types.chat import ChatCompletion

import replayable
from replayable.events.codec import (
    decode_value,
    dump_tree,
    encode_request,
    encode_value,
    to_tree,
)
from replayable.replay import ReplayResult
from replayable.store import EventStore, MemoryStore

# -- types the cases use (module level, so they can be imported on replay) ----------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclasses.dataclass
class Route:
    name: str
    points: list[Point]
    via: tuple[Point, ...]
    created: dt.date
    tags: set[str]
    length: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.length = len(self.points)


class Pair(NamedTuple):
    left: int
    right: str


Span = collections.namedtuple("Span", ["start", "end"])


class Address(pydantic.BaseModel):
    street: str
    postcode: str


class Customer(pydantic.BaseModel):
    name: str
    since: dt.datetime
    tier: Color
    addresses: list[Address]
    best: Address | None = None
    scores: tuple[int, ...] = ()


class Money:
    """A class only a registered codec knows."""

    def __init__(self, cents: int, currency: str) -> None:
        self.cents = cents
        self.currency = currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.cents, self.currency) == (
            other.cents,
            other.currency,
        )

    def __hash__(self) -> int:
        return hash((self.cents, self.currency))


replayable.register_codec(
    Money,
    lambda m: {"cents": m.cents, "currency": m.currency},
    lambda v: Money(v["cents"], v["currency"]),
)


class Opaque:
    """A class no codec knows."""


class QuotaExceededError(Exception):
    """A custom exception with positional args."""


class ApiStatusError(Exception):
    """An exception whose ``__init__`` needs a keyword argument, as SDK errors do."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def chat_completion() -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-42",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        }
    )


UTC_PLUS_530 = dt.timezone(dt.timedelta(hours=5, minutes=30))

CASES: dict[str, Any] = {
    # plain JSON
    "json-dict": {"a": 1, "b": [1.5, "x", None, True, {"c": False}], "é": "ü"},
    "json-list": [1, "two", 3.0, None, [], {}],
    "json-str": "hello",
    "json-int": -7,
    "json-float": 2.5,
    "json-bool": False,
    "json-none": None,
    "u64-max": 2**64 - 1,
    # containers
    "tuple": (1, "a", None),
    "nested-tuples": ((1, (2, 3)), [4, (5,)], {"k": (6, 7)}),
    "set": {1, 2, 3},
    "mixed-set": {"a", 1, (1, 2)},
    "frozenset": frozenset({"x", "y"}),
    "set-in-dict": {"ids": {3, 1, 2}},
    "bytes": b"\x00\xff\xfe binary",
    "bytearray": bytearray(b"mutable"),
    "bytes-in-list": [b"a", b"b"],
    # time
    "datetime-naive": dt.datetime(2024, 5, 17, 13, 45, 7, 123456),
    "datetime-utc": dt.datetime(2024, 5, 17, 13, 45, 7, tzinfo=dt.UTC),
    "datetime-offset": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC_PLUS_530),
    "date": dt.date(1999, 12, 31),
    "time-naive": dt.time(23, 59, 58, 999),
    "time-aware": dt.time(8, 30, tzinfo=dt.UTC),
    "timedelta": dt.timedelta(days=-2, seconds=5, microseconds=7),
    "datetimes-in-dict": {"at": dt.datetime(2020, 2, 29), "day": dt.date(2020, 2, 29)},
    # numbers
    "decimal": decimal.Decimal("1.10"),
    "decimal-in-list": [decimal.Decimal("-0.000001"), decimal.Decimal("1E+3")],
    "big-int": 2**64,
    "big-negative-int": -(2**63) - 1,
    "huge-int": 10**40,
    "big-ints-nested": {"n": [2**100, 1, -(2**70)]},
    # identity
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "uuid-in-dict": {"id": uuid.UUID(int=1)},
    # enums
    "enum": Color.GREEN,
    "enum-in-dict": {"color": Color.RED, "list": [Color.GREEN]},
    "int-enum": Level.HIGH,
    "str-enum": Mode.SAFE,
    # records
    "dataclass": Point(1, -2),
    "nested-dataclass": Route(
        name="coast",
        points=[Point(0, 0), Point(3, 4)],
        via=(Point(1, 1),),
        created=dt.date(2024, 1, 1),
        tags={"scenic"},
    ),
    "namedtuple": Pair(3, "three"),
    "collections-namedtuple": Span(start=1, end=9),
    "namedtuples-in-list": [Pair(1, "a"), Span(2, 3)],
    "pydantic": Address(street="1 Main St", postcode="N1"),
    "nested-pydantic": Customer(
        name="Ada",
        since=dt.datetime(2021, 6, 1, tzinfo=dt.UTC),
        tier=Color.GREEN,
        addresses=[Address(street="a", postcode="1"), Address(street="b", postcode="2")],
        best=Address(street="a", postcode="1"),
        scores=(3, 1),
    ),
    "chat-completion": chat_completion(),
    # awkward dicts
    "non-str-keys": {1: "one", (1, 2): "pair", None: "none", 2.5: "float", "s": "str"},
    "enum-keys": {Color.RED: 1, Level.LOW: 2},
    "literal-tag-key": {"$t": "tuple", "v": [1, 2]},
    "literal-tag-key-nested": {"$t": "bytes", "v": "eA==", "real": b"x"},
    "literal-tag-key-in-list": [{"$t": "set", "v": []}, (1,)],
    # registered codec
    "custom": Money(1999, "EUR"),
    "custom-nested": {"prices": [Money(1, "GBP"), Money(2, "USD")]},
}


def shape(value: Any) -> Any:
    """The types inside ``value``, recursively, so that ``[1]`` and ``(1,)`` differ."""
    t = type(value).__qualname__
    if isinstance(value, (list, tuple)):
        return (t, [shape(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return (t, sorted(repr(shape(v)) for v in value))
    if isinstance(value, dict):
        return (t, sorted((repr(k), repr(shape(k)), repr(shape(v))) for k, v in value.items()))
    return t


def assert_same(actual: Any, expected: Any) -> None:
    assert actual == expected
    assert type(actual) is type(expected)
    assert shape(actual) == shape(expected)


def roundtrip(value: Any) -> Any:
    data, tagged = encode_value(value)
    assert isinstance(data, bytes)
    return decode_value(data, "tagged" if tagged else "json")


# -- the record/replay cycle ---------------------------------------------------------


@replayable.tool
def produce(case: str) -> Any:
    return CASES[case]


@replayable.workflow
def echo(case: str) -> Any:
    return produce(case)


def record_then_replay(store: EventStore, fn: Any, *args: Any) -> tuple[str, ReplayResult]:
    with replayable.recording(store) as rec:
        try:
            fn(*args)
        except Exception:
            pass
    run_id = rec.run_ids[0]
    return run_id, replayable.replay(run_id, store=store, fn=fn)


# -- encode_value / decode_value -----------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_codec_round_trip(case: str) -> None:
    """decode_value(encode_value(v)) equals v and has the same types throughout."""
    assert_same(roundtrip(CASES[case]), CASES[case])


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("json-")] + ["u64-max"])
def test_plain_json_is_stored_untagged(case: str) -> None:
    """Plain JSON values are written as they are, without type tags."""
    data, tagged = encode_value(CASES[case])
    assert tagged is False
    assert orjson.loads(data) == CASES[case]


@pytest.mark.parametrize("case", ["tuple", "set", "bytes", "datetime-naive", "big-int", "custom"])
def test_other_values_are_tagged(case: str) -> None:
    """Values plain JSON would lose are written with a type tag."""
    data, tagged = encode_value(CASES[case])
    assert tagged is True
    assert b'"$t"' in data


def test_request_encoding_is_canonical() -> None:
    """Equal requests encode to the same bytes whatever their key or set order."""
    a = {"b": {3, 1, 2}, "a": (1, {"y": 1, "x": 2})}
    b = {"a": (1, {"x": 2, "y": 1}), "b": {2, 3, 1}}
    assert encode_request(a) == encode_request(b)


def test_value_encoding_keeps_key_order() -> None:
    """A value is written in its own key order (plain or tagged), sets in one order."""
    plain = {"b": 1, "a": {"z": 2, "y": 3}}
    assert encode_value(plain) == (b'{"b":1,"a":{"z":2,"y":3}}', False)
    tagged = {"b": {3, 1, 2}, "a": (1, {"y": 1, "x": 2})}
    assert encode_value(tagged)[0] == (
        b'{"b":{"$t":"set","v":[1,2,3]},"a":{"$t":"tuple","v":[1,{"y":1,"x":2}]}}'
    )
    assert list(roundtrip(tagged)) == ["b", "a"]


def test_aware_datetime_keeps_its_offset() -> None:
    """An aware datetime comes back aware, with the same UTC offset; a naive one stays naive."""
    aware = roundtrip(CASES["datetime-offset"])
    assert aware.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert roundtrip(CASES["datetime-naive"]).tzinfo is None


def test_decimal_keeps_its_exponent() -> None:
    """A Decimal comes back with its exact digits, trailing zeros included."""
    assert str(roundtrip(decimal.Decimal("1.10"))) == "1.10"


def test_dataclass_init_false_field_restored() -> None:
    """A dataclass field excluded from __init__ is restored too."""
    route = roundtrip(CASES["nested-dataclass"])
    assert route.length == 2
    assert all(type(p) is Point for p in route.via)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), float("-inf"), [float("nan"), 1.0], {"x": float("-inf")}],
    ids=["nan", "inf", "-inf", "nan-in-list", "inf-in-dict"],
)
def test_non_finite_floats_round_trip(value: Any) -> None:
    """NaN and infinities survive the codec, at the top level or nested."""
    out = roundtrip(value)
    assert repr(out) == repr(value)
    assert shape(out) == shape(value)
    data, tagged = encode_value(value)
    assert tagged is True
    assert b"null" not in data


def test_nested_str_and_int_enums_keep_their_type() -> None:
    """StrEnum/IntEnum members nested in plain dicts and lists come back as members."""
    out = roundtrip({"mode": Mode.FAST, "levels": [Level.LOW]})
    assert out == {"mode": Mode.FAST, "levels": [Level.LOW]}
    assert out["mode"] is Mode.FAST
    assert out["levels"][0] is Level.LOW


class Key(str):
    """A str subclass, as a dict key or a value."""


_SHARED = {"id": 1, "tags": ["a", "b"]}

#: Plain-looking containers with one lossy thing hidden deep inside (or none: the
#: last cases must stay untagged). Each must come back with the same types.
_HIDDEN: dict[str, tuple[Any, bool]] = {
    "tuple-deep": ({"rows": [{"id": 1, "pos": (3, 4)}]}, True),
    "str-subclass-key": ({"a": 1, Key("b"): 2}, True),
    "str-subclass-value": ([{"x": [Key("v")]}], True),
    "uuid-deep": ({"ids": [uuid.UUID(int=7)]}, True),
    "datetime-deep": ([{"at": dt.datetime(2026, 1, 2, 3, 4, 5)}], True),
    "dataclass-deep": ({"p": [Point(1, 2)]}, True),
    "intenum-deep": ({"levels": {"min": [Level.LOW]}}, True),
    "nan-beside-null": ({"a": None, "b": [1.5, float("nan")]}, True),
    "inf-deep": ([[[{"x": float("inf")}]]], True),
    "null-and-floats": ({"a": None, "b": [1.5, -0.0, 2e300]}, False),
    "shared-references": ({"first": _SHARED, "again": _SHARED, "list": [_SHARED] * 3}, False),
    "plain-deep": ({"a": [[[[{"b": [1, "x", True, None, 2.5]}]]]]}, False),
}


@pytest.mark.parametrize("case", sorted(_HIDDEN))
def test_lossy_values_hidden_in_plain_containers_are_tagged(case: str) -> None:
    """The fast path's exactness check sees every level: anything orjson would write as
    something else (a tuple as an array, an enum or a str subclass as its value, NaN as
    null) sends the value down the tagged path, and plain values stay untagged."""
    value, lossy = _HIDDEN[case]
    data, tagged = encode_value(value)
    assert tagged is lossy
    # The tagged path writes what the full walk writes; the fast path, plain JSON.
    assert data == (dump_tree(to_tree(value)) if lossy else orjson.dumps(value))
    if "subclass" not in case:  # an unregistered str subclass comes back as str
        out = decode_value(data, "tagged" if tagged else "json")
        assert shape(out) == shape(value)
        assert repr(out) == repr(value)


def test_unencodable_value_raises_with_path() -> None:
    """A value of an unknown type raises a TypeError naming the type and where it sits."""
    from replayable.events.codec import UnencodableError

    with pytest.raises(UnencodableError) as info:
        encode_value({"ok": 1, "bad": [Opaque()]})
    assert isinstance(info.value, TypeError)
    assert info.value.type_name == "tests.test_codec:Opaque"
    assert info.value.path == ".bad[0]"


# -- record, then replay ---------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_value_survives_record_and_replay(memory_store: MemoryStore, case: str) -> None:
    """A tool's return value is served on replay equal and of the same type."""
    _, result = record_then_replay(memory_store, echo, case)
    assert result.status == "identical", result.divergence
    assert result.events_served == 1
    assert_same(result.output, CASES[case])


def test_recorded_response_is_what_the_store_holds(memory_store: MemoryStore) -> None:
    """The event's stored response decodes to the tool's value (replay reads the store)."""
    with replayable.recording(memory_store) as rec:
        echo("nested-tuples")
    (event,) = memory_store.events(rec.run_ids[0])
    assert event.encoding == "tagged"
    assert_same(decode_value(event.response, event.encoding), CASES["nested-tuples"])


@pytest.mark.parametrize(
    "value",
    [float("nan"), [float("inf"), float("-inf")], {"x": float("nan")}],
    ids=["nan", "infs", "nan-in-dict"],
)
def test_non_finite_floats_replay(memory_store: MemoryStore, value: Any) -> None:
    """NaN and infinities returned by a tool are served back on replay."""

    @replayable.tool
    def measure() -> Any:
        return value

    @replayable.workflow
    def probe() -> Any:
        return measure()

    _, result = record_then_replay(memory_store, probe)
    assert result.status == "identical"
    assert repr(result.output) == repr(value)


def test_nested_str_enum_replayed_as_member(memory_store: MemoryStore) -> None:
    """A StrEnum nested in a tool's dict result is served on replay as the same member."""

    @replayable.tool
    def settings() -> dict[str, Any]:
        return {"mode": Mode.SAFE}

    seen: list[Any] = []

    @replayable.workflow
    def configure() -> str:
        seen.append(settings()["mode"])
        return "configured"

    _, result = record_then_replay(memory_store, configure)
    assert result.status == "identical"
    assert seen[0] is Mode.SAFE
    assert seen[1] is Mode.SAFE


def test_output_holding_nested_str_enum_replays_identical(memory_store: MemoryStore) -> None:
    """A run whose output holds a tool's nested StrEnum replays as identical."""

    @replayable.tool
    def settings() -> dict[str, Any]:
        return {"mode": Mode.SAFE}

    @replayable.workflow
    def configure() -> dict[str, Any]:
        return settings()

    _, result = record_then_replay(memory_store, configure)
    assert result.status == "identical", result.divergence


def test_llm_chat_completion_replays_as_chat_completion(memory_store: MemoryStore) -> None:
    """An SDK response object returned through llm() comes back as that SDK type."""

    def create(**kwargs: Any) -> ChatCompletion:
        return chat_completion()

    @replayable.workflow
    def ask() -> ChatCompletion:
        return replayable.llm(
            create, model="gpt-4o-mini", messages=[{"role": "user", "content": "weather?"}]
        )

    _, result = record_then_replay(memory_store, ask)
    assert result.status == "identical"
    assert type(result.output) is ChatCompletion
    assert result.output == chat_completion()
    call = result.output.choices[0].message.tool_calls[0]
    assert call.function.arguments == '{"city":"Oslo"}'


# -- unencodable values ----------------------------------------------------------------


@replayable.tool
def ping(n: int) -> str:
    return f"pong {n}"


@replayable.tool
def grab(kind: str) -> Any:
    return threading.Lock() if kind == "lock" else {"ok": True, "thing": [Opaque()]}


@replayable.workflow
def fragile(kind: str) -> Any:
    ping(1)
    ping(2)
    return grab(kind)


@pytest.mark.parametrize(
    ("kind", "type_name", "path"),
    [("lock", "_thread:lock", ""), ("opaque", "tests.test_codec:Opaque", ".thing[0]")],
)
def test_unencodable_result_raises_serialization_error(
    memory_store: MemoryStore, kind: str, type_name: str, path: str
) -> None:
    """An unencodable tool result raises SerializationError naming boundary, step and type;
    the events recorded before it stay in the store."""
    with (
        replayable.recording(memory_store) as rec,
        pytest.raises(replayable.SerializationError) as info,
    ):
        fragile(kind)
    err = info.value
    assert isinstance(err, TypeError)
    assert err.step == 3
    assert err.type_name == type_name
    assert err.path == path
    assert err.boundary is not None
    assert err.boundary == "grab"
    for part in ("'grab'", "step 3", type_name, "register_codec"):
        assert part in str(err)
    run_id = rec.run_ids[0]
    events = memory_store.events(run_id)
    assert [(e.seq, e.name) for e in events] == [(1, "ping"), (2, "ping"), (3, "grab")]
    assert [decode_value(e.response, e.encoding) for e in events[:2]] == ["pong 1", "pong 2"]
    assert events[2].error is not None
    assert orjson.loads(events[2].error)["type"] == "replayable.errors:SerializationError"
    assert memory_store.get_run(run_id).status == "failed"


def test_serialization_failure_replays(memory_store: MemoryStore) -> None:
    """A run that failed on an unencodable result replays to the same SerializationError."""
    _, result = record_then_replay(memory_store, fragile, "lock")
    assert result.status == "identical"
    assert type(result.error) is replayable.SerializationError
    assert result.events_served == 3


# -- exceptions ------------------------------------------------------------------------

ERRORS: dict[str, BaseException] = {
    "value-error": ValueError("bad value", 42),
    "key-error": KeyError("missing"),
    "custom": QuotaExceededError("user-1", 3),
    "needs-kwargs": ApiStatusError("rate limited", status_code=429),
    "no-args": RuntimeError(),
}


@replayable.tool
def failing(case: str) -> None:
    raise ERRORS[case]


@replayable.workflow
def attempt(case: str) -> None:
    failing(case)


@pytest.mark.parametrize("case", list(ERRORS))
def test_tool_exception_reraised_on_replay(memory_store: MemoryStore, case: str) -> None:
    """A tool's exception is re-raised on replay as the same type with the same args."""
    run_id, result = record_then_replay(memory_store, attempt, case)
    original = ERRORS[case]
    assert memory_store.get_run(run_id).status == "failed"
    assert type(result.error) is type(original)
    assert result.error is not original
    assert result.error.args == original.args
    assert str(result.error) == str(original)
    assert result.status == "identical"


def test_exception_caught_by_agent_replays(memory_store: MemoryStore) -> None:
    """An agent that catches a tool's error sees the same error on replay."""

    @replayable.workflow
    def tolerant() -> list[Any]:
        seen = []
        for case in ("custom", "value-error"):
            try:
                failing(case)
            except Exception as exc:
                seen.append((type(exc).__name__, exc.args))
        return seen

    _, result = record_then_replay(memory_store, tolerant)
    assert result.status == "identical"
    assert result.output == [
        ("QuotaExceededError", ("user-1", 3)),
        ("ValueError", ("bad value", 42)),
    ]


def test_exception_with_unencodable_args_keeps_type(memory_store: MemoryStore) -> None:
    """An exception whose args cannot be encoded comes back as its type with its message."""
    lock = threading.Lock()

    @replayable.tool
    def stuck() -> None:
        raise TimeoutError(lock)

    @replayable.workflow
    def wait() -> None:
        stuck()

    _, result = record_then_replay(memory_store, wait)
    assert type(result.error) is TimeoutError
    assert result.error.args == (str(lock),)


def _local_error_class() -> type[Exception]:
    class VanishedError(Exception):
        pass

    return VanishedError


VanishedError = _local_error_class()


@replayable.tool
def vanishing() -> None:
    raise VanishedError("gone", 7)


@replayable.workflow
def lose() -> None:
    vanishing()


def test_unimportable_exception_becomes_recorded_error(memory_store: MemoryStore) -> None:
    """A recorded exception whose type cannot be imported is raised as RecordedError."""
    _, result = record_then_replay(memory_store, lose)
    err = result.error
    assert type(err) is replayable.RecordedError
    assert err.type_name == "tests.test_codec:_local_error_class.<locals>.VanishedError"
    assert err.message == str(VanishedError("gone", 7))
    assert err.type_name in str(err)


def test_unimportable_exception_replay_is_identical(memory_store: MemoryStore) -> None:
    """Replaying a run that failed with an unimportable exception type reports identical."""
    _, result = record_then_replay(memory_store, lose)
    assert result.status == "identical"
