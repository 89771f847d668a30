"""Values that cross a boundary, to JSON and back with their types.

Plain JSON values (dicts with string keys, lists, str, int, float, bool,
None) are stored as they are. Anything else is written with a type tag,
``{"$t": "tuple", "v": [...]}``, and comes back as the same type on replay:
tuples, sets, bytes, datetimes, Decimal, UUID, Enum, dataclasses, named
tuples, pydantic models, and whatever :func:`register_codec` adds.

A value is stored in its own order: dict keys as they were inserted, so
``json.dumps`` of the replayed value is the live one's. Requests are
canonical instead (sorted keys), because their bytes are fingerprinted.

The hot path (:func:`encode_value`) serializes with orjson first and checks
that the value holds only exact JSON types, a level at a time in C (so a
tuple, UUID, datetime or ``StrEnum`` nested in a dict is caught), and that no
float is NaN or infinite; orjson itself refuses anything else it cannot write.
Only when that check fails is the value walked in Python. Strings with lone
surrogates (``os.fsdecode`` of a non-UTF-8 file name) are tagged and come
back as they were; values nested deeper than :data:`MAX_DEPTH` levels, and
values that contain themselves, raise :class:`UnencodableError` with the path
where it happens.

Decoding builds classes only through the allowlist of
:mod:`replayable.allowlist`: a stored record names a type, it never chooses
which code runs.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import gc
import json
import math
import uuid
import zoneinfo
from collections.abc import Callable
from typing import Any, Final

import orjson

from replayable import allowlist

__all__ = [
    "MAX_DEPTH",
    "UnencodableError",
    "decode_error",
    "decode_tree",
    "decode_value",
    "dump_tree",
    "encode_error",
    "encode_request",
    "encode_value",
    "printable",
    "qualified_name",
    "register_codec",
    "resolve_name",
    "to_tree",
    "unencodable_note",
    "unencodable_request",
]

TAG: Final = "$t"
#: Values keep their key order; only requests (fingerprinted) are sorted.
_OPTS: Final = orjson.OPT_PASSTHROUGH_SUBCLASS
_SORTED: Final = orjson.OPT_SORT_KEYS
_REQ_OPTS: Final = orjson.OPT_SORT_KEYS  # non-str keys take the to_tree path
#: How deeply containers may nest in a recorded value. orjson writes 254 levels;
#: deeper values (to this limit) are written by the standard library instead.
MAX_DEPTH: Final = 256
_PLAIN_ROOTS: Final = frozenset({dict, list, str, int, float, bool, type(None)})
_SCALARS: Final = frozenset({str, int, bool, type(None)})
_referents: Final = gc.get_referents
_CONTAINERS: Final = frozenset({dict, list})
_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1


class UnencodableError(TypeError):
    """A value the codec cannot write; ``path`` says where in the value, ``reason`` why
    when it is not the type itself (a value that contains itself, one nested too deeply)."""

    def __init__(self, type_name: str, path: str, reason: str | None = None) -> None:
        where = _short(path) or "the top level"
        why = f": {reason}" if reason else ""
        super().__init__(f"cannot encode a value of type {type_name} at {where}{why}")
        self.type_name = type_name
        self.path = path
        self.reason = reason


def _short(path: str) -> str:
    return path if len(path) <= 80 else f"{path[:40]}…{path[-36:]}"


class _TooDeep(Exception):
    def __init__(self, path: str, value: Any) -> None:
        self.path = path
        self.value = value


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
    """Import ``module:qualname`` from a module the allowlist admits.

    Raises :class:`~replayable.errors.UntrustedRecordError` for any other module
    (before importing it), ImportError or AttributeError when it is missing.
    """
    return allowlist.resolve(name)


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
            else:
                level = _referents(value)
                if len(level) <= 8:
                    # The common small result (a flat dict or list of strings, ints,
                    # booleans and nulls), checked here without a call.
                    for item in level:
                        if type(item) not in _SCALARS:
                            break
                    else:
                        return data, False
                if _exact(value, data, level):
                    return data, False
    return dump_tree(to_tree(value)), True


def _exact(value: Any, data: bytes, level: list[Any]) -> bool:
    """Whether the container ``value``, which orjson wrote as ``data``, reads back as itself.

    orjson writes tuples as arrays, enum members, UUIDs, datetimes and dataclasses as
    their values, and NaN and the infinities as ``null``; each of these must take the
    tagged path. The walk goes level by level through what the garbage collector sees
    each container hold (a dict's values, and its keys unless all are exact ``str``),
    so the type test runs in C over a whole level at once: any type outside the exact
    JSON types refuses the fast path. orjson has already refused cycles and anything
    deeper than it writes, so the walk ends. Floats read back as themselves unless one
    is not finite, which orjson wrote as ``null``: only then is the round trip compared.
    ``level`` is what the container holds (``gc.get_referents(value)``).
    """
    floats = False
    while level:
        if len(level) <= 8:  # a few items: a loop costs less than building a set
            nested = False
            for item in level:
                t = type(item)
                if t not in _PLAIN_ROOTS:
                    return False
                if t is float:
                    floats = True
                elif t is dict or t is list:
                    nested = True
            if not nested:
                break
        else:
            types = set(map(type, level))
            if not types <= _PLAIN_ROOTS:
                return False
            if float in types:
                floats = True
            if types.isdisjoint(_CONTAINERS):
                break
        level = _referents(*level)
    return not floats or b"null" not in data or bool(orjson.loads(data) == value)


def encode_request(value: Any) -> bytes:
    """Canonical JSON of a request (sorted keys). Lossy where types do not matter
    (tuples become lists)."""
    try:
        return orjson.dumps(value, option=_REQ_OPTS, default=_request_default)
    except TypeError:
        # Integers beyond 64 bits, lone surrogates, deep nesting, values the hook refused.
        return dump_tree(to_tree(value), sort=True)


def unencodable_note(exc: UnencodableError, part: str) -> dict[str, Any]:
    """What an event marked unencodable records about why (``part``: request or response)."""
    return {"part": part, "type": exc.type_name, "path": exc.path, "reason": exc.reason}


def unencodable_request(exc: UnencodableError) -> bytes:
    """The request stored for a call whose request could not be encoded: the same on
    replay for the same failure, so the step is matched and its error served again."""
    return encode_request({"$unencodable": {"type": exc.type_name, "path": exc.path}})


def _request_default(obj: Any) -> Any:
    return to_tree(obj)


def dump_tree(tree: Any, *, sort: bool = False) -> bytes:
    """JSON bytes of a tree :func:`to_tree` built (sorted keys with ``sort``)."""
    try:
        return orjson.dumps(tree, option=_SORTED if sort else _OPTS)
    except TypeError as exc:
        if "Recursion limit" not in str(exc):
            raise UnencodableError(type(tree).__name__, "", str(exc)) from None
    # Deeper than orjson writes (to_tree already bounded the depth).
    return json.dumps(
        tree, ensure_ascii=False, separators=(",", ":"), allow_nan=False, sort_keys=sort
    ).encode()


def to_tree(value: Any, path: str = "") -> Any:
    """A JSON tree for ``value`` with type tags wherever plain JSON would lose the type.

    Raises :class:`UnencodableError` for a type the codec does not know, a value
    that contains itself, or one nested deeper than :data:`MAX_DEPTH`.
    """
    try:
        return _tree(value, path, 0)
    except _TooDeep as deep:
        cycle = _cycle(value)
        if cycle is not None:
            where, inner = cycle
            raise UnencodableError(
                qualified_name(type(inner)), where, "it contains itself (a recursive value)"
            ) from None
        raise UnencodableError(
            qualified_name(type(deep.value)),
            deep.path,
            f"nested deeper than {MAX_DEPTH} levels",
        ) from None
    except RecursionError:
        raise UnencodableError(
            qualified_name(type(value)), path, "nested too deeply for the interpreter's stack"
        ) from None


def _children(value: Any) -> list[tuple[str, Any]]:
    if type(value) is dict or isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    return []


def _cycle(root: Any) -> tuple[str, Any] | None:
    """The path of a container that contains itself, if ``root`` holds one."""
    on_path: set[int] = set()
    # Iterative depth-first walk: (value, path, children left or None when entering).
    stack: list[tuple[Any, str, list[tuple[str, Any]] | None]] = [(root, "", None)]
    while stack:
        value, path, todo = stack.pop()
        if todo is None:
            if id(value) in on_path:
                return path, value
            todo = _children(value)
            if not todo:
                continue
            on_path.add(id(value))
        if todo:
            step, child = todo.pop()
            stack.append((value, path, todo))
            stack.append((child, path + step, None))
        else:
            on_path.discard(id(value))
    return None


def _text(value: str) -> Any:
    """A string as JSON can hold it: lone surrogates are tagged (their UTF-8 bytes)."""
    if value.isascii():
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "surrogatepass")
        return {TAG: "str", "v": base64.b64encode(raw).decode()}
    return value


def _clock_tree(value: dt.datetime | dt.time) -> dict[str, Any]:
    """A datetime or time: its ISO text, and what ISO text drops (a named zone, ``fold``)."""
    out: dict[str, Any] = {TAG: "datetime" if type(value) is dt.datetime else "time"}
    out["v"] = value.isoformat()
    zone = value.tzinfo
    if isinstance(zone, zoneinfo.ZoneInfo) and zone.key:
        out["tz"] = zone.key
    if value.fold:  # the second of a repeated wall-clock hour
        out["fold"] = 1
    return out


def printable(text: str) -> str:
    """``text`` as valid UTF-8: lone surrogates written as ``\\udcff`` escapes (for
    messages that are shown and compared, not rebuilt)."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def _tree(value: Any, path: str, depth: int) -> Any:
    t = type(value)
    if t is str:
        return _text(value)
    if t is bool or value is None:
        return value
    if t is int:
        if _I64_MIN <= value <= _U64_MAX:
            return value
        return {TAG: "int", "v": str(value)}
    if t is float:
        if math.isfinite(value):
            return value
        return {TAG: "float", "v": repr(value)}
    if depth >= MAX_DEPTH and (t is list or t is dict or t is tuple or t is set):
        raise _TooDeep(path, value)
    depth += 1
    if t is list:
        out = []
        for i, v in enumerate(value):
            out.append(_tree(v, f"{path}[{i}]", depth))
        return out
    if t is dict:
        if all(type(k) is str and (k.isascii() or _text(k) is k) for k in value):
            items = {}
            for k, v in value.items():
                items[k] = _tree(v, f"{path}.{k}", depth)
            return {TAG: "dict", "v": items} if TAG in value else items
        return {
            TAG: "map",
            "v": [
                [_tree(k, f"{path}<key>", depth), _tree(v, f"{path}[{k!r}]", depth)]
                for k, v in value.items()
            ],
        }
    custom = _custom_by_type.get(t)
    if custom is not None:
        return {TAG: "custom", "cls": custom[0], "v": _tree(custom[1](value), path, depth)}
    if isinstance(value, enum.Enum):
        return {TAG: "enum", "cls": qualified_name(t), "name": value.name}
    if t is tuple:
        items_ = []
        for i, v in enumerate(value):
            items_.append(_tree(v, f"{path}[{i}]", depth))
        return {TAG: "tuple", "v": items_}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {
            TAG: "namedtuple",
            "cls": qualified_name(t),
            "v": [
                _tree(v, f"{path}.{f}", depth) for f, v in zip(value._fields, value, strict=True)
            ],
        }
    if t is set or t is frozenset:
        members = [_tree(v, f"{path}{{}}", depth) for v in value]
        members.sort(key=lambda x: dump_tree(x, sort=True))
        return {TAG: t.__name__, "v": members}
    if t is bytes or t is bytearray:
        return {TAG: t.__name__, "v": base64.b64encode(value).decode()}
    if t is dt.datetime or t is dt.time:
        return _clock_tree(value)
    if t is dt.date:
        return {TAG: "date", "v": value.isoformat()}
    if t is dt.timedelta:
        return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if t is decimal.Decimal:
        return {TAG: "decimal", "v": str(value)}
    if t is uuid.UUID:
        return {TAG: "uuid", "v": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _tree(getattr(value, f.name), f"{path}.{f.name}", depth)
            for f in dataclasses.fields(value)
        }
        return {TAG: "dataclass", "cls": qualified_name(t), "v": fields}
    dump = getattr(value, "model_dump", None)
    if dump is not None and hasattr(t, "model_validate"):
        data = dump(mode="json", by_alias=True, round_trip=True)
        try:
            orjson.dumps(data)
        except TypeError:
            # Lone surrogates (or deep nesting) in a field: the dump is tagged too, under
            # "t", so records written before this read as they did.
            return {TAG: "pydantic", "cls": qualified_name(t), "t": _tree(data, path, depth)}
        return {TAG: "pydantic", "cls": qualified_name(t), "v": data}
    for base, (tag, enc) in _custom_by_type.items():
        if isinstance(value, base):
            return {TAG: "custom", "cls": tag, "v": _tree(enc(value), path, depth)}
    if isinstance(value, str):
        return _text(str(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return _tree(int(value), path, depth)
    if isinstance(value, float):
        return _tree(float(value), path, depth)
    raise UnencodableError(qualified_name(t), path)


# -- decoding -----------------------------------------------------------------


def decode_value(data: str | bytes | None, encoding: str) -> Any:
    """The value that :func:`encode_value` wrote; tags are read only for ``tagged``."""
    if data is None:
        return None
    tree = orjson.loads(data)
    return decode_tree(tree) if encoding == "tagged" else tree


def decode_tree(tree: Any) -> Any:
    """Rebuild typed values from a tagged JSON tree.

    Classes are built only from modules :mod:`replayable.allowlist` admits;
    any other name raises :class:`~replayable.errors.UntrustedRecordError`
    before anything is imported.
    """
    try:
        return _decode(tree)
    except RecursionError:
        raise UnencodableError("value", "", "nested too deeply to decode here") from None


def _decode(tree: Any) -> Any:
    t = type(tree)
    if t is list:
        out = []
        for v in tree:
            out.append(_decode(v))
        return out
    if t is not dict:
        return tree
    tag = tree.get(TAG)
    if tag is None:
        items = {}
        for k, v in tree.items():
            items[k] = _decode(v)
        return items
    if tag == "tuple":
        return tuple(_decode(tree["v"]))
    reader = _READERS.get(tag)
    if reader is None:
        raise UnencodableError(f"unknown tag {tag!r}", "")
    return reader(tree)


def _is_enum(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, enum.Enum)


def _is_namedtuple(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def _is_dataclass(cls: Any) -> bool:
    return isinstance(cls, type) and dataclasses.is_dataclass(cls)


def _is_pydantic(cls: Any) -> bool:
    if not isinstance(cls, type):
        return False
    try:
        import pydantic
    except ImportError:  # pragma: no cover - a pydantic value implies pydantic
        return False
    return issubclass(cls, pydantic.BaseModel)


_KINDS: Final[dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "enum": ("an enum", _is_enum),
    "namedtuple": ("a named tuple", _is_namedtuple),
    "dataclass": ("a dataclass", _is_dataclass),
    "pydantic": ("a pydantic model", _is_pydantic),
}


def _typed(tree: dict[str, Any]) -> Any:
    """The class a tagged tree names, refused unless allowed and of the tag's kind."""
    from replayable.errors import UntrustedRecordError

    kind = tree[TAG]
    what, check = _KINDS[kind]
    name = tree.get("cls")
    if not isinstance(name, str):
        raise UntrustedRecordError(repr(name), what, "the class name is not a string")
    cls = allowlist.resolve(name, what=what)
    if not check(cls):
        raise UntrustedRecordError(name, what, f"{name!r} is not {what}")
    return cls


def _read_dataclass(tree: dict[str, Any]) -> Any:
    cls = _typed(tree)
    values = {k: _decode(v) for k, v in tree["v"].items()}
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    obj = cls(**{k: v for k, v in values.items() if k in init})
    for k, v in values.items():
        if k not in init:
            object.__setattr__(obj, k, v)
    return obj


def _read_pydantic(tree: dict[str, Any]) -> Any:
    cls = _typed(tree)
    data = tree["v"] if "v" in tree else _decode(tree["t"])
    try:
        return cls.model_validate(data)
    except Exception:
        # Response models built without validation (as SDKs do) may not
        # validate strictly; construct them the same way.
        construct = getattr(cls, "construct", None) or cls.model_construct
        return construct(**data)


def _read_clock(tree: dict[str, Any]) -> Any:
    cls = dt.datetime if tree[TAG] == "datetime" else dt.time
    value = cls.fromisoformat(tree["v"])
    if "tz" in tree:
        value = value.replace(tzinfo=zoneinfo.ZoneInfo(tree["tz"]))
    return value.replace(fold=1) if tree.get("fold") else value


def _read_custom(tree: dict[str, Any]) -> Any:
    decoder = _custom_by_name.get(tree["cls"])
    if decoder is None:
        raise UnencodableError(f"unregistered codec {tree['cls']!r}", "")
    return decoder(_decode(tree["v"]))


def _read_str(tree: dict[str, Any]) -> str:
    return base64.b64decode(tree["v"]).decode("utf-8", "surrogatepass")


_READERS: Final[dict[str, Callable[[dict[str, Any]], Any]]] = {
    "dict": lambda t: {k: _decode(v) for k, v in t["v"].items()},
    "map": lambda t: {_decode(k): _decode(v) for k, v in t["v"]},
    "str": _read_str,
    "int": lambda t: int(t["v"]),
    "float": lambda t: float(t["v"]),
    "namedtuple": lambda t: _typed(t)(*(_decode(v) for v in t["v"])),
    "set": lambda t: {_decode(v) for v in t["v"]},
    "frozenset": lambda t: frozenset(_decode(v) for v in t["v"]),
    "bytes": lambda t: base64.b64decode(t["v"]),
    "bytearray": lambda t: bytearray(base64.b64decode(t["v"])),
    "datetime": _read_clock,
    "date": lambda t: dt.date.fromisoformat(t["v"]),
    "time": _read_clock,
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
    """A recorded exception: its type, message and (when encodable) its args. Never raises."""
    raw = list(exc.args)
    if isinstance(exc, OSError) and exc.filename is not None and len(raw) == 2:
        # OSError keeps the file names out of ``args``; its constructor takes them back.
        raw = [exc.errno, exc.strerror, exc.filename, None, exc.filename2]
    try:
        args: Any = to_tree(raw)
        dump_tree(args)
    except UnencodableError:
        args = None
    try:
        message = str(exc)
    except Exception as inner:  # a broken __str__ must not lose the event
        message = f"<str() of the exception raised {type(inner).__name__}>"
    record = {"type": qualified_name(type(exc)), "message": printable(message), "args": args}
    from replayable.errors import SerializationError

    if isinstance(exc, SerializationError):  # where it happened, for the agent on replay
        record["attrs"] = {
            k: _text(str(v)) if isinstance(v, str) else v for k, v in vars(exc).items()
        }
    return dump_tree(record)


def decode_error(data: str | bytes) -> BaseException:
    """Rebuild a recorded exception as its own type when the allowlist admits its module
    (else, and when it cannot be imported, as :class:`~replayable.errors.RecordedError`)."""
    from replayable.errors import RecordedError

    record = orjson.loads(data)
    type_name, message = record["type"], record["message"]
    try:
        cls = allowlist.resolve(type_name, what="an exception type", loaded=True)
    except Exception:
        return RecordedError(type_name, message)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return RecordedError(type_name, message)
    args = tuple(_decode(record["args"])) if record["args"] is not None else (message,)
    try:
        exc = cls(*args)
    except Exception:
        # Exceptions whose __init__ wants more than args (SDK errors taking a
        # response) are rebuilt without calling __init__.
        exc = cls.__new__(cls, *args)
        exc.args = args
    attrs = record.get("attrs")
    if isinstance(attrs, dict) and type_name == "replayable.errors:SerializationError":
        for key in ("boundary", "step", "type_name", "path"):
            value = attrs.get(key)
            setattr(exc, key, _decode(value) if isinstance(value, dict) else value)
    return exc
