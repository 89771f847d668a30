"""The anomaly scan: every finished run not yet scanned, through every enabled rule.

Incremental by construction: a run's scan mark is stored in the same
transaction as its flags, so a scan picks up exactly the finished runs no
scan has marked (a run that ends later, or arrives late from a spool, is
still found), and two scans never flag a run twice. Workflow statistics
come from the store (SQL aggregates on SQLite and PostgreSQL), once per
workflow per scan. Per batch, the store's run summaries (counted in the
database on PostgreSQL) let each rule's screen pass over the runs it cannot
flag, and only the other runs' events are read.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replayable.audit import rules as _rules
from replayable.audit.annotations import new_id
from replayable.audit.rules import AnomalyConfig, Rule, RuleContext, find_rule
from replayable.errors import AppendOnlyError
from replayable.events.audit import AnomalyFlag, WorkflowStats
from replayable.events.model import Run
from replayable.store.audit_base import RunSummary
from replayable.store.base import EventStore

__all__ = ["QueueItem", "ScanResult", "Scanner", "anomaly_queue"]

#: Batches of runs listed per look-up of the unscanned runs.
_PAGE = 20


@dataclass
class ScanResult:
    """What one scan did: runs scanned, flags stored, time taken, rules that failed."""

    runs: int = 0
    flags: list[AnomalyFlag] = field(default_factory=list)
    seconds: float = 0.0
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # run, rule, message
    skipped: int = 0  # runs another scan marked first

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else 0.0


class Scanner:
    """Scans ``store`` with the registered rules (or the ``rules`` named).

    >>> result = Scanner(store).scan(since=time.time() - 30 * 86400)
    >>> [f.run_id for f in result.flags if f.rule == "empty_data_decision"]
    """

    def __init__(
        self,
        store: EventStore,
        *,
        rules: Iterable[str] | None = None,
        config: AnomalyConfig | None = None,
        batch: int = 500,
    ) -> None:
        self.store = store
        self.rules: list[Rule] = (
            list(_rules.registry.values()) if rules is None else [find_rule(r) for r in rules]
        )
        self.config = config or AnomalyConfig()
        self.batch = batch
        self._stats: dict[str, WorkflowStats] = {}

    def scan(
        self,
        *,
        since: float | None = None,
        workflow: str | None = None,
        limit: int | None = None,
        on_batch: Callable[[ScanResult], None] | None = None,
    ) -> ScanResult:
        """Scan every finished, unscanned run started at or after ``since`` (of
        ``workflow`` only, if given; at most ``limit`` runs); store and return the flags."""
        result = ScanResult()
        began = time.perf_counter()
        self._stats = {}
        after: tuple[float, str] | None = None
        while limit is None or result.runs + result.skipped < limit:
            # Runs come a page of several batches at a time (finding the unscanned runs
            # costs a pass over the scan marks); events and flags go a batch at a time.
            size = self.batch * _PAGE
            if limit is not None:
                size = min(size, limit - result.runs - result.skipped)
            page = self.store.unscanned_runs(
                since=since, workflow=workflow, limit=size, after=after
            )
            if not page:
                break
            after = (page[-1].started_at, page[-1].run_id)
            for lo in range(0, len(page), self.batch):
                runs = page[lo : lo + self.batch]
                flags = self._check(runs, result)
                try:
                    self.store.append_flags(flags, [r.run_id for r in runs])
                except AppendOnlyError:
                    # Another scan marked some of these first; it owns their flags.
                    result.skipped += len(runs)
                    continue
                result.runs += len(runs)
                result.flags.extend(flags)
                if on_batch is not None:
                    on_batch(result)
            if len(page) < size:
                break
        result.seconds = time.perf_counter() - began
        return result

    def follow(
        self,
        *,
        interval: float = 5.0,
        since: float | None = None,
        workflow: str | None = None,
        on_result: Callable[[ScanResult], None] | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Scan again every ``interval`` seconds until ``stop()`` is true."""
        while not stop():
            result = self.scan(since=since, workflow=workflow)
            if on_result is not None:
                on_result(result)
            deadline = time.monotonic() + interval
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.2, interval))

    def _check(self, runs: Sequence[Run], result: ScanResult) -> list[AnomalyFlag]:
        missing = {r.workflow for r in runs} - set(self._stats)
        if missing:
            self._stats.update(self.store.workflow_stats(missing))
        # Which rules are left to look at each run: the rules' screens answer from the
        # run summaries counted in the store, and only the runs some rule still looks
        # at have their events read.
        screened = any(r.screen is not None for r in self.rules)
        summaries = self.store.run_summaries([r.run_id for r in runs]) if screened else {}
        todo: dict[str, list[tuple[Rule, dict[str, Any]]]] = {}
        for run in runs:
            ctx = RuleContext(run, [], self._stats.get(run.workflow))
            left = todo[run.run_id] = []
            for r in self.rules:
                params = self.config.params(r, run.workflow)
                if not params.get("enabled", True):
                    continue
                ctx.params = params
                if r.screen is None or self._screen(r, ctx, summaries[run.run_id], result):
                    left.append((r, params))
        events = self.store.events_of([r.run_id for r in runs if todo[r.run_id]])
        now = time.time()
        flags: list[AnomalyFlag] = []
        for run in runs:
            if not todo[run.run_id]:
                continue
            ctx = RuleContext(run, events.get(run.run_id, []), self._stats.get(run.workflow))
            for r, params in todo[run.run_id]:
                ctx.params = params
                try:
                    findings = r.run(ctx)
                except Exception as exc:  # a rule must not stop the scan: report and go on
                    self._failed(result, run, r, exc)
                    continue
                for f in findings:
                    flags.append(
                        AnomalyFlag(
                            flag_id=new_id(now),
                            rule=r.name,
                            run_id=run.run_id,
                            workflow=run.workflow,
                            steps=tuple(f.steps),
                            evidence=dict(f.evidence),
                            score=float(f.score),
                            created_at=now,
                            tenant=run.start.tenant,
                        )
                    )
        return flags

    def _screen(self, r: Rule, ctx: RuleContext, summary: RunSummary, result: ScanResult) -> bool:
        assert r.screen is not None
        try:
            return bool(r.screen(ctx, summary))
        except Exception as exc:  # let the rule itself look, and fail where it fails
            self._failed(result, ctx.run, r, exc, "screen")
            return True

    @staticmethod
    def _failed(result: ScanResult, run: Run, r: Rule, exc: Exception, part: str = "") -> None:
        message = f"{type(exc).__name__}: {exc}"
        result.errors.append((run.run_id, r.name, message))
        where = f"anomaly rule {r.name}" + (f" ({part})" if part else "")
        warnings.warn(
            f"{where} failed on run {run.run_id}: {message}", RuntimeWarning, stacklevel=3
        )


@dataclass(frozen=True, slots=True)
class QueueItem:
    """A flag in the anomaly queue and the annotation that closed it, if any."""

    flag: AnomalyFlag
    closed_by: str | None

    @property
    def open(self) -> bool:
        return self.closed_by is None


def anomaly_queue(
    store: EventStore,
    *,
    open_only: bool = False,
    rule: str | None = None,
    run_id: str | None = None,
) -> list[QueueItem]:
    """The stored flags, highest score first, each with the annotation closing it."""
    name = None if rule is None else find_rule(rule).name
    flags = store.flags(rule=name, run_id=run_id)
    closers = store.flag_closers()
    items = [QueueItem(f, closers.get(f.flag_id)) for f in flags]
    if open_only:
        items = [i for i in items if i.open]
    items.sort(key=lambda i: (-i.flag.score, i.flag.created_at, i.flag.flag_id))
    return items
