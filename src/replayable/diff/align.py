"""Line two event sequences up so inserted, removed and changed steps face each other."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Literal

from replayable.events.model import Event

__all__ = ["Op", "align"]

Op = tuple[Literal["equal", "replace", "insert", "delete"], int, int, int, int]


def _tokens(events: Sequence[Event]) -> list[tuple[str, str]]:
    return [(e.kind, e.name) for e in events]


def align(left: Sequence[Event], right: Sequence[Event]) -> list[tuple[Event | None, Event | None]]:
    """Pairs of events, in order; ``None`` on one side marks an inserted or removed step.

    Identical calls (kind, name and request fingerprint) anchor the alignment;
    between anchors, steps are matched by kind and name, then by position.
    The common prefix and suffix are matched first, so a replay or a fork
    of a long run costs time in proportion to what differs.
    """
    n, m = len(left), len(right)
    start = 0
    while start < n and start < m and _same_call(left[start], right[start]):
        start += 1
    end = 0
    while end < n - start and end < m - start and _same_call(left[n - 1 - end], right[m - 1 - end]):
        end += 1
    pairs: list[tuple[Event | None, Event | None]] = [(left[i], right[i]) for i in range(start)]
    mid_l, mid_r = left[start : n - end], right[start : m - end]
    pairs.extend(_align_middle(mid_l, mid_r))
    pairs.extend((left[n - end + i], right[m - end + i]) for i in range(end))
    return pairs


def _same_call(a: Event, b: Event) -> bool:
    return a.kind == b.kind and a.name == b.name and a.fingerprint == b.fingerprint


def _align_middle(
    left: Sequence[Event], right: Sequence[Event]
) -> list[tuple[Event | None, Event | None]]:
    """Anchor on identical calls first, then pair what lies between by kind and name."""
    if not left or not right:
        return [(e, None) for e in left] + [(None, e) for e in right]
    exact = difflib.SequenceMatcher(None, _calls(left), _calls(right), autojunk=False)
    out: list[tuple[Event | None, Event | None]] = []
    for tag, i1, i2, j1, j2 in exact.get_opcodes():
        if tag == "equal":
            out.extend(zip(left[i1:i2], right[j1:j2], strict=True))
        else:
            out.extend(_align_by_name(left[i1:i2], right[j1:j2]))
    return out


def _calls(events: Sequence[Event]) -> list[tuple[str, str, str]]:
    return [(e.kind, e.name, e.fingerprint) for e in events]


def _align_by_name(
    left: Sequence[Event], right: Sequence[Event]
) -> list[tuple[Event | None, Event | None]]:
    if not left or not right:
        return [(e, None) for e in left] + [(None, e) for e in right]
    if len(left) == len(right) and _tokens(left) == _tokens(right):
        return list(zip(left, right, strict=True))
    matcher = difflib.SequenceMatcher(None, _tokens(left), _tokens(right), autojunk=False)
    out: list[tuple[Event | None, Event | None]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(zip(left[i1:i2], right[j1:j2], strict=True))
        elif tag == "replace":
            # Different calls in the same place: side by side, the surplus on
            # either side as removed or inserted.
            k = min(i2 - i1, j2 - j1)
            out.extend(zip(left[i1 : i1 + k], right[j1 : j1 + k], strict=True))
            out.extend((e, None) for e in left[i1 + k : i2])
            out.extend((None, e) for e in right[j1 + k : j2])
        elif tag == "delete":
            out.extend((e, None) for e in left[i1:i2])
        else:
            out.extend((None, e) for e in right[j1:j2])
    return out
