"""Recompute a run's annotation chain and name the first annotation that does not match."""

from __future__ import annotations

from dataclasses import dataclass

from replayable.errors import UnreadableRecordError
from replayable.events.audit import annotation_genesis, annotation_hash
from replayable.store.base import EventStore
from replayable.store.integrity import Integrity

__all__ = ["AnnotationChainReport", "verify_annotations"]


@dataclass(frozen=True, slots=True)
class AnnotationChainReport:
    """The outcome of checking one run's annotations; ``first_bad`` is ``None`` when intact."""

    run_id: str
    ok: bool
    checked: int
    first_bad: str | None = None
    reason: str = ""

    @property
    def message(self) -> str:
        if self.ok:
            return f"run {self.run_id}: annotations intact ({self.checked})"
        return f"run {self.run_id}: annotation {self.first_bad}: {self.reason}"


def verify_annotations(
    store: EventStore,
    run_id: str,
    *,
    integrity: Integrity | None = None,
    allow_unkeyed: bool = False,
) -> AnnotationChainReport:
    """Walk the run's annotations in chain order, recomputing every link.

    Catches an edited annotation (its hash no longer matches), a removed or
    re-ordered one (a position is missing or a link points elsewhere), one
    moved from another run, and a correction naming an annotation the run
    does not hold. Keyed links are checked with the key each names
    (``integrity`` defaults to the environment's); while a key is configured,
    an unkeyed annotation is refused unless ``allow_unkeyed``, since anyone
    could have rewritten it.
    """
    integrity = integrity or Integrity.from_env()
    configured = integrity.current_key() is not None
    try:
        chain = store.annotations(run_id)
    except UnreadableRecordError as exc:
        return AnnotationChainReport(run_id, False, 0, None, f"unreadable: {exc}")
    prev: str | None = None
    seen: set[str] = set()
    for position, a in enumerate(chain):

        def bad(
            reason: str, a_id: str = a.annotation_id, n: int = position
        ) -> AnnotationChainReport:
            return AnnotationChainReport(run_id, False, n, a_id, reason)

        if a.run_id != run_id:
            return bad(f"belongs to run {a.run_id}")
        if a.chain_index != position:
            return bad(
                f"chain position {a.chain_index} found where {position} belongs "
                "(an annotation was removed)"
            )
        key = None if a.key_id is None else integrity.key(a.key_id)
        if a.key_id is not None and key is None:
            return bad(f"chained with key {a.key_id!r}, which is not configured")
        if a.key_id is None and configured and not allow_unkeyed:
            return bad("unkeyed while a chain key is configured: anyone could have rewritten it")
        if a.prev_hash != (annotation_genesis(run_id, key) if prev is None else prev):
            return bad("link to the previous annotation does not match")
        if a.hash != annotation_hash(a, key):
            return bad("content does not match its hash (the annotation was altered)")
        if a.amends is not None and a.amends not in seen:
            return bad(f"amends {a.amends}, which is not an earlier annotation of this run")
        seen.add(a.annotation_id)
        prev = a.hash
    return AnnotationChainReport(run_id, True, len(chain))
