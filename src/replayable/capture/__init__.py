"""Capture: the boundary markers, the recording session and the background writer.

The names below are imported when first used: the writer process imports
``replayable.capture.writer._child`` and needs none of the boundary markers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayable._lazy import lazy

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
    from replayable.capture.context import carry
    from replayable.capture.executor import ContextThreadPoolExecutor
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
    "ContextThreadPoolExecutor": "replayable.capture.executor",
    "carry": "replayable.capture.context",
    "Recording": "replayable.capture.recording",
    **dict.fromkeys(("prompt", "retrieval", "snapshot"), "replayable.capture.decisions"),
}

__all__ = [
    "ContextThreadPoolExecutor",
    "Recording",
    "asleep",
    "carry",
    "configure",
    "llm",
    "now",
    "prompt",
    "randint",
    "random",
    "retrieval",
    "settings",
    "sleep",
    "snapshot",
    "span",
    "tool",
    "utcnow",
    "uuid4",
    "workflow",
    "workflow_info",
]


__getattr__, __dir__ = lazy(__name__, _LAZY)
