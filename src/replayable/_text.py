"""Two versions of a value, short enough to read side by side, the change kept in view."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["changed_pair"]


def changed_pair(
    old: Any,
    new: Any,
    short: Callable[[Any], str],
    *,
    width: int = 80,
    context: int = 30,
    limit: int = 160,
) -> tuple[str, str]:
    """Both sides of a changed value. Two strings longer than ``width`` are cut around
    the part that differs (``context`` characters either side, the changed part itself
    at most ``limit``), so the changed words show however long the shared beginning or
    end is; anything else is rendered by ``short``."""
    if not (isinstance(old, str) and isinstance(new, str)) or (
        len(repr(old)) <= width and len(repr(new)) <= width
    ):
        return short(old), short(new)
    prefix = 0
    most = min(len(old), len(new))
    while prefix < most and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < most - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    start = max(0, prefix - context)

    def cut(text: str) -> str:
        stop = min(len(text), len(text) - suffix + context)
        middle = text[start:stop]
        if len(middle) > limit:  # a long rewrite: its start and its end
            half = limit // 2
            middle = middle[:half] + "…" + middle[-half:]
        return ("…" if start else "") + repr(middle) + ("…" if stop < len(text) else "")

    return cut(old), cut(new)
