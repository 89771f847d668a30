"""Reading option values the CLI accepts as text: times, ``key=value`` pairs, statuses."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterable
from typing import Any, Final, cast

from replayable.errors import ConfigurationError
from replayable.events.model import RunStatus

__all__ = ["parse_meta", "parse_status", "parse_when"]

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_RELATIVE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_STATUSES: Final = ("completed", "failed", "incomplete")


def parse_when(text: str | None, option: str, *, now: float | None = None) -> float | None:
    """Epoch seconds for ``2h``/``3d``/``45m`` ago, or an ISO date or date-time.

    A date-time without a zone is local time; a bare date means its midnight.
    """
    if text is None:
        return None
    match = _RELATIVE.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2).lower()
        return (time.time() if now is None else now) - amount * _UNITS[unit]
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{option} {text!r} is not a time; use an ISO date such as 2025-06-30, "
            "a date-time such as 2025-06-30T14:00, or an age such as 2h or 3d"
        ) from None
    return moment.timestamp()


def parse_meta(pairs: Iterable[str]) -> dict[str, Any]:
    """``key=value`` options as a dict; the value is compared as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--meta {pair!r} is not key=value")
        out[key.strip()] = value
    return out


def parse_status(text: str | None) -> RunStatus | None:
    """One of ``completed``, ``failed``, ``incomplete``."""
    if text is None:
        return None
    value = text.strip().lower()
    if value not in _STATUSES:
        raise ConfigurationError(f"--status {text!r} is not one of {', '.join(_STATUSES)}")
    return cast(RunStatus, value)
