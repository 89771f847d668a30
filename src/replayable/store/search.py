"""Impact queries: find events across runs, and the runs they belong to.

An :class:`EventQuery` selects events by the run's workflow and metadata and
by the event's kind, name, time and JSON-path predicates on its request,
response, error or metadata. ``store.search(query)`` returns a
:class:`SearchPage` of runs (newest first), each with its matching steps.
Every backend answers the same query the same way; this module holds the
reference evaluation in Python, which the memory and SQLite stores use.

A predicate is written ``side.path op value``::

    response.rows empty
    request.jurisdiction ^= GB
    request.contract.pages >= 10
    response.status == "ok"

``side`` is ``request``, ``response``, ``error`` or ``metadata``; the path is
dot-separated (a number indexes a list). Operators: ``==``, ``!=``, ``^=``
(string starts with), ``~=`` (string contains), ``<``, ``<=``, ``>``, ``>=``
(numbers), and the words ``empty``, ``nonempty``, ``exists``, ``missing``.
A value is read as JSON when it parses (``3``, ``true``, ``[]``, ``"x"``),
else as a plain string.

The SQL backends share one query builder (:class:`SqlDialect`, :func:`event_filter`):
PostgreSQL over its JSONB columns, DuckDB over the JSON text of the Parquet archive.
Each predicate compiles to a condition that holds for *at least* every matching event,
and a second condition saying where the first one is exact. Where it is not (a payload
held in the blob tier, encrypted or not; a path step the dialect cannot express), the
event is a candidate that the backend checks in Python once its payload is read, with
:meth:`EventQuery.matches_event`, so every backend gives the reference's answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

import orjson

from replayable.errors import ConfigurationError
from replayable.events.model import Event, Run
from replayable.store.payloads import REF_PREFIX

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = [
    "DUCKDB",
    "POSTGRES",
    "EventFilter",
    "EventQuery",
    "Predicate",
    "SearchHit",
    "SearchPage",
    "SqlDialect",
    "SqlPredicate",
    "event_filter",
    "search_in_python",
]

Side = Literal["request", "response", "error", "metadata"]
Op = Literal[
    "eq",
    "ne",
    "prefix",
    "contains",
    "lt",
    "le",
    "gt",
    "ge",
    "empty",
    "nonempty",
    "exists",
    "missing",
]

SIDES: Final = ("request", "response", "error", "metadata")
_SYMBOLS: Final[dict[str, Op]] = {
    "==": "eq",
    "!=": "ne",
    "^=": "prefix",
    "~=": "contains",
    "<=": "le",
    ">=": "ge",
    "<": "lt",
    ">": "gt",
}
_WORDS: Final[dict[str, Op]] = {
    "empty": "empty",
    "nonempty": "nonempty",
    "exists": "exists",
    "missing": "missing",
}
_UNARY: Final = frozenset(_WORDS.values())
_PATTERN: Final = re.compile(
    r"^\s*(?P<side>[a-z]+)(?:\.(?P<path>[^\s=!^~<>]+))?"
    r"(?:\s*(?P<sym>==|!=|\^=|~=|<=|>=|<|>)\s*(?P<value>.*?)|\s+(?P<word>[a-z]+))\s*$"
)
_EMPTY: Final[tuple[Any, ...]] = ([], {}, "", None)


@dataclass(frozen=True, slots=True)
class Predicate:
    """A condition on one JSON value inside an event's request, response, error or metadata."""

    side: Side
    path: tuple[str, ...]
    op: Op
    value: Any = None

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ConfigurationError(
                f"predicate side {self.side!r} is not one of {', '.join(SIDES)}"
            )
        if any(not p for p in self.path):
            raise ConfigurationError(f"predicate path {'.'.join(self.path)!r} has an empty part")
        if self.op in ("prefix", "contains") and not isinstance(self.value, str):
            raise ConfigurationError(f"operator {self.op} needs a string, got {self.value!r}")
        if self.op in ("lt", "le", "gt", "ge") and not _is_number(self.value):
            raise ConfigurationError(f"operator {self.op} needs a number, got {self.value!r}")

    @classmethod
    def parse(cls, text: str) -> Predicate:
        """Read ``side.path op value`` (see the module docstring)."""
        m = _PATTERN.match(text)
        if m is None:
            raise ConfigurationError(
                f"cannot read predicate {text!r}; write side.path op value, "
                "e.g. 'response.rows empty' or 'request.jurisdiction ^= GB'"
            )
        side = m["side"]
        if side not in SIDES:
            raise ConfigurationError(
                f"predicate {text!r}: {side!r} is not one of {', '.join(SIDES)}"
            )
        # A bare side ('response empty') tests the whole value.
        path = tuple(m["path"].split(".")) if m["path"] else ()
        if m["word"] is not None:
            op = _WORDS.get(m["word"])
            if op is None:
                raise ConfigurationError(
                    f"predicate {text!r}: unknown operator {m['word']!r}; expected one of "
                    f"{', '.join([*_SYMBOLS, *_WORDS])}"
                )
            return cls(side, path, op)  # type: ignore[arg-type]
        op = _SYMBOLS[m["sym"]]
        raw = m["value"]
        if raw == "":
            raise ConfigurationError(f"predicate {text!r} has no value after {m['sym']}")
        value: Any
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        if op in ("prefix", "contains") and not isinstance(value, str):
            value = raw
        return cls(side, path, op, value)  # type: ignore[arg-type]

    def __str__(self) -> str:
        where = ".".join((self.side, *self.path))
        if self.op in _UNARY:
            return f"{where} {self.op}"
        symbol = next(s for s, o in _SYMBOLS.items() if o == self.op)
        return f"{where} {symbol} {orjson.dumps(self.value).decode()}"

    def matches(self, event: Event) -> bool:
        """Whether ``event`` satisfies this predicate."""
        if self.side == "request":
            tree: Any = orjson.loads(event.request)
        elif self.side == "response":
            if event.response is None:
                return self.op in ("missing", "ne")
            tree = orjson.loads(event.response)
        elif self.side == "error":
            if event.error is None:
                return self.op in ("missing", "ne")
            tree = orjson.loads(event.error)
        else:
            tree = event.metadata
        found, value = _resolve(tree, self.path)
        return _test(self.op, found, value, self.value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _resolve(tree: Any, path: Sequence[str]) -> tuple[bool, Any]:
    node = tree
    for part in path:
        if isinstance(node, dict):
            if part not in node:
                return False, None
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(node) <= index < len(node):
                return False, None
            node = node[index]
        else:
            return False, None
    return True, node


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1 (as PostgreSQL's jsonb compares)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _test(op: Op, found: bool, value: Any, expected: Any) -> bool:
    if op == "exists":
        return found
    if op == "missing":
        return not found
    if op == "ne":
        return not (found and json_equal(value, expected))
    if not found:
        return False
    if op == "eq":
        return json_equal(value, expected)
    if op == "empty":
        return any(json_equal(value, e) for e in _EMPTY)
    if op == "nonempty":
        return not any(json_equal(value, e) for e in _EMPTY)
    if op == "prefix":
        return isinstance(value, str) and value.startswith(expected)
    if op == "contains":
        return isinstance(value, str) and expected in value
    if not _is_number(value):
        return False
    if op == "lt":
        return bool(value < expected)
    if op == "le":
        return bool(value <= expected)
    if op == "gt":
        return bool(value > expected)
    return bool(value >= expected)


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Which events to find. Every given condition must hold for an event to match.

    ``workflow`` and ``metadata`` (key=value, compared as ``list_runs`` does)
    apply to the event's run; ``kind``, ``name``, ``since``/``until`` (the
    event's start time, both ends included) and ``where`` to the event.
    ``limit`` runs per page, skipping ``offset`` runs.
    """

    workflow: str | None = None
    kind: str | None = None
    name: str | None = None
    since: float | None = None
    until: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    where: tuple[Predicate, ...] = ()
    limit: int = 50
    offset: int = 0
    #: Search the payloads of archived runs whose hot copies were dropped too, fetching
    #: them from the archive (slow: a run at a time). Without it a query that tests
    #: payloads leaves those runs out and counts them in ``SearchPage.archived_skipped``.
    include_archived: bool = False

    @property
    def tests_payloads(self) -> bool:
        """Whether a predicate looks into requests or responses (what archiving moves)."""
        return any(p.side in ("request", "response") for p in self.where)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ConfigurationError(f"search limit must be at least 1, got {self.limit}")
        if self.offset < 0:
            raise ConfigurationError(f"search offset must not be negative, got {self.offset}")
        if not isinstance(self.where, tuple):
            object.__setattr__(self, "where", tuple(self.where))

    def matches_event(self, event: Event) -> bool:
        """Whether ``event`` passes the event-level conditions (not workflow or metadata)."""
        if self.kind is not None and event.kind != self.kind:
            return False
        if self.name is not None and event.name != self.name:
            return False
        if self.since is not None and event.started_at < self.since:
            return False
        if self.until is not None and event.started_at > self.until:
            return False
        return all(p.matches(event) for p in self.where)

    def page(self, offset: int) -> EventQuery:
        """The same query at another offset."""
        return EventQuery(
            workflow=self.workflow,
            kind=self.kind,
            name=self.name,
            since=self.since,
            until=self.until,
            metadata=dict(self.metadata),
            where=self.where,
            limit=self.limit,
            offset=offset,
            include_archived=self.include_archived,
        )


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A run with the steps that matched, ordered by seq."""

    run: Run
    events: list[Event]

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of results; ``next_offset`` is ``None`` on the last page."""

    hits: list[SearchHit]
    offset: int
    next_offset: int | None
    #: Archived runs meeting the query's run conditions whose payloads were not searched
    #: (the query tests payloads and ``include_archived`` was not set): never a silent gap.
    archived_skipped: int = 0


def search_in_python(store: EventStore, query: EventQuery) -> SearchPage:
    """The reference evaluation: list runs, read their events, filter in Python."""
    from replayable.store.base import RunFilter

    runs = store.list_runs(RunFilter(workflow=query.workflow, metadata=query.metadata, limit=None))
    left_out = set()
    if query.tests_payloads and not query.include_archived:
        dropped = store.dropped_ids()
        left_out = {r.run_id for r in runs if r.run_id in dropped}
    hits: list[SearchHit] = []
    skipped = 0
    for run in runs:
        if run.run_id in left_out:
            continue
        matching = [e for e in store.events(run.run_id) if query.matches_event(e)]
        if not matching:
            continue
        if skipped < query.offset:
            skipped += 1
            continue
        if len(hits) == query.limit:
            return SearchPage(hits, query.offset, query.offset + query.limit, len(left_out))
        hits.append(SearchHit(run, matching))
    return SearchPage(hits, query.offset, None, len(left_out))


# -- the SQL query builder -------------------------------------------------------------


class SqlPredicate(NamedTuple):
    """One predicate in SQL: ``where`` holds for every event the predicate matches (and
    maybe more); ``certain`` holds where ``where`` is exactly the predicate."""

    where: str
    params: list[Any]
    certain: str
    certain_params: list[Any]


_EXACT: Final = 1 << 53  # integers beyond this are not all doubles


class SqlDialect:
    """How one SQL engine spells the event columns and JSON tests of a query.

    ``columns`` names the SQL expression for ``kind``, ``name``, ``started_at``, the
    four predicate sides and the payload references (``request_ref``,
    ``response_ref``, and ``error_ref`` for an error record the tier keeps); ``ph`` is
    the driver's placeholder.
    """

    name: str = ""
    ph: str = "?"

    def __init__(self, columns: Mapping[str, str]) -> None:
        self.columns = dict(columns)

    def json_test(self, p: Predicate) -> SqlPredicate:  # pragma: no cover - abstract
        raise NotImplementedError

    def predicate(self, p: Predicate) -> SqlPredicate:
        """``p`` in SQL, a payload held in the blob tier making its event a candidate."""
        test = self.json_test(p)
        ref = self.columns.get(f"{p.side}_ref")
        if ref is None:
            return test
        return SqlPredicate(
            f"({ref} IS NOT NULL OR {test.where})",
            test.params,
            f"({ref} IS NULL AND {test.certain})",
            test.certain_params,
        )


class _Postgres(SqlDialect):
    """JSONB: ``#>`` walks a path (a number indexes a list, as in Python), and jsonb
    equality is JSON equality, so every test is exact."""

    name = "postgresql"
    ph = "%s"

    def json_test(self, p: Predicate) -> SqlPredicate:
        sql, params = self.compile(p)
        return SqlPredicate(sql, params, "TRUE", [])

    def compile(self, p: Predicate) -> tuple[str, list[Any]]:
        col = self.columns[p.side]
        path = list(p.path)
        at = f"({col} #> %s::text[])"
        text_at = f"({col} #>> %s::text[])"
        empty = "ARRAY['[]', '{}', '\"\"', 'null']::jsonb[]"
        if p.op == "exists":
            return f"{at} IS NOT NULL", [path]
        if p.op == "missing":
            return f"{at} IS NULL", [path]
        if p.op == "eq":
            return f"{at} = %s::jsonb", [path, orjson.dumps(p.value).decode()]
        if p.op == "ne":
            return f"{at} IS DISTINCT FROM %s::jsonb", [path, orjson.dumps(p.value).decode()]
        if p.op == "empty":
            return f"{at} = ANY({empty})", [path]
        if p.op == "nonempty":
            return f"({at} IS NOT NULL AND NOT {at} = ANY({empty}))", [path, path]
        if p.op == "prefix":
            return (
                f"(jsonb_typeof({at}) = 'string' AND starts_with({text_at}, %s))",
                [path, path, p.value],
            )
        if p.op == "contains":
            return (
                f"(jsonb_typeof({at}) = 'string' AND strpos({text_at}, %s) > 0)",
                [path, path, p.value],
            )
        number = f"(CASE WHEN jsonb_typeof({at}) = 'number' THEN {text_at}::numeric END)"
        return f"{number} {_COMPARE[p.op]} %s::numeric", [path, path, p.value]


_COMPARE: Final = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_RELAXED: Final = {"lt": "<=", "le": "<=", "gt": ">=", "ge": ">="}


def json_pointer(path: Sequence[str]) -> str:
    """RFC 6901: ``/a/0`` (a number indexes a list and names a key of an object, as the
    reference evaluation reads a path)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in path)


class _DuckDB(SqlDialect):
    """JSON text, tested with DuckDB's JSON functions and JSON Pointer paths. Numbers
    compare as doubles: exact for a value below 2**53, candidates checked in Python for
    one above it; a
    negative list index or a nested value to compare with is checked in Python too.
    A payload that is not JSON at all matches no predicate (the reader names it)."""

    name = "duckdb"
    ph = "?"

    def json_test(self, p: Predicate) -> SqlPredicate:
        col = self.columns[p.side]
        if any(part.startswith("-") and part[1:].isdigit() for part in p.path):
            # Python reads -1 as the last element; a JSON Pointer does not.
            return SqlPredicate("TRUE", [], "FALSE", [])
        ptr = json_pointer(p.path)
        kind = f"json_type({col}, ?)"
        text = f"json_extract_string({col}, ?)"
        number = (
            f"(CASE WHEN {kind} IN ('BIGINT', 'UBIGINT', 'HUGEINT', 'DOUBLE') "
            f"THEN TRY_CAST({text} AS DOUBLE) END)"
        )

        def guard(sql: str) -> str:
            # An unparseable payload would stop the whole query: it matches nothing here.
            return f"(CASE WHEN json_valid({col}) THEN {sql} END)"

        if p.op == "exists":
            return SqlPredicate(guard(f"{kind} IS NOT NULL"), [ptr], "TRUE", [])
        if p.op == "missing":
            return SqlPredicate(f"({col} IS NULL OR {guard(f'{kind} IS NULL')})", [ptr], "TRUE", [])
        if p.op in ("empty", "nonempty"):
            empty = (
                f"({kind} = 'NULL' OR ({kind} = 'VARCHAR' AND {text} = '') "
                f"OR ({kind} = 'ARRAY' AND json_array_length({col}, ?) = 0) "
                f"OR ({kind} = 'OBJECT' AND len(json_keys({col}, ?)) = 0))"
            )
            params = [ptr] * 7
            if p.op == "empty":
                return SqlPredicate(guard(empty), params, "TRUE", [])
            return SqlPredicate(
                guard(f"({kind} IS NOT NULL AND NOT {empty})"), [ptr, *params], "TRUE", []
            )
        if p.op == "prefix":
            return SqlPredicate(
                guard(f"({kind} = 'VARCHAR' AND starts_with({text}, ?))"),
                [ptr, ptr, p.value],
                "TRUE",
                [],
            )
        if p.op == "contains":
            return SqlPredicate(
                guard(f"({kind} = 'VARCHAR' AND strpos({text}, ?) > 0)"),
                [ptr, ptr, p.value],
                "TRUE",
                [],
            )
        if p.op in _COMPARE:
            # A value below 2**53 is a double exactly, and so is its order against any
            # stored number. Past it, rounding may merge neighbours: the relaxed
            # comparison keeps every match, and Python decides.
            if abs(p.value) < _EXACT:
                return SqlPredicate(
                    guard(f"({number} {_COMPARE[p.op]} ?)"), [ptr, ptr, float(p.value)], "TRUE", []
                )
            return SqlPredicate(
                guard(f"({number} {_RELAXED[p.op]} ?)"), [ptr, ptr, float(p.value)], "FALSE", []
            )
        eq, eq_params, eq_certain, eq_cparams = self._equals(col, kind, text, number, ptr, p.value)
        if p.op == "eq":
            return SqlPredicate(guard(eq), eq_params, eq_certain, eq_cparams)
        # ne: every event but the certain matches of eq; certain where eq is.
        return SqlPredicate(
            f"NOT coalesce({guard(eq)} AND {eq_certain}, FALSE)",
            [*eq_params, *eq_cparams],
            f"coalesce({eq_certain} OR NOT {guard(eq)}, TRUE)",
            [*eq_cparams, *eq_params],
        )

    @staticmethod
    def _equals(
        col: str, kind: str, text: str, number: str, ptr: str, value: Any
    ) -> tuple[str, list[Any], str, list[Any]]:
        if value is None:
            return f"({kind} = 'NULL')", [ptr], "TRUE", []
        if isinstance(value, bool):
            return (
                f"({kind} = 'BOOLEAN' AND {text} = ?)",
                [ptr, ptr, "true" if value else "false"],
                "TRUE",
                [],
            )
        if isinstance(value, str):
            return f"({kind} = 'VARCHAR' AND {text} = ?)", [ptr, ptr, value], "TRUE", []
        if _is_number(value):
            sure = "TRUE" if abs(value) < _EXACT else "FALSE"
            return f"({number} = ?)", [ptr, ptr, float(value)], sure, []
        if value == [] or value == {}:
            shape = "ARRAY" if isinstance(value, list) else "OBJECT"
            size = "json_array_length" if shape == "ARRAY" else "len(json_keys"
            close = ")" if shape == "ARRAY" else "))"
            return f"({kind} = '{shape}' AND {size}({col}, ?{close} = 0)", [ptr, ptr], "TRUE", []
        shape = "ARRAY" if isinstance(value, list) else "OBJECT"
        return f"({kind} = '{shape}')", [ptr], "FALSE", []


#: PostgreSQL's ``agent_execution_events`` as ``e``.
POSTGRES: Final = _Postgres(
    {
        "kind": "e.event_type",
        "name": "e.name",
        "started_at": "e.timestamp_utc",
        "request": "e.input_payload",
        "response": "e.output_payload",
        # An error the tier keeps (encrypted) is not JSON in its column: such an event
        # is a candidate, tested once its error is read back.
        "error": f"(CASE WHEN starts_with(e.error_text, '{REF_PREFIX}') THEN NULL "
        "ELSE e.error_text::jsonb END)",
        "metadata": "e.metadata",
        "request_ref": "e.request_ref",
        "response_ref": "e.response_ref",
        "error_ref": f"(CASE WHEN starts_with(e.error_text, '{REF_PREFIX}') THEN e.error_text END)",
    }
)
#: The archive's event files (the stored-row columns) as ``e``.
DUCKDB: Final = _DuckDB(
    {
        "kind": "e.kind",
        "name": "e.name",
        "started_at": "e.started_at",
        "request": "e.request",
        "response": "e.response",
        "error": "e.error",
        "metadata": "e.metadata",
        "request_ref": "e.request_ref",
        "response_ref": "e.response_ref",
        "error_ref": f"(CASE WHEN starts_with(e.error, '{REF_PREFIX}') THEN e.error END)",
    }
)


class EventFilter(NamedTuple):
    """An :class:`EventQuery`'s event conditions in one dialect: ``where`` selects the
    candidate events, ``certain`` says which of them surely match."""

    where: str
    params: list[Any]
    certain: str
    certain_params: list[Any]


def event_filter(query: EventQuery, dialect: SqlDialect) -> EventFilter:
    """The kind, name, time and payload conditions of ``query`` (run conditions are the
    caller's: where runs live differs per backend)."""
    cols, ph = dialect.columns, dialect.ph
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("kind", query.kind), ("name", query.name)):
        if value is not None:
            where.append(f"{cols[column]} = {ph}")
            params.append(value)
    if query.since is not None:
        where.append(f"{cols['started_at']} >= {ph}")
        params.append(query.since)
    if query.until is not None:
        where.append(f"{cols['started_at']} <= {ph}")
        params.append(query.until)
    certain: list[str] = []
    certain_params: list[Any] = []
    for predicate in query.where:
        sql = dialect.predicate(predicate)
        where.append(sql.where)
        params.extend(sql.params)
        if sql.certain != "TRUE":
            certain.append(sql.certain)
            certain_params.extend(sql.certain_params)
    return EventFilter(
        " AND ".join(where) or "TRUE",
        params,
        " AND ".join(certain) or "TRUE",
        certain_params,
    )
