"""Thirty days of production: the contract-review agent run again and again, recorded.

``record_history`` reviews a schedule of contracts through the real agent and
the scripted model, a few a day over the past ``days`` days, each run recorded
into the store as production would have. ``affected`` of them are contracts
filed under a GB sub-jurisdiction (``GB-SCT``, ``GB-WLS``, ``GB-NIR``): their
exact-match rules lookup comes back empty, the silent failure the seed's
impact audit finds. The others (``GB``, ``US-NY``) find their rules.

The runs are spread over the days by running each under a shifted wall
clock: ``time.time()`` reads the scheduled day plus the real time elapsed, so
every timestamp the recording takes (and the agent's own ``now()``) falls on
that day, and durations stay real.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import replayable
from contract_review.agent import review_contract
from contract_review.model_server import serve
from replayable.store import EventStore

__all__ = ["AFFECTED_CONTRACTS", "CLEAN_CONTRACTS", "History", "record_history"]

#: Contracts filed under a sub-jurisdiction: the exact-match lookup finds no rules.
AFFECTED_CONTRACTS: Final = ("C-1042", "C-1187", "C-1203")
#: Contracts whose jurisdiction has rules of its own.
CLEAN_CONTRACTS: Final = ("C-0977", "C-1108", "C-1150", "C-1166")

DAY: Final = 86400.0


@dataclass
class History:
    """The runs recorded: all of them, and those whose rules lookup came back empty."""

    run_ids: list[str] = field(default_factory=list)
    affected: list[str] = field(default_factory=list)
    contracts: dict[str, str] = field(default_factory=dict)  # run id -> contract id


@contextmanager
def _clock_at(moment: float) -> Iterator[None]:
    """``time.time()`` reads ``moment`` plus the real time elapsed since entering."""
    real = time.time
    began = real()
    time.time = lambda: moment + (real() - began)
    try:
        yield
    finally:
        time.time = real


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def record_history(
    store: EventStore,
    *,
    days: int = 30,
    per_day: int = 2,
    affected: int = 14,
    seed: int = 7,
    now: float | None = None,
    reports_path: Path | None = None,
) -> History:
    """Record ``days * per_day`` reviews ending before ``now``, ``affected`` of them of
    GB sub-jurisdiction contracts; returns their run ids. Filed reports go to
    ``reports_path`` (default ``.replayable/history-reports.jsonl``)."""
    total = days * per_day
    if not 0 <= affected <= total:
        raise ValueError(f"affected must be between 0 and {total}, not {affected}")
    rng = random.Random(seed)
    hit = set(rng.sample(range(total), affected))
    start_day = (time.time() if now is None else now) - days * DAY
    history = History()
    reports = reports_path or Path(".replayable/history-reports.jsonl")
    with (
        serve(seed=seed) as model,
        _environ(
            OPENAI_BASE_URL=model.base_url,
            OPENAI_API_KEY="demo-key",
            CONTRACT_REVIEW_REPORTS=str(reports),
        ),
        replayable.recording(store) as rec,
    ):
        for i in range(total):
            pool = AFFECTED_CONTRACTS if i in hit else CLEAN_CONTRACTS
            contract = pool[rng.randrange(len(pool))]
            day, slot = divmod(i, per_day)
            hour = 8 + slot * (9 / per_day) + rng.random()
            moment = start_day + day * DAY + hour * 3600
            # One recording for the month; each run carries its own contract id.
            rec.metadata = {"contract_id": contract, "source": "history"}
            with _clock_at(moment):
                review_contract(contract)
            run_id = rec.run_ids[-1]
            history.run_ids.append(run_id)
            history.contracts[run_id] = contract
            if i in hit:
                history.affected.append(run_id)
    return history
