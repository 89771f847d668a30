"""Run metadata as it is stored: a JSON object, checked where a user gives it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from replayable.errors import ConfigurationError

__all__ = ["json_metadata"]

_INT64 = (-(2**63), 2**63 - 1)


def json_metadata(value: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """``value`` as the JSON object a run's metadata is stored as (tuples as lists), or
    :class:`ConfigurationError` naming the first key or value JSON has no exact form
    for: a key that is not text, a set or other object, NaN or an infinity, an integer
    outside 64 bits. Refused here, before a run starts, rather than by the store when
    the run's records reach it (then only a warning and the rejected spool say so)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{where} takes a mapping, not {type(value).__name__}")
    return _object(value, where, 0)


def _object(value: Mapping[Any, Any], where: str, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in value.items():
        if type(k) is not str:
            raise ConfigurationError(
                f"{where}: key {k!r} is {type(k).__name__}, not text (run metadata is JSON)"
            )
        out[k] = _value(v, f"{where}.{k}", depth + 1)
    return out


def _value(v: Any, where: str, depth: int) -> Any:
    if depth > 64:
        raise ConfigurationError(f"{where} is nested more than 64 levels deep")
    if v is None or isinstance(v, (str, bool)):
        return v
    if isinstance(v, int):
        if not _INT64[0] <= v <= _INT64[1]:
            raise ConfigurationError(
                f"{where} is an integer outside 64 bits ({str(v)[:20]}…); store it as text"
            )
        return int(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigurationError(f"{where} is {v!r}, which JSON cannot hold")
        return float(v)
    if isinstance(v, Mapping):
        return _object(v, where, depth)
    if isinstance(v, (list, tuple)):
        return [_value(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
    raise ConfigurationError(
        f"{where} is {type(v).__name__}, not a JSON value (text, number, true/false, null, "
        "a list or an object with text keys)"
    )
