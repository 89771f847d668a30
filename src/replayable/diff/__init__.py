"""Run diff: align two runs' events and name the first meaningful divergence."""

from replayable.diff.align import align
from replayable.diff.compare import Comparer, FieldChange
from replayable.diff.result import FirstDivergence, RunDiff, StepPair, diff

__all__ = ["Comparer", "FieldChange", "FirstDivergence", "RunDiff", "StepPair", "align", "diff"]
