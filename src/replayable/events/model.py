"""Plain, frozen records: what the log holds.

An :class:`Event` is one crossing of a non-deterministic boundary. A run is
written as two immutable records: :class:`RunStart` when it begins and
:class:`RunEnd` when it finishes; a run with no end record is ``incomplete``.
Payloads are kept as canonical JSON text so that hashing, storing and diffing
never re-encode them.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec
import orjson

__all__ = [
    "BOUNDARY_KINDS",
    "EVENT_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "SEALED_EVENT_VERSION",
    "SEALED_SCHEMA_VERSION",
    "Event",
    "Run",
    "RunEnd",
    "RunStart",
    "RunStatus",
]

#: Version of the event and run record layout. Bump it with an upcaster.
SCHEMA_VERSION: Final = 1
#: Version of the run records of a store that encrypts payloads: their seal (and start
#: MAC) covers the sha256 of the input, output and error instead of their text, which
#: are stored encrypted, so that a run whose data key was destroyed still verifies.
SEALED_SCHEMA_VERSION: Final = 2
#: Version of the event record: 2 hashes the sha256 of its request and response
#: instead of their text (see :func:`~replayable.events.canonical.event_fields`), so
#: that an event whose payload was erased or archived still verifies. Events of
#: version 1 keep their own hashing.
EVENT_SCHEMA_VERSION: Final = 2
#: Version of the events of a store that encrypts payloads: 3 also hashes the sha256 of
#: the error record (stored encrypted, like the payloads) and of the metadata's
#: canonical JSON in place of their text.
SEALED_EVENT_VERSION: Final = 3

#: The places where the outside world enters an agent. ``span`` groups events;
#: ``gap`` notes a network connection no boundary captured (host, port, call site).
#: Neither has a causal key: replay never matches them.
BOUNDARY_KINDS: Final = (
    "llm",
    "tool",
    "http",
    "clock",
    "random",
    "uuid",
    "sleep",
    "retrieval",
    "prompt",
    "state_read",
    "state_write",
    "subrun",
    "span",
    "gap",
)

RunStatus = Literal["completed", "failed", "incomplete"]


class Event(msgspec.Struct, frozen=True, gc=False):
    """One boundary crossing: what went in and what came back.

    ``request``, ``response`` and ``error`` are canonical JSON text;
    ``encoding`` says how ``response`` is encoded (``json`` for plain JSON,
    ``tagged`` when it carries type tags). ``key`` is the causal position
    (task lineage and ordinal) that replay matches on; ``parent`` is the seq
    of the enclosing span or ``None``.
    """

    run_id: str
    seq: int
    kind: str
    name: str
    key: str | None
    parent: int | None
    call_site: str | None
    request: str
    fingerprint: str
    response: str | None
    encoding: str
    error: str | None
    side_effect: bool
    started_at: float
    duration_ns: int
    metadata: dict[str, Any]
    chain_index: int
    prev_hash: str
    hash: str
    schema_version: int = EVENT_SCHEMA_VERSION
    #: What a reader found wrong with the stored row (column and problem), empty when
    #: the row is sound. A record with problems holds placeholders for what it could
    #: not read: readers show it as unreadable, replay stops at it, verify fails it.
    problems: tuple[str, ...] = ()
    #: Set when a payload can no longer be read by design (its data key was destroyed, or
    #: retention purged it from the archive): "erased on DATE by WHO", "purged on DATE by
    #: WHO". The payload's place holds a placeholder and ``problems``
    #: says so, and its sha256 (``request_digest``/``response_digest``) stands in for it
    #: in the hash, so the chain still verifies.
    erased: str | None = None
    request_digest: str | None = None
    response_digest: str | None = None
    #: The erased error record's sha256 (version 3 events hash it in the error's place).
    error_digest: str | None = None
    #: The sha256 of the metadata's canonical JSON when it is gone (version 3 events hash
    #: it in the metadata's place).
    metadata_digest: str | None = None

    def request_value(self) -> Any:
        """The request as a JSON tree (redacted, as stored)."""
        return orjson.loads(self.request)

    def response_tree(self) -> Any:
        """The response as stored: a JSON tree, with type tags if ``encoding`` is tagged."""
        return None if self.response is None else orjson.loads(self.response)

    def error_value(self) -> dict[str, Any] | None:
        """The recorded error record (type, message, args) or ``None``."""
        return None if self.error is None else orjson.loads(self.error)


class RunStart(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Written when a run begins. ``input`` is tagged JSON of ``{"args", "kwargs"}``."""

    run_id: str
    workflow: str
    entrypoint: str
    parent_run_id: str | None
    parent_seq: int | None
    root_run_id: str
    tenant: str | None
    input: str
    metadata: dict[str, Any]
    code: dict[str, Any]
    env_hash: str | None
    lineage: dict[str, Any]
    started_at: float
    schema_version: int = SCHEMA_VERSION
    #: The chain format (see :mod:`replayable.events.chain`): ``None`` for the unkeyed
    #: v1 chain, ``"2:<key id>:<start mac>"`` for a keyed one. Set by the writer.
    chain: str | None = None
    #: The erased input's sha256 (a version 2 start hashes it in the input's place).
    input_digest: str | None = None


class RunEnd(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Written when a run finishes: its outcome and its seal.

    ``last_hash`` seals the run: the head of its event chain hashed together
    with the start record and this record's fields (see ``run_seal``).
    """

    run_id: str
    status: Literal["completed", "failed"]
    output: str | None
    error: str | None
    ended_at: float
    event_count: int
    last_hash: str
    schema_version: int = SCHEMA_VERSION
    #: Ed25519 signature (hex) of the seal, for a keyed chain; ``None`` for v1.
    signature: str | None = None
    #: The erased output's and error's sha256 (a version 2 end's seal covers them).
    output_digest: str | None = None
    error_digest: str | None = None


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """A run as read back: its start record and, once finished, its end record."""

    start: RunStart
    end: RunEnd | None = None
    #: What a reader found wrong with the stored run or end row (see ``Event.problems``).
    problems: tuple[str, ...] = ()
    #: "erased on DATE by WHO" when the run's input, output or error can no longer be
    #: read by design (its data key was destroyed; see ``Event.erased``).
    erased: str | None = None

    @property
    def run_id(self) -> str:
        return self.start.run_id

    @property
    def workflow(self) -> str:
        return self.start.workflow

    @property
    def status(self) -> RunStatus:
        return "incomplete" if self.end is None else self.end.status

    @property
    def started_at(self) -> float:
        return self.start.started_at

    @property
    def ended_at(self) -> float | None:
        return None if self.end is None else self.end.ended_at

    @property
    def metadata(self) -> dict[str, Any]:
        return self.start.metadata

    @property
    def parent_run_id(self) -> str | None:
        return self.start.parent_run_id
