"""Check runs against their chains, seals, signatures and the anchor; name what is wrong.

Each run gets one status (:data:`STATUSES`), the worst of what was found:

========== ===========================================================================
intact     chain, seal and every check hold
altered    a record does not match its hash, MAC, seal or signature, or is unreadable
           (``first_bad_seq`` names the first bad event; ``None`` means a run record)
missing    the anchor recorded the run; the store has no run record
truncated  the anchor saw more events, or a seal, than the store holds
orphaned   events whose run record is missing, and no anchor to say more
unkeyed    recorded without a chain key while a key is configured
gapped     the chain holds but seq numbers are missing (a step was never stored)
unsealed   no end record and no seal in the anchor: still running, or cut short
========== ===========================================================================

:func:`verify_run` checks one run, :func:`verify_store` every run the store
or the anchor knows, plus events left without a run record. Neither raises on
a malformed row: a bad row is a finding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from replayable.errors import RunNotFoundError, StoreError
from replayable.events.chain import (
    ChainFormatError,
    ChainKey,
    end_seal,
    event_digest,
    genesis,
    parse_chain,
    seal_message,
    start_mac,
)
from replayable.events.model import Event, Run
from replayable.store.anchor import AnchoredRun, AnchorIndex
from replayable.store.base import EventStore
from replayable.store.integrity import Integrity, start_digest

__all__ = [
    "STATUSES",
    "ChainReport",
    "Status",
    "StoreReport",
    "seq_gaps",
    "verify_run",
    "verify_store",
]

Status = Literal[
    "intact", "altered", "missing", "truncated", "orphaned", "unkeyed", "gapped", "unsealed"
]
#: Every status, worst first (a run's status is the worst of its findings).
STATUSES: Final[tuple[Status, ...]] = (
    "altered",
    "missing",
    "truncated",
    "orphaned",
    "unkeyed",
    "gapped",
    "unsealed",
    "intact",
)


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The outcome of checking one run. ``ok`` only when ``status`` is ``intact``."""

    run_id: str
    status: Status
    events_checked: int = 0
    first_bad_seq: int | None = None
    reason: str = ""
    keyed: bool = False
    key_id: str | None = None
    anchored: bool = False
    gaps: tuple[tuple[int, int], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "intact"

    @property
    def message(self) -> str:
        if self.ok:
            how = f", key {self.key_id!r}" if self.keyed else ""
            extra = f"; {'; '.join(self.notes)}" if self.notes else ""
            return f"run {self.run_id}: chain intact ({self.events_checked} events){how}{extra}"
        where = f"event {self.first_bad_seq}" if self.first_bad_seq is not None else "run record"
        if self.status != "altered":
            where = self.status
        return f"run {self.run_id}: {where}: {self.reason}"


@dataclass
class StoreReport:
    """Every run checked, and problems that belong to no one run (anchor entries)."""

    runs: list[ChainReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.ok for r in self.runs)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for r in self.runs:
            out[r.status] += 1
        return {s: n for s, n in out.items() if n}


class _Findings:
    """What checking one run found; the worst decides the status."""

    def __init__(self) -> None:
        self.found: list[tuple[Status, str, int | None]] = []
        self.notes: list[str] = []

    def add(self, status: Status, reason: str, seq: int | None = None) -> None:
        self.found.append((status, reason, seq))

    def worst(self) -> tuple[Status, str, int | None]:
        if not self.found:
            return "intact", "", None
        rank = {s: i for i, s in enumerate(STATUSES)}
        return min(self.found, key=lambda f: rank[f[0]])


def _index(store: EventStore, integrity: Integrity) -> AnchorIndex | None:
    if integrity.anchor is None:
        return None
    return AnchorIndex.read(integrity.anchor, store.store_id(), integrity.keys, store.sees_tenant)


def verify_run(
    store: EventStore,
    run_id: str,
    *,
    integrity: Integrity | None = None,
    anchor: AnchorIndex | None = None,
    allow_unkeyed: bool = False,
) -> ChainReport:
    """Check one run: its records, chain, seal, signature, tags, environment snapshot and
    what the anchor holds for it. ``integrity`` defaults to what the environment configures;
    ``anchor`` is the anchor already read (read here when not given)."""
    integrity = integrity if integrity is not None else Integrity.from_env()
    if anchor is None:
        anchor = _index(store, integrity)
    try:
        return _verify(store, run_id, integrity, anchor, allow_unkeyed)
    except RunNotFoundError:
        raise
    except StoreError:
        raise
    except Exception as exc:  # a row shaped like nothing a check expects
        return ChainReport(run_id, "altered", reason=f"a stored record cannot be checked: {exc!r}")


def _verify(
    store: EventStore,
    run_id: str,
    integrity: Integrity,
    index: AnchorIndex | None,
    allow_unkeyed: bool,
) -> ChainReport:
    anchored = index.runs.get(run_id) if index is not None else None
    try:
        run = store.get_run(run_id)
    except RunNotFoundError:
        return _absent(store, run_id, anchored)
    events = store.events(run_id)
    f = _Findings()
    for problem in run.problems:
        # An erased input, output or error is by design: its sha256 stands in for it in
        # the start MAC and the seal, which are checked as for any other run.
        if run.erased is None or not problem.endswith(run.erased):
            f.add("altered", f"unreadable column {problem}")
    key, keyed, key_id = _chain_key(run, integrity, f, allow_unkeyed, anchored)
    head, checked = _walk(run_id, key, events, f)
    gaps = seq_gaps(events)
    if gaps:
        shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in gaps[:5])
        f.add("gapped", f"seq {shown} missing: those steps were never stored or were removed")
    _check_end(run, key, head, len(events), f)
    _check_extras(store, run, f)
    if index is not None:
        if anchored is None:
            f.notes.append("not in the anchor")
        else:
            _check_anchor(run, events, anchored, f)
    elif run.end is None:
        f.notes.append("no anchor configured to tell a cut tail from a run cut short")
    if run.end is None and (anchored is None or anchored.seal is None):
        f.add("unsealed", "no end record and no seal in the anchor: still running, or cut short")
    status, reason, seq = f.worst()
    return ChainReport(
        run_id,
        status,
        checked,
        seq,
        reason,
        keyed=keyed,
        key_id=key_id,
        anchored=anchored is not None,
        gaps=tuple(gaps),
        notes=tuple(f.notes),
    )


