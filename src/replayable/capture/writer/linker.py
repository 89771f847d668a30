"""Turning hand-offs into store records: redaction, fingerprints, hash chains, seals.

The writer thread owns one :class:`Linker` per store. It keeps each open run's
chain head and count, and the start record its end record is sealed with.
Chains advance only when a batch is committed (``commit``), so a batch built
again after a failure links the same way.

With a chain key configured (:class:`~replayable.store.integrity.Integrity`)
links and seals are HMAC-SHA256 and each seal is signed with Ed25519; with an
anchor, each batch's starts, chain heads and seals are published to it. All of
it happens here, on the writer's side: the agent's hot path does no crypto.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from replayable.capture.writer.deferred import expand
from replayable.errors import ConfigurationError, RunNotFoundError
from replayable.events.canonical import canonical
from replayable.events.chain import (
    ChainFormatError,
    ChainKey,
    chain_label,
    genesis,
    parse_chain,
    seal_for,
    seal_message,
)
from replayable.events.codec import encode_request
from replayable.events.model import (
    EVENT_SCHEMA_VERSION,
    SCHEMA_VERSION,
    SEALED_EVENT_VERSION,
    SEALED_SCHEMA_VERSION,
    Event,
    RunEnd,
    RunStart,
)
from replayable.events.redaction import Redactor
from replayable.store.integrity import Integrity, anchor_entry, start_anchor_fields

if TYPE_CHECKING:
    from replayable.store.base import EventStore

log = logging.getLogger("replayable")

_sha256 = hashlib.sha256


def _builtin_sha256() -> Any:
    """The interpreter's own SHA-256 (``_sha256``, ``_sha2`` from 3.12): no OpenSSL
    context to set up, so cheaper for a payload of one block; OpenSSL's where absent."""
    for module in ("_sha256", "_sha2"):
        try:
            return importlib.import_module(module).sha256
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256  # pragma: no cover - a build without them


_one_block = _builtin_sha256()
#: Up to this many bytes fit one SHA-256 block with its padding: hashed there, they
#: cost about two thirds of OpenSSL's call; longer ones go to OpenSSL.
_ONE_BLOCK = 55
_dumps = orjson.dumps
_SORT = orjson.OPT_SORT_KEYS
#: ``kind NUL name NUL``, the prefix of a fingerprint's input, per boundary (bounded).
_PREFIXES: dict[tuple[str, str], bytes] = {}


def _prefix(kind: str, name: str) -> bytes:
    prefix = f"{kind}\x00{name}\x00".encode()
    if len(_PREFIXES) < 4096:
        _PREFIXES[(kind, name)] = prefix
    return prefix


def _warn(message: str) -> None:
    # On the writer thread: a warnings filter set to "error" must not stop it.
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Exception:
        log.warning(message)


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
    __slots__ = ("count", "head", "key", "seen")

    def __init__(self, run_id: str, key: ChainKey | None) -> None:
        self.key = key
        self.count = 0
        self.head = genesis(key, run_id)
        #: An adopting linker's record of the seqs the run holds (stored or linked).
        self.seen: set[int] | None = None


#: Anchor entries waiting for an anchor that failed are kept, up to this many.
_MAX_ANCHOR_BACKLOG = 100_000


