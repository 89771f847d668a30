"""Recompute a run's hash chain and name the first event that does not match."""

from __future__ import annotations

from dataclasses import dataclass

from replayable.events.canonical import event_hash, genesis_hash, run_seal
from replayable.store.base import EventStore

__all__ = ["ChainReport", "verify_run"]


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The outcome of checking one run. ``first_bad_seq`` is ``None`` when the chain holds."""

    run_id: str
    ok: bool
    events_checked: int
    first_bad_seq: int | None = None
    reason: str = ""

    @property
    def message(self) -> str:
        if self.ok:
            return f"run {self.run_id}: chain intact ({self.events_checked} events)"
        where = f"event {self.first_bad_seq}" if self.first_bad_seq is not None else "run record"
        return f"run {self.run_id}: {where}: {self.reason}"


def verify_run(store: EventStore, run_id: str) -> ChainReport:
    """Walk the run's events in chain order, recomputing every link.

    Catches an edited event (its hash no longer matches its content), a
    removed or re-ordered event (a link points at the wrong predecessor or a
    chain position is missing) and a truncated tail (the end record names a
    different head or count).
    """
    run = store.get_run(run_id)
    events = sorted(store.events(run_id), key=lambda e: e.chain_index)
    prev = genesis_hash(run_id)
    for position, event in enumerate(events):
        if event.chain_index != position:
            return ChainReport(
                run_id,
                False,
                position,
                event.seq,
                f"chain position {event.chain_index} found where {position} belongs "
                "(an event was removed)",
            )
        if event.prev_hash != prev:
            return ChainReport(
                run_id, False, position, event.seq, "link to the previous event does not match"
            )
        expected = event_hash(event)
        if event.hash != expected:
            return ChainReport(
                run_id,
                False,
                position,
                event.seq,
                "content does not match its hash (the event was altered)",
            )
        prev = event.hash
    end = run.end
    if end is not None:
        if end.event_count != len(events):
            return ChainReport(
                run_id,
                False,
                len(events),
                None,
                f"end record expects {end.event_count} events, found "
                f"{len(events)} (events were removed or added)",
            )
        seal = run_seal(
            prev, run.start, end.status, end.output, end.error, end.ended_at, end.event_count
        )
        if end.last_hash != seal:
            return ChainReport(
                run_id,
                False,
                len(events),
                None,
                "the run's start or end record does not match its seal "
                "(input, metadata, outcome or chain head was altered)",
            )
    return ChainReport(run_id, True, len(events))
