"""Values that cross a boundary, to JSON and back with their types.

Plain JSON values (dicts with string keys, lists, str, int, float, bool,
None) are stored as they are. Anything else is written with a type tag,
``{"$t": "tuple", "v": [...]}``, and comes back as the same type on replay:
tuples, sets, bytes, datetimes, Decimal, UUID, Enum, dataclasses, named
tuples, pydantic models, and whatever :func:`register_codec` adds.

The hot path (:func:`encode_value`) serializes with orjson first and checks
that the JSON reads back equal to the value, which is cheap and catches
tuples, UUIDs, non-finite floats and anything orjson cannot write. Only when
that check fails is the value walked in Python. One case the check cannot
see: members of ``str``/``int`` enums (``StrEnum``, ``IntEnum``) *nested
inside* plain dicts or lists compare equal to their values and come back as
those values; an enum at the top level, or any plain ``Enum``, keeps its type.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import importlib
import math
import uuid
from collections.abc import Callable
from typing import Any, Final

import orjson

__all__ = [
    "UnencodableError",
    "decode_error",
    "decode_tree",
    "decode_value",
    "encode_error",
    "encode_request",
    "encode_value",
    "qualified_name",
    "register_codec",
    "resolve_name",
    "to_tree",
]

TAG: Final = "$t"
_OPTS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS
_REQ_OPTS: Final = orjson.OPT_SORT_KEYS  # non-str keys take the to_tree path
_PLAIN_ROOTS: Final = frozenset({dict, list, str, int, float, bool, type(None)})
_SCALARS: Final = frozenset({str, int, bool, type(None)})
_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1


class UnencodableError(TypeError):
    """A value has a type the codec cannot write; ``path`` says where in the value."""

    def __init__(self, type_name: str, path: str) -> None:
        super().__init__(f"cannot encode a value of type {type_name} at {path or 'the top level'}")
        self.type_name = type_name
        self.path = path


_Encoder = Callable[[Any], Any]
_Decoder = Callable[[Any], Any]
_custom_by_type: dict[type, tuple[str, _Encoder]] = {}
_custom_by_name: dict[str, _Decoder] = {}


def register_codec(
    cls: type, encode: _Encoder, decode: _Decoder, *, name: str | None = None
) -> None:
    """Teach the codec a type: ``encode(obj)`` returns an encodable value, ``decode`` reverses it.

    ``name`` defaults to the type's ``module:qualname``; keep it stable, it is
    what recorded events refer to.
    """
    tag = name or qualified_name(cls)
    _custom_by_type[cls] = (tag, encode)
    _custom_by_name[tag] = decode


def qualified_name(cls: type) -> str:
    """``module:qualname`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_name(name: str) -> Any:
    """Import ``module:qualname``; raises ImportError or AttributeError."""
    module_name, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# -- encoding -----------------------------------------------------------------


def encode_value(value: Any) -> tuple[bytes, bool]:
    """Canonical JSON of ``value`` and whether it carries type tags.

    Raises :class:`UnencodableError` for a type the codec does not know.
    """
    t = type(value)
    if t in _PLAIN_ROOTS:
        try:
            data = orjson.dumps(value, option=_OPTS)
        except TypeError:
            pass
        else:
            if t in _SCALARS:
                return data, False
            if t is float:
                if value - value == 0.0:  # finite; NaN and infinities need a tag
                    return data, False
            elif orjson.loads(data) == value:
                return data, False
    return orjson.dumps(to_tree(value), option=_OPTS), True


def encode_request(value: Any) -> bytes:
    """Canonical JSON of a request. Lossy where types do not matter (tuples become lists)."""
    try:
        return orjson.dumps(value, option=_REQ_OPTS, default=_request_default)
    except TypeError:
        # Integers beyond 64 bits and values the default hook refused.
        return orjson.dumps(to_tree(value), option=_OPTS)


def _request_default(obj: Any) -> Any:
    return to_tree(obj)


def to_tree(value: Any, path: str = "") -> Any:
    """A JSON tree for ``value`` with type tags wherever plain JSON would lose the type."""
    t = type(value)
    if t is str or t is bool or value is None:
        return value
    if t is int:
        if _I64_MIN <= value <= _U64_MAX:
            return value
        return {TAG: "int", "v": str(value)}
    if t is float:
        if math.isfinite(value):
            return value
        return {TAG: "float", "v": repr(value)}
    if t is list:
        return [to_tree(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if t is dict:
        if all(type(k) is str for k in value):
            items = {k: to_tree(v, f"{path}.{k}") for k, v in value.items()}
            return {TAG: "dict", "v": items} if TAG in value else items
        return {
            TAG: "map",
            "v": [
                [to_tree(k, f"{path}<key>"), to_tree(v, f"{path}[{k!r}]")] for k, v in value.items()
            ],
        }
    custom = _custom_by_type.get(t)
    if custom is not None:
        return {TAG: "custom", "cls": custom[0], "v": to_tree(custom[1](value), path)}
    if isinstance(value, enum.Enum):
        return {TAG: "enum", "cls": qualified_name(t), "name": value.name}
    if t is tuple:
        return {TAG: "tuple", "v": [to_tree(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {
            TAG: "namedtuple",
            "cls": qualified_name(t),
            "v": [to_tree(v, f"{path}.{f}") for f, v in zip(value._fields, value, strict=True)],
        }
    if t is set or t is frozenset:
        members = [to_tree(v, f"{path}{{}}") for v in value]
        members.sort(key=lambda x: orjson.dumps(x, option=_OPTS))
        return {TAG: t.__name__, "v": members}
    if t is bytes or t is bytearray:
        return {TAG: t.__name__, "v": base64.b64encode(value).decode()}
    if t is dt.datetime:
        return {TAG: "datetime", "v": value.isoformat()}
    if t is dt.date:
        return {TAG: "date", "v": value.isoformat()}
    if t is dt.time:
        return {TAG: "time", "v": value.isoformat()}
    if t is dt.timedelta:
        return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if t is decimal.Decimal:
        return {TAG: "decimal", "v": str(value)}
    if t is uuid.UUID:
        return {TAG: "uuid", "v": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: to_tree(getattr(value, f.name), f"{path}.{f.name}")
            for f in dataclasses.fields(value)
        }
        return {TAG: "dataclass", "cls": qualified_name(t), "v": fields}
    dump = getattr(value, "model_dump", None)
    if dump is not None and hasattr(t, "model_validate"):
        return {
            TAG: "pydantic",
            "cls": qualified_name(t),
            "v": dump(mode="json", by_alias=True, round_trip=True),
        }
    for base, (tag, enc) in _custom_by_type.items():
        if isinstance(value, base):
            return {TAG: "custom", "cls": tag, "v": to_tree(enc(value), path)}
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return to_tree(int(value), path)
    if isinstance(value, float):
        return to_tree(float(value), path)
    raise UnencodableError(qualified_name(t), path)


# -- decoding -----------------------------------------------------------------


def decode_value(data: str | bytes | None, encoding: str) -> Any:
    """The value that :func:`encode_value` wrote; tags are read only for ``tagged``."""
    if data is None:
        return None
    tree = orjson.loads(data)
    return decode_tree(tree) if encoding == "tagged" else tree


def decode_tree(tree: Any) -> Any:
    """Rebuild typed values from a tagged JSON tree."""
    if type(tree) is list:
        return [decode_tree(v) for v in tree]
    if type(tree) is not dict:
        return tree
    tag = tree.get(TAG)
    if tag is None:
        return {k: decode_tree(v) for k, v in tree.items()}
    reader = _READERS.get(tag)
    if reader is None:
        raise UnencodableError(f"unknown tag {tag!r}", "")
    return reader(tree)


def _typed(tree: dict[str, Any]) -> Any:
    return resolve_name(tree["cls"])


def _read_dataclass(tree: dict[str, Any]) -> Any:
    cls = _typed(tree)
    values = {k: decode_tree(v) for k, v in tree["v"].items()}
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    obj = cls(**{k: v for k, v in values.items() if k in init})
    for k, v in values.items():
        if k not in init:
            object.__setattr__(obj, k, v)
    return obj


def _read_pydantic(tree: dict[str, Any]) -> Any:
    cls = _typed(tree)
    try:
        return cls.model_validate(tree["v"])
    except Exception:
        # Response models built without validation (as SDKs do) may not
        # validate strictly; construct them the same way.
        construct = getattr(cls, "construct", None) or cls.model_construct
        return construct(**tree["v"])


def _read_custom(tree: dict[str, Any]) -> Any:
    decoder = _custom_by_name.get(tree["cls"])
    if decoder is None:
        raise UnencodableError(f"unregistered codec {tree['cls']!r}", "")
    return decoder(decode_tree(tree["v"]))


_READERS: Final[dict[str, Callable[[dict[str, Any]], Any]]] = {
    "dict": lambda t: {k: decode_tree(v) for k, v in t["v"].items()},
    "map": lambda t: {decode_tree(k): decode_tree(v) for k, v in t["v"]},
    "int": lambda t: int(t["v"]),
    "float": lambda t: float(t["v"]),
    "tuple": lambda t: tuple(decode_tree(v) for v in t["v"]),
    "namedtuple": lambda t: _typed(t)(*(decode_tree(v) for v in t["v"])),
    "set": lambda t: {decode_tree(v) for v in t["v"]},
    "frozenset": lambda t: frozenset(decode_tree(v) for v in t["v"]),
    "bytes": lambda t: base64.b64decode(t["v"]),
    "bytearray": lambda t: bytearray(base64.b64decode(t["v"])),
    "datetime": lambda t: dt.datetime.fromisoformat(t["v"]),
    "date": lambda t: dt.date.fromisoformat(t["v"]),
    "time": lambda t: dt.time.fromisoformat(t["v"]),
    "timedelta": lambda t: dt.timedelta(days=t["v"][0], seconds=t["v"][1], microseconds=t["v"][2]),
    "decimal": lambda t: decimal.Decimal(t["v"]),
    "uuid": lambda t: uuid.UUID(t["v"]),
    "enum": lambda t: _typed(t)[t["name"]],
    "dataclass": _read_dataclass,
    "pydantic": _read_pydantic,
    "custom": _read_custom,
}


# -- errors -------------------------------------------------------------------


def encode_error(exc: BaseException) -> bytes:
    """A recorded exception: its type, message and (when encodable) its args."""
    try:
        args: Any = to_tree(list(exc.args))
    except UnencodableError:
        args = None
    record = {"type": qualified_name(type(exc)), "message": str(exc), "args": args}
    return orjson.dumps(record, option=_OPTS)


def decode_error(data: str | bytes) -> BaseException:
    """Rebuild a recorded exception as its own type when it can be imported."""
    from replayable.errors import RecordedError

    record = orjson.loads(data)
    type_name, message = record["type"], record["message"]
    try:
        cls = resolve_name(type_name)
    except Exception:
        return RecordedError(type_name, message)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return RecordedError(type_name, message)
    args = tuple(decode_tree(record["args"])) if record["args"] is not None else (message,)
    try:
        return cls(*args)
    except Exception:
        # Exceptions whose __init__ wants more than args (SDK errors taking a
        # response) are rebuilt without calling __init__.
        exc = cls.__new__(cls, *args)
        exc.args = args
        return exc