def _absent(store: EventStore, run_id: str, anchored: AnchoredRun | None) -> ChainReport:
    events = store.events(run_id)
    left = f"; {len(events)} of its events remain (orphaned)" if events else ""
    if anchored is not None:
        count = anchored.seal.get("count") if anchored.seal else anchored.head_count
        return ChainReport(
            run_id,
            "missing",
            len(events),
            reason=f"the anchor recorded this run ({count} events), the store has no "
            f"run record{left}",
            anchored=True,
        )
    if events:
        return ChainReport(
            run_id,
            "orphaned",
            len(events),
            reason=f"{len(events)} events whose run record is missing",
        )
    raise RunNotFoundError(f"no run {run_id!r} in {store.url}")


def _chain_key(
    run: Run,
    integrity: Integrity,
    f: _Findings,
    allow_unkeyed: bool,
    anchored: AnchoredRun | None,
) -> tuple[ChainKey | None, bool, str | None]:
    """The key the run's chain is checked with; findings for a bad or missing one."""
    try:
        fmt = parse_chain(run.start.chain)
    except ChainFormatError as exc:
        f.add("altered", f"the chain label cannot be read: {exc}")
        return None, False, None
    if not fmt.keyed:
        if integrity.current_key() is not None and not allow_unkeyed:
            f.add(
                "unkeyed",
                "recorded without a chain key, so whoever can write the database could "
                "have rewritten it undetected (pass --allow-unkeyed to accept such runs)",
            )
        elif anchored is not None and anchored.start is not None and anchored.start.get("chain"):
            pass  # the anchor check names the downgrade
        else:
            f.notes.append("unkeyed: configure a chain key to detect rewrites")
        return None, False, None
    assert fmt.key_id is not None
    key = integrity.key(fmt.key_id)
    if key is None:
        f.add(
            "altered",
            f"chained with key {fmt.key_id!r}, which is not configured here: forged, or "
            "verify lacks that key",
        )
        return None, True, fmt.key_id
    if start_mac(key, run.start) != fmt.start_mac:
        f.add(
            "altered",
            "the start record does not match its MAC (input, metadata, code, "
            "lineage or another start field was altered)",
        )
    return key, True, fmt.key_id


def _walk(run_id: str, key: ChainKey | None, events: list[Event], f: _Findings) -> tuple[str, int]:
    """Recompute every link in chain order; returns the chain head and the events that
    held before the first bad one."""
    prev = genesis(key, run_id)
    ordered = sorted(events, key=lambda e: e.chain_index)
    for position, event in enumerate(ordered):
        if event.problems and not _only_erased(event):
            f.add("altered", f"unreadable column {event.problems[0]}", event.seq)
            return prev, position
        # An erased payload's sha256 stands in for it in the hash: the link is checked
        # as for any other event.
        if event.chain_index != position:
            f.add(
                "altered",
                f"chain position {event.chain_index} found where {position} belongs "
                "(an event was removed)",
                event.seq,
            )
            return prev, position
        if event.prev_hash != prev:
            f.add("altered", "link to the previous event does not match", event.seq)
            return prev, position
        if event.hash != event_digest(key, event):
            f.add("altered", "content does not match its hash (the event was altered)", event.seq)
            return prev, position
        prev = event.hash
    return prev, len(ordered)


