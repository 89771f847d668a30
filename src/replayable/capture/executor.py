"""A thread pool whose tasks run in the submitter's recording context.

Apart from :mod:`replayable.capture.context` so that an agent that never makes one
does not import :mod:`concurrent.futures` (and :mod:`logging` with it) at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from replayable.capture.context import carry

__all__ = ["ContextThreadPoolExecutor"]

R = TypeVar("R")


class ContextThreadPoolExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose tasks run in the submitter's recording context."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        return super().submit(carry(fn), *args, **kwargs)
