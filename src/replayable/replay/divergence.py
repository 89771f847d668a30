"""Divergence: where a replay parted from its tape, as data and as a readable message."""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
import orjson

from replayable._text import changed_pair
from replayable.events.model import Event

__all__ = ["ActualCall", "Divergence", "DivergenceReason", "FieldDiff", "field_diff"]

DivergenceReason = Literal[
    "unexpected_call",
    "request_changed",
    "tape_exhausted",
    "calls_not_asked",
    "output_changed",
    "side_effect_blocked",
    "unrecorded_io",
    "unreadable_record",
]

_MISSING = "<missing>"
_TOOL_PATH = re.compile(r"(?:^|\.)tools\[(\d+)\]")


class FieldDiff(msgspec.Struct, frozen=True):
    """One field that differs: its path, the recorded value and the new one."""

    path: str
    expected: Any
    actual: Any


class ActualCall(msgspec.Struct, frozen=True, kw_only=True):
    """The call the replayed code made."""

    kind: str
    name: str
    key: str | None
    request: Any
    fingerprint: str
    call_site: str | None
    #: The first frame of the agent's own code above the call, when ``call_site`` is
    #: inside a library (an SDK, a framework): the line to look at.
    user_site: str | None = None


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """A structured replay failure: what was asked, what the tape held, which fields differ."""

    reason: DivergenceReason
    run_id: str
    step: int | None
    expected: Event | None = None
    actual: ActualCall | None = None
    diff: list[FieldDiff] = []
    nearest: Event | None = None
    unasked: list[int] = []
    call_site: str | None = None
    #: ``nearest`` holds exactly the request asked, recorded at another causal
    #: position: the same call, asked from a different task or order.
    same_request: bool = False

    @property
    def message(self) -> str:
        """A vcrpy-style explanation, several lines long."""
        lines = [self._headline()]
        if self.actual is not None:
            lines.append(
                f"  asked:    {self.actual.kind} {self.actual.name}({_short(self.actual.request)})"
            )
            site = _site(self.actual.user_site, self.actual.call_site)
            if site:
                lines.append(f"  at:       {site}")
        shown = self.expected or self.nearest
        if shown is not None:
            label = "recorded" if self.expected is not None else "nearest"
            if self.same_request:
                label = "recorded"
            lines.append(
                f"  {label}: step {shown.seq}: {shown.kind} {shown.name}"
                f"({_short(shown.request_value())})"
            )
            if shown.call_site and self.actual is None:
                lines.append(f"  at:       {shown.call_site}")
        if self.diff:
            lines.append("  fields that differ:")
            for d in self.diff[:10]:
                old, new = changed_pair(d.expected, d.actual, _short)
                lines.append(f"    {d.path or '(value)'}: recorded {old}, now {new}")
            if len(self.diff) > 10:
                lines.append(f"    … and {len(self.diff) - 10} more")
        for tool in self.changed_tools:
            lines.append(f"  the schema of tool {tool} changed")
        if self.unasked:
            seqs = ", ".join(str(s) for s in self.unasked[:10])
            lines.append(
                f"  recorded steps never asked: {seqs}" + (" …" if len(self.unasked) > 10 else "")
            )
        return "\n".join(lines)

    @property
    def changed_tools(self) -> list[str]:
        """The tools offered to the model whose definition differs, by name (a model call
        whose field diff reaches into its ``tools``)."""
        names = self.expected.metadata.get("tools") if self.expected is not None else None
        if not isinstance(names, list):
            return []
        out: list[str] = []
        for d in self.diff:
            m = _TOOL_PATH.search(d.path)
            if m is not None and int(m.group(1)) < len(names):
                name = str(names[int(m.group(1))])
                if name not in out:
                    out.append(name)
        return out

    def _headline(self) -> str:
        at = f"step {self.step}" if self.step is not None else "the end of the run"
        if self.reason == "request_changed":
            return f"replay diverged at {at}: the request changed"
        if self.reason == "unexpected_call":
            if self.same_request and self.nearest is not None and self.actual is not None:
                return (
                    f"replay diverged at {at}: the same call, asked from a different task "
                    f"position (recorded at {self.nearest.key}, asked at {self.actual.key})"
                )
            if self.expected is not None:
                return (
                    f"replay diverged at {at}: the code called "
                    f"{self.actual.kind + ' ' + self.actual.name if self.actual else '?'} "
                    f"where the recording has {self.expected.kind} {self.expected.name}"
                )
            return f"replay diverged at {at}: a call the recording does not hold"
        if self.reason == "tape_exhausted":
            return f"replay diverged at {at}: the recording has no more events"
        if self.reason == "side_effect_blocked":
            return (
                f"replay stopped at {at}: side effect blocked — "
                f"{self.actual.name if self.actual else 'a tool'} would change the world "
                "with a request the recording does not hold (name it in allow_live to run it)"
            )
        if self.reason == "unrecorded_io":
            where = self.actual.name if self.actual else "the network"
            return (
                f"replay stopped at {at}: the code opened a connection to {where} that the "
                "recording does not hold; nothing reaches the network in a pure replay "
                "(record the call through a boundary, or pass allow_network=True)"
            )
        if self.reason == "calls_not_asked":
            return f"replay diverged at {at}: recorded calls were never asked for"
        if self.reason == "unreadable_record":
            bad = self.expected
            what = "; ".join(bad.problems) if bad is not None else "it cannot be read"
            return (
                f"replay stopped at {at}: the recorded event is unreadable ({what}); "
                "`replayable verify` names what else is wrong with the run"
            )
        return "replay diverged: the run's output differs from the recorded output"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the divergence."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return self.message


def _short(value: Any, limit: int = 80) -> str:
    if isinstance(value, dict) and set(value) <= {"args", "kwargs"} and not value.get("args"):
        value = value.get("kwargs", {})
    if isinstance(value, dict):
        text = ", ".join(f"{k}={_short(v, 30)}" for k, v in value.items())
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = orjson.dumps(value, default=repr).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _site(user: str | None, library: str | None) -> str | None:
    """``user`` with the library frame beside it, or whichever of the two is known."""
    if user and library and user != library:
        return f"{user}  (in {library})"
    return user or library


def field_diff(expected: Any, actual: Any, path: str = "") -> list[FieldDiff]:
    """Leaf-level differences between two JSON trees, with dotted paths."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[FieldDiff] = []
        for k in sorted(set(expected) | set(actual), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in actual:
                out.append(FieldDiff(sub, expected[k], _MISSING))
            elif k not in expected:
                out.append(FieldDiff(sub, _MISSING, actual[k]))
            else:
                out.extend(field_diff(expected[k], actual[k], sub))
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        out = []
        for i in range(max(len(expected), len(actual))):
            sub = f"{path}[{i}]"
            if i >= len(actual):
                out.append(FieldDiff(sub, expected[i], _MISSING))
            elif i >= len(expected):
                out.append(FieldDiff(sub, _MISSING, actual[i]))
            else:
                out.extend(field_diff(expected[i], actual[i], sub))
        return out
    if type(expected) is not type(actual) or expected != actual:
        return [FieldDiff(path, expected, actual)]
    return []
