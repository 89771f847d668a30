"""Capture: the boundary markers, the recording session and the background writer."""

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
