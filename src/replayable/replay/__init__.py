"""Replay: tapes, matching, divergence, and every replay mode."""

from replayable.replay.api import load_entrypoint, replay
from replayable.replay.divergence import ActualCall, Divergence, FieldDiff
from replayable.replay.frames import FrameInfo, PausePoint
from replayable.replay.session import ReplayResult
from replayable.replay.tape import Tape

__all__ = [
    "ActualCall",
    "Divergence",
    "FieldDiff",
    "FrameInfo",
    "PausePoint",
    "ReplayResult",
    "Tape",
    "load_entrypoint",
    "replay",
]
