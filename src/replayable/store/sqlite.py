"""The embedded default store: SQLite in WAL mode, append-only by trigger."""

from __future__ import annotations

import functools
import operator
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import orjson

from replayable._files import private_file
from replayable.errors import (
    AppendOnlyError,
    ConfigurationError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store._sqlite_audit import AUDIT_SCHEMA, AUDIT_TABLES, SQLiteAudit, upgrade_audit
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
    REF_PREFIX,
    SUBJECT_KEY,
    BlobRow,
    NodeRow,
    PayloadTier,
    TierRows,
    epoch_spaces,
    kept_runs,
    node_digest,
    split_space,
    tier_ref,
)
from replayable.store.rows import (
    events_from_columns,
    ints_or_nulls,
    run_from_row,
    sound_events,
    texts_or_nulls,
    undecodable_text,
)

__all__ = ["SQLiteStore"]

#: 2 added ``runs.chain`` and ``run_ends.signature`` (keyed chains) and a store id;
#: 3 the payload tier (``events.request_ref``/``response_ref``, ``payload_*`` tables);
#: 4 the compact event row: hashes as 32-byte blobs, call sites named once in
#: ``call_sites`` (``events.site``), no ``events_kind_name`` index (see :func:`_event_rows`);
#: 5 blobs found by ``payload_blobs.digest_head`` (see :func:`_insert_blobs`); files written
#: before keep their (tenant, subject, digest) key, and both are read and written.
_DB_VERSION = 5

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
-- The hashes are 32-byte blobs (text in rows written before schema 4, and for a
-- value that is not 64 lowercase hex digits); call_site is NULL when site names the
-- row of call_sites holding it. Readers select _EVENT_SELECT, which gives both back
-- as text: the event as it was hashed.
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    key TEXT, parent INTEGER, call_site TEXT, request TEXT NOT NULL, fingerprint BLOB NOT NULL,
    response TEXT, encoding TEXT NOT NULL, error TEXT, side_effect INTEGER NOT NULL,
    started_at REAL NOT NULL, duration_ns INTEGER NOT NULL, metadata TEXT NOT NULL,
    chain_index INTEGER NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL,
    schema_version INTEGER NOT NULL, request_ref TEXT, response_ref TEXT, site INTEGER,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS call_sites (site_id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
-- A rowid table: blobs are appended in write order and only the key index takes
-- them in digest order (WITHOUT ROWID put the compressed bytes themselves at random
-- places in the tree, and a batch rewrote most of its pages). The index holds the
-- digest's first 56 bits as an integer (digest_head), not the 64 hex digits and the
-- key space: a batch's blobs land all over it, so every commit rewrites most of its
-- pages, and those are five times fewer. Several blobs may share a head; readers and
-- writers compare the whole digest. Files written before keep their layout (the key
-- (tenant, subject, digest), with no digest_head); both are read and written.
CREATE TABLE IF NOT EXISTS payload_blobs (
    tenant TEXT NOT NULL, subject TEXT NOT NULL, digest TEXT NOT NULL, codec TEXT NOT NULL,
    size INTEGER NOT NULL, data BLOB NOT NULL, digest_head INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS payload_nodes (
    tenant TEXT NOT NULL, subject TEXT NOT NULL, digest TEXT NOT NULL, parent TEXT,
    body TEXT NOT NULL, PRIMARY KEY (tenant, subject, digest)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS data_keys (
    tenant TEXT NOT NULL, subject TEXT NOT NULL, key_id TEXT NOT NULL, kek_id TEXT NOT NULL,
    wrapped BLOB NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, subject, key_id, kek_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS erasures (
    erasure_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, subject TEXT, erased_at REAL NOT NULL,
    erased_by TEXT NOT NULL, key_ids TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS archive_parts (
    part_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, day TEXT NOT NULL, runs TEXT NOT NULL,
    events_url TEXT NOT NULL, blobs_url TEXT NOT NULL, planned_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS archived_runs (
    run_id TEXT PRIMARY KEY, part_id TEXT NOT NULL, space TEXT NOT NULL, archived_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS archive_purges (
    part_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purged_at REAL NOT NULL,
    purged_by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS purged_payloads (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, request_digest TEXT NOT NULL,
    response_digest TEXT, PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS payload_dicts (
    tenant TEXT NOT NULL, dict_id TEXT NOT NULL, created_at REAL NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (tenant, dict_id)
);
"""
    + AUDIT_SCHEMA
)

_APPEND_ONLY = (
    "runs",
    "run_ends",
    "run_tags",
    "events",
    "call_sites",
    "blobs",
    "payload_blobs",
    "payload_nodes",
    "payload_dicts",
    "data_keys",
    "erasures",
    "archive_parts",
    "archived_runs",
    "archive_purges",
    "purged_payloads",
    *AUDIT_TABLES,
)


def _triggers() -> str:
    parts = []
    for table in _APPEND_ONLY:
        for op in ("UPDATE", "DELETE"):
            parts.append(
                f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'replayable: {table} is append-only'); END;"
            )
    return "\n".join(parts)


# The stored columns an insert fills, in the order of :func:`_event_rows` (call_site is
# left NULL: the sqlite3 module binds a None through its adapter lookup, at a cost).
_EVENT_COLS = (
    "run_id, seq, kind, name, key, parent, request, fingerprint, response, "
    "encoding, error, side_effect, started_at, duration_ns, metadata, chain_index, "
    "prev_hash, hash, schema_version, site"
)
_EVENT_ROW_COLS = _EVENT_COLS + ", request_ref, response_ref"


def _as_text(column: str) -> str:
    """SQL giving a hash column back as the text that was hashed (a blob as lowercase hex)."""
    return f"CASE WHEN typeof({column}) = 'blob' THEN lower(hex({column})) ELSE {column} END"


#: The columns the readers of ``events`` select, as stored: those of :data:`_EVENT_SELECT`
#: with the hashes as they are (32-byte blobs, or text in older rows) and the call site
#: as ``call_site, …, site``. :func:`_text_columns` makes the text form of them in Python,
#: where ``bytes.hex()`` and one lookup of the run's call sites cost a fraction of the
#: SQL's ``CASE``/``hex()`` on three columns and a subquery per row.
_EVENT_STORED = (
    "run_id, seq, kind, name, key, parent, call_site, request, fingerprint, response, "
    "encoding, error, side_effect, started_at, duration_ns, metadata, chain_index, "
    "prev_hash, hash, schema_version, request_ref, response_ref, site"
)
#: Where :data:`_EVENT_STORED` puts the columns :func:`_text_columns` rewrites.
_FINGERPRINT, _PREV_HASH, _HASH, _CALL_SITE, _SITE = 8, 17, 18, 6, 22

#: What :meth:`SQLiteStore._events` selects first: an event's small columns (numbers,
#: names, the mostly NULL ones) packed into one JSON array per row by SQLite, then the
#: payloads, the time and the hashes as stored. The sqlite3 module hands each value of
#: a row back at a cost of its own (it gives the GIL away and takes it back around each
#: column, and SQLite takes its mutex in each column call), several times that of
#: building the array and parsing it. JSON holds no blob and no REAL exactly, and
#: escaping a long payload costs more than a column: those stay columns. A row that the
#: array cannot hold as it is (a blob in a packed column makes the statement fail, a
#: REAL there reads as a float where none belongs) sends the read to :data:`_EVENT_STORED`.
_PACKED = (
    "seq, kind, name, key, parent, call_site, encoding, error, side_effect, duration_ns, "
    "chain_index, schema_version, request_ref, response_ref, site"
)
_PACKED_WIDTH = _PACKED.count(",") + 1
_INSIDE = operator.itemgetter(slice(1, -1))  # "[1,2]" -> "1,2"
_EVENT_PACKED = (
    f"json_array({_PACKED}), request, fingerprint, response, started_at, metadata, prev_hash, hash"
)

#: What readers select from ``events``: the event's columns in field order as text and
#: numbers, whatever form the row stores them in, then ``request_ref, response_ref``.
_EVENT_SELECT = (
    "run_id, seq, kind, name, key, parent, coalesce(call_site, "
    "(SELECT text FROM call_sites WHERE site_id = events.site)), request, "
    f"{_as_text('fingerprint')}, response, encoding, error, side_effect, started_at, "
    f"duration_ns, metadata, chain_index, {_as_text('prev_hash')}, {_as_text('hash')}, "
    "schema_version, request_ref, response_ref"
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
# Version 2 to 3: references to payloads in the blob tier (NULL: the payload is inline).
_UPGRADE_V3 = (
    "ALTER TABLE events ADD COLUMN request_ref TEXT",
    "ALTER TABLE events ADD COLUMN response_ref TEXT",
)
# Version 3 to 4: the call site by reference (rows written before keep the text in
# call_site, and their hashes as text: both read the same). No reader used the kind
# index, which cost a fifth of the key's size per event.
_UPGRADE_V4 = (
    "ALTER TABLE events ADD COLUMN site INTEGER",
    "DROP INDEX IF EXISTS events_kind_name",
)


def _hash_form(text: str) -> bytearray | str:
    """A hash as stored: the 32 bytes of 64 lowercase hex digits, anything else as it is
    (so every value reads back exactly, which the event's own hash depends on)."""
    if len(text) == 64:
        try:
            raw = bytearray.fromhex(text)
        except ValueError:
            return text
        if raw.hex() == text:
            return raw
    return text


def _hash_forms(texts: list[str]) -> list[bytearray | str]:
    """:func:`_hash_form` of each of ``texts``, with one check for a batch of digests
    (the usual case): all 64 characters long, none in upper case, each 32 bytes (no
    spaces, which ``fromhex`` skips).

    As bytearrays: the sqlite3 module binds those as they are, where a ``bytes`` value
    (and ``None``) first goes through its adapter lookup, a failed attribute lookup with
    the error message it formats, per value: more than the rest of the row's binding."""
    if set(map(len, texts)) <= {64}:
        joined = "".join(texts)
        if joined.lower() == joined:
            try:
                out = list(map(bytearray.fromhex, texts))
            except ValueError:  # not hex
                out = []
            if sum(map(len, out)) == 32 * len(texts):
                return out  # type: ignore[return-value]
    return [_hash_form(t) for t in texts]


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
#: At most this many rows go in one insert statement (a writer's whole batch).
_MAX_ROWS_PER_STATEMENT = 2048
#: SQLite's own bound on a statement's parameters unless the library says (3.32's).
_DEFAULT_VARIABLES = 32_766


@functools.lru_cache(maxsize=64)
def _rows_per_statement(variables: int, width: int) -> int:
    """The largest power of two of rows of ``width`` columns one statement may hold."""
    fits = max(1, min(_MAX_ROWS_PER_STATEMENT, variables // width))
    return 1 << (fits.bit_length() - 1)


def _variables(c: sqlite3.Connection) -> int:
    """How many parameters one statement of ``c`` may bind."""
    try:
        return int(c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    except (AttributeError, sqlite3.Error):  # pragma: no cover - before Python 3.11
        return _DEFAULT_VARIABLES


def _insert(
    c: sqlite3.Connection,
    head: str,
    width: int,
    rows: Sequence[tuple[Any, ...]],
    tail: str = "",
    variables: int = _DEFAULT_VARIABLES,
) -> None:
    """Insert ``rows`` with multi-row statements, not ``executemany``.

    The sqlite3 module releases the GIL around every row it steps; while
    another thread is busy, taking it back costs up to a switch interval (5 ms)
    per row, and a 2,048-event batch took 15 s. A few statements per batch take
    it back a few times, and the database does the batch's work without it.

    Statements hold a power of two of rows (up to what the statement's
    parameters allow, ``variables``): the sqlite3 module then finds each one
    prepared already. Compiling a statement of a new size cost about as much as
    running it, and batches come in every size.
    """
    if not rows:
        return
    n = len(rows)
    if n == 1:  # a durable boundary's batch
        c.execute(_statement(head, width, 1, tail), rows[0])
        return
    per = _rows_per_statement(variables, width)
    start = 0
    while start < n:
        size = min(per, 1 << ((n - start).bit_length() - 1))
        chunk = rows[start : start + size]
        start += size
        c.execute(_statement(head, width, size, tail), list(chain.from_iterable(chunk)))


@functools.lru_cache(maxsize=256)
def _statement(head: str, width: int, rows: int, tail: str = "") -> str:
    """``head VALUES (?, …), … tail`` for ``rows`` rows of ``width`` columns."""
    one = "(" + ",".join("?" * width) + ")"
    return f"{head} VALUES " + ",".join([one] * rows) + tail


_RUNS_HEAD = f"INSERT INTO runs ({_RUN_COLS})"
_TAGS_HEAD = "INSERT OR IGNORE INTO run_tags (key, value, run_id)"
_EVENTS_HEAD = f"INSERT INTO events ({_EVENT_ROW_COLS})"
_INLINE_EVENTS_HEAD = f"INSERT INTO events ({_EVENT_COLS})"
_BLOBS_HEAD = "INSERT INTO payload_blobs (tenant, subject, digest, codec, data, size)"
_NODES_HEAD = "INSERT INTO payload_nodes (tenant, subject, digest, parent, body)"
# ON CONFLICT DO NOTHING skips a blob stored already, and nothing else: OR IGNORE
# would also skip a row a NOT NULL refuses.
_SKIP_STORED = " ON CONFLICT DO NOTHING"
_ENDS_HEAD = f"INSERT INTO run_ends ({_END_COLS})"
_FULL = "PRAGMA synchronous=FULL"
_NORMAL = "PRAGMA synchronous=NORMAL"
#: How long a write waits for another connection's lock unless bounded (``connect``'s).
_BUSY_MS = 30_000


def _packed() -> None:
    return None


_HEADED_BLOBS_HEAD = (
    "INSERT INTO payload_blobs (tenant, subject, digest, codec, data, size, digest_head)"
)
#: The hex digits of a digest its head holds (56 bits: a non-negative SQLite integer).
_HEAD_DIGITS = 14


def _digest_head(digest: str) -> int | None:
    """The ``digest_head`` a blob of ``digest`` is stored under (``None``: not hex, so no
    blob has it)."""
    try:
        return int(digest[:_HEAD_DIGITS], 16)
    except ValueError:
        return None


_BY_HEAD = operator.itemgetter(6)


def _headed_rows(rows: TierRows) -> list[tuple[str, str, str, str, bytes, int, int]]:
    """A batch's new blobs as rows of a file with ``digest_head`` (:func:`blob_rows`' and
    the head), in head order: the statement walks the head index once, forward."""
    blobs = rows.blobs.values()
    spaces = {t: split_space(t) for t in {b.tenant for b in blobs}}
    # Our own sha256 hex digests: their heads parse.
    out = [
        (*spaces[b.tenant], b.digest, b.codec, b.data, b.size, int(b.digest[:_HEAD_DIGITS], 16))
        for b in blobs
    ]
    out.sort(key=_BY_HEAD)
    return out


def _insert_blobs(c: sqlite3.Connection, rows: list[tuple[Any, ...]], headed: bool) -> None:
    """Insert a batch's new blob rows (:func:`blob_rows`, or :func:`_headed_rows` for a
    file with ``digest_head``), skipping those stored.

    A file with ``digest_head`` has no unique key to skip a stored blob on: the batch's
    blobs stored already (by another store object, another process, or before this one
    forgot what it stored) are read first, under the write lock, by their heads, and
    compared whole.
    """
    if not headed:
        _insert(c, _BLOBS_HEAD, 6, rows, _SKIP_STORED)
        return
    heads = [r[6] for r in rows]
    stored: set[tuple[str, str, str]] = set()
    for start in range(0, len(heads), _ROWS_PER_STATEMENT):
        chunk = heads[start : start + _ROWS_PER_STATEMENT]
        # One row back, not one per blob (the sqlite3 module gives the GIL away per row).
        (found,) = c.execute(
            "SELECT json_group_array(json_array(tenant, subject, digest)) FROM payload_blobs "
            f"WHERE digest_head IN ({','.join('?' * len(chunk))})",
            chunk,
        ).fetchone()
        if found != "[]":
            stored.update((str(t), str(s), str(d)) for t, s, d in orjson.loads(found))
    if stored:
        rows = [r for r in rows if (r[0], r[1], r[2]) not in stored]
    _insert(c, _HEADED_BLOBS_HEAD, 7, rows)


def _live(
    c: sqlite3.Connection, refs: dict[str, set[str]]
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The (tenant, subject, digest) of every node and blob the references need."""
    nodes: list[tuple[str, str, str]] = []
    blobs: list[tuple[str, str, str]] = []
    for key_space, wanted in refs.items():
        tenant, subject = split_space(key_space)
        seen: set[str] = set()
        todo = {r[64:96] for r in wanted if len(r) > 64}
        blobs.extend((tenant, subject, r) for r in wanted if len(r) == 64)
        while todo:
            seen |= todo
            batch = sorted(todo)
            todo = set()
            for start in range(0, len(batch), 500):
                chunk = batch[start : start + 500]
                for digest, parent, body in c.execute(
                    "SELECT digest, parent, CAST(body AS BLOB) FROM payload_nodes WHERE "
                    f"tenant = ? AND subject = ? AND digest IN ({','.join('?' * len(chunk))})",
                    [tenant, subject, *chunk],
                ):
                    text = bytes(body or b"").decode(errors="replace")
                    if node_digest(parent, text) != digest:
                        # Which blobs it needed is unknown: dropping none is the safe answer.
                        raise StoreError(
                            f"payload node {digest[:12]} is altered (run `replayable verify`); "
                            "no blobs were dropped"
                        )
                    nodes.append((tenant, subject, digest))
                    blobs.extend((tenant, subject, piece[1]) for piece in orjson.loads(text))
                    if parent is not None and parent not in seen:
                        todo.add(parent)
    return nodes, blobs


def _event_rows(
    events: Sequence[Event],
    split: list[tuple[Event, str | None, str | None]] | None,
    sites: dict[str, int],
    null: Any = None,
) -> list[tuple[Any, ...]]:
    """The stored rows (:data:`_EVENT_COLS`) of ``events``, then their payload references
    when ``split`` (the events as the tier left them, with those references); ``sites``
    holds the id of each call site; ``null`` stands for a missing key, parent, response,
    error and site (see :data:`_NULL`). :data:`_EVENT_SELECT` reads them back."""
    evs = events if split is None else [e for e, _, _ in split]
    fingerprints = _hash_forms([e.fingerprint for e in evs])
    hashes = _hash_forms([e.hash for e in evs])
    prev_texts = [e.prev_hash for e in evs]
    if prev_texts[1:] == [e.hash for e in evs[:-1]]:  # one chain: each links the one before
        prevs = [*_hash_forms(prev_texts[:1]), *hashes[:-1]]
    else:
        prevs = _hash_forms(prev_texts)
    dumps, sort, site_id = orjson.dumps, orjson.OPT_SORT_KEYS, sites.get
    # Every value of an exact type the sqlite3 module binds directly (1/0, not a bool;
    # ``null``, not None).
    rows = [
        (
            e.run_id, e.seq, e.kind, e.name, null if (k := e.key) is None else k,
            null if (p := e.parent) is None else p, e.request, fp,
            null if (r := e.response) is None else r, e.encoding,
            null if (x := e.error) is None else x, 1 if e.side_effect else 0, e.started_at,
            e.duration_ns, dumps(m, option=sort).decode() if (m := e.metadata) else "{}",
            e.chain_index, prev, h, e.schema_version,
            site_id(e.call_site, null),  # type: ignore[arg-type]
        )
        for e, fp, prev, h in zip(evs, fingerprints, prevs, hashes, strict=True)
    ]  # fmt: skip
    if split is None:
        return rows
    return [(*r, rq, rs) for r, (_, rq, rs) in zip(rows, split, strict=True)]


#: A missing value as the sqlite3 module binds it fastest: SQLite stores a NaN as NULL,
#: and a float is bound directly, where None first goes through the module's adapter
#: lookup (a failed attribute lookup on a type, with the error message it formats),
#: which cost an event row with no parent and no error more than the rest of its
#: binding. Used only where the library is seen to do so (see :func:`_null_for`).
_NULL = float("nan")


def _null_for(c: sqlite3.Connection) -> Any:
    """:data:`_NULL` if ``c``'s SQLite stores a bound NaN as NULL (every version does),
    else None."""
    try:
        (stored,) = c.execute("SELECT ? IS NULL", (_NULL,)).fetchone()
    except sqlite3.Error:
        return None
    return _NULL if stored == 1 else None


def _site_ids(c: sqlite3.Connection, texts: set[str]) -> dict[str, int]:
    """The ids of call sites ``texts`` in ``call_sites``, adding those it lacks (inside
    the caller's write transaction, so another writer's ids are the ones read)."""
    out: dict[str, int] = {}
    ordered = sorted(texts)
    for start in range(0, len(ordered), _ROWS_PER_STATEMENT):
        chunk = ordered[start : start + _ROWS_PER_STATEMENT]
        c.execute(_statement("INSERT INTO call_sites (text)", 1, len(chunk), _SKIP_STORED), chunk)
        marks = ",".join("?" * len(chunk))
        # One row back, not one per site: the sqlite3 module gives the GIL away at every
        # row it steps, and beside a busy agent thread each costs a switch interval.
        (found,) = c.execute(
            f"SELECT json_group_object(text, site_id) FROM call_sites WHERE text IN ({marks})",
            chunk,
        ).fetchone()
        out.update((str(t), int(i)) for t, i in orjson.loads(found).items())
    return out


def _as_hex(values: Sequence[Any]) -> list[Any]:
    """A hash column in the text form it was hashed in: a blob as lowercase hex, any
    other value as it is (what :func:`_as_text` gives in SQL)."""
    try:
        return list(map(bytes.hex, values))  # every value a blob: the usual case
    except TypeError:
        return [v.hex() if type(v) is bytes else v for v in values]


def _text_columns(
    rows: Sequence[Sequence[Any]], site_texts: Callable[[set[int]], dict[int, str]]
) -> list[Sequence[Any]]:
    """The columns of ``rows`` (:data:`_EVENT_STORED`) as :data:`_EVENT_SELECT` gives
    them: hashes as text, the call site's text in ``call_site``; ``site`` left out.
    ``site_texts`` gives the text of each call-site id asked for (a missing one stays
    NULL, as the subquery leaves it)."""
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True))
    if not columns:
        return [[] for _ in range(_SITE)]
    for at in (_FINGERPRINT, _PREV_HASH, _HASH):
        columns[at] = _as_hex(columns[at])
    sites = columns.pop(_SITE)
    wanted = {s for s in sites if s is not None}
    if wanted:
        texts = site_texts(wanted)
        columns[_CALL_SITE] = [
            text if text is not None or site is None else texts.get(site)
            for text, site in zip(columns[_CALL_SITE], sites, strict=True)
        ]
    return columns


def _tier_generation(c: sqlite3.Connection) -> str:
    """How many times maintenance has dropped blobs from this file ('' for never)."""
    row = c.execute("SELECT value FROM meta WHERE key = 'tier_generation'").fetchone()
    return str(row[0]) if row else ""


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


class SQLiteStore(SQLiteAudit, TierReads, EventStore):
    """Runs in one SQLite file. Writes go through one connection; reads use one per thread."""

    _BLOB_DATA = "CAST(data AS BLOB)"  # the column is untyped: read it as bytes

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
        self._tenant_cache: dict[str, str] = {}
        #: Call sites known to be in ``call_sites``, by text: their ids (a cache).
        self._site_ids: dict[str, int] = {}
        self.tier = PayloadTier()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._conn = self._connect()
        self._variables = _variables(self._conn)
        self._null = _null_for(self._conn)
        #: The write connection's settings as last sent (``append`` sends changes only).
        self._sync = _NORMAL
        self._busy_ms = _BUSY_MS
        try:
            self._init_schema()
        except BaseException:
            self._conn.close()
            raise
        self._tier_generation = _tier_generation(self._conn)
        enable_encryption(self)
        self.cold = ColdReader(self)

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
                if version in (1, 2, 3):
                    have = {r[1] for r in c.execute("PRAGMA table_info(events)")}
                    for stmt in (*_UPGRADE_V3, *_UPGRADE_V4):
                        if stmt.split()[-2] not in have:
                            c.execute(stmt)
                for stmt in (_SCHEMA + _triggers()).split(";\n"):
                    if stmt.strip():
                        c.execute(stmt)
                upgrade_audit(c)
                self._blob_heads = "digest_head" in {
                    r[1] for r in c.execute("PRAGMA table_info(payload_blobs)")
                }
                if self._blob_heads:
                    c.execute(
                        "CREATE INDEX IF NOT EXISTS payload_blobs_head "
                        "ON payload_blobs (digest_head)"
                    )
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
        tier_rows = TierRows()
        tier = self.tier
        sealed_runs = tier.seal is not None and bool(starts or ends)
        if sealed_runs:
            # Encrypting: the run records' input, output and error go to the tier too.
            given_starts, given_ends = starts, ends
            tenants = self._tenants(
                {s.run_id for s in starts} | {r.run_id for r in ends} | {e.run_id for e in events},
                starts,
            )
            starts, ends = tier.seal_runs(self, starts, ends, tenants.__getitem__, tier_rows)
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
        known = self._site_ids
        new_sites = {
            site for e in events if (site := e.call_site) is not None and site not in known
        }
        # With a call site not seen before, the rows are built once its id is read,
        # under the write lock; else here, before taking it.
        sites = known if not new_sites else None
        split: list[tuple[Event, str | None, str | None]] | None = None
        if tier.any_tiered(events):
            if not sealed_runs:
                tenants = self._tenants({e.run_id for e in events}, starts)
            split = tier.split_events(self, events, tenants.__getitem__, tier_rows, pack=False)
            # Compressed while this thread builds and writes the event rows.
            packed = tier.pack_in_background(self, tier_rows, self._blob_rows)
            events_head, event_width = _EVENTS_HEAD, 22
        else:
            # No payload for the tier: the references NULL.
            events_head, event_width = _INLINE_EVENTS_HEAD, 20
            packed = _packed
            if tier_rows.pending:  # the run records' values, with no event to wait for
                tier.pack_in_background(self, tier_rows)
        event_rows = [] if sites is None else _event_rows(events, split, sites, self._null)
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
                if events_head is _EVENTS_HEAD or sealed_runs:
                    generation = _tier_generation(c)
                    if generation != self._tier_generation:
                        # Maintenance dropped blobs since this object last looked (here or
                        # in another process): what it remembers as stored may be gone, so
                        # the batch's blobs are found again, under this lock.
                        packed()
                        tier.forget_stored()
                        tier_rows = TierRows()
                        if sealed_runs:
                            tier.seal_runs(
                                self, given_starts, given_ends, tenants.__getitem__, tier_rows
                            )
                        tier.split_events(self, events, tenants.__getitem__, tier_rows)
                        packed = _packed
                        self._tier_generation = generation
                if sites is None:
                    sites = {**known, **_site_ids(c, new_sites)}
                    event_rows = _event_rows(events, split, sites, self._null)
                _insert(c, _RUNS_HEAD, 15, run_rows)
                _insert(c, _TAGS_HEAD, 3, tag_rows)
                _insert(c, events_head, event_width, event_rows, variables=self._variables)
                # Left running if a statement fails: it only fills this batch's rows.
                packed()
                if tier_rows:
                    if tier_rows.blobs:
                        prepared = tier_rows.prepared
                        _insert_blobs(
                            c,
                            self._blob_rows(tier_rows) if prepared is None else prepared,
                            self._blob_heads,
                        )
                    _insert(
                        c,
                        _NODES_HEAD,
                        5,
                        [(*split_space(n[0]), *n[1:]) for n in tier_rows.nodes.values()],
                        _SKIP_STORED,
                    )
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
            except BaseException:
                # Compressing the batch's blobs failed (or the thread was interrupted):
                # nothing of the batch stays.
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        finally:
            lock.release()
        if new_sites and sites is not None:
            # Known once committed: a batch rolled back may have named ids no row holds.
            fresh = {t: sites[t] for t in new_sites}
            if len(known) > 10_000:
                self._site_ids = fresh  # replaced, not cleared: other threads may read it
            else:
                known.update(fresh)
        if tier_rows:
            tier.committed(tier_rows)

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

    def _query(
        self, sql: str, params: Sequence[Any] = (), *, undecodable: bool = False
    ) -> list[Any]:
        """The rows ``sql`` selects. With ``undecodable``, for readers that name a bad
        row and go on (runs, events, audit records), a text value that is not UTF-8 comes
        back as :class:`~replayable.store.rows.UndecodableText`; otherwise, and by the
        sqlite3 module's default, it fails the whole query."""
        conn = self._reader()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if not undecodable or "decode to UTF-8" not in str(exc):
                raise store_error(exc, f"reading {self.url} failed: {exc}") from exc
            # A text value that is not UTF-8 (the driver fails the whole query on it):
            # read again keeping such values, so that the readers name the bad row.
            try:
                conn.text_factory = undecodable_text
                return conn.execute(sql, params).fetchall()
            except sqlite3.Error as again:
                raise store_error(again, f"reading {self.url} failed: {again}") from again
            finally:
                conn.text_factory = str
        except sqlite3.Error as exc:
            raise store_error(exc, f"reading {self.url} failed: {exc}") from exc

    def get_blob(self, digest: str) -> bytes | None:
        rows = self._query("SELECT data FROM blobs WHERE digest = ?", (digest,))
        return bytes(rows[0][0]) if rows else None

    def get_run(self, run_id: str) -> Run:
        rows = self._query(self._select_runs() + " WHERE r.run_id = ?", (run_id,), undecodable=True)
        if not rows:
            raise RunNotFoundError(f"no run {run_id!r} in {self.url}")
        return self._joined_runs([run_from_row(rows[0])])[0]

    def _joined_runs(self, runs: list[Run]) -> list[Run]:
        """Runs with the values the tier keeps put back (see ``PayloadTier.join_runs``)."""
        kept = kept_runs(runs)
        if not kept:
            return runs
        tenants = self._tenants(kept, ())
        return self.tier.join_runs(self, runs, tenants.__getitem__)

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
        rows = self._query(sql, params, undecodable=True)
        return self._joined_runs([run_from_row(row) for row in rows])

    def events(self, run_id: str) -> list[Event]:
        cold = self._archived_one(run_id)
        if cold is not None:
            return self.cold.events(cold)
        return self._events("WHERE run_id = ? ORDER BY seq", (run_id,))

    def events_until(self, run_id: str, seq: int) -> list[Event]:
        cold = self._archived_one(run_id)
        if cold is not None:
            return [e for e in self.cold.events(cold) if e.seq <= seq]
        return self._events("WHERE run_id = ? AND seq <= ? ORDER BY seq", (run_id, seq))

    def events_range(self, run_id: str, first_seq: int, last_seq: int) -> list[Event]:
        check_range(first_seq, last_seq)
        if last_seq < first_seq:
            return []
        cold = self._archived_one(run_id)
        if cold is not None:
            return [e for e in self.cold.events(cold) if first_seq <= e.seq <= last_seq]
        return self._events(
            "WHERE run_id = ? AND seq BETWEEN ? AND ? ORDER BY seq", (run_id, first_seq, last_seq)
        )

    def event_at(self, run_id: str, seq: int) -> Event | None:
        cold = self._archived_one(run_id)
        if cold is not None:
            return next((e for e in self.cold.events(cold) if e.seq == seq), None)
        found = self._events("WHERE run_id = ? AND seq = ?", (run_id, seq))
        return found[0] if found else None

    # -- the archive index (see :mod:`replayable.store.cold`) ---------------------------

    def _archived_one(self, run_id: str) -> ArchivedRun | None:
        return self.archived_runs([run_id]).get(run_id)

    def archived_runs(self, run_ids: Sequence[str]) -> dict[str, ArchivedRun]:
        out: dict[str, ArchivedRun] = {}
        ids = list(run_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = self._query(
                "SELECT a.run_id, a.part_id, p.events_url, p.blobs_url, a.space, "
                "g.purged_at, g.purged_by "
                "FROM archived_runs a JOIN archive_parts p ON p.part_id = a.part_id "
                "LEFT JOIN archive_purges g ON g.part_id = a.part_id "
                f"WHERE a.run_id IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            out.update(
                {
                    r[0]: ArchivedRun(
                        r[0],
                        r[1],
                        r[2],
                        r[3],
                        r[4],
                        None if r[5] is None else purged_notice(r[5], r[6]),
                    )
                    for r in rows
                }
            )
        return out

    def dropped_ids(self) -> set[str]:
        # Per archived run, through the (run_id, seq) key: a dropped run's first row answers.
        rows = self._query(
            "SELECT a.run_id FROM archived_runs a WHERE EXISTS (SELECT 1 FROM events e "
            "WHERE e.run_id = a.run_id AND e.request = 'null' AND e.response IS NULL "
            "AND e.request_ref IS NULL AND e.response_ref IS NULL)"
        )
        return {str(r[0]) for r in rows}

    def hot_events(self, run_id: str) -> list[Event]:
        return self._events("WHERE run_id = ? ORDER BY seq", (run_id,))

    def archive_index(self) -> list[tuple[ArchivePart, PurgeRow | None]]:
        rows = self._query(PART_INDEX_SQL)
        return [
            (
                ArchivePart.from_row(r),
                None if r[7] is None else PurgeRow(r[0], r[1], r[7], r[8]),
            )
            for r in rows
        ]

    def record_purge(self, part_id: str, digests: Sequence[PurgedDigest], at: float) -> PurgeRow:
        """The file's owner is the maintenance role of an SQLite store."""
        found = self._query("SELECT tenant FROM archive_parts WHERE part_id = ?", (part_id,))
        if not found:
            raise ConfigurationError(f"no archive part {part_id!r} in {self.url}")
        row = PurgeRow(part_id, str(found[0][0]), at, self.login_name())
        with self._write_lock:
            c = self._conn
            try:
                c.execute("BEGIN IMMEDIATE")
                c.executemany(
                    "INSERT INTO purged_payloads VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    digests,
                )
                c.execute(
                    "INSERT INTO archive_purges VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", row
                )
                c.execute("COMMIT")
            except sqlite3.Error as exc:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise store_error(exc, f"recording a purge in {self.url} failed: {exc}") from exc
        stored = self._query(
            "SELECT part_id, tenant, purged_at, purged_by FROM archive_purges WHERE part_id = ?",
            (part_id,),
        )
        return PurgeRow(*stored[0])

    def purged_digests(self, run_id: str) -> dict[int, tuple[str, str | None]]:
        rows = self._query(
            "SELECT seq, request_digest, response_digest FROM purged_payloads WHERE run_id = ?",
            (run_id,),
        )
        return {int(r[0]): (str(r[1]), r[2]) for r in rows}

    def archived_ids(self) -> set[str]:
        return {str(r[0]) for r in self._query("SELECT run_id FROM archived_runs")}

    def archive_plan(self, part: ArchivePart) -> None:
        self._write_one(
            "INSERT INTO archive_parts VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            part.values(),
        )

    def archive_pending(self) -> list[ArchivePart]:
        rows = self._query(PENDING_PARTS_SQL)
        return [ArchivePart.from_row(r) for r in rows]

    def archive_commit(self, part_id: str, runs: Sequence[tuple[str, str]], at: float) -> None:
        with self._write_lock:
            try:
                self._conn.executemany(
                    "INSERT INTO archived_runs VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [(rid, part_id, sp, at) for rid, sp in runs],
                )
            except sqlite3.Error as exc:
                raise store_error(
                    exc, f"indexing archived runs in {self.url} failed: {exc}"
                ) from exc

    def stored_rows(self, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        columns = self.stored_columns(run_ids)
        return list(zip(*columns, strict=True)) if columns else []

    def stored_columns(self, run_ids: Sequence[str]) -> list[Sequence[Any]]:
        out: list[Sequence[Any]] = []
        ids = sorted(run_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = self._query(
                f"SELECT {_EVENT_STORED} FROM events "
                f"WHERE run_id IN ({','.join('?' * len(chunk))}) ORDER BY run_id, seq",
                chunk,
            )
            if not rows:
                continue
            columns = _text_columns(rows, self._site_texts)
            out = columns if not out else [[*a, *b] for a, b in zip(out, columns, strict=True)]
        return out

    def _site_texts(self, site_ids: set[int]) -> dict[int, str]:
        """The text of each call site among ``site_ids``, as the file holds it now.

        Read on every call, never kept: the store appends to ``call_sites`` only, but a
        row rewritten on disk must read as rewritten (so that ``verify`` in a
        long-running process catches it), not as this object remembers it."""
        known: dict[int, str] = {}
        missing = list(site_ids)
        for start in range(0, len(missing), _ROWS_PER_STATEMENT):
            chunk = missing[start : start + _ROWS_PER_STATEMENT]
            ((found,),) = self._query(
                "SELECT json_group_object(site_id, text) FROM call_sites "
                f"WHERE site_id IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            known.update((int(i), str(t)) for i, t in orjson.loads(found).items())
        return known

    def run_spaces(self, run_ids: Sequence[str]) -> dict[str, str]:
        return self._tenants(set(run_ids), ())

    def drop_archived_payloads(self, run_ids: Sequence[str]) -> int:
        """Clear the hot copies of archived runs' payloads (the owner's maintenance step):
        only runs the archive index names; their metadata and hashes stay."""
        archived = list(self.archived_runs(run_ids))
        if not archived:
            return 0
        n = 0
        with self._write_lock:
            c = self._conn
            try:
                c.execute("BEGIN IMMEDIATE")
                c.execute("DROP TRIGGER events_no_update")
                for start in range(0, len(archived), 500):
                    chunk = archived[start : start + 500]
                    cur = c.execute(
                        "UPDATE events SET request = 'null', response = NULL, request_ref = NULL, "
                        "response_ref = NULL WHERE run_id IN "
                        f"({','.join('?' * len(chunk))}) AND (request <> 'null' OR response "
                        "IS NOT NULL OR request_ref IS NOT NULL OR response_ref IS NOT NULL)",
                        chunk,
                    )
                    n += cur.rowcount
                c.execute(
                    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN "
                    "SELECT RAISE(ABORT, 'replayable: events is append-only'); END"
                )
                c.execute("COMMIT")
            except sqlite3.Error as exc:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise store_error(
                    exc, f"dropping archived payloads in {self.url} failed: {exc}"
                ) from exc
        return n

    def drop_archived_blobs(self) -> tuple[int, int]:
        """Delete the blobs and nodes no hot event references any more (the owner's
        maintenance step, after :meth:`drop_archived_payloads`): those only archived runs
        use, whose archive holds its own copy. A blob a hot run shares is kept. Returns
        (blobs, nodes) deleted. Writers of this file, in any process, notice and stop
        taking the dropped blobs as stored."""
        with self._write_lock:
            c = self._conn
            try:
                c.execute("BEGIN IMMEDIATE")
                refs: dict[str, set[str]] = {}
                # What hot rows reference: events' payloads and errors, and the run
                # records' input, output and error (never archived: always hot).
                kept = f"substr({{0}}, 1, {len(REF_PREFIX)}) = '{REF_PREFIX}'"
                rows = c.execute(
                    "SELECT run_id, request_ref, response_ref, "
                    f"CASE WHEN {kept.format('error')} THEN error END FROM events "
                    "WHERE request_ref IS NOT NULL OR response_ref IS NOT NULL "
                    f"OR {kept.format('error')}"
                ).fetchall()
                rows += c.execute(
                    f"SELECT run_id, NULL, NULL, input FROM runs WHERE {kept.format('input')}"
                ).fetchall()
                for column in ("output", "error"):
                    rows += c.execute(
                        f"SELECT run_id, NULL, NULL, {column} FROM run_ends "
                        f"WHERE {kept.format(column)}"
                    ).fetchall()
                spaces = self._tenants({r[0] for r in rows}, ())
                for run_id, rq, rs, held in rows:
                    mine = refs.setdefault(spaces[run_id], set())
                    mine.update(r for r in (rq, rs, tier_ref(held)) if r is not None)
                live_nodes, live_blobs = _live(c, refs)
                c.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS live_blobs (t, s, d, PRIMARY KEY (t, s, d))"
                )
                c.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS live_nodes (t, s, d, PRIMARY KEY (t, s, d))"
                )
                c.execute("DELETE FROM temp.live_blobs")
                c.execute("DELETE FROM temp.live_nodes")
                c.executemany("INSERT OR IGNORE INTO temp.live_blobs VALUES (?, ?, ?)", live_blobs)
                c.executemany("INSERT OR IGNORE INTO temp.live_nodes VALUES (?, ?, ?)", live_nodes)
                counts = []
                for table, live in (
                    ("payload_blobs", "live_blobs"),
                    ("payload_nodes", "live_nodes"),
                ):
                    c.execute(f"DROP TRIGGER {table}_no_delete")
                    cur = c.execute(
                        f"DELETE FROM {table} WHERE NOT EXISTS (SELECT 1 FROM temp.{live} l "
                        f"WHERE l.t = {table}.tenant AND l.s = {table}.subject "
                        f"AND l.d = {table}.digest)"
                    )
                    counts.append(cur.rowcount)
                    c.execute(
                        f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} BEGIN "
                        f"SELECT RAISE(ABORT, 'replayable: {table} is append-only'); END"
                    )
                c.execute("DELETE FROM temp.live_blobs")
                c.execute("DELETE FROM temp.live_nodes")
                if any(counts):
                    c.execute(
                        "INSERT OR REPLACE INTO meta VALUES ('tier_generation', ?)",
                        (str(int(_tier_generation(c) or 0) + 1),),
                    )
                c.execute("COMMIT")
            except sqlite3.Error as exc:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise store_error(
                    exc, f"dropping archived blobs in {self.url} failed: {exc}"
                ) from exc
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
        self.tier.forget_stored()
        return counts[0], counts[1]

    def _write_one(self, sql: str, params: Sequence[Any]) -> None:
        with self._write_lock:
            try:
                self._conn.execute(sql, params)
            except sqlite3.Error as exc:
                raise store_error(exc, f"writing to {self.url} failed: {exc}") from exc

    def _events(self, where: str, params: tuple[Any, ...]) -> list[Event]:
        """The events of the rows ``where`` selects, all of the run ``params[0]``
        (``where`` starts with ``WHERE run_id = ?``)."""
        read = self._packed_events(where, params)
        if read is None:
            rows = self._query(
                f"SELECT {_EVENT_STORED} FROM events {where}", params, undecodable=True
            )
            columns = _text_columns(rows, self._site_texts)
            read = events_from_columns(columns[:20]), columns[20], columns[21], columns[11]
        events, request_refs, response_refs, errors = read
        n = len(events)
        # No payload kept in the tier (an error may still be: its text a reference).
        if (
            request_refs.count(None) == n
            and response_refs.count(None) == n
            and (
                errors.count(None) == n
                or not any(type(e) is str and e.startswith(REF_PREFIX) for e in errors)
            )
        ):
            return events
        split = list(zip(events, request_refs, response_refs, strict=True))
        if not self.tier.needs_join(split):
            return events
        tenants = self._tenants({e.run_id for e, _, _ in split}, ())
        return self.tier.join_events(self, split, tenants.__getitem__)

    def _packed_events(
        self, where: str, params: tuple[Any, ...]
    ) -> tuple[list[Event], Sequence[Any], Sequence[Any], Sequence[Any]] | None:
        """The rows ``where`` selects read through :data:`_EVENT_PACKED`: their events,
        ``request_ref``, ``response_ref`` and ``error`` columns; ``None`` unless every
        row is sound, so that the stored columns are read and each problem named.

        The run id is not read back: ``run_id = ?`` (binary text comparison) holds only
        where the stored value is that very text."""
        run_id = params[0]
        if type(run_id) is not str:
            return None
        try:
            cursor = self._reader().execute(f"SELECT {_EVENT_PACKED} FROM events {where}", params)
            rows = cursor.fetchall()
        except sqlite3.Error:  # a blob in a packed column, say; the stored read tells
            return None
        if not rows:
            return [], (), (), ()
        packed, request, fingerprint, response, started_at, metadata, prev_hash, digest = zip(
            *rows, strict=True
        )
        # One array of every row's values, not a list per row (which the garbage
        # collector would walk): each array SQLite made holds _PACKED_WIDTH values.
        try:
            flat = orjson.loads(f"[{','.join(map(_INSIDE, packed))}]")
        except (orjson.JSONDecodeError, TypeError):  # a REAL as no JSON number (Inf)
            return None
        if len(flat) != _PACKED_WIDTH * len(rows):
            return None
        # Tuples of text and numbers, which the collector stops walking once it has seen
        # them (lists it walks on every pass while they live).
        (seq, kind, name, key, parent, call_site, encoding, error, side_effect,
         duration_ns, chain_index, version, request_refs, response_refs,
         sites) = (tuple(flat[i::_PACKED_WIDTH]) for i in range(_PACKED_WIDTH))  # fmt: skip
        del flat, rows
        if not (
            texts_or_nulls(request_refs) and texts_or_nulls(response_refs) and ints_or_nulls(sites)
        ):
            return None
        if sites.count(None) < len(sites):
            wanted = {s for s in sites if s is not None}
            texts = self._site_texts(wanted)
            call_site = tuple(
                text if text is not None or site is None else texts.get(site)
                for text, site in zip(call_site, sites, strict=True)
            )
        events = sound_events(
            (
                (run_id,) * len(seq), seq, kind, name, key, parent, call_site, request,
                _as_hex(fingerprint), response, encoding, error, side_effect, started_at,
                duration_ns, metadata, chain_index, _as_hex(prev_hash), _as_hex(digest),
                version,
            )
        )  # fmt: skip
        if events is None:
            return None
        return events, request_refs, response_refs, error

    # -- the payload tier ----------------------------------------------------------

    def _tenants(self, run_ids: set[str], starts: Sequence[RunStart]) -> dict[str, str]:
        """The key space each run's payloads are kept under ('' for none), in the epoch
        of it the run started in (see :func:`~replayable.store.payloads.epoch_space`)."""
        given = [(s.run_id, s.tenant, s.metadata.get(SUBJECT_KEY), s.started_at) for s in starts]
        named = {s.run_id for s in starts}
        found: dict[str, str] = {}
        cache = self._tenant_cache
        unknown = []
        for rid in run_ids:
            if rid in named:
                continue
            t = cache.get(rid)
            if t is None:
                unknown.append(rid)
            else:
                found[rid] = t
        stored: list[tuple[Any, ...]] = []
        for start in range(0, len(unknown), 500):
            chunk = unknown[start : start + 500]
            marks = ",".join("?" * len(chunk))
            stored += self._query(
                f"SELECT run_id, tenant, json_extract(metadata, '$.{SUBJECT_KEY}'), started_at "
                f"FROM runs WHERE run_id IN ({marks})",
                chunk,
            )
        if given or stored:
            spaces = epoch_spaces([*given, *stored], self.erasures)
            found.update(spaces)
            for row in stored:
                cache[row[0]] = spaces[row[0]]
        for rid in run_ids:
            found.setdefault(rid, "")
        if len(cache) > 100_000:
            cache.clear()
        return found

    def _in(self, sql: str, key_space: str, digests: Sequence[str]) -> list[Any]:
        out: list[Any] = []
        for start in range(0, len(digests), 500):
            chunk = list(digests[start : start + 500])
            marks = ",".join("?" * len(chunk))
            out.extend(self._query(sql.format(marks=marks), [*split_space(key_space), *chunk]))
        return out

    def tier_nodes(self, tenant: str, digests: Sequence[str]) -> list[NodeRow]:
        # As bytes, decoded here: an altered row may hold text that is not UTF-8, which
        # must make its payload unreadable, not the whole read fail.
        rows = self._in(
            "SELECT digest, parent, CAST(body AS BLOB) FROM payload_nodes "
            "WHERE tenant = ? AND subject = ? AND digest IN ({marks})",
            tenant,
            digests,
        )
        return [
            NodeRow(tenant, str(r[0]), r[1], bytes(r[2] or b"").decode(errors="replace"))
            for r in rows
        ]

    def tier_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]:
        if self._blob_heads:
            return self._headed_blobs(tenant, digests)
        rows = self._in(
            "SELECT digest, codec, CAST(data AS BLOB), size FROM payload_blobs "
            "WHERE tenant = ? AND subject = ? AND digest IN ({marks})",
            tenant,
            digests,
        )
        return [BlobRow(tenant, r[0], r[1], bytes(r[2]), r[3]) for r in rows]

    def _blob_rows(self, rows: TierRows) -> list[tuple[Any, ...]]:
        """The rows of a batch's new blobs, for :func:`_insert_blobs`."""
        return _headed_rows(rows) if self._blob_heads else blob_rows(rows)

    def _headed_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]:
        """``tier_blobs`` of a file whose blobs are found by ``digest_head``."""
        out: list[BlobRow] = []
        key = split_space(tenant)
        for start in range(0, len(digests), 500):
            chunk = list(digests[start : start + 500])
            heads = sorted({h for d in chunk if (h := _digest_head(d)) is not None})
            if not heads:
                continue
            rows = self._query(
                "SELECT digest, codec, CAST(data AS BLOB), size FROM payload_blobs "
                f"WHERE digest_head IN ({','.join('?' * len(heads))}) AND tenant = ? "
                f"AND subject = ? AND digest IN ({','.join('?' * len(chunk))})",
                [*heads, *key, *chunk],
            )
            out.extend(BlobRow(tenant, r[0], r[1], bytes(r[2]), r[3]) for r in rows)
        return out

    def tier_dictionary(self, tenant: str, dict_id: str | None) -> tuple[str, bytes] | None:
        if dict_id is None:
            rows = self._query(
                "SELECT dict_id, data FROM payload_dicts WHERE tenant = ? "
                "ORDER BY created_at DESC, dict_id DESC LIMIT 1",
                (tenant,),
            )
        else:
            rows = self._query(
                "SELECT dict_id, data FROM payload_dicts WHERE tenant = ? AND dict_id = ?",
                (tenant, dict_id),
            )
        return (str(rows[0][0]), bytes(rows[0][1])) if rows else None

    def tier_put_dictionary(self, tenant: str, dict_id: str, data: bytes, at: float) -> None:
        with self._write_lock:
            try:
                self._conn.execute(
                    "INSERT INTO payload_dicts VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (tenant, dict_id, at, data),
                )
            except sqlite3.Error as exc:
                raise store_error(exc, f"writing a dictionary to {self.url} failed: {exc}") from exc
        self.tier.forget_dictionaries()

    def _tier_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._query(sql, params)

    def put_key_rows(self, rows: Sequence[KeyRow]) -> None:
        with self._write_lock:
            try:
                self._conn.executemany(
                    "INSERT INTO data_keys VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [tuple(r) for r in rows],
                )
            except sqlite3.Error as exc:
                raise store_error(exc, f"writing a data key to {self.url} failed: {exc}") from exc

    def erase_keys(
        self, tenant: str, subjects: Sequence[str] | None, by: str, at: float
    ) -> list[str]:
        """Destroy the data keys of a tenant (every subject) or of the subjects named, in
        one transaction, and record it. The file's owner is the maintenance role of an
        SQLite store."""
        out: list[str] = []
        with self._write_lock:
            c = self._conn
            try:
                # Overwrite the deleted bytes on disk, not only unlink them from the tree.
                c.execute("PRAGMA secure_delete = ON")
                c.execute("BEGIN IMMEDIATE")
                c.execute("DROP TRIGGER data_keys_no_delete")
                for subject in [None] if subjects is None else subjects:
                    where, params = "tenant = ?", [tenant]
                    if subject is not None:
                        where += " AND subject = ?"
                        params.append(subject)
                    ids = sorted(
                        {
                            str(r[0])
                            for r in c.execute(
                                f"SELECT key_id FROM data_keys WHERE {where}", params
                            )
                        }
                    )
                    c.execute(f"DELETE FROM data_keys WHERE {where}", params)
                    c.execute(
                        "INSERT INTO erasures VALUES (?, ?, ?, ?, ?, ?)",
                        (str(uuid.uuid4()), tenant, subject, at, by, orjson.dumps(ids).decode()),
                    )
                    out += ids
                c.execute(
                    "CREATE TRIGGER data_keys_no_delete BEFORE DELETE ON data_keys BEGIN "
                    "SELECT RAISE(ABORT, 'replayable: data_keys is append-only'); END"
                )
                c.execute("COMMIT")
                if not self._memory:
                    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise store_error(exc, f"erasing data keys in {self.url} failed: {exc}") from exc
            finally:
                c.execute("PRAGMA secure_delete = OFF")
        return out

    def erasures(self, tenant: str) -> list[ErasureRow]:
        rows = self._query(
            "SELECT tenant, subject, erased_at, erased_by, key_ids FROM erasures "
            "WHERE tenant = ? ORDER BY erased_at",
            (tenant,),
        )
        return [ErasureRow(r[0], r[1], r[2], r[3], tuple(orjson.loads(r[4]))) for r in rows]

    def erasure_mark(self) -> object:
        return self._query("SELECT count(*) FROM erasures")[0][0]

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
