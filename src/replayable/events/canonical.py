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
    "covered",
    "event_hash",
    "fingerprint",
    "genesis_hash",
    "payload_digest",
    "run_seal",
    "seal_outcome",
    "seal_tail",
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


def covered(text: str | None, digest: str | None) -> str | None:
    """What a hash that covers a value by its sha256 takes for it: the digest given (the
    value was erased), else the sha256 of ``text`` (``None`` stays ``None``)."""
    if digest is not None:
        return digest
    return None if text is None else payload_digest(text)


def event_fields(event: Event) -> tuple[Any, ...]:
    """The fields of ``event`` that its hash covers, in chain order.

    A version 2 event covers the sha256 of its request and response rather than
    their text: the hash commits to the same bytes, and still verifies when the
    payload itself is gone (erased by crypto-shredding, or not fetched from the archive).
    A version 3 event (written where payloads are encrypted) covers the sha256 of its
    error record and of its metadata's canonical JSON too (``error_digest`` and
    ``metadata_digest`` stand in for them once they are gone).
    """
    request: str | None = event.request
    response = event.response
    error = event.error
    metadata: Any = event.metadata
    version = event.schema_version
    if version >= 2:
        request = event.request_digest or payload_digest(event.request)
        response = covered(response, event.response_digest)
        if version >= 3:
            error = covered(error, event.error_digest)
            metadata = event.metadata_digest or payload_digest(canonical(metadata))
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
        error,
        event.side_effect,
        event.started_at,
        event.duration_ns,
        metadata,
        event.schema_version,
    )


def start_fields(start: RunStart) -> tuple[Any, ...]:
    """The start record's fields as the seal and the start MAC cover them (a version 2
    start, written where payloads are encrypted, covers its input's sha256)."""
    return (
        start.run_id,
        start.workflow,
        start.entrypoint,
        start.parent_run_id,
        start.parent_seq,
        start.root_run_id,
        start.tenant,
        start.input if start.schema_version < 2 else covered(start.input, start.input_digest),
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
    *,
    version: int = 1,
    output_digest: str | None = None,
    error_digest: str | None = None,
) -> str:
    """The end record's ``last_hash``: the chain head hashed with the run's start and end.

    It makes the run records tamper-evident too: editing a finished run's input,
    metadata, outcome or event count breaks the seal. A ``version`` 2 end is sealed
    over its output's and error's sha256 (the digests given stand in for erased ones).
    """
    out, err = seal_outcome(version, output, error, output_digest, error_digest)
    tail = seal_tail(status, out, err, ended_at, event_count, version)
    return chain_hash(head, ("run-seal", *start_fields(start), *tail))


def seal_outcome(
    version: int,
    output: str | None,
    error: str | None,
    output_digest: str | None = None,
    error_digest: str | None = None,
) -> tuple[str | None, str | None]:
    """The output and error as an end record of ``version`` is sealed over: their text
    (version 1), or their sha256 (version 2, or the digest given for an erased one)."""
    if version < 2:
        return output, error
    return covered(output, output_digest), covered(error, error_digest)


def seal_tail(
    status: str,
    output: str | None,
    error: str | None,
    ended_at: float,
    event_count: int,
    version: int,
) -> tuple[Any, ...]:
    """The end record's part of the seal's fields; a version 2 end names its version
    (so it cannot be passed off as a version 1 end whose output is a digest's text)."""
    tail: tuple[Any, ...] = (status, output, error, ended_at, event_count)
    return tail if version < 2 else (*tail, version)


def chain_hash(prev_hash: str, fields: tuple[Any, ...]) -> str:
    """sha256 of the previous hash and the canonical JSON of an event's fields."""
    h = hashlib.sha256(prev_hash.encode())
    h.update(orjson.dumps(fields, option=_SORT))
    return h.hexdigest()
