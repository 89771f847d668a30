"""What the SQLite and PostgreSQL audit tables share: rows, column lists and filters.

A row holds an audit record's fields in the order the record declares them;
tuple and dict fields travel as JSON text. The backends differ only in a few
column names (PostgreSQL suffixes its JSON text columns ``_text`` and keeps run
ids as UUID) and in their placeholders, which the callers pass in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, TypeVar

import msgspec
import orjson

from replayable.errors import UnreadableRecordError
from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag
from replayable.store.rows import UndecodableText

__all__ = [
    "CLOSERS_SQL",
    "access_where",
    "closers",
    "columns",
    "flag_where",
    "from_row",
    "to_row",
    "unscanned_where",
    "where_sql",
]

Record = TypeVar("Record", Annotation, AccessEntry, AnomalyFlag)

#: Fields kept as JSON text, per record type; those read back as tuples.
_JSON: Final[dict[type, tuple[str, ...]]] = {
    Annotation: ("closes",),
    AccessEntry: ("steps", "what"),
    AnomalyFlag: ("steps", "evidence"),
}
_TUPLES: Final = frozenset({"closes", "steps", "what"})
#: A field whose column is named otherwise (``user`` is a reserved word in SQL).
_RENAMED: Final = {"user": "app_user"}


def columns(
    kind: type[Annotation] | type[AccessEntry] | type[AnomalyFlag],
    *,
    json_suffix: str = "",
    run_id: str = "run_id",
) -> str:
    """The column list of ``kind``'s table in field order: JSON columns named with
    ``json_suffix``, the run id column read as ``run_id`` (e.g. ``run_id::text``)."""
    names = []
    for f in kind.__struct_fields__:
        name = _RENAMED.get(f, f)
        if f in _JSON[kind]:
            name += json_suffix
        elif f == "run_id":
            name = run_id
        names.append(name)
    return ", ".join(names)


def to_row(record: Annotation | AccessEntry | AnomalyFlag) -> tuple[Any, ...]:
    """The record's column values in :func:`columns` order."""
    as_json = _JSON[type(record)]
    return tuple(
        orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode() if f in as_json else v
        for f, v in zip(record.__struct_fields__, msgspec.structs.astuple(record), strict=True)
    )


def _named(kind: type[Record], row: Sequence[Any]) -> str:
    """The stored record a row holds, as a reader's error names it (kind and id)."""
    return f"stored {kind.__name__} {row[0]!r:.60}"


def from_row(kind: type[Record], row: Sequence[Any]) -> Record:
    """A record from a row in :func:`columns` order (SQLite's 0/1 read as booleans)."""
    values = dict(zip(kind.__struct_fields__, row, strict=True))
    for f, v in values.items():
        if type(v) is UndecodableText:
            raise UnreadableRecordError(
                f"{_named(kind, row)}: column {f} is not valid UTF-8 ({bytes(v)!r:.60})"
            )
    for f in _JSON[kind]:
        try:
            value = orjson.loads(values[f])
        except orjson.JSONDecodeError as exc:
            raise UnreadableRecordError(
                f"{_named(kind, row)}: column {f} is not valid JSON ({exc})"
            ) from None
        values[f] = tuple(value) if f in _TUPLES else value
    if kind is Annotation:
        values["retract"] = bool(values["retract"])
    return kind(**values)


#: The annotations that close flags, oldest first (``{closes}``: the JSON column).
CLOSERS_SQL: Final = (
    "SELECT annotation_id, {closes} FROM annotations WHERE {closes} <> '[]' "
    "ORDER BY created_at, annotation_id"
)


def closers(rows: Iterable[Sequence[Any]]) -> dict[str, str]:
    """Flag id -> the first annotation closing it, from :data:`CLOSERS_SQL` rows."""
    out: dict[str, str] = {}
    for annotation_id, text in rows:
        for flag_id in orjson.loads(text):
            out.setdefault(flag_id, annotation_id)
    return out


def where_sql(where: Sequence[str]) -> str:
    """`` WHERE a AND b`` (or nothing)."""
    return " WHERE " + " AND ".join(where) if where else ""


def _filters(ph: str, *conditions: tuple[str, Any]) -> tuple[list[str], list[Any]]:
    # Each condition whose value is given, with that value for each of its placeholders.
    where: list[str] = []
    params: list[Any] = []
    for template, value in conditions:
        if value is not None:
            where.append(template.format(ph=ph))
            params.extend([value] * template.count("{ph}"))
    return where, params


def access_where(
    run_id: str | None, who: str | None, since: float | None, ph: str
) -> tuple[list[str], list[Any]]:
    """Conditions and parameters of an access-log read (``ph``: the placeholder)."""
    return _filters(
        ph,
        ("run_id = {ph}", run_id),
        ("(login = {ph} OR app_user = {ph})", who),
        ("at >= {ph}", since),
    )


def flag_where(
    run_id: str | None, rule: str | None, since: float | None, ph: str
) -> tuple[list[str], list[Any]]:
    """Conditions and parameters of an anomaly-flag read."""
    return _filters(
        ph, ("run_id = {ph}", run_id), ("rule = {ph}", rule), ("created_at >= {ph}", since)
    )


def unscanned_where(
    since: float | None, workflow: str | None, ph: str
) -> tuple[list[str], list[Any]]:
    """Conditions and parameters choosing runs (``r``) no scan has marked; the caller
    adds how far a scan got, in its dialect."""
    where, params = _filters(ph, ("r.started_at >= {ph}", since), ("r.workflow = {ph}", workflow))
    where.insert(0, "NOT EXISTS (SELECT 1 FROM anomaly_scanned s WHERE s.run_id = r.run_id)")
    return where, params
