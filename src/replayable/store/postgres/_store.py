"""The production store: PostgreSQL, append-only by privilege and trigger, one tenant per store."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import orjson
import psycopg

from replayable.errors import ConfigurationError, RunNotFoundError, StoreError
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store.base import EventStore, RunFilter, tag_value
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
_STAGE_COLS = (
    "run_id, parent_run_id, sequence, event_type, name, key, parent, call_site, request_text, "
    "fingerprint, response_text, encoding, error_text, side_effect, timestamp_utc, duration_ns, "
    "metadata_text, chain_index, prev_hash, hash, schema_version, tenant"
)
_STAGE_TABLE = """
CREATE TEMP TABLE IF NOT EXISTS replayable_stage_events (
    run_id UUID, parent_run_id UUID, sequence INTEGER, event_type TEXT, name TEXT, key TEXT,
    parent INTEGER, call_site TEXT, request_text TEXT, fingerprint TEXT, response_text TEXT,
    encoding TEXT, error_text TEXT, side_effect BOOLEAN, timestamp_utc DOUBLE PRECISION,
    duration_ns BIGINT, metadata_text TEXT, chain_index INTEGER, prev_hash TEXT, hash TEXT,
    schema_version INTEGER, tenant TEXT
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


def _dumps(value: Any) -> str:
    if not value and type(value) is dict:
        return "{}"  # most events carry no metadata
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


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


class PostgresStore(PostgresAudit, EventStore):
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
        self._staged = False
        self._direct: bool | None = None
        self._closed = False
        try:
            self._prepare_schema()
            if self.tenant is None:
                self.tenant = self._only_writable_tenant()
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
        run_rows = [self._run_row(s) for s in starts]
        for e in events:
            if e.run_id not in self._run_info and not _is_uuid(e.run_id):
                raise ConfigurationError(f"event run id {e.run_id!r} is not a UUID")
        for end in ends:
            if not _is_uuid(end.run_id):
                raise ConfigurationError(f"end record run id {end.run_id!r} is not a UUID")
        # The batch's digest makes a retry idempotent: a batch whose COMMIT went
        # through but was never acknowledged is found in ``batches`` and skipped.
        # An event stands in it by its key and its hash, which covers its content:
        # encoding every event again cost as much as a tenth of the batch's write.
        digest = hashlib.sha256(
            msgspec.msgpack.encode(
                [self.tenant, starts, [(e.run_id, e.seq, e.hash) for e in events], ends]
            )
        ).hexdigest()
        with self._write_lock:
            conn = self._conn(write=True)
            try:
                with conn.transaction():
                    if not durable:
                        conn.execute("SET LOCAL synchronous_commit = off")
                    cur = conn.execute(
                        "INSERT INTO batches (tenant, digest) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING",
                        (self._batch_tenant(starts, events, ends), digest),
                    )
                    if cur.rowcount == 0:
                        return
                    with conn.cursor() as c:
                        if run_rows:
                            c.executemany(_INSERT_RUN, run_rows)
                        if events:
                            self._copy_events(conn, c, starts, events)
                        if ends:
                            c.executemany(_INSERT_END, [self._end_row(r) for r in ends])
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "writing a batch")
        for s in starts:
            self._remember(s.run_id, self._access_tenant(s), s.parent_run_id)

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
        events: Sequence[Event],
    ) -> None:
        info = dict(self._run_info)
        for s in starts:
            info[s.run_id] = (self._access_tenant(s), s.parent_run_id)
        unknown = list({e.run_id for e in events if e.run_id not in info})
        if unknown:
            found = cur.execute(
                "SELECT run_id::text, tenant, parent_run_id::text FROM runs "
                "WHERE run_id = ANY(%s::uuid[])",
                (unknown,),
            ).fetchall()
            for run_id, tenant, parent in found:
                info[run_id] = (tenant, parent)
                self._remember(run_id, tenant, parent)
            hidden = sorted(set(unknown) - {row[0] for row in found})
            if hidden and self.tenant is not None:
                # Under a tenant, an event may only join a run that tenant can see.
                raise StoreError(
                    f"{self.url} has no run {hidden[0]} for tenant {self.tenant!r}; "
                    "a run's start record must be written before its events"
                )
        if self._direct is None:
            row = conn.execute("SELECT row_security_active('agent_execution_events')").fetchone()
            self._direct = not (row and row[0])
        if not self._direct and not self._staged:
            conn.execute(_STAGE_TABLE)
            self._staged = True
        missing = (self.tenant, None)
        # COPY cannot write through row-level security, so for a role the policies
        # apply to, rows land in a temporary table and INSERT … SELECT checks them.
        table = "agent_execution_events" if self._direct else "replayable_stage_events"
        with cur.copy(f"COPY {table} ({_STAGE_COLS}) FROM STDIN") as copy:
            write = copy.write_row
            for e in events:
                tenant, parent_run = info.get(e.run_id, missing)
                write(
                    (
                        e.run_id,
                        parent_run,
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
                        _dumps(e.metadata),
                        e.chain_index,
                        e.prev_hash,
                        e.hash,
                        e.schema_version,
                        tenant,
                    )
                )
        if not self._direct:
            cur.execute(
                f"INSERT INTO agent_execution_events ({_STAGE_COLS}) "
                f"SELECT {_STAGE_COLS} FROM replayable_stage_events"
            )

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
        return run_from_row(rows[0])

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """Several runs by id in one query (unknown ids are left out)."""
        valid = [r for r in run_ids if _is_uuid(r)]
        rows = self.query(_SELECT_RUNS + " WHERE r.run_id = ANY(%s::uuid[])", (valid,))
        return {row[0]: run_from_row(row) for row in rows}

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
        return [run_from_row(row) for row in self.query(sql, params)]

    def events(self, run_id: str) -> list[Event]:
        if not _is_uuid(run_id):
            return []
        rows = self.query(
            f"SELECT {_EVENT_COLS} FROM agent_execution_events WHERE run_id = %s ORDER BY sequence",
            (run_id,),
        )
        return [event_from_row(r) for r in rows]

    def event_at(self, run_id: str, seq: int) -> Event | None:
        if not _is_uuid(run_id):
            return None
        rows = self.query(
            f"SELECT {_EVENT_COLS} FROM agent_execution_events WHERE run_id = %s AND sequence = %s",
            (run_id, seq),
        )
        return event_from_row(rows[0]) if rows else None

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
