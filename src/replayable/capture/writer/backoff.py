"""How long the writer waits before it asks an unavailable store again."""

from __future__ import annotations

import time

__all__ = ["Backoff"]

MIN_DELAY, MAX_DELAY = 0.05, 2.0


class Backoff:
    """Doubling delays from 50 ms to 2 s between attempts; a success starts over."""

    __slots__ = ("delay", "next_try")

    def __init__(self) -> None:
        self.delay = MIN_DELAY
        self.next_try = 0.0

    def succeeded(self) -> None:
        self.delay = MIN_DELAY

    def failed(self) -> None:
        """Schedule the next attempt after the current delay, and lengthen it."""
        self.next_try = time.monotonic() + self.delay
        self._grow()

    def pause(self) -> None:
        """Sleep the current delay now (the writer thread's own errors), and lengthen it."""
        time.sleep(self.delay)
        self._grow()

    def due(self) -> bool:
        """Whether the next attempt may run now."""
        return time.monotonic() >= self.next_try

    def now(self) -> None:
        """Let the next attempt run at once (an explicit drain)."""
        self.next_try = 0.0

    def _grow(self) -> None:
        self.delay = min(self.delay * 2, MAX_DELAY)
