"""Decision policies that come with replayable, built from parameters.

- :func:`only_allowed_tools`: the agent called only tools on a list.
- :func:`argument_limits`: a tool's arguments stay within bounds (amounts, dates).
- :func:`confirmation_before`: every call of a side-effect tool follows its own
  confirmation call.
- :func:`no_decision_on_empty_result`: after a lookup answered nothing, no
  decision was taken (a side-effect call, or what ``decided`` says of the output).

Each returns a :class:`~replayable.audit.policies.Policy` whose fingerprint
covers the parameters too, so "refunds up to 500" and "up to 1,000" are two
versions of the rule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from replayable.audit.policies import Call, Policy, PolicyRun, Violation, code_fingerprint

__all__ = [
    "argument_limits",
    "confirmation_before",
    "no_decision_on_empty_result",
    "only_allowed_tools",
]


def only_allowed_tools(*allowed: str, name: str = "only_allowed_tools") -> Policy:
    """Every tool the run called is one of ``allowed``."""
    permitted = frozenset(allowed)

    def check(run: PolicyRun) -> Violation | None:
        bad = [c for c in run.tools() if c.name not in permitted]
        if bad:
            names = ", ".join(sorted({c.name for c in bad}))
            return run.violation(f"called tools outside the allowed list: {names}", *bad)
        return None

    return Policy(name, check, params={"allowed": sorted(permitted)})


def _comparable(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value[:10]) if len(value) >= 10 else value
        except ValueError:
            return value
    if isinstance(value, dt.datetime):
        return value.date()
    return value


def argument_limits(tool: str, *, name: str | None = None, **limits: tuple[Any, Any]) -> Policy:
    """Each call of ``tool`` has every named argument within ``(low, high)`` (inclusive;
    ``None`` leaves a side open). Dates may be ``date`` objects or ISO text::

        argument_limits("refund", amount=(0, 500))
        argument_limits("book_flight", date=("2026-01-01", "2026-12-31"))
    """
    for arg, bounds in limits.items():
        if not (isinstance(bounds, tuple) and len(bounds) == 2):
            raise ValueError(f"argument_limits({tool!r}): {arg}= must be a (low, high) tuple")

    def check(run: PolicyRun) -> Violation | None:
        for call in run.calls(tool):
            args = call.args if isinstance(call.args, dict) else {}
            for arg, (low, high) in limits.items():
                if arg not in args:
                    return run.violation(f"{tool} was called without {arg}", call)
                value = _comparable(args[arg])
                try:
                    below = low is not None and value < _comparable(low)
                    above = high is not None and value > _comparable(high)
                except TypeError:
                    return run.violation(f"{tool} {arg}={args[arg]!r} cannot be compared", call)
                if below or above:
                    return run.violation(
                        f"{tool} {arg}={args[arg]!r} is outside [{low}, {high}]", call
                    )
        return None

    return Policy(
        name or f"{tool}_argument_limits",
        check,
        params={"tool": tool, "limits": {k: [str(v) for v in b] for k, b in limits.items()}},
    )


def confirmation_before(
    action: str, confirm: str, *, name: str | None = None, confirmed: str | None = None
) -> Policy:
    """Every call of ``action`` comes after a call of ``confirm`` of its own (one
    confirmation is used up by one action). With ``confirmed``, the confirmation's
    result must be truthy, or hold that key truthy (``{"approved": true}``)."""

    def granted(c: Call) -> bool:
        if c.error is not None:
            return False
        if confirmed is None:
            return True
        result = c.result
        return bool(result.get(confirmed)) if isinstance(result, dict) else bool(result)

    def check(run: PolicyRun) -> Violation | None:
        pending: list[Call] = []
        for c in run.calls():
            if c.name == confirm and granted(c):
                pending.append(c)
            elif c.name == action:
                if not pending:
                    return run.violation(f"{action} was called without a {confirm} first", c)
                pending.pop(0)
        return None

    return Policy(
        name or f"confirm_before_{action}",
        check,
        params={"action": action, "confirm": confirm, "confirmed": confirmed},
    )


def no_decision_on_empty_result(
    lookup: str,
    *,
    decided: Callable[[PolicyRun, Call], Call | bool | None] | None = None,
    name: str | None = None,
) -> Policy:
    """After a call of ``lookup`` answered nothing (an empty list, dict, text or
    ``None``), the run took no decision: no side-effect call followed, or, with
    ``decided(run, empty_call)``, that function found none (it returns the deciding
    call, ``True``, or a falsy value)."""

    def check(run: PolicyRun) -> Violation | None:
        for empty in run.calls(lookup):
            if not empty.empty:
                continue
            if decided is not None:
                found = decided(run, empty)
                if found:
                    steps = (empty, found) if isinstance(found, Call) else (empty,)
                    return run.violation(
                        f"decided after {lookup} answered nothing at step {empty.seq}", *steps
                    )
                continue
            later = next((c for c in run.calls() if c.seq > empty.seq and c.side_effect), None)
            if later is not None:
                return run.violation(
                    f"{later.name} acted after {lookup} answered nothing at step {empty.seq}",
                    empty,
                    later,
                )
        return None

    return Policy(
        name or f"no_decision_on_empty_{lookup}",
        check,
        params={
            "lookup": lookup,
            "decided": None if decided is None else code_fingerprint(decided, {}),
        },
    )
