"""Capture: the boundary markers, the recording session and the background writer.

The names below are imported when first used: the writer process imports
``replayable.capture._child`` and needs none of the boundary markers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replayable.capture.boundaries import (
        asleep,
        llm,
        now,
        randint,
        random,
        sleep,
        span,
        tool,
        utcnow,
        uuid4,
        workflow,
        workflow_info,
    )
    from replayable.capture.config import configure, settings
    from replayable.capture.context import ContextThreadPoolExecutor, carry
    from replayable.capture.recording import Recording

_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "asleep",
            "llm",
            "now",
            "randint",
            "random",
            "sleep",
            "span",
            "tool",
            "utcnow",
            "uuid4",
            "workflow",
            "workflow_info",
        ),
        "replayable.capture.boundaries",
    ),
    "configure": "replayable.capture.config",
    "settings": "replayable.capture.config",
    "ContextThreadPoolExecutor": "replayable.capture.context",
    "carry": "replayable.capture.context",
    "Recording": "replayable.capture.recording",
}

__all__ = [
    "ContextThreadPoolExecutor",
    "Recording",
    "asleep",
    "carry",
    "configure",
    "llm",
    "now",
    "randint",
    "random",
    "settings",
    "sleep",
    "span",
    "tool",
    "utcnow",
    "uuid4",
    "workflow",
    "workflow_info",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'replayable.capture' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