def _only_erased(event: Event) -> bool:
    """Whether every problem of ``event`` is an erased payload (by design, not damage)."""
    notice = event.erased
    return notice is not None and all(p.endswith(notice) for p in event.problems)


def seq_gaps(events: Iterable[Event]) -> list[tuple[int, int]]:
    """The ranges of seq numbers missing between 1 and the highest stored (readable) one."""
    seqs = sorted(e.seq for e in events if not e.problems or _only_erased(e))
    gaps: list[tuple[int, int]] = []
    expected = 1
    for seq in seqs:
        if seq > expected:
            gaps.append((expected, seq - 1))
        expected = max(expected, seq + 1)
    return gaps


def _check_end(run: Run, key: ChainKey | None, head: str, count: int, f: _Findings) -> None:
    end = run.end
    if end is None:
        return
    if end.event_count != count:
        f.add(
            "altered",
            f"end record expects {end.event_count} events, found {count} "
            "(events were removed or added)",
        )
        return
    if end.last_hash != end_seal(key, head, run.start, end):
        f.add(
            "altered",
            "the run's start or end record does not match its seal "
            "(input, metadata, outcome or chain head was altered)",
        )
        return
    if key is None and end.signature is not None:
        f.add("altered", "the end record of an unkeyed chain carries a signature")
        return
    if key is not None and not key.signature_holds(
        seal_message(run.run_id, end.last_hash), end.signature
    ):
        f.add("altered", "the end record's seal signature does not hold")


def _check_extras(store: EventStore, run: Run, f: _Findings) -> None:
    """What the records point at: the environment snapshot, the tag index.

    Payload blobs (when events reference them) are checked here the same way: by
    the digest the hashed record names.
    """
    for problem in _blob_problems(store, run):
        f.add("altered", problem)
    tags = store.tag_problem(run)
    if tags is not None:
        f.add("altered", tags)


def _blob_problems(store: EventStore, run: Run) -> list[str]:
    digest = run.start.env_hash
    if not digest:
        return []
    data = store.get_blob(digest)
    if data is None:
        return [f"the environment snapshot {digest[:16]}... is missing"]
    if hashlib.sha256(data).hexdigest() != digest:
        return ["the environment snapshot does not match its hash (it was altered)"]
    return []


def _check_anchor(run: Run, events: list[Event], a: AnchoredRun, f: _Findings) -> None:
    if a.start is not None:
        if a.start.get("chain") != run.start.chain:
            f.add("altered", "the chain label differs from the one the anchor recorded")
        elif a.start.get("digest") != start_digest(run.start):
            f.add("altered", "the start record differs from the one the anchor recorded")
    by_position = {e.chain_index: e for e in events if not e.problems or _only_erased(e)}
    if a.head_count > len(events):
        f.add(
            "truncated",
            f"the anchor saw {a.head_count} events, the store holds {len(events)}",
        )
    elif a.head_count:
        at = by_position.get(a.head_count - 1)
        if at is None or at.hash != a.head:
            seq = at.seq if at is not None else None
            f.add(
                "altered",
                f"event at chain position {a.head_count - 1} differs from the "
                "anchor's record of it",
                seq,
            )
    if a.seal is not None:
        end = run.end
        if end is None:
            f.add(
                "truncated",
                f"the end record is missing: the anchor sealed this run with "
                f"{a.seal.get('count')} events",
            )
        elif end.last_hash != a.seal.get("seal") or end.event_count != a.seal.get("count"):
            f.add("altered", "the end record differs from the seal the anchor holds")


def verify_store(
    store: EventStore,
    *,
    integrity: Integrity | None = None,
    allow_unkeyed: bool = False,
    progress: Callable[[int], None] | None = None,
) -> StoreReport:
    """Check every run the store or the anchor knows, and events without a run record.

    ``progress`` is called with the number of runs to check, then with 0 after each.
    """
    integrity = integrity if integrity is not None else Integrity.from_env()
    report = StoreReport()
    index = _index(store, integrity)
    if index is not None:
        report.problems.extend(index.problems)
    run_ids = list(store.iter_run_ids())
    known = set(run_ids)
    extra = sorted((store.event_run_ids() - known) | (set(index.runs if index else ()) - known))
    todo = run_ids + extra
    if progress is not None:
        progress(len(todo))
    for run_id in todo:
        try:
            report.runs.append(
                verify_run(
                    store, run_id, integrity=integrity, anchor=index, allow_unkeyed=allow_unkeyed
                )
            )
        except RunNotFoundError:
            pass  # an anchor entry for a run this store never held
        if progress is not None:
            progress(0)
    return report
