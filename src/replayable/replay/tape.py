"""A run's recorded events, indexed by causal position for replay."""

from __future__ import annotations

from collections.abc import Iterable

from replayable.events.model import Event

__all__ = ["Tape"]


class Tape:
    """Events by causal key; tracks which have been served."""

    __slots__ = ("_by_key", "_pending", "events")

    def __init__(self, events: Iterable[Event]) -> None:
        self.events = sorted(events, key=lambda e: e.seq)
        self._by_key = {e.key: e for e in self.events if e.key is not None}
        self._pending = {e.seq for e in self.events if e.key is not None}

    def at(self, key: str) -> Event | None:
        """The recorded event at causal position ``key``, served or not."""
        return self._by_key.get(key)

    def take(self, event: Event) -> bool:
        """Mark ``event`` served; ``False`` if it already was."""
        if event.seq in self._pending:
            self._pending.discard(event.seq)
            return True
        return False

    def unasked(self) -> list[Event]:
        """Recorded calls not served yet, in seq order."""
        return [e for e in self.events if e.seq in self._pending]

    def remaining(self) -> int:
        return len(self._pending)

    def nearest(self, kind: str, name: str) -> Event | None:
        """The first unserved event with this kind and name, else the first unserved one."""
        fallback = None
        for e in self.events:
            if e.seq in self._pending:
                if e.kind == kind and e.name == name:
                    return e
                fallback = fallback or e
        return fallback
