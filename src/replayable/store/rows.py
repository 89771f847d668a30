"""Rows to records: the column order the SQL stores select, decoded once for all of them.

A row is stored data, and a hostile or damaged one must not stop a reader:
every column is checked for the type it must have (and JSON columns parsed).
A column that fails is replaced by a placeholder and named in the record's
``problems`` (``"metadata: not valid JSON (…)"``), so ``runs`` can flag the
run, ``show`` print the row as unreadable, ``replay`` stop at that step and
``verify`` count it as broken, each naming run, seq, column and what is wrong.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson

from replayable.events.model import (
    EVENT_SCHEMA_VERSION,
    SCHEMA_VERSION,
    SEALED_EVENT_VERSION,
    SEALED_SCHEMA_VERSION,
    Event,
    Run,
    RunEnd,
    RunStart,
)
from replayable.store.payloads import REF_PREFIX

#: The newest record versions this replayable reads.
_RUN_MAX: Final = SEALED_SCHEMA_VERSION
_EVENT_MAX: Final = SEALED_EVENT_VERSION

__all__ = [
    "END_COLUMNS",
    "EVENT_COLUMNS",
    "RUN_COLUMNS",
    "UndecodableText",
    "event_from_row",
    "event_to_row",
    "events_from_columns",
    "ints_or_nulls",
    "run_from_row",
    "sound_events",
    "texts_or_nulls",
    "undecodable_text",
]


class _Bad(Exception):
    """A column value that is not what the column holds."""


class UndecodableText(bytes):
    """A text column's value whose bytes are not UTF-8, as a store read it back (the
    database holds what it was given: a hostile or damaged row may hold anything)."""

    __slots__ = ()


def undecodable_text(data: bytes) -> str | UndecodableText:
    """A text value's bytes as ``str``, or kept as :class:`UndecodableText` if they are
    not UTF-8 (a driver's text factory: the row is then reported, not the whole read)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return UndecodableText(data)


def _type_name(v: object) -> str:
    if type(v) is UndecodableText:
        return "text that is not UTF-8"
    return "NULL" if v is None else type(v).__name__


def _text(v: Any) -> str:
    if type(v) is not str:
        if type(v) is UndecodableText:
            raise _Bad(f"is not valid UTF-8 ({_show(bytes(v))})")
        raise _Bad(f"is {_type_name(v)}, not text")
    return v


def _opt_text(v: Any) -> str | None:
    return None if v is None else _text(v)


def _int(v: Any) -> int:
    if type(v) is not int:
        raise _Bad(f"is {_type_name(v)} {_show(v)}, not an integer")
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _number(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise _Bad(f"is {_type_name(v)} {_show(v)}, not a number")


def _bool(v: Any) -> bool:
    if v is True or v is False:
        return v
    if type(v) is int and v in (0, 1):
        return bool(v)
    raise _Bad(f"is {_type_name(v)} {_show(v)}, not a boolean")


def _json_text(v: Any) -> str:
    text = _text(v)
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _Bad(f"is not valid JSON ({exc})") from None
    return text


def _opt_json_text(v: Any) -> str | None:
    return None if v is None else _json_text(v)


def _is_ref(v: Any) -> bool:
    """Whether ``v`` is the text of a value kept in the payload tier (read by the store)."""
    return type(v) is str and v.startswith(REF_PREFIX)


def _opt_output_text(v: Any) -> str | None:
    """A run's output: JSON text, NULL, or a reference to the tier."""
    return v if _is_ref(v) else _opt_json_text(v)


def _input_text(v: Any) -> str:
    """A run's input: JSON text of ``{"args": [...], "kwargs": {...}}`` (or a reference)."""
    if _is_ref(v):
        return str(v)
    value = _json_object(v)
    if type(value.get("args")) is not list or type(value.get("kwargs")) is not dict:
        raise _Bad("is not an object of args (a list) and kwargs (an object)")
    return str(v)


def _opt_error_text(v: Any) -> str | None:
    """An error record: JSON text of an object (type, message, args), NULL, or a reference."""
    if v is None:
        return None
    if _is_ref(v):
        return str(v)
    _json_object(v)
    return str(v)


def _json_object(v: Any) -> dict[str, Any]:
    try:
        value = orjson.loads(_text(v))
    except orjson.JSONDecodeError as exc:
        raise _Bad(f"is not valid JSON ({exc})") from None
    if type(value) is not dict:
        raise _Bad(f"is JSON {_type_name(value)}, not an object")
    return value


def _version(v: Any) -> int:
    n = _int(v)
    if not 1 <= n <= _RUN_MAX:
        raise _Bad(f"{n} is not a record version this replayable reads (1 to {_RUN_MAX})")
    return n


def _event_version(v: Any) -> int:
    n = _int(v)
    if not 1 <= n <= _EVENT_MAX:
        raise _Bad(f"{n} is not an event version this replayable reads (1 to {_EVENT_MAX})")
    return n


def _status(v: Any) -> str:
    if v not in ("completed", "failed"):
        raise _Bad(f"{_show(v)} is not completed or failed")
    return str(v)


def _encoding(v: Any) -> str:
    if v not in ("json", "tagged"):
        raise _Bad(f"{_show(v)} is not json or tagged")
    return str(v)


def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


_Check = Callable[[Any], Any]

# (field, check, placeholder when unreadable; a type stands for a fresh value of it)
RUN_COLUMNS: Final[tuple[tuple[str, _Check, Any], ...]] = (
    ("run_id", _text, ""),
    ("workflow", _text, "?"),
    ("entrypoint", _text, "?"),
    ("parent_run_id", _opt_text, None),
    ("parent_seq", _opt_int, None),
    ("root_run_id", _text, ""),
    ("tenant", _opt_text, None),
    ("input", _input_text, '{"args":[],"kwargs":{}}'),
    ("metadata", _json_object, dict),
    ("code", _json_object, dict),
    ("env_hash", _opt_text, None),
    ("lineage", _json_object, dict),
    ("started_at", _number, 0.0),
    ("schema_version", _version, SCHEMA_VERSION),
    ("chain", _opt_text, None),
)
END_COLUMNS: Final[tuple[tuple[str, _Check, Any], ...]] = (
    ("run_id", _text, ""),
    ("status", _status, "failed"),
    ("output", _opt_output_text, None),
    ("error", _opt_error_text, None),
    ("ended_at", _number, 0.0),
    ("event_count", _int, -1),
    ("last_hash", _text, ""),
    ("schema_version", _version, SCHEMA_VERSION),
    ("signature", _opt_text, None),
)
EVENT_COLUMNS: Final[tuple[tuple[str, _Check, Any], ...]] = (
    ("run_id", _text, ""),
    ("seq", _int, -1),
    ("kind", _text, "?"),
    ("name", _text, "?"),
    ("key", _opt_text, None),
    ("parent", _opt_int, None),
    ("call_site", _opt_text, None),
    ("request", _json_text, "null"),
    ("fingerprint", _text, ""),
    ("response", _opt_json_text, None),
    ("encoding", _encoding, "json"),
    ("error", _opt_error_text, None),
    ("side_effect", _bool, False),
    ("started_at", _number, 0.0),
    ("duration_ns", _int, 0),
    ("metadata", _json_object, dict),
    ("chain_index", _int, -1),
    ("prev_hash", _text, ""),
    ("hash", _text, ""),
    ("schema_version", _event_version, EVENT_SCHEMA_VERSION),
)


def _decode(
    columns: tuple[tuple[str, _Check, Any], ...], row: Sequence[Any], offset: int = 0
) -> tuple[dict[str, Any], tuple[str, ...]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for i, (name, check, placeholder) in enumerate(columns):
        try:
            value = row[offset + i]
        except IndexError:
            problems.append(f"{name}: column is missing")
            values[name] = placeholder() if placeholder is dict else placeholder
            continue
        try:
            values[name] = check(value)
        except _Bad as exc:
            problems.append(f"{name}: {exc}")
            values[name] = placeholder() if placeholder is dict else placeholder
    for name in ("started_at", "ended_at"):
        t = values.get(name)
        if isinstance(t, float) and not math.isfinite(t):
            problems.append(f"{name}: {t} is not a finite time")
            values[name] = 0.0
    return values, tuple(problems)


def run_from_row(row: Sequence[Any]) -> Run:
    """A :class:`Run` from a row of the run columns followed by the end-record columns
    (``None`` there for a run without an end record); bad columns land in ``problems``."""
    values, problems = _decode(RUN_COLUMNS, row)
    start = RunStart(**values)
    end = None
    width = len(RUN_COLUMNS)
    if len(row) > width and row[width] is not None:
        end_values, end_problems = _decode(END_COLUMNS, row, width)
        end_values["run_id"] = start.run_id or end_values["run_id"]
        end = RunEnd(**end_values)
        problems += tuple(f"end record {p}" for p in end_problems)
    return Run(start=start, end=end, problems=problems)


def event_from_row(r: Sequence[Any]) -> Event:
    """An :class:`Event` from a row of the event columns in field order; bad columns land
    in ``problems`` (a seq that cannot be read becomes ``chain_index + 1``, or -1)."""
    sound = _sound_event(r)
    if sound is not None:
        return sound
    values, problems = _decode(EVENT_COLUMNS, r)
    if problems:
        if values["seq"] == -1 and values["chain_index"] >= 0:
            values["seq"] = values["chain_index"] + 1
        return Event(**values, problems=problems)
    return Event(**values)


def _sound_event(r: Sequence[Any]) -> Event | None:
    """The event of a row whose every column is what :data:`EVENT_COLUMNS` checks, in
    one pass without a call per column; ``None`` for any other row, which the
    column-by-column decoder then reads and names the problems of. Readers of long
    runs (replay, diff, show) meet sound rows almost always."""
    if len(r) != len(EVENT_COLUMNS):
        return None
    (run_id, seq, kind, name, key, parent, site, request, fingerprint, response,
     encoding, error, side_effect, started_at, duration_ns, metadata, chain_index,
     prev_hash, digest, version) = r  # fmt: skip
    if not (
        type(run_id) is str and type(seq) is int and type(kind) is str and type(name) is str
        and (key is None or type(key) is str) and (parent is None or type(parent) is int)
        and (site is None or type(site) is str) and type(request) is str
        and type(fingerprint) is str and (response is None or type(response) is str)
        and (encoding == "json" or encoding == "tagged") and type(encoding) is str
        and (error is None or type(error) is str)
        and (side_effect is True or side_effect is False
             or (type(side_effect) is int and (side_effect == 0 or side_effect == 1)))
        and (type(started_at) is float or type(started_at) is int)
        and started_at - started_at == 0  # finite
        and type(duration_ns) is int and type(metadata) is str and type(chain_index) is int
        and type(prev_hash) is str and type(digest) is str
        and type(version) is int and 1 <= version <= _EVENT_MAX
    ):  # fmt: skip
        return None
    loads = orjson.loads
    try:
        loads(request)
        if response is not None:
            loads(response)
        if error is not None and error[:6] != REF_PREFIX and type(loads(error)) is not dict:
            return None
        meta = loads(metadata)
    except orjson.JSONDecodeError:
        return None
    if type(meta) is not dict:
        return None
    # Positional, in field order (much cheaper than keywords for the one hot caller).
    return Event(
        run_id, seq, kind, name, key, parent, site, request, fingerprint, response, encoding,
        error, bool(side_effect), float(started_at), duration_ns, meta, chain_index, prev_hash,
        digest, version,
    )  # fmt: skip


def events_from_columns(columns: Sequence[Sequence[Any]]) -> list[Event]:
    """The events of rows given as columns in field order (:data:`EVENT_COLUMNS`), each
    holding values as the sqlite3 module hands them back: ``int``, ``float``, ``str``,
    ``bytes`` or ``None``, never a subclass.

    Each column is checked at once, in loops that run in C (a join, an array, one
    ``orjson.loads`` per JSON text): the same checks :func:`event_from_row` makes of a
    row. Where any value of a column fails one, every row goes through
    :func:`event_from_row`, which names the problems of each."""
    events = sound_events(columns)
    if events is not None:
        return events
    return [event_from_row(r) for r in zip(*columns, strict=True)]


_JSON_OBJECT = frozenset({dict})
_ENCODINGS = frozenset({"json", "tagged"})
_FLAGS = frozenset({0, 1})


def _texts(column: Sequence[Any]) -> bool:
    """Whether every value is a ``str`` (``join`` refuses anything else the sqlite3
    module gives: a number, bytes, NULL)."""
    try:
        "".join(column)
    except TypeError:
        return False
    return True


def _ints(column: Sequence[Any]) -> bool:
    """Whether every value is an ``int``: their sum is one (a float makes it a float;
    text, bytes or NULL make ``sum`` fail; the sqlite3 module gives no bool)."""
    try:
        return type(sum(column)) is int
    except TypeError:
        return False


def _present(column: Sequence[Any]) -> Sequence[Any]:
    """The values of a nullable column that are not NULL."""
    nulls = column.count(None)
    if nulls == 0:
        return column
    if nulls == len(column):
        return ()
    return [v for v in column if v is not None]


def texts_or_nulls(column: Sequence[Any]) -> bool:
    """Whether every value (as the sqlite3 module gives them) is a ``str`` or ``None``."""
    return _texts(_present(column))


def ints_or_nulls(column: Sequence[Any]) -> bool:
    """Whether every value (as the sqlite3 module gives them) is an ``int`` or ``None``."""
    return _ints(_present(column))


def sound_events(columns: Sequence[Sequence[Any]]) -> list[Event] | None:
    """The events of columns (as :func:`events_from_columns` takes them) whose every
    value passes the checks of :data:`EVENT_COLUMNS`; ``None`` if any value does not."""
    if len(columns) != len(EVENT_COLUMNS):
        return None
    (run_id, seq, kind, name, key, parent, site, request, fingerprint, response,
     encoding, error, side_effect, started_at, duration_ns, metadata, chain_index,
     prev_hash, digest, version) = columns  # fmt: skip
    if not (
        _texts(run_id) and _ints(seq) and _texts(kind) and _texts(name)
        and _texts(_present(key)) and _ints(_present(parent)) and _texts(_present(site))
        and _texts(request) and _texts(fingerprint) and _texts(_present(response))
        and _ENCODINGS.issuperset(encoding) and _ints(side_effect)
        and _FLAGS.issuperset(side_effect) and _ints(duration_ns) and _texts(metadata)
        and _ints(chain_index) and _texts(prev_hash) and _texts(digest) and _ints(version)
    ):  # fmt: skip
        return None
    if version and not (min(version) >= 1 and max(version) <= _EVENT_MAX):
        return None
    try:
        # An infinity or NaN makes the sum one (as may an overflow: then the rows are
        # read one by one, which finds them all finite).
        if not math.isfinite(sum(started_at)):
            return None
    except TypeError:  # text, bytes or NULL
        return None
    errors = _present(error)
    if not _texts(errors):
        return None
    loads = orjson.loads
    try:
        deque(map(loads, request), maxlen=0)
        deque(map(loads, _present(response)), maxlen=0)
        meta = list(map(loads, metadata))
        if errors:
            kept = [e for e in errors if not e.startswith(REF_PREFIX)]
            if not _JSON_OBJECT.issuperset(map(type, map(loads, kept))):
                return None
    except orjson.JSONDecodeError:
        return None
    if not _JSON_OBJECT.issuperset(map(type, meta)):
        return None
    return list(
        map(
            Event, run_id, seq, kind, name, key, parent, site, request, fingerprint, response,
            encoding, error, map(bool, side_effect), map(float, started_at), duration_ns, meta,
            chain_index, prev_hash, digest, version,
        )
    )  # fmt: skip


def event_to_row(e: Event) -> tuple[Any, ...]:
    """An event's columns in field order, as :func:`event_from_row` reads them."""
    return (
        e.run_id,
        e.seq,
        e.kind,
        e.name,
        e.key,
        e.parent,
        e.call_site,
        e.request,
        e.fingerprint,
        e.response,
        e.encoding,
        e.error,
        int(e.side_effect),
        e.started_at,
        e.duration_ns,
        orjson.dumps(e.metadata, option=orjson.OPT_SORT_KEYS).decode(),
        e.chain_index,
        e.prev_hash,
        e.hash,
        e.schema_version,
    )
