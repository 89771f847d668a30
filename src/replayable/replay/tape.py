"""A run's recorded events, indexed by causal position for replay."""

from __future__ import annotations

from collections.abc import Iterable

from replayable.events.model import Event

__all__ = ["Tape"]


class Tape:
    """Events by causal key; tracks which have been served."""

    __slots__ = ("_by_key", "_pending", "events")

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.events: list[Event] = []
        self._by_key: dict[str, Event] = {}
        self._pending: set[int] = set()
        self.extend(events)

    def extend(self, events: Iterable[Event]) -> None:
        """Add events not already on the tape (a prefix loaded first, the rest later)."""
        known = {e.seq for e in self.events}
        added = [e for e in events if e.seq not in known]
        if not added:
            return
        self.events = sorted([*self.events, *added], key=lambda e: e.seq)
        for e in added:
            if e.key is not None:
                self._by_key[e.key] = e
                self._pending.add(e.seq)

    def at(self, key: str) -> Event | None:
        """The recorded event at causal position ``key``, served or not."""
        return self._by_key.get(key)

    def served(self, event: Event) -> bool:
        return event.seq not in self._pending

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

    def find(self, kind: str, name: str, fingerprint: str) -> Event | None:
        """The first unserved event with exactly this request, wherever it sits."""
        for e in self.events:
            if (
                e.seq in self._pending
                and e.fingerprint == fingerprint
                and e.kind == kind
                and e.name == name
            ):
                return e
        return None

    def find_name(self, kind: str, name: str) -> Event | None:
        """The first unserved event with this kind and name."""
        for e in self.events:
            if e.seq in self._pending and e.kind == kind and e.name == name:
                return e
        return None

    def nearest(self, kind: str, name: str) -> Event | None:
        """The first unserved event with this kind and name, else the first unserved one."""
        fallback = None
        for e in self.events:
            if e.seq in self._pending:
                if e.kind == kind and e.name == name:
                    return e
                fallback = fallback or e
        return fallback

    def by_seq(self, seq: int) -> Event | None:
        for e in self.events:
            if e.seq == seq:
                return e
        return None