class Linker:
    """Builds events, start and end records for one store's writer."""

    def __init__(
        self,
        store: EventStore,
        redactor: Redactor,
        integrity: Integrity | None = None,
        *,
        adopt: bool = False,
    ) -> None:
        self.store = store
        #: Taking over from a writer that died: every run may have stored events already,
        #: and a record may be handed over twice; each seq is linked once.
        self.adopt = adopt
        self.redactor = redactor
        self.integrity = integrity if integrity is not None else Integrity.from_env()
        self.chains: dict[str, Chain] = {}
        self.starts: dict[str, RunStart] = {}
        self._anchoring: dict[tuple[str, str], dict[str, Any]] = {}
        self._anchor_backlog: list[dict[str, Any]] = []
        self._anchor_failed = False
        self._store_id: str | None = None
        #: Whether the store encrypts payloads (see ``_sealed``), once known.
        self._seals: bool | None = None

    def _sealed(self) -> bool:
        """Whether the store encrypts payloads: its records are then written in the
        formats that hash the values it encrypts by their sha256, so that they still
        verify once erased. A store not reached yet (an outage at start) is not opened
        for this: it will encrypt as the environment's data keys say."""
        found = self._seals
        if found is not None:
            return found
        store = self.store
        if not getattr(store, "opened", True):
            from replayable.store.crypto import data_keys_from_env

            try:
                wrapper = data_keys_from_env(getattr(store, "data_env", None))
            except Exception:
                return False  # the store refuses the same setting when it opens
            return wrapper is not None and wrapper.current_kek() is not None
        tier = getattr(store, "tier", None)
        found = self._seals = tier is not None and tier.seal is not None
        return found

    def commit(self, chains: dict[str, Chain], ended: Iterable[str]) -> None:
        """Adopt the chain heads of a committed batch; forget runs that ended."""
        self.chains.update(chains)
        if self.integrity.anchor is not None:
            self._anchor(chains)
        for run_id in ended:
            self.chains.pop(run_id, None)
            self.starts.pop(run_id, None)

    def _key_of(self, start: RunStart | None) -> ChainKey | None:
        """The key a run is chained with: the one its start record names."""
        if start is None:
            return self.integrity.current_key()
        try:
            fmt = parse_chain(start.chain)
        except ChainFormatError:
            return None
        if fmt.key_id is None:
            return None
        key = self.integrity.key(fmt.key_id)
        if key is None:
            # The run was started under a key this writer does not hold: its events
            # cannot be linked so that they verify, and saying so beats a silent break.
            raise ConfigurationError(
                f"run {start.run_id} is chained with key {fmt.key_id!r}, which is not "
                "configured for this writer"
            )
        return key

    def chain(self, run_id: str, chains: dict[str, Chain]) -> Chain:
        chain = chains.get(run_id)
        if chain is None:
            committed = self.chains.get(run_id)
            if committed is not None:
                chain = Chain.__new__(Chain)
                chain.key, chain.count, chain.head = committed.key, committed.count, committed.head
                chain.seen = None if committed.seen is None else set(committed.seen)
            elif run_id in self.starts and not self.adopt:
                chain = Chain(run_id, self._key_of(self.starts[run_id]))
            else:
                # A run this writer did not start: another writer (the writer process,
                # before this one took over from it) linked its first events.
                start: RunStart | None = self.starts.get(run_id)
                if start is None:
                    try:
                        start = self.store.get_run(run_id).start
                    except RunNotFoundError:
                        start = None
                chain = Chain(run_id, self._key_of(start))
                stored = self.store.events(run_id)
                if stored:
                    chain.count, chain.head = stored[-1].chain_index + 1, stored[-1].hash
                if self.adopt:
                    chain.seen = {e.seq for e in stored}
            chains[run_id] = chain
        return chain

    # -- anchoring ---------------------------------------------------------------------

    def _queue_anchor(
        self, kind: str, run_id: str, key: ChainKey | None, start: RunStart | None, **fields: Any
    ) -> None:
        if self.integrity.anchor is None:
            return
        if self._store_id is None:
            self._store_id = self.store.store_id()
        tenant = self.store.row_tenant(start) if start is not None else None
        self._anchoring[(kind, run_id)] = anchor_entry(
            key, kind, self._store_id, tenant, run_id, **fields
        )

    def _anchor(self, chains: dict[str, Chain]) -> None:
        anchor = self.integrity.anchor
        assert anchor is not None
        for run_id, chain in chains.items():
            if chain.count:
                self._queue_anchor(
                    "head",
                    run_id,
                    chain.key,
                    self.starts.get(run_id),
                    count=chain.count,
                    head=chain.head,
                )
        entries = [*self._anchor_backlog, *self._anchoring.values()]
        self._anchoring.clear()
        if not entries:
            return
        # Starts first: a reader never meets a seal for a run it has not seen begin.
        order = {"start": 0, "head": 1, "seal": 2}
        entries.sort(key=lambda e: order.get(e["type"], 3))
        try:
            anchor.publish(entries)
        except Exception as exc:
            # The store write goes on; the entries wait for the anchor to come back.
            self._anchor_backlog = entries[-_MAX_ANCHOR_BACKLOG:]
            if not self._anchor_failed:
                self._anchor_failed = True
                _warn(f"replayable: cannot publish to anchor {anchor.url}: {exc}")
            return
        self._anchor_backlog = []
        self._anchor_failed = False

    def event(self, p: PendingEvent, chains: dict[str, Chain], clean: bool = False) -> Event | None:
        """The event for hand-off ``p``, linked after its run's chain head; ``None`` for
        a seq an adopting linker has stored or linked already. ``clean``: its request,
        response and error bytes were scanned already (``clean_events``) and hold no
        secret."""
        if self.adopt:
            seen = self.chain(p[0], chains).seen
            if seen is not None:
                if p[1] in seen:
                    return None
                seen.add(p[1])
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
            clean = False
        if clean:
            error = None if err is None else err.decode()
        else:
            redactor = self.redactor
            if resp is None:
                if redactor.needs_redaction(req):
                    req = redactor.redact_bytes(req)
            # One scan over both (most hold no secret); a hit checks each on its own.
            elif redactor.needs_redaction(req + resp):
                req = redactor.redact_bytes(req)
                resp = redactor.redact_bytes(resp)
            error = None if err is None else redactor.redact_bytes(err).decode()
        prefix = _PREFIXES.get((kind, name))
        if prefix is None:
            prefix = _prefix(kind, name)
        fp = _sha256(prefix + req).hexdigest()
        metadata = self._metadata(meta) if meta else {}
        sealed = self._seals
        if sealed is None:
            sealed = self._sealed()
        if sealed:
            version = SEALED_EVENT_VERSION
            hashed_error = None if error is None else _sha256(error.encode()).hexdigest()
            hashed_meta: Any = _sha256(canonical(metadata)).hexdigest()
        else:
            version, hashed_error, hashed_meta = EVENT_SCHEMA_VERSION, error, metadata
        encoding = "tagged" if tagged else "json"
        chain = chains.get(run_id)
        if chain is None:
            chain = self.chain(run_id, chains)
        prev = chain.head
        index = chain.count
        data = _dumps(
            (
                run_id,
                seq,
                index,
                kind,
                name,
                key,
                parent,
                call_site,
                # Version 2 events hash their payloads' sha256 (canonical.event_fields),
                # version 3 their error's and metadata's too.
                (_one_block if len(req) <= _ONE_BLOCK else _sha256)(req).hexdigest(),
                fp,
                None
                if resp is None
                else (_one_block if len(resp) <= _ONE_BLOCK else _sha256)(resp).hexdigest(),
                encoding,
                hashed_error,
                side_effect,
                started_at,
                duration_ns,
                hashed_meta,
                version,
            ),
            option=_SORT,
        )
        ckey = chain.key
        if ckey is None:
            digest = _sha256(prev.encode() + data).hexdigest()
        else:
            digest = ckey.mac(prev.encode() + data)
        chain.count = index + 1
        chain.head = digest
        # Positional: the fields in ``Event``'s order (keywords cost a lookup each).
        return Event(
            run_id,
            seq,
            kind,
            name,
            key,
            parent,
            call_site,
            req.decode(),
            fp,
            None if resp is None else resp.decode(),
            encoding,
            error,
            side_effect,
            started_at,
            duration_ns,
            metadata,
            index,
            prev,
            digest,
            version,
        )

    def events(
        self,
        pendings: list[PendingEvent],
        chains: dict[str, Chain],
        clean: bool,
        clean_ids: set[int],
        refuse: Callable[[PendingEvent, Exception], None],
    ) -> list[Event]:
        """The events of many buffered hand-offs, in order: what ``event`` builds for each,
        with the common case (scanned clean, no metadata, raw bytes, a plain store) built
        in this one loop, without a call per event. ``clean``: all of them were found
        clean; else ``clean_ids`` holds the ids of those that were. A hand-off that
        cannot be built goes to ``refuse`` (which may raise, to stop the batch)."""
        out: list[Event] = []
        add = out.append
        one = self.event
        if self.adopt or (self._seals is not False and self._sealed()):
            for p in pendings:
                try:
                    built = one(p, chains, clean or id(p) in clean_ids)
                except Exception as exc:
                    refuse(p, exc)
                    continue
                if built is not None:
                    add(built)
            return out
        prefixes = _PREFIXES
        sha, small, dumps, sort = _sha256, _one_block, _dumps, _SORT
        version = EVENT_SCHEMA_VERSION
        current: str | None = None
        chain: Chain | None = None
        last_kind: str | None = None
        last_name: str | None = None
        prefix = b""
        for p in pendings:
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
            try:
                if (
                    meta
                    or tagged.__class__ is str
                    or not (clean or id(p) in clean_ids)
                    or req.__class__ is not bytes
                ):
                    built = one(p, chains, clean or id(p) in clean_ids)
                    if built is not None:
                        add(built)
                    current = None  # ``one`` may have made the run's chain
                    continue
                if run_id != current or chain is None:
                    chain = chains.get(run_id)
                    if chain is None:
                        chain = self.chain(run_id, chains)
                    current = run_id
                if kind != last_kind or name != last_name:
                    # Runs of one boundary are the rule: no key to hash for each event.
                    found = prefixes.get((kind, name))
                    prefix = _prefix(kind, name) if found is None else found
                    last_kind, last_name = kind, name
                fp = sha(prefix + req).hexdigest()
                error = None if err is None else err.decode()
                prev = chain.head
                index = chain.count
                data = dumps(
                    (
                        run_id,
                        seq,
                        index,
                        kind,
                        name,
                        key,
                        parent,
                        call_site,
                        (small if len(req) <= _ONE_BLOCK else sha)(req).hexdigest(),
                        fp,
                        None
                        if resp is None
                        else (small if len(resp) <= _ONE_BLOCK else sha)(resp).hexdigest(),
                        "tagged" if tagged else "json",
                        error,
                        side_effect,
                        started_at,
                        duration_ns,
                        {},
                        version,
                    ),
                    option=sort,
                )
                ckey = chain.key
                if ckey is None:
                    digest = sha(prev.encode() + data).hexdigest()
                else:
                    digest = ckey.mac(prev.encode() + data)
                chain.count = index + 1
                chain.head = digest
            except Exception as exc:
                refuse(p, exc)
                current = None
                continue
            add(
                Event(
                    run_id,
                    seq,
                    kind,
                    name,
                    key,
                    parent,
                    call_site,
                    req.decode(),
                    fp,
                    None if resp is None else resp.decode(),
                    "tagged" if tagged else "json",
                    error,
                    side_effect,
                    started_at,
                    duration_ns,
                    {},
                    index,
                    prev,
                    digest,
                    version,
                )
            )
        return out

    def clean_events(self, pendings: list[PendingEvent]) -> bool:
        """Whether none of these hand-offs' request, response and error bytes holds a
        secret, found by one scan over them all (see ``Redactor.needs_redaction_any``);
        ``False`` also when one of them is not plain bytes (a deferred event)."""
        parts: list[bytes] = []
        add = parts.append
        for p in pendings:
            req, resp, tagged, err = p[7], p[8], p[9], p[10]
            if tagged.__class__ is str or req.__class__ is not bytes:
                return False
            add(req)
            if resp is not None:
                if resp.__class__ is not bytes:
                    return False
                add(resp)
            if err is not None:
                if err.__class__ is not bytes:
                    return False
                add(err)
        return not self.redactor.needs_redaction_any(parts)

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
        if redacted != start.input or metadata is not start.metadata:
            start = msgspec.structs.replace(start, input=redacted, metadata=metadata)
        if self._sealed() and start.schema_version < SEALED_SCHEMA_VERSION:
            start = msgspec.structs.replace(start, schema_version=SEALED_SCHEMA_VERSION)
        key = self.integrity.current_key()
        if key is not None:
            start = msgspec.structs.replace(start, chain=chain_label(key, start))
        self._queue_anchor("start", start.run_id, key, start, **start_anchor_fields(start))
        return start

    def end(
        self, item: tuple[str, str, bytes | None, bytes | None, float], chains: dict[str, Chain]
    ) -> RunEnd:
        run_id, status, output, error, ended_at = item
        chain = self.chain(run_id, chains)
        redact = self.redactor.redact_bytes
        out = None if output is None else redact(output).decode()
        err = None if error is None else redact(error).decode()
        start = self.starts.get(run_id) or self.store.get_run(run_id).start
        key = chain.key
        version = SEALED_SCHEMA_VERSION if self._sealed() else SCHEMA_VERSION
        seal = seal_for(
            key, chain.head, start, status, out, err, ended_at, chain.count, version=version
        )
        self._queue_anchor("seal", run_id, key, start, count=chain.count, seal=seal)
        return RunEnd(
            run_id=run_id,
            status=status,  # type: ignore[arg-type]
            output=out,
            error=err,
            ended_at=ended_at,
            event_count=chain.count,
            last_hash=seal,
            schema_version=version,
            signature=None if key is None else key.sign(seal_message(run_id, seal)),
        )
