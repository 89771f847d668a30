"""Plain, frozen audit records: annotations, access-log entries and anomaly flags.

They live beside the event log, never inside it: an annotation names a run
(and optionally one of its events by seq), an access entry names what was
read, a flag names the rule, the run and the steps it found. All three are
append-only. Annotations are hash-chained per run the way events are, with
the same :func:`~replayable.events.canonical.chain_hash`, so ``verify``
catches an edited, removed or re-ordered annotation.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from replayable.events.canonical import canonical, chain_hash
from replayable.events.chain import ChainKey, genesis, link

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "CHANNELS",
    "ROLES",
    "VERDICTS",
    "AccessEntry",
    "Annotation",
    "AnomalyFlag",
    "Verdict",
    "WorkflowStats",
    "annotation_genesis",
    "annotation_hash",
]

#: Version of the audit record layout. Bump it with an upcaster.
AUDIT_SCHEMA_VERSION: Final = 1

Verdict = Literal["ok", "concern", "violation", "needs-review"]

#: The verdicts an annotation may carry.
VERDICTS: Final = ("ok", "concern", "violation", "needs-review")

#: How a payload was read: the command line, the web pages, the JSON API, a report.
CHANNELS: Final = ("cli", "web", "api", "report")

#: Application roles. ``analyst`` and ``admin`` may annotate; ``auditor`` only reads.
ROLES: Final = ("engineer", "analyst", "auditor", "admin")


class Annotation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A structured note on a run (``seq`` is ``None``) or on one of its events.

    An annotation is never edited. A correction is a new annotation whose
    ``amends`` names the one it replaces; a retraction is one with ``retract``
    set (and no verdict). ``closes`` names anomaly flags this annotation
    settles. ``chain_index``/``prev_hash``/``hash`` chain the run's
    annotations in the order they were written: HMAC-SHA256 under the chain
    key ``key_id`` names, like a keyed event chain, or sha256 when no key was
    configured (``key_id`` is ``None``).
    """

    annotation_id: str
    run_id: str
    seq: int | None
    author: str
    role: str
    login: str
    created_at: float
    verdict: str | None
    policy: str | None
    note: str
    amends: str | None
    retract: bool
    closes: tuple[str, ...]
    tenant: str | None
    chain_index: int
    key_id: str | None
    prev_hash: str
    hash: str
    schema_version: int = AUDIT_SCHEMA_VERSION


class AccessEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One read of recorded payloads: who, when, what, through which edge and why.

    ``login`` is the database or operating-system login, ``user`` the
    application user; ``steps`` lists the seqs whose payloads were shown
    (empty when the read was not of events); ``what`` names the kinds of data
    read (``request``, ``response``, ``annotations``, ``flags``,
    ``access_log``, ``report``) and, for reads that are not a plain display,
    how they were used: ``replay`` (a replay served the tape to agent code),
    ``diff`` (two runs compared), ``search`` (payloads matched by a query;
    ``steps`` are the matching ones).
    """

    entry_id: str
    at: float
    login: str
    user: str
    role: str
    channel: str
    purpose: str | None
    run_id: str | None
    steps: tuple[int, ...]
    what: tuple[str, ...]
    tenant: str | None
    schema_version: int = AUDIT_SCHEMA_VERSION


class AnomalyFlag(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one anomaly rule found in one run: the steps, the evidence and a score.

    A flag is open until an annotation names it in ``closes``.
    """

    flag_id: str
    rule: str
    run_id: str
    workflow: str
    steps: tuple[int, ...]
    evidence: dict[str, Any]
    score: float
    created_at: float
    tenant: str | None
    schema_version: int = AUDIT_SCHEMA_VERSION


class WorkflowStats(msgspec.Struct, frozen=True, kw_only=True):
    """Figures over a workflow's finished runs, as the anomaly rules compare against.

    ``llm_mean``/``llm_std`` are the mean and population standard deviation
    of LLM calls per run; ``median_duration`` is in seconds (``None`` when no
    run has ended).
    """

    workflow: str
    runs: int
    llm_mean: float
    llm_std: float
    median_duration: float | None


def annotation_genesis(run_id: str, key: ChainKey | None = None) -> str:
    """The ``prev_hash`` of a run's first annotation (apart from its events' chain)."""
    return genesis(key, f"annotations:{run_id}")


def _fields(a: Annotation) -> tuple[object, ...]:
    return (
        "annotation",
        a.annotation_id,
        a.run_id,
        a.seq,
        a.author,
        a.role,
        a.login,
        a.created_at,
        a.verdict,
        a.policy,
        a.note,
        a.amends,
        a.retract,
        list(a.closes),
        a.tenant,
        a.chain_index,
        a.schema_version,
    )


def annotation_hash(a: Annotation, key: ChainKey | None = None) -> str:
    """The hash an annotation must carry, given the ``prev_hash`` it carries: keyed with
    ``key`` (which must be the key ``a.key_id`` names) or, without one, unkeyed."""
    if key is None:
        return chain_hash(a.prev_hash, _fields(a))
    return link(key, a.prev_hash, canonical((*_fields(a), key.key_id)))
