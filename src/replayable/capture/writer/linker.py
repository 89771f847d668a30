"""Turning hand-offs into store records: redaction, fingerprints, hash chains, seals.

The writer thread owns one :class:`Linker` per store. It keeps each open run's
chain head and count, and the start record its end record is sealed with.
Chains advance only when a batch is committed (``commit``), so a batch built
again after a failure links the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from replayable.capture.writer.deferred import expand
from replayable.events.canonical import (
    canonical,
    chain_hash,
    fingerprint,
    genesis_hash,
    run_seal,
)
from replayable.events.codec import encode_request
from replayable.events.model import SCHEMA_VERSION, Event, RunEnd, RunStart
from replayable.events.redaction import Redactor

if TYPE_CHECKING:
    from replayable.store.base import EventStore


__all__ = ["Chain", "Linker", "PendingEvent"]

#: What a boundary hands off: (run_id, seq, kind, name, key, parent, call_site,
#: request bytes, response bytes | None, tagged, error bytes | None,
#: side_effect, started_at, duration_ns, metadata | None). A deferred event
#: (see :mod:`~replayable.capture.writer.deferred`) has its builder's name in place of
#: ``tagged`` and raw parts in place of the request and response bytes.
PendingEvent = tuple[
    str,
    int,
    str,
    str,
    "str | None",
    "int | None",
    "str | None",
    Any,
    Any,
    "bool | str",
    "bytes | None",
    bool,
    float,
    int,
    "dict[str, Any] | None",
]


class Chain:
    __slots__ = ("count", "head")

    def __init__(self, run_id: str) -> None:
        self.count = 0
        self.head = genesis_hash(run_id)


class Linker:
    """Builds events, start and end records for one store's writer."""

    def __init__(self, store: EventStore, redactor: Redactor) -> None:
        self.store = store
        self.redactor = redactor
        self.chains: dict[str, Chain] = {}
        self.starts: dict[str, RunStart] = {}

    def commit(self, chains: dict[str, Chain], ended: Iterable[str]) -> None:
        """Adopt the chain heads of a committed batch; forget runs that ended."""
        self.chains.update(chains)
        for run_id in ended:
            self.chains.pop(run_id, None)
            self.starts.pop(run_id, None)

    def chain(self, run_id: str, chains: dict[str, Chain]) -> Chain:
        chain = chains.get(run_id)
        if chain is None:
            committed = self.chains.get(run_id)
            chain = Chain(run_id)
            if committed is not None:
                chain.count, chain.head = committed.count, committed.head
            elif run_id not in self.starts:
                # A run this writer did not start: another writer (the writer process,
                # before this one took over from it) linked its first events.
                stored = self.store.events(run_id)
                if stored:
                    chain.count, chain.head = stored[-1].chain_index + 1, stored[-1].hash
            chains[run_id] = chain
        return chain

    def event(self, p: PendingEvent, chains: dict[str, Chain]) -> Event:
        (
            run_id,
            seq,
            kind,
            name,
            key,
            parent,
            call_site,
            req,
            resp,
            tagged,
            err,
            side_effect,
            started_at,
            duration_ns,
            meta,
        ) = p
        if tagged.__class__ is str:  # raw parts, for the builder ``tagged`` names
            req, resp, tagged, meta = expand(tagged, kind, name, req, resp, meta)
        redactor = self.redactor
        if resp is None:
            if redactor.needs_redaction(req):
                req = redactor.redact_bytes(req)
            response = None
        else:
            # One scan over both (most hold no secret); a hit checks each on its own.
            if redactor.needs_redaction(req + resp):
                req = redactor.redact_bytes(req)
                resp = redactor.redact_bytes(resp)
            response = resp.decode()
        request = req.decode()
        error = None if err is None else redactor.redact_bytes(err).decode()
        fp = fingerprint(kind, name, req)
        metadata = self._metadata(meta) if meta else {}
        encoding = "tagged" if tagged else "json"
        chain = self.chain(run_id, chains)
        prev = chain.head
        index = chain.count
        digest = self.hash(
            prev,
            (
                run_id,
                seq,
                index,
                kind,
                name,
                key,
                parent,
                call_site,
                request,
                fp,
                response,
                encoding,
                error,
                side_effect,
                started_at,
                duration_ns,
                metadata,
                SCHEMA_VERSION,
            ),
        )
        chain.count = index + 1
        chain.head = digest
        return Event(
            run_id=run_id,
            seq=seq,
            kind=kind,
            name=name,
            key=key,
            parent=parent,
            call_site=call_site,
            request=request,
            fingerprint=fp,
            response=response,
            encoding=encoding,
            error=error,
            side_effect=side_effect,
            started_at=started_at,
            duration_ns=duration_ns,
            metadata=metadata,
            chain_index=index,
            prev_hash=prev,
            hash=digest,
        )

    def hash(self, prev: str, fields: tuple[Any, ...]) -> str:
        """An event's link: the hash of its fields after ``prev`` (the run's chain head).

        The one place the writer hashes an event.
        """
        return chain_hash(prev, fields)

    def _metadata(self, meta: dict[str, Any]) -> dict[str, Any]:
        """An event's metadata as JSON values, with secrets redacted: an LLM call's
        metadata repeats its messages and output, which may hold what the request did."""
        try:
            data = canonical(meta)
        except TypeError:  # an SDK may pass a class (a response_format), say
            data = encode_request(meta)
            meta = orjson.loads(data)
        if self.redactor.needs_redaction(data):
            redacted: dict[str, Any] = self.redactor(orjson.loads(data))
            return redacted
        return meta

    def start(self, start: RunStart) -> RunStart:
        redacted = self.redactor.redact_bytes(start.input.encode()).decode()
        # Run metadata is stored and indexed as given, so a secret in it (an
        # ``api_key`` tag) must be caught here like one in the input.
        metadata = start.metadata
        try:
            if metadata and self.redactor.needs_redaction(canonical(metadata)):
                metadata = self.redactor(metadata)
        except TypeError:
            pass  # not JSON: the store refuses it with its own error
        if redacted == start.input and metadata is start.metadata:
            return start
        return msgspec.structs.replace(start, input=redacted, metadata=metadata)

    def end(
        self, item: tuple[str, str, bytes | None, bytes | None, float], chains: dict[str, Chain]
    ) -> RunEnd:
        run_id, status, output, error, ended_at = item
        chain = self.chain(run_id, chains)
        redact = self.redactor.redact_bytes
        out = None if output is None else redact(output).decode()
        err = None if error is None else redact(error).decode()
        start = self.starts.get(run_id) or self.store.get_run(run_id).start
        return RunEnd(
            run_id=run_id,
            status=status,  # type: ignore[arg-type]
            output=out,
            error=err,
            ended_at=ended_at,
            event_count=chain.count,
            last_hash=run_seal(chain.head, start, status, out, err, ended_at, chain.count),
        )
