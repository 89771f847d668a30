"""Canonical JSON, fingerprints and the hash chain (redaction: :mod:`~replayable.events.redaction`).

Canonical JSON is orjson with sorted keys: UTF-8, no insignificant
whitespace, one spelling per number. Everything that is hashed goes through
here, so the bytes that are fingerprinted are exactly the bytes that are
stored.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from replayable.events.model import Event, RunStart

__all__ = [
    "canonical",
    "chain_hash",
    "event_hash",
    "fingerprint",
    "genesis_hash",
    "payload_digest",
    "run_seal",
]

_SORT: Final = orjson.OPT_SORT_KEYS


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes of a plain JSON value (sorted keys)."""
    return orjson.dumps(value, option=_SORT)


def fingerprint(kind: str, name: str, request: bytes) -> str:
    """What replay compares: a hash of the boundary and its canonical, redacted request
    (``kind NUL name NUL request``)."""
    return hashlib.sha256(_boundary_prefix(kind, name) + request).hexdigest()


@functools.lru_cache(maxsize=4096)
def _boundary_prefix(kind: str, name: str) -> bytes:
    return f"{kind}\x00{name}\x00".encode()


def genesis_hash(run_id: str) -> str:
    """The ``prev_hash`` of a run's first event."""
    return hashlib.sha256(b"replayable-chain:" + run_id.encode()).hexdigest()


def payload_digest(text: str | bytes) -> str:
    """The sha256 (hex) of a payload's canonical text: what a version 2 event hashes."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def event_fields(event: Event) -> tuple[Any, ...]:
    """The fields of ``event`` that its hash covers, in chain order.

    A version 2 event covers the sha256 of its request and response rather than
    their text: the hash commits to the same bytes, and still verifies when the
    payload itself is gone (erased by crypto-shredding, or not fetched from the archive).
    """
    request: str | None = event.request
    response = event.response
    if event.schema_version >= 2:
        request = event.request_digest or payload_digest(event.request)
        if event.response_digest is not None:
            response = event.response_digest
        elif response is not None:
            response = payload_digest(response)
    return (
        event.run_id,
        event.seq,
        event.chain_index,
        event.kind,
        event.name,
        event.key,
        event.parent,
        event.call_site,
        request,
        event.fingerprint,
        response,
        event.encoding,
        event.error,
        event.side_effect,
        event.started_at,
        event.duration_ns,
        event.metadata,
        event.schema_version,
    )


def start_fields(start: RunStart) -> tuple[Any, ...]:
    """The start record's fields as the seal and the start MAC cover them."""
    return (
        start.run_id,
        start.workflow,
        start.entrypoint,
        start.parent_run_id,
        start.parent_seq,
        start.root_run_id,
        start.tenant,
        start.input,
        start.metadata,
        start.code,
        start.env_hash,
        start.lineage,
        start.started_at,
        start.schema_version,
    )


def event_hash(event: Event) -> str:
    """The hash an event must carry, given the ``prev_hash`` it carries."""
    return chain_hash(event.prev_hash, event_fields(event))


def run_seal(
    head: str,
    start: RunStart,
    status: str,
    output: str | None,
    error: str | None,
    ended_at: float,
    event_count: int,
) -> str:
    """The end record's ``last_hash``: the chain head hashed with the run's start and end.

    It makes the run records tamper-evident too: editing a finished run's input,
    metadata, outcome or event count breaks the seal.
    """
    return chain_hash(
        head,
        (
            "run-seal",
            *start_fields(start),
            status,
            output,
            error,
            ended_at,
            event_count,
        ),
    )


def chain_hash(prev_hash: str, fields: tuple[Any, ...]) -> str:
    """sha256 of the previous hash and the canonical JSON of an event's fields."""
    h = hashlib.sha256(prev_hash.encode())
    h.update(orjson.dumps(fields, option=_SORT))
    return h.hexdigest()
