"""Replay: tapes, matching, divergence."""

from replayable.replay.divergence import ActualCall, Divergence, FieldDiff
from replayable.replay.replayer import ReplayResult, replay
from replayable.replay.tape import Tape

__all__ = ["ActualCall", "Divergence", "FieldDiff", "ReplayResult", "Tape", "replay"]
