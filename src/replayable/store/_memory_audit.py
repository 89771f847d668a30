"""The in-memory store's audit records: lists and dicts, checked as a database would."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from replayable.errors import AppendOnlyError
from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag, WorkflowStats
from replayable.store.audit_base import STATS_WINDOW, stats_from

if TYPE_CHECKING:
    from replayable.events.model import Event, Run, RunEnd, RunStart

__all__ = ["MemoryAudit"]


class MemoryAudit:
    """Mixed into :class:`~replayable.store.MemoryStore`."""

    _lock: threading.RLock
    _starts: dict[str, RunStart]
    _ends: dict[str, RunEnd]
    _events: dict[str, dict[int, Event]]

    def _audit_init(self) -> None:
        self._annotations: dict[str, list[Annotation]] = {}
        self._annotation_ids: set[str] = set()
        self._access: list[AccessEntry] = []
        self._flags: list[AnomalyFlag] = []
        self._scanned: set[str] = set()

    def append_annotations(self, annotations: Sequence[Annotation]) -> None:
        with self._lock:
            taken: set[tuple[str, int]] = set()
            ids: set[str] = set()
            for a in annotations:
                chain = self._annotations.get(a.run_id, [])
                where = (a.run_id, a.chain_index)
                if a.chain_index < len(chain) or where in taken:
                    raise AppendOnlyError(
                        f"annotation position {a.chain_index} of run {a.run_id} is taken"
                    )
                if a.annotation_id in self._annotation_ids or a.annotation_id in ids:
                    raise AppendOnlyError(f"annotation {a.annotation_id} is already recorded")
                taken.add(where)
                ids.add(a.annotation_id)
            for a in annotations:
                self._annotations.setdefault(a.run_id, []).append(a)
                self._annotation_ids.add(a.annotation_id)

    def annotations(self, run_id: str) -> list[Annotation]:
        with self._lock:
            return sorted(self._annotations.get(run_id, []), key=lambda a: a.chain_index)

    def flag_closers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._lock:
            every = sorted(
                (a for chain in self._annotations.values() for a in chain),
                key=lambda a: (a.created_at, a.annotation_id),
            )
        for a in every:
            for flag_id in a.closes:
                out.setdefault(flag_id, a.annotation_id)
        return out

    def append_access(self, entries: Sequence[AccessEntry]) -> None:
        with self._lock:
            self._access.extend(entries)

    def access_entries(
        self,
        *,
        run_id: str | None = None,
        who: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[AccessEntry]:
        with self._lock:
            found = [
                e
                for e in self._access
                if (run_id is None or e.run_id == run_id)
                and (who is None or who in (e.login, e.user))
                and (since is None or e.at >= since)
            ]
        found.sort(key=lambda e: (e.at, e.entry_id))
        return found if limit is None else found[-limit:] if limit else []

    def append_flags(self, flags: Sequence[AnomalyFlag], scanned: Sequence[str]) -> None:
        with self._lock:
            again = [r for r in scanned if r in self._scanned]
            if again or len(set(scanned)) != len(scanned):
                raise AppendOnlyError(f"run {(again or list(scanned))[0]} was already scanned")
            self._flags.extend(flags)
            self._scanned.update(scanned)

    def flags(
        self,
        *,
        run_id: str | None = None,
        rule: str | None = None,
        since: float | None = None,
    ) -> list[AnomalyFlag]:
        with self._lock:
            return [
                f
                for f in self._flags
                if (run_id is None or f.run_id == run_id)
                and (rule is None or f.rule == rule)
                and (since is None or f.created_at >= since)
            ]

    def unscanned_runs(
        self,
        *,
        since: float | None = None,
        workflow: str | None = None,
        limit: int = 500,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        from replayable.events.model import Run

        with self._lock:
            runs = [
                Run(start=self._starts[r], end=end)
                for r, end in self._ends.items()
                if r not in self._scanned and r in self._starts
            ]
        runs = [
            r
            for r in runs
            if (since is None or r.started_at >= since)
            and (workflow is None or r.workflow == workflow)
            and (after is None or (r.started_at, r.run_id) > after)
        ]
        runs.sort(key=lambda r: (r.started_at, r.run_id))
        return runs[:limit]

    def events_of(self, run_ids: Sequence[str]) -> dict[str, list[Event]]:
        with self._lock:
            return {
                r: [by_seq[s] for s in sorted(by_seq)]
                for r in run_ids
                for by_seq in [dict(self._events.get(r, {}))]
            }

    def workflow_stats(self, workflows: Iterable[str]) -> dict[str, WorkflowStats]:
        wanted = set(workflows)
        per: dict[str, list[tuple[float, int, float]]] = {w: [] for w in wanted}
        with self._lock:
            for run_id, end in self._ends.items():
                start = self._starts.get(run_id)
                if start is None or start.workflow not in wanted:
                    continue
                llm = sum(1 for e in self._events.get(run_id, {}).values() if e.kind == "llm")
                per[start.workflow].append((end.ended_at, llm, end.ended_at - start.started_at))
        out = {}
        for workflow, rows in per.items():
            recent = sorted(rows, reverse=True)[:STATS_WINDOW]
            out[workflow] = stats_from(workflow, [(n, d) for _, n, d in recent])
        return out
