"""``replayable.diff(a, b)``: two runs aligned step by step, and where they first part."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from replayable._text import changed_pair
from replayable.diff.align import align
from replayable.diff.compare import RANK_ORDER, Comparer, FieldChange
from replayable.diff.context import describe_change, run_context_changes, step_context_changes
from replayable.events.model import Event, Run
from replayable.store import EventStore, open_store

__all__ = ["FirstDivergence", "RunDiff", "StepPair", "diff"]

PairStatus = Literal["same", "changed", "different_call", "inserted", "removed"]


def _tree(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


@dataclass(frozen=True)
class StepPair:
    """One aligned position: the step on each side (or ``None``) and what differs."""

    status: PairStatus
    left: Event | None
    right: Event | None
    changes: tuple[FieldChange, ...] = ()

    @property
    def rank(self) -> str | None:
        """The most important rank among the changes (``structural`` for a whole step)."""
        if self.status in ("inserted", "removed", "different_call"):
            return "structural"
        if not self.changes:
            return None
        return min((c.rank for c in self.changes), key=RANK_ORDER.__getitem__)

    @property
    def meaningful(self) -> bool:
        return self.rank in ("structural", "significant", "text")

    def to_dict(self) -> dict[str, Any]:
        def side(e: Event | None) -> dict[str, Any] | None:
            return None if e is None else {"step": e.seq, "kind": e.kind, "name": e.name}

        return {
            "status": self.status,
            "rank": self.rank,
            "left": side(self.left),
            "right": side(self.right),
            "changes": [c.to_dict() for c in self.changes],
        }


@dataclass(frozen=True)
class FirstDivergence:
    """Where two runs first part ways in a way that matters."""

    left_step: int | None
    right_step: int | None
    kind: str
    name: str
    status: PairStatus
    field: str | None
    old: Any
    new: Any
    rank: str
    #: A sentence for a decision-context change ("document 17 changed from v2 to v3").
    note: str | None = None

    def describe(self) -> str:
        steps = f"step {self.left_step or '—'} ↔ {self.right_step or '—'}"
        if self.note is not None:
            return f"{steps}: {self.kind} {self.name}: {self.note}"
        if self.status == "inserted":
            return f"{steps}: {self.kind} {self.name} only in the second run"
        if self.status == "removed":
            return f"{steps}: {self.kind} {self.name} only in the first run"
        if self.status == "different_call":
            return f"{steps}: different calls ({self.old} vs {self.new})"
        old, new = changed_pair(self.old, self.new, _short, width=60)
        what = f"{self.kind} {self.name}: {self.field}"
        return f"{steps}: {what} changed from {old} to {new} ({self.rank})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "left_step": self.left_step,
            "right_step": self.right_step,
            "kind": self.kind,
            "name": self.name,
            "status": self.status,
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "rank": self.rank,
            "note": self.note,
            "description": self.describe(),
        }


def _short(value: Any, limit: int = 60) -> str:
    text = orjson.dumps(value, default=repr).decode() if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class RunDiff:
    """Two runs side by side: aligned pairs, output changes and the first divergence."""

    left: Run
    right: Run
    pairs: list[StepPair]
    output_changes: list[FieldChange] = field(default_factory=list)
    first: FirstDivergence | None = None

    @property
    def identical(self) -> bool:
        """No meaningful difference anywhere (noise aside)."""
        return self.first is None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pairs:
            out[p.status] = out.get(p.status, 0) + 1
        return out

    def to_dict(self, all_pairs: bool = True) -> dict[str, Any]:
        pairs = self.pairs if all_pairs else [p for p in self.pairs if p.status != "same"]
        return {
            "left": {
                "run_id": self.left.run_id,
                "workflow": self.left.workflow,
                "status": self.left.status,
            },
            "right": {
                "run_id": self.right.run_id,
                "workflow": self.right.workflow,
                "status": self.right.status,
            },
            "identical": self.identical,
            "first_divergence": self.first.to_dict() if self.first else None,
            "counts": self.counts(),
            "output_changes": [c.to_dict() for c in self.output_changes],
            "pairs": [p.to_dict() for p in pairs],
        }


_new = object.__new__


def _step_pair(
    status: PairStatus, left: Event, right: Event, changes: tuple[FieldChange, ...] = ()
) -> StepPair:
    """``StepPair(status, left, right, changes)`` at half the cost, for the pairs of two
    long runs (see :func:`replayable.diff.compare.field_change`)."""
    pair = _new(StepPair)
    fields = pair.__dict__
    fields["status"] = status
    fields["left"] = left
    fields["right"] = right
    fields["changes"] = changes
    return pair


def _pair(comparer: Comparer, a: Event | None, b: Event | None) -> StepPair:
    if a is None:
        return StepPair("inserted", None, b)
    if b is None:
        return StepPair("removed", a, None)
    if a.kind != b.kind or a.name != b.name:
        return StepPair("different_call", a, b)
    # The decision context first: where it changed, it says why the payloads did. Equal
    # metadata holds no context change (an adapter's result aside, which is compared as
    # values: True and 1 are equal metadata but a changed result).
    meta = a.metadata
    changes: list[FieldChange] = (
        []
        if meta == b.metadata and "normalized" not in meta
        else step_context_changes(comparer, a, b)
    )
    if a.fingerprint != b.fingerprint:
        changes += comparer.compare_text("request", a.request, b.request)
    if a.response != b.response:
        changes += comparer.compare_text("response", a.response, b.response, kind=a.kind)
    if a.error != b.error:
        changes += comparer.compare_text("error", a.error, b.error)
    if not changes:
        return _step_pair("same", a, b)
    if len(changes) == 1:
        return _step_pair("changed", a, b, (changes[0],))
    ordered = tuple(sorted(changes, key=lambda c: RANK_ORDER[c.rank]))
    return _step_pair("changed", a, b, ordered)


def _first(
    pairs: list[StepPair], output: list[FieldChange], left: Run, right: Run
) -> FirstDivergence | None:
    for level in (("structural", "significant"), ("text",)):
        # The run's context holds before its first step.
        for c in output:
            if c.side == "context" and c.rank in level:
                return FirstDivergence(
                    None, None, "run", "context", "changed", c.where, c.old, c.new, c.rank,
                    describe_change(c),
                )  # fmt: skip
        for p in pairs:
            if p.rank not in level:
                continue
            ev = p.left or p.right
            assert ev is not None
            if p.status == "different_call":
                assert p.left is not None
                assert p.right is not None
                return FirstDivergence(
                    p.left.seq,
                    p.right.seq,
                    ev.kind,
                    ev.name,
                    p.status,
                    None,
                    f"{p.left.kind} {p.left.name}",
                    f"{p.right.kind} {p.right.name}",
                    "structural",
                )
            if p.status in ("inserted", "removed"):
                return FirstDivergence(
                    p.left.seq if p.left else None,
                    p.right.seq if p.right else None,
                    ev.kind,
                    ev.name,
                    p.status,
                    None,
                    None,
                    None,
                    "structural",
                )
            change = next(c for c in p.changes if c.rank in level)
            return FirstDivergence(
                p.left.seq if p.left else None,
                p.right.seq if p.right else None,
                ev.kind,
                ev.name,
                p.status,
                change.where,
                change.old,
                change.new,
                change.rank,
                describe_change(change),
            )
        for c in output:
            if c.rank in level:
                return FirstDivergence(
                    None, None, "run", "output", "changed", c.where, c.old, c.new, c.rank
                )
    return None


def diff(
    a: str | Run,
    b: str | Run,
    *,
    store: EventStore | str | None = None,
    ignore: Iterable[str] = (),
    significant: Iterable[str] = (),
) -> RunDiff:
    """Align two runs (ids or prefixes) and compare them step by step.

    Works for an original and its replay, an original and a fork, or any two
    runs of one workflow. ``ignore`` and ``significant`` take dotted path
    patterns (``response.*.id``, ``request.amount``) that refine the defaults.
    """
    st = open_store(store)
    left = a if isinstance(a, Run) else st.run(a)
    right = b if isinstance(b, Run) else st.run(b)
    comparer = Comparer(ignore, significant)
    pairs = [
        _pair(comparer, x, y) for x, y in align(st.events(left.run_id), st.events(right.run_id))
    ]
    # A run's context (flags, configuration, permissions) comes before its outcome.
    outcome: list[FieldChange] = run_context_changes(comparer, left, right)
    le, re_ = left.end, right.end
    if (le is None) != (re_ is None):
        outcome.append(FieldChange("run", "status", left.status, right.status, "structural"))
    elif le is not None and re_ is not None:
        if le.status != re_.status:
            outcome.append(FieldChange("run", "status", le.status, re_.status, "structural"))
        outcome += comparer.compare("output", _tree(le.output), _tree(re_.output))
        outcome += comparer.compare("error", _tree(le.error), _tree(re_.error))
    return RunDiff(left, right, pairs, outcome, _first(pairs, outcome, left, right))
