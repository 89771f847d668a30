"""``--override N=VALUE`` checked against what step N recorded, before a replay starts.

The agent's code reads an override exactly as it read the recorded value, so
a value of another shape fails inside the agent (``KeyError: 'status'``,
``'dict' object has no attribute 'choices'``) far from the option that caused
it. Here an override must have the recorded value's type, and for a mapping
at least its keys (more are fine); the first difference is reported with its
path and an example of what was recorded. An override of a recorded
dataclass or pydantic model gives its fields as JSON and is rebuilt as that
type, as the recorded value would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from replayable.cli.render import plain
from replayable.errors import ConfigurationError
from replayable.events.codec import TAG, decode_tree
from replayable.events.model import Event
from replayable.store import EventStore

__all__ = ["check_overrides", "shape_problem"]

#: Recorded types whose override is given as their fields and rebuilt.
_REBUILT: Final = ("pydantic", "dataclass")
_EXAMPLE_WIDTH: Final = 160


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def shape_problem(expected: Any, given: Any, path: str = "") -> str | None:
    """How ``given`` differs in shape from ``expected`` (None when it fits).

    Types must agree (any number for a number; anything where null was
    recorded); an object must have every recorded key; a list's first item
    must fit the recorded list's first item.
    """
    where = f" at {path}" if path else ""
    if expected is None:
        return None
    if _kind(expected) != _kind(given):
        return f"is {_kind(given)}{where}, where {_kind(expected)} was recorded"
    if isinstance(expected, dict):
        missing = [k for k in expected if k not in given]
        if missing:
            keys = ", ".join(repr(k) for k in missing[:5])
            return f"lacks the key{'s' if len(missing) > 1 else ''} {keys}{where}"
        for key, value in expected.items():
            problem = shape_problem(value, given[key], f"{path}.{key}" if path else key)
            if problem is not None:
                return problem
    if isinstance(expected, list) and expected and given:
        return shape_problem(expected[0], given[0], f"{path}[0]")
    return None


def _example(value: Any) -> str:
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= _EXAMPLE_WIDTH else text[: _EXAMPLE_WIDTH - 1] + "…"


def _checked(run_id: str, step: int, event: Event | None, value: Any, last: int) -> Any:
    if event is None:
        raise ConfigurationError(
            f"--override {step}: run {run_id} has no step {step} (its steps are 1 to {last})"
        )
    if event.error is not None or event.response is None:
        return value  # the step raised (or returned nothing): any value may stand in
    tree = orjson.loads(event.response)
    expected = plain(tree)
    problem = shape_problem(expected, value)
    if problem is not None:
        tagged = tree.get(TAG) if isinstance(tree, dict) else None
        what = f"a {tree.get('cls', tagged)}" if tagged else _kind(expected)
        raise ConfigurationError(
            f"--override {step}: step {step} ({event.kind} {event.name!r}) recorded {what}; "
            f"the override {problem}. Give a value of the same shape, such as the "
            f"recorded one: {_example(expected)}"
        )
    if isinstance(tree, dict) and tree.get(TAG) in _REBUILT and isinstance(value, dict):
        return decode_tree({**tree, "v": value})
    return value


def check_overrides(store: EventStore, run_id: str, overrides: Mapping[int, Any]) -> dict[int, Any]:
    """The overrides, each checked against the step it replaces (rebuilt as its type).

    Raises :class:`ConfigurationError` naming the step, what was recorded and
    what differs.
    """
    if not overrides:
        return dict(overrides)
    events = {e.seq: e for e in store.events(run_id)}
    last = max(events, default=0)
    return {
        step: _checked(run_id, step, events.get(step), value, last)
        for step, value in overrides.items()
    }
