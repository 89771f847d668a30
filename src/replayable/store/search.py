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
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

from replayable.errors import ConfigurationError
from replayable.events.model import Event, Run

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["EventQuery", "Predicate", "SearchHit", "SearchPage", "search_in_python"]

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


def search_in_python(store: EventStore, query: EventQuery) -> SearchPage:
    """The reference evaluation: list runs, read their events, filter in Python."""
    from replayable.store.base import RunFilter

    runs = store.list_runs(RunFilter(workflow=query.workflow, metadata=query.metadata, limit=None))
    hits: list[SearchHit] = []
    skipped = 0
    for run in runs:
        matching = [e for e in store.events(run.run_id) if query.matches_event(e)]
        if not matching:
            continue
        if skipped < query.offset:
            skipped += 1
            continue
        if len(hits) == query.limit:
            return SearchPage(hits, query.offset, query.offset + query.limit)
        hits.append(SearchHit(run, matching))
    return SearchPage(hits, query.offset, None)
