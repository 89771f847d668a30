"""Compliance annotations: structured notes on a run or one of its events.

``annotate`` appends a new annotation to the run's annotation chain;
``read_annotations`` (``replayable.annotations``) returns them as an
:class:`AnnotationSet`: the current state (each note as last corrected,
retracted ones left out) and the whole history in the order it was written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import msgspec

from replayable.audit.actor import Actor, require
from replayable.errors import AppendOnlyError, ConfigurationError, RunNotFoundError
from replayable.events.audit import VERDICTS, Annotation, annotation_genesis, annotation_hash
from replayable.events.ids import uuid7
from replayable.store.base import EventStore
from replayable.store.integrity import Integrity

__all__ = ["AnnotationSet", "annotate_run", "new_id"]

#: A concurrent writer took the chain position we computed: read the head again.
_RETRIES = 8


def new_id(now: float | None = None) -> str:
    """A fresh UUIDv7 for an audit record."""
    ms = int((time.time() if now is None else now) * 1000)
    return uuid7(ms, os.urandom(10))


@dataclass(frozen=True, slots=True)
class AnnotationSet:
    """A run's annotations: ``history`` in chain order, ``current`` as they stand now."""

    run_id: str
    history: tuple[Annotation, ...]

    @property
    def current(self) -> list[Annotation]:
        """Annotations neither corrected nor retracted since, oldest first (retractions
        themselves are history only)."""
        replaced = {a.amends for a in self.history if a.amends is not None}
        return [a for a in self.history if a.annotation_id not in replaced and not a.retract]

    def versions(self, annotation_id: str) -> list[Annotation]:
        """The annotation and every later version of it (corrections, a retraction)."""
        out = [a for a in self.history if a.annotation_id == annotation_id]
        while out:
            nxt = [a for a in self.history if a.amends == out[-1].annotation_id]
            if not nxt:
                break
            out.append(nxt[0])
        return out

    def on_step(self, seq: int | None) -> list[Annotation]:
        """The current annotations on event ``seq`` (``None``: on the run itself)."""
        return [a for a in self.current if a.seq == seq]

    def find(self, annotation_id: str) -> Annotation | None:
        """The annotation with this id, or an unambiguous prefix of it."""
        hits = [a for a in self.history if a.annotation_id.startswith(annotation_id.lower())]
        return hits[0] if len(hits) == 1 else None

    def __iter__(self) -> Iterator[Annotation]:
        return iter(self.history)

    def __len__(self) -> int:
        return len(self.history)


def _check(
    store: EventStore,
    run_id: str,
    step: int | None,
    verdict: str | None,
    note: str,
    retract: bool,
    amends: Annotation | None,
) -> None:
    if step is not None and store.event_at(run_id, step) is None:
        raise ConfigurationError(f"run {run_id} has no step {step} to annotate")
    if retract:
        if amends is None:
            raise ConfigurationError("a retraction must name the annotation it retracts")
        if verdict is not None:
            raise ConfigurationError("a retraction carries no verdict; give only --note")
    elif verdict not in VERDICTS:
        raise ConfigurationError(f"verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    if not note.strip():
        raise ConfigurationError("an annotation needs a note saying what was reviewed")


def _resolve_amended(store: EventStore, run_id: str, ref: str | None) -> Annotation | None:
    if ref is None:
        return None
    found = AnnotationSet(run_id, tuple(store.annotations(run_id)))
    target = found.find(ref)
    if target is None:
        raise ConfigurationError(f"run {run_id} has no annotation {ref!r} (or it is ambiguous)")
    if target.retract:
        raise ConfigurationError(f"annotation {target.annotation_id} is a retraction")
    later = [a for a in found.history if a.amends == target.annotation_id]
    if later:
        raise ConfigurationError(
            f"annotation {target.annotation_id} was already amended by "
            f"{later[0].annotation_id}; amend that one"
        )
    return target


def _resolve_flags(store: EventStore, run_id: str, refs: Iterable[str]) -> tuple[str, ...]:
    refs = list(refs)
    if not refs:
        return ()
    ids = [f.flag_id for f in store.flags(run_id=run_id)]
    out = []
    for ref in refs:
        hits = [i for i in ids if i.startswith(ref.lower())]
        if len(hits) != 1:
            raise ConfigurationError(
                f"run {run_id} has no anomaly flag {ref!r} (or it is ambiguous)"
            )
        out.append(hits[0])
    return tuple(out)


def annotate_run(
    store: EventStore,
    actor: Actor,
    run: str,
    *,
    step: int | None = None,
    verdict: str | None,
    note: str,
    policy: str | None = None,
    amends: str | None = None,
    retract: bool = False,
    closes: Iterable[str] = (),
    now: float | None = None,
    integrity: Integrity | None = None,
) -> Annotation:
    """Append an annotation to ``run`` (an id or prefix) as ``actor``; returns it.

    ``amends`` names (by id or prefix) the annotation this one corrects, or
    with ``retract=True`` withdraws. ``closes`` names anomaly flags of the run
    this annotation settles. The link is keyed with the current chain key of
    ``integrity`` (default: the environment's, as the writer's event chains).
    """
    require(actor, "annotate", "annotate runs")
    try:
        record = store.get_run(run)  # a full id: one lookup, not a prefix search first
    except RunNotFoundError:
        record = store.run(run)
    run_id = record.run_id
    amended = _resolve_amended(store, run_id, amends)
    flag_ids = _resolve_flags(store, run_id, closes)
    if amended is not None and step is None:
        step = amended.seq
    _check(store, run_id, step, verdict, note, retract, amended)
    key = (integrity or Integrity.from_env()).current_key()
    for _ in range(_RETRIES):
        head = store.annotation_head(run_id)
        created = time.time() if now is None else now
        draft = Annotation(
            annotation_id=new_id(created),
            run_id=run_id,
            seq=step,
            author=actor.user,
            role=actor.role,
            login=actor.login,
            created_at=created,
            verdict=verdict,
            policy=policy,
            note=note,
            amends=None if amended is None else amended.annotation_id,
            retract=retract,
            closes=flag_ids,
            tenant=record.start.tenant,
            chain_index=0 if head is None else head.chain_index + 1,
            key_id=None if key is None else key.key_id,
            prev_hash=annotation_genesis(run_id, key) if head is None else head.hash,
            hash="",
        )
        annotation = msgspec.structs.replace(draft, hash=annotation_hash(draft, key))
        try:
            store.append_annotations([annotation])
        except AppendOnlyError:
            continue  # another annotation took this chain position first
        return annotation
    raise AppendOnlyError(
        f"could not append an annotation to run {run_id}: the chain kept moving "
        f"({_RETRIES} attempts)"
    )
