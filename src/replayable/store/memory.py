"""The in-memory store: a real backend that passes the same contract as SQLite."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import ClassVar

from replayable.errors import AppendOnlyError, RunNotFoundError
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store._memory_audit import MemoryAudit
from replayable.store.base import EventStore, RunFilter

__all__ = ["MemoryStore"]


class MemoryStore(MemoryAudit, EventStore):
    """Keeps everything in dicts; ``memory://name`` stores of one name are shared in a process."""

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._starts: dict[str, RunStart] = {}
        self._ends: dict[str, RunEnd] = {}
        self._events: dict[str, dict[int, Event]] = {}
        self._blobs: dict[str, bytes] = {}
        self._audit_init()

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """The process-wide store called ``name`` (``memory://name``)."""
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(f"memory://{name}")
            return store

    def append(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
    ) -> None:
        with self._lock:
            # Check the whole batch first, against the store and against itself
            # (as a database's unique keys do), so that a refused batch writes nothing.
            new_starts: set[str] = set()
            for s in starts:
                if s.run_id in self._starts or s.run_id in new_starts:
                    raise AppendOnlyError(f"run {s.run_id} already has a start record")
                new_starts.add(s.run_id)
            new_events: set[tuple[str, int]] = set()
            for e in events:
                if e.seq in self._events.get(e.run_id, {}) or (e.run_id, e.seq) in new_events:
                    raise AppendOnlyError(f"event {e.run_id}#{e.seq} is already recorded")
                new_events.add((e.run_id, e.seq))
            new_ends: set[str] = set()
            for end in ends:
                if end.run_id in self._ends or end.run_id in new_ends:
                    raise AppendOnlyError(f"run {end.run_id} already has an end record")
                new_ends.add(end.run_id)
            for s in starts:
                self._starts[s.run_id] = s
            for e in events:
                self._events.setdefault(e.run_id, {})[e.seq] = e
            for end in ends:
                self._ends[end.run_id] = end

    def put_blob(self, digest: str, data: bytes) -> None:
        with self._lock:
            self._blobs.setdefault(digest, data)

    def get_blob(self, digest: str) -> bytes | None:
        return self._blobs.get(digest)

    def get_run(self, run_id: str) -> Run:
        start = self._starts.get(run_id)
        if start is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.url}")
        return Run(start=start, end=self._ends.get(run_id))

    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        with self._lock:
            ids = [r for r in self._starts if r.startswith(prefix)]
        return sorted(ids)[:limit]

    def list_runs(self, filter: RunFilter | None = None) -> list[Run]:
        f = filter or RunFilter()
        with self._lock:
            runs = [Run(start=s, end=self._ends.get(r)) for r, s in self._starts.items()]
        runs = [r for r in runs if f.matches(r)]
        runs.sort(key=lambda r: (r.started_at, r.run_id), reverse=True)
        return runs if f.limit is None else runs[: f.limit]

    def events(self, run_id: str) -> list[Event]:
        with self._lock:
            by_seq = dict(self._events.get(run_id, {}))
        return [by_seq[s] for s in sorted(by_seq)]

    def event_at(self, run_id: str, seq: int) -> Event | None:
        with self._lock:
            return self._events.get(run_id, {}).get(seq)

    def event_run_ids(self) -> set[str]:
        with self._lock:
            return {r for r, events in self._events.items() if events}

    def iter_run_ids(self) -> Iterator[str]:
        with self._lock:
            ids = sorted(self._starts, key=lambda r: (self._starts[r].started_at, r))
        return iter(ids)
