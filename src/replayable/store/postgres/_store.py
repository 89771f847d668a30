"""The production store: PostgreSQL, append-only by privilege and trigger, one tenant per store."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import threading
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

import msgspec
import orjson
import psycopg
from psycopg.types.string import BytesBinaryDumper

from replayable.errors import (
    ConfigurationError,
    RunNotFoundError,
    StoreError,
    StoreRefusedError,
)
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store._tier_sql import TierReads, blob_rows
from replayable.store.base import EventStore, RunFilter, check_range, tag_value
from replayable.store.cold import (
    PART_INDEX_SQL,
    PENDING_PARTS_SQL,
    ArchivedRun,
    ArchivePart,
    ColdReader,
    PurgedDigest,
    PurgeRow,
    purged_notice,
)
from replayable.store.crypto import ErasureRow, KeyRow, enable_encryption
from replayable.store.payloads import (
    SUBJECT_KEY,
    BlobRow,
    NodeRow,
    PayloadTier,
    TierRows,
    epoch_spaces,
    kept_runs,
    split_space,
)
from replayable.store.postgres._audit import PostgresAudit
from replayable.store.postgres._connect import connect, parse_url, raise_store_error
from replayable.store.postgres._schema import LATEST_VERSION, check_version, current_version
from replayable.store.postgres._schema import upgrade as run_upgrade
from replayable.store.rows import event_from_row, run_from_row
from replayable.store.search import EventQuery, SearchPage

__all__ = ["PostgresStore"]

_RUN_COLS = (
    "r.run_id::text, r.workflow, r.entrypoint, r.parent_run_id::text, r.parent_seq, "
    "r.root_run_id::text, r.record_tenant, r.input_text, r.metadata_text, r.code_text, "
    "r.env_hash, r.lineage_text, r.started_at, r.schema_version, r.chain, "
    "e.run_id::text, e.status, e.output_text, e.error_text, e.ended_at, e.event_count, "
    "e.last_hash, e.schema_version, e.signature"
)
_SELECT_RUNS = f"SELECT {_RUN_COLS} FROM runs r LEFT JOIN run_ends e ON e.run_id = r.run_id"
_EVENT_COLS = (
    "run_id::text, sequence, event_type, name, key, parent, call_site, request_text, "
    "fingerprint, response_text, encoding, error_text, side_effect, timestamp_utc, "
    "duration_ns, metadata_text, chain_index, prev_hash, hash, schema_version"
)
#: The event columns and the references of payloads in the blob tier.
_EVENT_ROW_COLS = _EVENT_COLS + ", request_ref, response_ref"
_STAGE_COLS = (
    "run_id, parent_run_id, sequence, event_type, name, key, parent, call_site, request_text, "
    "fingerprint, response_text, encoding, error_text, side_effect, timestamp_utc, duration_ns, "
    "metadata_text, chain_index, prev_hash, hash, schema_version, tenant, request_ref, "
    "response_ref"
)
#: The binary COPY's type of each staged column. A UUID travels as its 16 bytes, which
#: is its binary form: dumped as ``bytea`` from bytes computed once per run.
_STAGE_TYPES = (
    "bytea", "bytea", "int4", "text", "text", "text", "int4", "text", "text", "text",
    "text", "text", "text", "bool", "float8", "int8", "text", "int4", "text", "text",
    "int4", "text", "text", "text",
)  # fmt: skip
_STAGE_TABLE = """
CREATE TEMP TABLE IF NOT EXISTS replayable_stage_events (
    run_id UUID, parent_run_id UUID, sequence INTEGER, event_type TEXT, name TEXT, key TEXT,
    parent INTEGER, call_site TEXT, request_text TEXT, fingerprint TEXT, response_text TEXT,
    encoding TEXT, error_text TEXT, side_effect BOOLEAN, timestamp_utc DOUBLE PRECISION,
    duration_ns BIGINT, metadata_text TEXT, chain_index INTEGER, prev_hash TEXT, hash TEXT,
    schema_version INTEGER, tenant TEXT, request_ref TEXT, response_ref TEXT
) ON COMMIT DELETE ROWS
"""
_INSERT_RUN = (
    "INSERT INTO runs (run_id, workflow, entrypoint, parent_run_id, parent_seq, root_run_id, "
    "tenant, record_tenant, input_text, metadata_text, tags, code_text, env_hash, lineage_text, "
    "started_at, schema_version, chain) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_INSERT_END = (
    "INSERT INTO run_ends (run_id, tenant, status, output_text, error_text, ended_at, "
    "event_count, last_hash, schema_version, signature) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_RUN_INFO_CACHE = 100_000
#: A batch claims its digest first; a retried batch finds it taken and writes nothing.
_CLAIM_BATCH = "INSERT INTO batches (tenant, digest) VALUES (%s, %s) ON CONFLICT DO NOTHING"
#: The same, buffered: ``synchronous_commit`` off for this transaction (``SET LOCAL``) in the
#: same statement, so a buffered batch costs no round trip more than a durable one.
_CLAIM_BATCH_BUFFERED = (
    "INSERT INTO batches (tenant, digest) SELECT %s, %s "
    "WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL ON CONFLICT DO NOTHING"
)


class _BlobsDropped(Exception):
    """A blob drop committed since the batch was split: it is rolled back and retried."""


def _dumps(value: Any) -> str:
    if not value and type(value) is dict:
        return "{}"  # most events carry no metadata
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


#: An event row whose payloads the archive dropped from the hot store (an archived
#: run's rows; a recorded event always has a request other than JSON null, or a response).
DROPPED_EVENT = (
    "e.request_text = 'null' AND e.response_text IS NULL AND e.request_ref IS NULL "
    "AND e.response_ref IS NULL"
)


def _packed() -> None:
    return None


def _is_uuid(text: str | None) -> bool:
    if text is None:
        return True
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def run_tags(metadata: dict[str, Any]) -> list[str]:
    """The indexed ``key=value`` tags of run metadata (the key JSON-quoted, so '=' is safe)."""
    tags = []
    for key, value in metadata.items():
        if isinstance(value, dict | list):
            continue
        text = tag_value(value)
        quoted = orjson.dumps(key).decode()
        tags.append(quoted if text is None else f"{quoted}={text}")
    return tags


#: The integer columns of an event, all PostgreSQL ``INTEGER``.
_INT4_FIELDS = ("seq", "parent", "chain_index", "schema_version")
#: ``array("i")`` holds C ints, which are 32 bits wherever Python runs.
assert array("i").itemsize == 4


def _check_integers(events: Sequence[Event], seqs: list[int]) -> str | None:
    """What is wrong with an integer of ``events`` PostgreSQL's INTEGER cannot hold, if any.

    Binary COPY writes an ``int4`` by truncating the Python int (2**32 + 3 would be
    stored as 3), so the range is checked before, a C-level pass per column.
    """
    try:
        array("i", seqs)
        array("i", [e.chain_index for e in events])
        array("i", [p for e in events if (p := e.parent) is not None])
        array("i", {e.schema_version for e in events})
    except (TypeError, OverflowError) as exc:
        for e in events:
            for name in _INT4_FIELDS:
                value = getattr(e, name)
                if value is None and name == "parent":
                    continue
                if not isinstance(value, int) or not -(2**31) <= value < 2**31:
                    return f"event {e.seq!r} of run {e.run_id}: {name} {value!r} is not an INTEGER"
        return f"an integer PostgreSQL's INTEGER cannot hold ({exc})"
    return None


def _bad_value(e: Event | None, exc: BaseException) -> str:
    """Which value of ``e`` binary COPY could not encode, for the refusal's message."""
    if e is None:
        return str(exc)
    where = f"event {e.seq!r} of run {e.run_id}"
    for name in (
        *("kind", "name", "request", "fingerprint", "encoding", "prev_hash", "hash"),
        *("key", "call_site", "response", "error"),
    ):
        value = getattr(e, name)
        if value is None and name in ("key", "call_site", "response", "error"):
            continue
        if not isinstance(value, str):
            return f"{where}: {name} is {type(value).__name__}, not text"
        try:
            value.encode()
        except UnicodeEncodeError as bad:
            return f"{where}: {name} is not UTF-8 text ({bad.reason} at {bad.start})"
    if not isinstance(e.started_at, int | float):
        return f"{where}: started_at {e.started_at!r} is not a number"
    if type(e.duration_ns) is not int or not -(2**63) <= e.duration_ns < 2**63:
        return f"{where}: duration_ns {e.duration_ns!r} is not a BIGINT"
    try:
        _dumps(e.metadata)
    except TypeError as bad:
        return f"{where}: metadata is not JSON ({bad})"
    return f"{where}: {exc}"


