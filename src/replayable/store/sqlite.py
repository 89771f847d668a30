"""The embedded default store: SQLite in WAL mode, append-only by trigger."""

from __future__ import annotations

import functools
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import orjson

from replayable._files import private_file
from replayable.errors import (
    AppendOnlyError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store._sqlite_audit import AUDIT_SCHEMA, AUDIT_TABLES, SQLiteAudit, upgrade_audit
from replayable.store.base import EventStore, RunFilter, tag_value
from replayable.store.rows import event_from_row, event_to_row, run_from_row

__all__ = ["SQLiteStore"]

#: 2 added ``runs.chain`` and ``run_ends.signature`` (keyed chains) and a store id.
_DB_VERSION = 2

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, workflow TEXT NOT NULL, entrypoint TEXT NOT NULL,
    parent_run_id TEXT, parent_seq INTEGER, root_run_id TEXT NOT NULL, tenant TEXT,
    input TEXT NOT NULL, metadata TEXT NOT NULL, code TEXT NOT NULL, env_hash TEXT,
    lineage TEXT NOT NULL, started_at REAL NOT NULL, schema_version INTEGER NOT NULL,
    chain TEXT
);
CREATE INDEX IF NOT EXISTS runs_workflow ON runs (workflow, started_at);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started_at);
CREATE INDEX IF NOT EXISTS runs_parent ON runs (parent_run_id);
CREATE TABLE IF NOT EXISTS run_ends (
    run_id TEXT PRIMARY KEY, status TEXT NOT NULL, output TEXT, error TEXT,
    ended_at REAL NOT NULL, event_count INTEGER NOT NULL, last_hash TEXT NOT NULL,
    schema_version INTEGER NOT NULL, signature TEXT
);
CREATE TABLE IF NOT EXISTS run_tags (
    key TEXT NOT NULL, value TEXT, run_id TEXT NOT NULL, PRIMARY KEY (key, value, run_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    key TEXT, parent INTEGER, call_site TEXT, request TEXT NOT NULL, fingerprint TEXT NOT NULL,
    response TEXT, encoding TEXT NOT NULL, error TEXT, side_effect INTEGER NOT NULL,
    started_at REAL NOT NULL, duration_ns INTEGER NOT NULL, metadata TEXT NOT NULL,
    chain_index INTEGER NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS events_kind_name ON events (kind, name);
CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
"""
    + AUDIT_SCHEMA
)

_APPEND_ONLY = ("runs", "run_ends", "run_tags", "events", "blobs", *AUDIT_TABLES)


def _triggers() -> str:
    parts = []
    for table in _APPEND_ONLY:
        for op in ("UPDATE", "DELETE"):
            parts.append(
                f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'replayable: {table} is append-only'); END;"
            )
    return "\n".join(parts)


_EVENT_COLS = (
    "run_id, seq, kind, name, key, parent, call_site, request, fingerprint, response, "
    "encoding, error, side_effect, started_at, duration_ns, metadata, chain_index, "
    "prev_hash, hash, schema_version"
)
_RUN_COLS = (
    "run_id, workflow, entrypoint, parent_run_id, parent_seq, root_run_id, tenant, "
    "input, metadata, code, env_hash, lineage, started_at, schema_version, chain"
)
_END_COLS = (
    "run_id, status, output, error, ended_at, event_count, last_hash, schema_version, signature"
)

# Version 1 to 2: columns for the keyed chain (NULL in old rows: the v1 chain).
_UPGRADE_V2 = (
    "ALTER TABLE runs ADD COLUMN chain TEXT",
    "ALTER TABLE run_ends ADD COLUMN signature TEXT",
)


# run_tags is WITHOUT ROWID, so its key columns cannot hold NULL: a null metadata
# value is tagged with this text, which no other value's text form can equal.
_NULL_TAG = "\x00null"


def _tag(value: Any) -> str:
    text = tag_value(value)
    return _NULL_TAG if text is None else text


def _parse_version(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _tag_difference(stored: set[Any], wanted: set[Any]) -> str | None:
    extra, lacking = sorted(stored - wanted, key=repr), sorted(wanted - stored, key=repr)
    if not (extra or lacking):
        return None
    parts = []
    if extra:
        parts.append(f"{len(extra)} tag(s) not in its metadata ({extra[0]!r}...)")
    if lacking:
        parts.append(f"{len(lacking)} of its metadata tag(s) missing ({lacking[0]!r}...)")
    return "the tag index does not match the run's metadata: " + "; ".join(parts)


_ROWS_PER_STATEMENT = 500


def _insert(c: sqlite3.Connection, head: str, width: int, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` with multi-row statements, not ``executemany``.

    The sqlite3 module releases the GIL around every row it steps; while the
    agent's thread is busy, taking it back costs up to a switch interval (5 ms)
    per row, and a 2,048-event batch took 15 s. One statement per few hundred
    rows takes it back a few times a batch.
    """
    if not rows:
        return
    if len(rows) == 1:  # a durable boundary's batch
        c.execute(_statement(head, width, 1), rows[0])
        return
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        c.execute(_statement(head, width, len(chunk)), list(chain.from_iterable(chunk)))


@functools.lru_cache(maxsize=256)
def _statement(head: str, width: int, rows: int) -> str:
    """``head VALUES (?, …), …`` for ``rows`` rows of ``width`` columns."""
    one = "(" + ",".join("?" * width) + ")"
    return f"{head} VALUES " + ",".join([one] * rows)


_RUNS_HEAD = f"INSERT INTO runs ({_RUN_COLS})"
_TAGS_HEAD = "INSERT OR IGNORE INTO run_tags (key, value, run_id)"
_EVENTS_HEAD = f"INSERT INTO events ({_EVENT_COLS})"
_ENDS_HEAD = f"INSERT INTO run_ends ({_END_COLS})"
_FULL = "PRAGMA synchronous=FULL"
_NORMAL = "PRAGMA synchronous=NORMAL"
#: How long a write waits for another connection's lock unless bounded (``connect``'s).
_BUSY_MS = 30_000


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def store_error(exc: sqlite3.Error | OSError, message: str) -> StoreError:
    """The replayable error for a driver error (the one translation point of this store).

    A locked or unopenable database, a full disk or a lost file is unavailable
    (the writer spools and retries); a constraint is an append-only refusal;
    any other database error refuses the data itself.
    """
    error: StoreError
    if isinstance(exc, sqlite3.IntegrityError):
        error = AppendOnlyError(message)
    elif isinstance(exc, OSError | sqlite3.OperationalError | sqlite3.InterfaceError):
        error = StoreUnavailableError(message)
    else:
        error = StoreRefusedError(message)
    error.__cause__ = exc
    return error


class SQLiteStore(SQLiteAudit, EventStore):
    """Runs in one SQLite file. Writes go through one connection; reads use one per thread."""

    def __init__(self, path: Path | str) -> None:
        self._memory = str(path) == ":memory:"
        # Absolute from the start: connections opened later (per reading thread, or by
        # the writer process) must find this file whatever the directory is by then.
        self.path = Path(path) if self._memory else Path(path).absolute()
        self.url = f"sqlite:///{self.path}"
        if not self._memory:
            try:
                # Made 0600 before SQLite opens it: the WAL and shared-memory files
                # SQLite adds take the database file's mode.
                private_file(self.path)
            except OSError as exc:
                raise store_error(exc, f"cannot create {self.url}: {exc}") from exc
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._conn = self._connect()
        #: The write connection's settings as last sent (``append`` sends changes only).
        self._sync = _NORMAL
        self._busy_ms = _BUSY_MS
        try:
            self._init_schema()
        except BaseException:
            self._conn.close()
            raise

    # -- connections -----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0
            )
            if not self._memory:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_NORMAL)
            conn.execute("PRAGMA foreign_keys=OFF")
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            raise store_error(
                exc, f"{self.url} is not a usable replayable database: {exc}"
            ) from exc
        return conn

    def _reader(self) -> sqlite3.Connection:
        if self._memory:
            return self._conn
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._write_lock:
                self._readers.append(conn)
        return conn

    def _init_schema(self) -> None:
        try:
            with self._write_lock:
                c = self._conn
                c.execute("BEGIN IMMEDIATE")
                # Read the version before touching anything else: a newer schema may
                # have changed the tables our CREATE statements refer to.
                c.execute(
                    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
                )
                row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is not None:
                    version = _parse_version(row[0])
                    if version is None or version > _DB_VERSION:
                        c.execute("ROLLBACK")
                        raise SchemaVersionError(
                            f"{self.url} has schema version {row[0]}; this replayable reads "
                            f"up to {_DB_VERSION}. Upgrade replayable."
                        )
                version = None if row is None else _parse_version(row[0])
                if version == 1:
                    for stmt in _UPGRADE_V2:
                        c.execute(stmt)
                for stmt in (_SCHEMA + _triggers()).split(";\n"):
                    if stmt.strip():
                        c.execute(stmt)
                upgrade_audit(c)
                c.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(_DB_VERSION),)
                )
                c.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (str(uuid.uuid4()),))
                found = c.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
                self._id = str(found[0])
                c.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise store_error(
                exc, f"{self.url} is not a usable replayable database: {exc}"
            ) from exc

    # -- writing ----------------------------------------------------------------

    def append(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
    ) -> None:
        run_rows = [
            (
                s.run_id,
                s.workflow,
                s.entrypoint,
                s.parent_run_id,
                s.parent_seq,
                s.root_run_id,
                s.tenant,
                s.input,
                _dumps(s.metadata),
                _dumps(s.code),
                s.env_hash,
                _dumps(s.lineage),
                s.started_at,
                s.schema_version,
                s.chain,
            )
            for s in starts
        ]
        tag_rows = [
            (k, _tag(v), s.run_id)
            for s in starts
            for k, v in s.metadata.items()
            if not isinstance(v, (dict, list))
        ]
        event_rows = [event_to_row(e) for e in events]
        end_rows = [
            (
                r.run_id,
                r.status,
                r.output,
                r.error,
                r.ended_at,
                r.event_count,
                r.last_hash,
                r.schema_version,
                r.signature,
            )
            for r in ends
        ]
        within: float | None = getattr(self._local, "within", None)
        lock = self._write_lock
        if within is None:
            lock.acquire()
        elif not lock.acquire(timeout=within):
            raise StoreUnavailableError(
                f"writing to {self.url} failed: another write held it for {within:g}s"
            )
        try:
            c = self._conn
            try:
                # Each setting is sent only when it changes: a statement per commit costs
                # a durable boundary a few percent of its disk time.
                sync = _FULL if durable else _NORMAL
                if self._sync is not sync:
                    c.execute(sync)
                    self._sync = sync
                busy = _BUSY_MS if within is None else max(1, int(within * 1000))
                if self._busy_ms != busy:
                    c.execute(f"PRAGMA busy_timeout={busy}")
                    self._busy_ms = busy
                c.execute("BEGIN IMMEDIATE")
                _insert(c, _RUNS_HEAD, 15, run_rows)
                _insert(c, _TAGS_HEAD, 3, tag_rows)
                _insert(c, _EVENTS_HEAD, 20, event_rows)
                _insert(c, _ENDS_HEAD, 9, end_rows)
                c.execute("COMMIT")
            except sqlite3.Error as exc:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                refused = isinstance(exc, sqlite3.IntegrityError)
                raise store_error(
                    exc,
                    f"{self.url} refused the batch: {exc}"
                    if refused
                    else (f"writing to {self.url} failed: {exc}"),
                ) from exc
        finally:
            lock.release()

    #: A lock held by another connection is waited for at most the bound given
    #: (SQLite's busy timeout), the write lock of this object too; the rest of a
    #: commit is the disk's.
    bounds_own_waits = True

    def append_bounded(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
        within: float,
    ) -> None:
        # Through ``append`` (which reads the bound on this thread), so a subclass's
        # ``append`` is the one that runs either way.
        local = self._local
        local.within = within
        try:
            self.append(starts, events, ends, durable=durable)
        finally:
            local.within = None

    def put_blob(self, digest: str, data: bytes) -> None:
        with self._write_lock:
            try:
                self._conn.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?)", (digest, data))
            except sqlite3.Error as exc:
                raise store_error(exc, f"writing a blob to {self.url} failed: {exc}") from exc

    # -- reading ----------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._reader().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise store_error(exc, f"reading {self.url} failed: {exc}") from exc

    def get_blob(self, digest: str) -> bytes | None:
        rows = self._query("SELECT data FROM blobs WHERE digest = ?", (digest,))
        return bytes(rows[0][0]) if rows else None

    def get_run(self, run_id: str) -> Run:
        rows = self._query(self._select_runs() + " WHERE r.run_id = ?", (run_id,))
        if not rows:
            raise RunNotFoundError(f"no run {run_id!r} in {self.url}")
        return run_from_row(rows[0])

    def _select_runs(self) -> str:
        return (
            f"SELECT r.{_RUN_COLS.replace(', ', ', r.')}, e.{_END_COLS.replace(', ', ', e.')} "
            "FROM runs r LEFT JOIN run_ends e ON e.run_id = r.run_id"
        )

    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        upper = prefix + "\uffff"
        rows = self._query(
            "SELECT run_id FROM runs WHERE run_id >= ? AND run_id < ? ORDER BY run_id LIMIT ?",
            (prefix, upper, limit),
        )
        return [r[0] for r in rows]

    def _run_conditions(self, f: RunFilter) -> tuple[str, list[Any]]:
        where, params = f.sql_conditions("?")
        for k, v in f.metadata.items():
            if isinstance(v, dict | list):  # nested values are not tagged
                where.append("0")
                continue
            where.append("r.run_id IN (SELECT run_id FROM run_tags WHERE key = ? AND value = ?)")
            params.extend((k, _tag(v)))
        return (" WHERE " + " AND ".join(where) if where else ""), params

    def count_runs(self, filter: RunFilter | None = None) -> int:
        where, params = self._run_conditions(filter or RunFilter())
        sql = "SELECT count(*) FROM runs r LEFT JOIN run_ends e ON e.run_id = r.run_id" + where
        return int(self._query(sql, params)[0][0])

    def list_runs(self, filter: RunFilter | None = None) -> list[Run]:
        f = filter or RunFilter()
        where, params = self._run_conditions(f)
        sql = self._select_runs() + where
        sql += " ORDER BY r.started_at DESC, r.run_id DESC"
        if f.limit is not None:
            sql += " LIMIT ?"
            params.append(f.limit)
        return [run_from_row(row) for row in self._query(sql, params)]

    def events(self, run_id: str) -> list[Event]:
        return self._events("WHERE run_id = ? ORDER BY seq", (run_id,))

    def events_until(self, run_id: str, seq: int) -> list[Event]:
        return self._events("WHERE run_id = ? AND seq <= ? ORDER BY seq", (run_id, seq))

    def event_at(self, run_id: str, seq: int) -> Event | None:
        found = self._events("WHERE run_id = ? AND seq = ?", (run_id, seq))
        return found[0] if found else None

    def _events(self, where: str, params: tuple[Any, ...]) -> list[Event]:
        rows = self._query(f"SELECT {_EVENT_COLS} FROM events {where}", params)
        return [event_from_row(r) for r in rows]

    def iter_run_ids(self) -> Iterator[str]:
        rows = self._query("SELECT run_id FROM runs ORDER BY started_at, run_id")
        return iter([str(r[0]) for r in rows])

    def store_id(self) -> str:
        return self._id

    def event_run_ids(self) -> set[str]:
        return {str(r[0]) for r in self._query("SELECT DISTINCT run_id FROM events")}

    def tag_problem(self, run: Run) -> str | None:
        stored = {
            (r[0], r[1])
            for r in self._query("SELECT key, value FROM run_tags WHERE run_id = ?", (run.run_id,))
        }
        wanted = {
            (k, _tag(v)) for k, v in run.start.metadata.items() if not isinstance(v, (dict, list))
        }
        return _tag_difference(stored, wanted)

    def close(self) -> None:
        self.run_close_hooks()
        with self._write_lock:
            self._conn.close()
            # Reader connections of every thread, not only the closing one.
            for conn in self._readers:
                conn.close()
            self._readers.clear()
