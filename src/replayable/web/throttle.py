"""Failed sign-ins slow the next ones down: per client address, and per address and name.

Each failure is logged. After ``FREE`` failures within ``WINDOW_S`` for one name from
one address (``FREE_PER_ADDRESS`` for an address over every name: many people may share
one), a further attempt waits ``BASE_S``, doubling with each failure after that up to
``MAX_S``, and is refused meanwhile without checking the password (a check costs an
argon2id hash, about 50 ms of CPU: unlimited guesses were also a cheap way to load the
server). A success clears its own name's count. Per address, never per name alone, so
that nobody can lock a person out of their account from elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["LoginThrottle"]

log = logging.getLogger("replayable.web")

FREE: Final = 5
FREE_PER_ADDRESS: Final = 20
WINDOW_S: Final = 900.0
BASE_S: Final = 30.0
MAX_S: Final = 900.0
#: Entries kept before those out of the window are dropped.
_PRUNE_AT: Final = 10_000


class LoginThrottle:
    """Failed sign-ins by client address and name, and how long the next must wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[tuple[str, ...], list[float]] = {}
        self._pruned_at = float("-inf")

    def _keys(self, address: str, name: str) -> tuple[tuple[tuple[str, ...], int], ...]:
        return (("name", address, name.lower()), FREE), (("address", address), FREE_PER_ADDRESS)

    def wait_s(self, address: str, name: str) -> float:
        """Seconds before a sign-in as ``name`` from ``address`` is checked again (0: now)."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for key, free in self._keys(address, name):
                times = self._recent(key, now)
                if len(times) >= free:
                    pause = min(MAX_S, BASE_S * 2 ** (len(times) - free))
                    wait = max(wait, times[-1] + pause - now)
        return wait

    def failed(self, address: str, name: str) -> None:
        now = self._clock()
        with self._lock:
            if len(self._failures) >= _PRUNE_AT and now - self._pruned_at >= 60.0:
                self._pruned_at = now
                # Addresses and names no one has failed as lately: a guesser rotating
                # them must not grow this without end.
                self._failures = {k: v for k, v in self._failures.items() if now - v[-1] < WINDOW_S}
            for key, _ in self._keys(address, name):
                self._failures[key] = [*self._recent(key, now), now]
        log.warning("replayable web: failed sign-in as %r from %s", name, address)

    def succeeded(self, address: str, name: str) -> None:
        with self._lock:
            self._failures.pop(("name", address, name.lower()), None)

    def _recent(self, key: tuple[str, ...], now: float) -> list[float]:
        """``key``'s failures within the window (an entry with none left is dropped; a
        check adds none, so asking about any name costs no memory)."""
        times = [t for t in self._failures.get(key, ()) if now - t < WINDOW_S]
        if times:
            self._failures[key] = times
        else:
            self._failures.pop(key, None)
        return times