class PostgresStore(PostgresAudit, TierReads, EventStore):
    """Runs in a PostgreSQL schema. ``tenant`` scopes every read and write (row-level security).

    Open one with ``open_store("postgresql://user@host/db?tenant=acme")`` or
    ``PostgresStore(url, tenant="acme")``. The schema is created or upgraded on
    open unless ``migrate=False`` (then run ``replayable db upgrade``);
    ``create=False`` refuses a schema that holds no store yet.
    """

    def __init__(
        self,
        url: str,
        *,
        tenant: str | None = None,
        schema: str | None = None,
        migrate: bool | None = None,
        create: bool = True,
    ) -> None:
        target = parse_url(url)
        self._create = create
        changes: dict[str, Any] = {}
        if tenant is not None:
            changes["tenant"] = tenant or None
        if schema is not None:
            changes["schema"] = schema
        if migrate is not None:
            changes["migrate"] = migrate
        if changes:
            target = dataclasses.replace(target, **changes)
        self.target = target
        self.tenant = target.tenant
        self.url = target.display
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._write_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._read_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._run_info: dict[str, tuple[str | None, str | None]] = {}
        self.tier = PayloadTier()
        self._space_cache: dict[str, str] = {}
        self._tier_generation: int | None = None
        self._staged = False
        self._direct: bool | None = None
        self._closed = False
        try:
            self._prepare_schema()
            if self.tenant is None:
                self.tenant = self._only_writable_tenant()
            enable_encryption(self)
            self.cold = ColdReader(self)
        except BaseException:
            self.close()
            raise

    def connect_url(self) -> str:
        return self.target.url()

    # -- connections -----------------------------------------------------------

    def _conn(self, write: bool) -> psycopg.Connection[tuple[Any, ...]]:
        if self._closed:
            raise StoreError(f"{self.url} is closed")
        conn = self._write_conn if write else self._read_conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = connect(self.target)
            if write:
                self._write_conn = conn
                self._staged = False
                self._direct = None
            else:
                self._read_conn = conn
        return conn

    def _prepare_schema(self) -> None:
        with self._write_lock:
            conn = self._conn(write=True)
            where = f"{self.url} (schema {self.target.schema!r})"
            try:
                version = current_version(conn, self.target.schema)
                check_version(version, where)
                if version == LATEST_VERSION:
                    return
                if version is None and not self._create:
                    raise StoreError(f"no store at {where}; record a run first or check the URL")
                if not self.target.migrate:
                    raise StoreError(
                        f"{where} is at schema version {version or 0}, this replayable needs "
                        f"{LATEST_VERSION}; run `replayable db upgrade`"
                    )
                run_upgrade(conn, self.target.schema, where)
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "preparing the schema")

    def _only_writable_tenant(self) -> str | None:
        """The login's one writable tenant when the URL names none (None if several or none).

        So ``postgresql://acme_agent@db/agents`` records for tenant acme once
        ``replayable db grant-tenant acme_agent acme --write`` was run.

        The table owner is not bound by the tenant policies and keeps writing
        runs without a tenant.
        """
        with self._read_lock:
            conn = self._conn(write=False)
            try:
                row = conn.execute(
                    "SELECT row_security_active('runs'), session_tenants(true)"
                ).fetchone()
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "reading the login's tenants")
        if row is None or not row[0] or len(row[1]) != 1 or not row[1][0]:
            return None
        # Writes go to that tenant; reads still show every tenant the login may read.
        return str(row[1][0])

    def upgrade(self) -> list[int]:
        """Apply missing migrations; returns the versions applied."""
        with self._write_lock:
            try:
                return run_upgrade(self._conn(write=True), self.target.schema, self.url)
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "upgrading the schema")

    def schema_version(self) -> int | None:
        """The schema version of the database (``None`` when it holds no store)."""
        with self._read_lock:
            try:
                return current_version(self._conn(write=False), self.target.schema)
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "reading the schema version")

    # -- writing ----------------------------------------------------------------

    def append(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
    ) -> None:
        if not (starts or events or ends):
            return
        tier_rows = TierRows()
        tier = self.tier
        given_starts, given_ends = starts, ends
        if tier.seal is not None and (starts or ends):
            # Encrypting: the run records' input, output and error go to the tier too.
            spaces = self._tier_tenants(
                {s.run_id for s in starts} | {r.run_id for r in ends}, starts
            )
            starts, ends = tier.seal_runs(self, starts, ends, spaces.__getitem__, tier_rows)
        run_rows = [self._run_row(s) for s in starts]
        run_ids = {e.run_id for e in events}
        for run_id in run_ids - self._run_info.keys():
            if not _is_uuid(run_id):
                raise ConfigurationError(f"event run id {run_id!r} is not a UUID")
        for end in ends:
            if not _is_uuid(end.run_id):
                raise ConfigurationError(f"end record run id {end.run_id!r} is not a UUID")
        # The batch's digest makes a retry idempotent: a batch whose COMMIT went
        # through but was never acknowledged is found in ``batches`` and skipped.
        # An event stands in it by its key and its hash, which covers its content:
        # encoding every event again cost as much as a tenth of the batch's write.
        # Flat lists rather than a tuple per event, and BLAKE2b, which hashes them in
        # half sha256's time here (the digest is a key, the chain's hashes stay sha256).
        seqs = [e.seq for e in events]
        digest = hashlib.blake2b(
            msgspec.msgpack.encode(
                [
                    self.tenant,
                    given_starts,
                    [e.run_id for e in events],
                    seqs,
                    [e.hash for e in events],
                    given_ends,
                ]
            ),
            digest_size=32,
        ).hexdigest()
        problem = _check_integers(events, seqs)
        if problem is not None:
            raise StoreRefusedError(f"writing a batch in {self.url} failed: {problem}")
        split: Iterable[tuple[Event, str | None, str | None]]
        packed: Callable[[], None] = _packed
        if tier.any_tiered(events):
            tenants = self._tier_tenants(run_ids, starts)
            split = tier.split_events(self, events, tenants.__getitem__, tier_rows, pack=False)
            # Compressed while this thread sends the event rows; the blobs follow them.
            packed = tier.pack_in_background(self, tier_rows)
        else:
            split = zip(events, repeat(None), repeat(None))
        if tier_rows.pending:  # the run records' values, in a batch without events
            tier.pack_in_background(self, tier_rows)()
        # A batch that may reference the tier's blobs checks, in its transaction, that no
        # blob drop ran since this object last looked (``drop_archived_blobs``).
        tiered = tier.any_tiered(events) or (tier.seal is not None and bool(starts or ends))
        with self._write_lock:
            conn = self._conn(write=True)
            try:
                with conn.transaction():
                    cur = conn.execute(
                        _CLAIM_BATCH if durable else _CLAIM_BATCH_BUFFERED,
                        (self._batch_tenant(starts, events, ends), digest),
                    )
                    if cur.rowcount == 0:
                        packed()
                        return
                    if tiered and self._tier_changed(conn):
                        packed()
                        raise _BlobsDropped
                    with conn.cursor() as c:
                        if run_rows:
                            c.executemany(_INSERT_RUN, run_rows)
                        if events:
                            self._copy_events(conn, c, starts, split, run_ids)
                        # Left running if a statement fails: it only fills this batch's rows.
                        packed()
                        if tier_rows:
                            self._insert_tier(c, tier_rows)
                        if ends:
                            c.executemany(_INSERT_END, [self._end_row(r) for r in ends])
            except _BlobsDropped:
                # What this object remembers as stored may be gone: the batch is split
                # and sent again, with its blobs (the rolled back claim included).
                tier.forget_stored()
                retry = True
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "writing a batch")
            else:
                retry = False
        if retry:
            self.append(given_starts, events, given_ends, durable=durable)
            return
        for s in starts:
            self._remember(s.run_id, self._access_tenant(s), s.parent_run_id)
        if tier_rows:
            tier.committed(tier_rows)

    def _tier_changed(self, conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
        """Whether a blob drop committed since this object last looked (the generation
        is then taken as seen). Holds the drop lock, shared, until the batch commits."""
        row = conn.execute("SELECT tier_generation()").fetchone()
        generation = int(row[0]) if row else 0
        seen, self._tier_generation = self._tier_generation, generation
        return seen is not None and seen != generation

    def _batch_tenant(
        self, starts: Sequence[RunStart], events: Sequence[Event], ends: Sequence[RunEnd]
    ) -> str:
        """The tenant a batch's digest is kept under: the store's, else its first record's."""
        if self.tenant is not None:
            return self.tenant
        for s in starts:
            if s.tenant is not None:
                return s.tenant
        for run_id in [e.run_id for e in events[:1]] + [r.run_id for r in ends[:1]]:
            tenant = self._run_info.get(run_id, (None, None))[0]
            if tenant is not None:
                return tenant
        return ""

    def _access_tenant(self, start: RunStart) -> str | None:
        return self.tenant if self.tenant is not None else start.tenant

    def _run_row(self, s: RunStart) -> tuple[Any, ...]:
        for label, value in (
            ("run id", s.run_id),
            ("parent run id", s.parent_run_id),
            ("root run id", s.root_run_id),
        ):
            if not _is_uuid(value):
                raise ConfigurationError(
                    f"run {s.run_id!r}: {label} {value!r} is not a UUID in canonical form"
                )
        if self.tenant is not None and s.tenant not in (None, self.tenant):
            raise ConfigurationError(
                f"run {s.run_id} names tenant {s.tenant!r} but {self.url} writes for "
                f"tenant {self.tenant!r}"
            )
        return (
            s.run_id,
            s.workflow,
            s.entrypoint,
            s.parent_run_id,
            s.parent_seq,
            s.root_run_id,
            self._access_tenant(s),
            s.tenant,
            s.input,
            _dumps(s.metadata),
            run_tags(s.metadata),
            _dumps(s.code),
            s.env_hash,
            _dumps(s.lineage),
            s.started_at,
            s.schema_version,
            s.chain,
        )

    def _end_row(self, r: RunEnd) -> tuple[Any, ...]:
        tenant = self._run_info.get(r.run_id, (self.tenant, None))[0]
        return (
            r.run_id,
            tenant,
            r.status,
            r.output,
            r.error,
            r.ended_at,
            r.event_count,
            r.last_hash,
            r.schema_version,
            r.signature,
        )

    def _remember(self, run_id: str, tenant: str | None, parent: str | None) -> None:
        if len(self._run_info) >= _RUN_INFO_CACHE:
            self._run_info.clear()
        self._run_info[run_id] = (tenant, parent)

    def _copy_events(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        cur: psycopg.Cursor[tuple[Any, ...]],
        starts: Sequence[RunStart],
        events: Iterable[tuple[Event, str | None, str | None]],
        run_ids: set[str],
    ) -> None:
        info = self._run_info
        batch: dict[str, tuple[str | None, str | None]] = {
            s.run_id: (self._access_tenant(s), s.parent_run_id) for s in starts
        }
        unknown = list(run_ids - batch.keys() - info.keys())
        if unknown:
            found = cur.execute(
                "SELECT run_id::text, tenant, parent_run_id::text FROM runs "
                "WHERE run_id = ANY(%s::uuid[])",
                (unknown,),
            ).fetchall()
            for run_id, tenant, parent in found:
                batch[run_id] = (tenant, parent)
                self._remember(run_id, tenant, parent)
            hidden = sorted(set(unknown) - {row[0] for row in found})
            if hidden and self.tenant is not None:
                # Under a tenant, an event may only join a run that tenant can see.
                raise StoreError(
                    f"{self.url} has no run {hidden[0]} for tenant {self.tenant!r}; "
                    "a run's start record must be written before its events"
                )
        # Per run, once: its id and parent as the 16 bytes binary COPY sends, its tenant.
        runs: dict[str, tuple[bytes, bytes | None, str | None]] = {}
        for run_id in run_ids:
            tenant, parent_run = batch.get(run_id) or info.get(run_id) or (self.tenant, None)
            runs[run_id] = (
                uuid.UUID(run_id).bytes,
                None if parent_run is None else uuid.UUID(parent_run).bytes,
                tenant,
            )
        if self._direct is None:  # once per connection
            row = conn.execute("SELECT row_security_active('agent_execution_events')").fetchone()
            self._direct = not (row and row[0])
            # The binary dumper found by the bytea oid is psycopg's DB-API one, written in
            # Python; the plain one is compiled, and a Python call per row cost a tenth.
            conn.adapters.register_dumper(bytes, BytesBinaryDumper)
        if not self._direct and not self._staged:
            conn.execute(_STAGE_TABLE)
            self._staged = True
        # COPY cannot write through row-level security, so for a role the policies
        # apply to, rows land in a temporary table and INSERT … SELECT checks them.
        table = "agent_execution_events" if self._direct else "replayable_stage_events"
        with cur.copy(f"COPY {table} ({_STAGE_COLS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(_STAGE_TYPES)
            write = copy.write_row
            dumps = _dumps
            e: Event | None = None
            try:
                for e, request_ref, response_ref in events:
                    run_key, parent_key, tenant = runs[e.run_id]
                    metadata = e.metadata
                    write(
                        (
                            run_key,
                            parent_key,
                            e.seq,
                            e.kind,
                            e.name,
                            e.key,
                            e.parent,
                            e.call_site,
                            e.request,
                            e.fingerprint,
                            e.response,
                            e.encoding,
                            e.error,
                            e.side_effect,
                            e.started_at,
                            e.duration_ns,
                            dumps(metadata) if metadata or type(metadata) is not dict else "{}",
                            e.chain_index,
                            e.prev_hash,
                            e.hash,
                            e.schema_version,
                            tenant,
                            request_ref,
                            response_ref,
                        )
                    )
            except (TypeError, ValueError, OverflowError) as exc:
                # A value binary COPY cannot encode (a text that is not one, a surrogate,
                # a number too large): the batch is refused, naming the event.
                raise StoreRefusedError(
                    f"writing a batch in {self.url} failed: {_bad_value(e, exc)}"
                ) from exc
        if not self._direct:
            cur.execute(
                f"INSERT INTO agent_execution_events ({_STAGE_COLS}) "
                f"SELECT {_STAGE_COLS} FROM replayable_stage_events"
            )

    # -- the payload tier ----------------------------------------------------------

    def _tier_tenants(self, run_ids: set[str], starts: Sequence[RunStart]) -> dict[str, str]:
        """The key space each run's payloads are kept under ('' for none), in the epoch
        of it the run started in (see :func:`~replayable.store.payloads.epoch_space`)."""
        given = [
            (s.run_id, self._access_tenant(s), s.metadata.get(SUBJECT_KEY), s.started_at)
            for s in starts
        ]
        found: dict[str, str] = {}
        cache = self._space_cache
        unknown = []
        for rid in run_ids - {s.run_id for s in starts}:
            known = cache.get(rid)
            if known is None:
                unknown.append(rid)
            else:
                found[rid] = known
        valid = [r for r in unknown if _is_uuid(r)]
        stored: list[Any] = []
        if valid:
            stored = self.query(
                f"SELECT run_id::text, tenant, metadata->'{SUBJECT_KEY}', started_at FROM runs "
                "WHERE run_id = ANY(%s::uuid[])",
                (valid,),
            )
        if given or stored:
            spaces = epoch_spaces([*given, *stored], self.erasures)
            found.update(spaces)
            if len(cache) > 100_000:
                cache.clear()
            for row in stored:
                cache[row[0]] = spaces[row[0]]
        for rid in run_ids:
            found.setdefault(rid, self.tenant or "")
        return found

    def _insert_tier(self, cur: psycopg.Cursor[tuple[Any, ...]], rows: TierRows) -> None:
        # Arrays go in binary (%b): psycopg quotes each element of a text array with a
        # regular expression and the server parses it back, which cost as much as
        # five times the rest of writing a batch of small blobs.
        if rows.blobs:
            blobs = blob_rows(rows)
            cur.execute(
                "INSERT INTO payload_blobs (tenant, subject, digest, codec, data, size) "
                "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
                "%b::bytea[], %b::int4[]) ON CONFLICT DO NOTHING",
                [list(column) for column in zip(*blobs, strict=True)],
            )
        if rows.nodes:
            nodes = list(rows.nodes.values())
            cur.execute(
                "INSERT INTO payload_nodes (tenant, subject, digest, parent, body) "
                "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
                "%b::text[]) ON CONFLICT DO NOTHING",
                (
                    [split_space(n.tenant)[0] for n in nodes],
                    [split_space(n.tenant)[1] for n in nodes],
                    [n.digest for n in nodes],
                    [n.parent for n in nodes],
                    [n.body for n in nodes],
                ),
            )

    def tier_nodes(self, tenant: str, digests: Sequence[str]) -> list[NodeRow]:
        rows = self.query(
            "SELECT digest, parent, body FROM payload_nodes "
            "WHERE tenant = %s AND subject = %s AND digest = ANY(%s::text[])",
            (*split_space(tenant), list(digests)),
        )
        return [NodeRow(tenant, *r) for r in rows]

    def tier_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]:
        rows = self.query(
            "SELECT digest, codec, data, size FROM payload_blobs "
            "WHERE tenant = %s AND subject = %s AND digest = ANY(%s::text[])",
            (*split_space(tenant), list(digests)),
        )
        return [BlobRow(tenant, r[0], r[1], bytes(r[2]), r[3]) for r in rows]

    def tier_dictionary(self, tenant: str, dict_id: str | None) -> tuple[str, bytes] | None:
        if dict_id is None:
            rows = self.query(
                "SELECT dict_id, data FROM payload_dicts WHERE tenant = %s "
                "ORDER BY created_at DESC, dict_id DESC LIMIT 1",
                (tenant,),
            )
        else:
            rows = self.query(
                "SELECT dict_id, data FROM payload_dicts WHERE tenant = %s AND dict_id = %s",
                (tenant, dict_id),
            )
        return (str(rows[0][0]), bytes(rows[0][1])) if rows else None

    def tier_put_dictionary(self, tenant: str, dict_id: str, data: bytes, at: float) -> None:
        with self._write_lock:
            try:
                self._conn(write=True).execute(
                    "INSERT INTO payload_dicts (tenant, dict_id, created_at, data) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (tenant, dict_id, at, data),
                )
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "writing a dictionary")
        self.tier.forget_dictionaries()

    def _tier_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.query(sql.replace("?", "%s"), params)

    def put_key_rows(self, rows: Sequence[KeyRow]) -> None:
        with self._write_lock:
            try:
                with self._conn(write=True).cursor() as cur:
                    cur.executemany(
                        "INSERT INTO data_keys (tenant, subject, key_id, kek_id, wrapped, "
                        "created_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [tuple(r) for r in rows],
                    )
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "writing a data key")

    def erase_keys(
        self, tenant: str, subjects: Sequence[str] | None, by: str, at: float
    ) -> list[str]:
        """Through ``erase_data_keys``, once per subject in one transaction: the
        maintenance role's, recorded under its login (``by`` is not trusted here: the
        database names the session user)."""
        out: list[str] = []
        with self._write_lock:
            conn = self._conn(write=True)
            try:
                with conn.transaction():
                    for subject in [None] if subjects is None else subjects:
                        row = conn.execute(
                            "SELECT erase_data_keys(%s, %s, %s)", (tenant, subject, at)
                        ).fetchone()
                        out += list(row[0]) if row else []
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "erasing data keys")
        return out

    def erasures(self, tenant: str) -> list[ErasureRow]:
        rows = self.query(
            "SELECT tenant, subject, erased_at, erased_by, key_ids FROM erasures "
            "WHERE tenant = %s ORDER BY erased_at",
            (tenant,),
        )
        return [ErasureRow(r[0], r[1], r[2], r[3], tuple(r[4])) for r in rows]

    def erasure_mark(self) -> object:
        return self.query("SELECT count(*) FROM erasures")[0][0]

    # -- the archive index (see :mod:`replayable.store.cold`) ---------------------------

    def archived_runs(self, run_ids: Sequence[str]) -> dict[str, ArchivedRun]:
        valid = [r for r in run_ids if _is_uuid(r)]
        if not valid:
            return {}
        rows = self.query(
            "SELECT a.run_id::text, a.part_id, p.events_url, p.blobs_url, a.space, "
            "g.purged_at, g.purged_by "
            "FROM archived_runs a JOIN archive_parts p ON p.part_id = a.part_id "
            "LEFT JOIN archive_purges g ON g.part_id = a.part_id "
            "WHERE a.run_id = ANY(%s::uuid[])",
            (valid,),
        )
        return {
            r[0]: ArchivedRun(
                r[0], r[1], r[2], r[3], r[4], None if r[5] is None else purged_notice(r[5], r[6])
            )
            for r in rows
        }

    def dropped_ids(self) -> set[str]:
        rows = self.query(
            "SELECT a.run_id::text FROM archived_runs a WHERE EXISTS (SELECT 1 FROM "
            f"agent_execution_events e WHERE e.run_id = a.run_id AND {DROPPED_EVENT})"
        )
        return {str(r[0]) for r in rows}

    def hot_events(self, run_id: str) -> list[Event]:
        if not _is_uuid(run_id):
            return []
        rows = self.query(
            f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events WHERE run_id = %s "
            "ORDER BY sequence",
            (run_id,),
        )
        return self.joined(rows)

    def archive_index(self) -> list[tuple[ArchivePart, PurgeRow | None]]:
        rows = self.query(PART_INDEX_SQL)
        return [
            (
                ArchivePart.from_row(r),
                None if r[7] is None else PurgeRow(r[0], r[1], r[7], r[8]),
            )
            for r in rows
        ]

    def record_purge(self, part_id: str, digests: Sequence[PurgedDigest], at: float) -> PurgeRow:
        """Through ``record_archive_purge``: the maintenance role's, recorded under the
        session's login."""
        valid = [d for d in digests if _is_uuid(d[0])]
        with self._write_lock:
            try:
                self._conn(write=True).execute(
                    "SELECT record_archive_purge(%s, %s, %s::uuid[], %s::int[], %s::text[], "
                    "%s::text[])",
                    (
                        part_id,
                        at,
                        [d[0] for d in valid],
                        [d[1] for d in valid],
                        [d[2] for d in valid],
                        [d[3] for d in valid],
                    ),
                )
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "recording a purge")
        stored = self.query(
            "SELECT part_id, tenant, purged_at, purged_by FROM archive_purges WHERE part_id = %s",
            (part_id,),
        )
        return PurgeRow(*stored[0])

    def purged_digests(self, run_id: str) -> dict[int, tuple[str, str | None]]:
        if not _is_uuid(run_id):
            return {}
        rows = self.query(
            "SELECT sequence, request_digest, response_digest FROM purged_payloads "
            "WHERE run_id = %s",
            (run_id,),
        )
        return {int(r[0]): (str(r[1]), r[2]) for r in rows}

    def archived_ids(self) -> set[str]:
        return {str(r[0]) for r in self.query("SELECT run_id::text FROM archived_runs")}

    def archive_plan(self, part: ArchivePart) -> None:
        self._execute(
            "INSERT INTO archive_parts (part_id, tenant, day, runs, events_url, blobs_url, "
            "planned_at) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            part.values(),
        )

    def archive_pending(self) -> list[ArchivePart]:
        rows = self.query(PENDING_PARTS_SQL)
        return [ArchivePart.from_row(r) for r in rows]

    def archive_commit(self, part_id: str, runs: Sequence[tuple[str, str]], at: float) -> None:
        tenants = {
            rid: (tenant or "")
            for rid, tenant in self.query(
                "SELECT run_id::text, tenant FROM runs WHERE run_id = ANY(%s::uuid[])",
                ([r for r, _ in runs],),
            )
        }
        with self._write_lock:
            try:
                with self._conn(write=True).cursor() as cur:
                    cur.executemany(
                        "INSERT INTO archived_runs (run_id, tenant, part_id, space, archived_at) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [(rid, tenants.get(rid, ""), part_id, sp, at) for rid, sp in runs],
                    )
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "indexing archived runs")

    def stored_rows(self, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        valid = sorted(r for r in run_ids if _is_uuid(r))
        if not valid:
            return []
        return self.query(
            f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events v "
            "WHERE v.run_id = ANY(%s::uuid[]) ORDER BY v.run_id, v.sequence",
            (valid,),
        )

    def run_spaces(self, run_ids: Sequence[str]) -> dict[str, str]:
        return self._tier_tenants(set(run_ids), ())

    def drop_archived_payloads(self, run_ids: Sequence[str]) -> int:
        """Through ``drop_archived_payloads``: the maintenance role's, for archived runs only."""
        valid = [r for r in run_ids if _is_uuid(r)]
        if not valid:
            return 0
        with self._write_lock:
            try:
                row = (
                    self._conn(write=True)
                    .execute("SELECT drop_archived_payloads(%s::uuid[])", (valid,))
                    .fetchone()
                )
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "dropping archived payloads")
        return int(row[0]) if row else 0

    def drop_archived_blobs(self) -> tuple[int, int]:
        """Through ``drop_archived_blobs``: the maintenance role's, after
        :meth:`drop_archived_payloads`. Deletes, in the tenants the login may write, the
        blobs and nodes no hot row references (those only archived runs used, whose
        archive holds its own copy); a blob a hot run shares is kept. Returns (blobs,
        nodes) deleted. Writers in any process notice the drop in their next batch's
        transaction and send that batch's blobs again."""
        with self._write_lock:
            try:
                row = self._conn(write=True).execute("SELECT drop_archived_blobs()").fetchone()
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "dropping archived blobs")
        if row is None or row[0] is None:
            return (0, 0)
        blobs, nodes = row[0]
        if blobs or nodes:
            self.tier.forget_stored()
        return (int(blobs), int(nodes))

    def _execute(self, statement: str, params: Sequence[Any]) -> None:
        with self._write_lock:
            try:
                self._conn(write=True).execute(statement, params)
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "writing")

    def joined(self, rows: Sequence[Sequence[Any]]) -> list[Event]:
        """Events from rows of the event columns and the two references, payloads joined."""
        split = [(event_from_row(r[:20]), r[20], r[21]) for r in rows]
        if not self.tier.needs_join(split):
            return [e for e, _, _ in split]
        tenants = self._tier_tenants({e.run_id for e, _, _ in split}, ())
        return self.tier.join_events(self, split, tenants.__getitem__)

    def put_blob(self, digest: str, data: bytes) -> None:
        with self._write_lock:
            try:
                self._conn(write=True).execute(
                    "INSERT INTO blobs (tenant, digest, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (self.tenant or "", digest, data),
                )
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "writing a blob")

    # -- reading ----------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only statement on the reader connection (errors translated)."""
        with self._read_lock:
            try:
                return self._conn(write=False).execute(sql, params).fetchall()
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "reading")

    def get_blob(self, digest: str) -> bytes | None:
        rows = self.query(
            "SELECT data FROM blobs WHERE tenant = %s AND digest = %s", (self.tenant or "", digest)
        )
        return bytes(rows[0][0]) if rows else None

    def get_run(self, run_id: str) -> Run:
        rows = (
            self.query(_SELECT_RUNS + " WHERE r.run_id = %s", (run_id,)) if _is_uuid(run_id) else []
        )
        if not rows:
            raise RunNotFoundError(f"no run {run_id!r} in {self.url}")
        return self._joined_runs([run_from_row(rows[0])])[0]

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """Several runs by id in one query (unknown ids are left out)."""
        valid = [r for r in run_ids if _is_uuid(r)]
        rows = self.query(_SELECT_RUNS + " WHERE r.run_id = ANY(%s::uuid[])", (valid,))
        return {run.run_id: run for run in self._joined_runs([run_from_row(r) for r in rows])}

    def _joined_runs(self, runs: list[Run]) -> list[Run]:
        """Runs with the values the tier keeps put back (see ``PayloadTier.join_runs``)."""
        kept = kept_runs(runs)
        if not kept:
            return runs
        spaces = self._tier_tenants(kept, ())
        return self.tier.join_runs(self, runs, spaces.__getitem__)

    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        bounds = _uuid_bounds(prefix.lower())
        if bounds is None:
            return []
        rows = self.query(
            "SELECT run_id::text FROM runs WHERE run_id BETWEEN %s::uuid AND %s::uuid "
            "ORDER BY run_id LIMIT %s",
            (*bounds, limit),
        )
        return [r[0] for r in rows]

    def _run_conditions(self, f: RunFilter) -> tuple[str, list[Any]] | None:
        """The WHERE clause of a run filter, or None when no run can match it."""
        if f.parent_run_id is not None and not _is_uuid(f.parent_run_id):
            return None
        where, params = f.sql_conditions("%s")
        if f.metadata:
            if any(isinstance(v, dict | list) for v in f.metadata.values()):
                return None  # nested values are not indexed, so no filter matches them
            where.append("r.tags @> %s::text[]")
            params.append(run_tags(f.metadata))
        return (" WHERE " + " AND ".join(where) if where else ""), params

    def count_runs(self, filter: RunFilter | None = None) -> int:
        found = self._run_conditions(filter or RunFilter())
        if found is None:
            return 0
        where, params = found
        sql = "SELECT count(*) FROM runs r LEFT JOIN run_ends e ON e.run_id = r.run_id" + where
        return int(self.query(sql, params)[0][0])

    def list_runs(self, filter: RunFilter | None = None) -> list[Run]:
        f = filter or RunFilter()
        found = self._run_conditions(f)
        if found is None:
            return []
        where, params = found
        sql = _SELECT_RUNS + where
        sql += " ORDER BY r.started_at DESC, r.run_id DESC"
        if f.limit is not None:
            sql += " LIMIT %s"
            params.append(f.limit)
        return self._joined_runs([run_from_row(row) for row in self.query(sql, params)])

    def events(self, run_id: str) -> list[Event]:
        if not _is_uuid(run_id):
            return []
        cold = self.archived_runs([run_id]).get(run_id)
        if cold is not None:
            return self.cold.events(cold)
        rows = self.query(
            f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events WHERE run_id = %s "
            "ORDER BY sequence",
            (run_id,),
        )
        return self.joined(rows)

    def events_range(self, run_id: str, first_seq: int, last_seq: int) -> list[Event]:
        check_range(first_seq, last_seq)
        if last_seq < first_seq or not _is_uuid(run_id):
            return []
        cold = self.archived_runs([run_id]).get(run_id)
        if cold is not None:
            return [e for e in self.cold.events(cold) if first_seq <= e.seq <= last_seq]
        rows = self.query(
            f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events "
            "WHERE run_id = %s AND sequence BETWEEN %s AND %s ORDER BY sequence",
            # Clamped to the column's type, so the bounds stay integers the key serves.
            (run_id, max(first_seq, -(2**31)), min(last_seq, 2**31 - 1)),
        )
        return self.joined(rows)

    def events_until(self, run_id: str, seq: int) -> list[Event]:
        return self.events_range(run_id, -(2**31), seq)

    def event_at(self, run_id: str, seq: int) -> Event | None:
        if not _is_uuid(run_id):
            return None
        cold = self.archived_runs([run_id]).get(run_id)
        if cold is not None:
            return next((e for e in self.cold.events(cold) if e.seq == seq), None)
        rows = self.query(
            f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events "
            "WHERE run_id = %s AND sequence = %s",
            (run_id, seq),
        )
        return self.joined(rows)[0] if rows else None

    def iter_run_ids(self) -> Iterator[str]:
        rows = self.query("SELECT run_id::text FROM runs ORDER BY started_at, run_id")
        return iter([r[0] for r in rows])

    def store_id(self) -> str:
        found: str | None = self.__dict__.get("_store_id")
        if found is None:
            rows = self.query("SELECT value FROM store_info WHERE key = 'store_id'")
            if not rows:
                raise StoreError(f"{self.url} has no store id (store_info is empty)")
            found = self.__dict__["_store_id"] = str(rows[0][0])
        return found

    def row_tenant(self, start: RunStart) -> str | None:
        return self._access_tenant(start)

    def sees_tenant(self, tenant: str | None) -> bool:
        readable: set[str] | bool | None = self.__dict__.get("_readable")
        if readable is None:
            rows = self.query("SELECT row_security_active('runs'), session_tenants(false)")
            active, tenants = rows[0] if rows else (True, [])
            # A role the policies do not apply to (the owner) reads every tenant.
            readable = True if not active else set(tenants or ())
            self.__dict__["_readable"] = readable
        if readable is True:
            return self.tenant is None or tenant == self.tenant
        assert isinstance(readable, set)
        if self.tenant is not None and tenant != self.tenant:
            return False
        return (tenant or "") in readable

    def event_run_ids(self) -> set[str]:
        rows = self.query("SELECT DISTINCT run_id::text FROM agent_execution_events")
        return {str(r[0]) for r in rows}

    def tag_problem(self, run: Run) -> str | None:
        if not _is_uuid(run.run_id):
            return None
        rows = self.query("SELECT tags FROM runs WHERE run_id = %s", (run.run_id,))
        if not rows:
            return None
        stored = rows[0][0]
        if not isinstance(stored, list) or not all(isinstance(t, str) for t in stored):
            return f"the tag index is {type(stored).__name__}, not a list of text"
        wanted = run_tags(run.start.metadata)
        if sorted(stored) == sorted(wanted):
            return None
        extra = sorted(set(stored) - set(wanted))
        lacking = sorted(set(wanted) - set(stored))
        parts = []
        if extra:
            parts.append(f"{len(extra)} tag(s) not in its metadata ({extra[0]!r}...)")
        if lacking:
            parts.append(f"{len(lacking)} of its metadata tag(s) missing ({lacking[0]!r}...)")
        if not parts:
            parts.append("a tag is repeated")
        return "the tag index does not match the run's metadata: " + "; ".join(parts)

    def search(self, query: EventQuery) -> SearchPage:
        from replayable.store.postgres._search import search

        return search(self, query)

    def interrupt(self) -> None:
        """Shut the sockets of both connections down (without taking the locks a hung
        call holds): its blocked read returns, psycopg raises, the lock is released and
        the next call reconnects."""
        for conn in (self._write_conn, self._read_conn):
            if conn is None or conn.closed:
                continue
            try:
                fd = conn.pgconn.socket
                sock = socket.socket(fileno=os.dup(fd))
            except Exception:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.close()

    def close(self) -> None:
        self.run_close_hooks()
        with self._write_lock, self._read_lock:
            self._closed = True
            for conn in (self._write_conn, self._read_conn):
                if conn is not None:
                    conn.close()
            self._write_conn = self._read_conn = None


def _uuid_bounds(prefix: str) -> tuple[str, str] | None:
    """The lowest and highest UUID starting with ``prefix``, or None if no UUID can."""
    if len(prefix) > 36:
        return None
    digits = []
    for i, ch in enumerate(prefix):
        if i in (8, 13, 18, 23):
            if ch != "-":
                return None
        elif ch in "0123456789abcdef":
            digits.append(ch)
        else:
            return None
    hexs = "".join(digits)
    return hexs.ljust(32, "0"), hexs.ljust(32, "f")
