"""``replayable archive``: move finished runs' payloads to Parquet on any fsspec filesystem.

Layout under the destination (a local directory, ``s3://bucket/prefix``, …)::

    events/tenant=<T>/date=<YYYY-MM-DD>/part-<id>.parquet   event rows, sorted by run, seq
    blobs/tenant=<T>/date=<YYYY-MM-DD>/part-<id>.parquet    the blob-tier rows they need
    runs/tenant=<T>/date=<YYYY-MM-DD>/part-<id>.parquet     one row per run: what queries
                                                            over the archive filter runs by

Both zstd-compressed; event row groups are cut at run boundaries near
:data:`ROW_GROUP_ROWS` rows, so reading one run reads one or two row groups.
Blobs are copied as stored: still compressed, still encrypted under their
data keys (erasing a key erases archived payloads too).

The job is restartable. A part is *planned* in the store (its runs fixed,
its id derived from them) before its files are written; its files are then
written and *read back*: the events file must hold exactly the part's event
rows (run, seq, hash) and the blobs file every blob and node they reference.
Only then are its runs *indexed*, and only indexed runs have their hot
payloads dropped, through the maintenance path (on PostgreSQL the steward's
procedure; the append-only guards refuse any other change). A rerun after a
crash first finishes the planned parts, writing the same files again, then
drops what an interrupted drop left, so nothing is lost and no run is
archived twice. Each part's drop is written to the audit trail.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

import orjson

from replayable.archive.sqlite_table import event_table, read_rows
from replayable.audit.access import log_reads
from replayable.audit.actor import Actor
from replayable.errors import AccessDeniedError, ConfigurationError, StoreError
from replayable.events.model import Run
from replayable.store.base import EventStore, RunFilter, tag_value
from replayable.store.cold import EVENT_FIELDS, RUN_FIELDS, ArchivePart, filesystem, runs_url
from replayable.store.payloads import BlobRow, NodeRow, reachable, tier_ref
from replayable.store.sqlite import SQLiteStore

__all__ = ["ArchiveReport", "RetentionPolicy", "archive", "drop_blobs", "parse_age"]

#: Event rows per row group (cut at the next run boundary).
ROW_GROUP_ROWS: Final = 16_384
#: Most events in one part file (cut at a run boundary).
PART_EVENTS: Final = 500_000
DAY: Final = 86_400.0
#: The events file's columns but the hashes: a hash never repeats, so a dictionary of
#: them only fills up (the writer then encodes the row group again, plain) and their
#: min and max prune nothing; every other column is dictionary-encoded, with statistics.
_DICTIONARY_COLUMNS: Final = [
    name for name in EVENT_FIELDS if name not in ("fingerprint", "prev_hash", "hash")
]


def parse_age(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise ConfigurationError(f"age {text!r} must be a number and a unit: 30d, 12h, 90m, 2w")
    unit = {"s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY}[m.group(2)]
    return float(m.group(1)) * unit


#: Seconds in a retention year (365.25 days).
YEAR: Final = 365.25 * DAY


@dataclass(frozen=True)
class RetentionPolicy:
    """How long payloads stay hot (days) and then archived (years), per tenant and workflow.

    From ``[tool.replayable.retention]`` in pyproject.toml::

        [tool.replayable.retention]
        hot_days = 30
        archive_years = 7
        [tool.replayable.retention.tenants.acme]
        archive_years = 10
        [tool.replayable.retention.workflows.triage]
        hot_days = 7

    A run's payloads are archived ``hot_days`` after it started and purged from the
    archive ``archive_years`` after that. A workflow's setting wins over its tenant's,
    a tenant's over the defaults.
    """

    hot_days: float = 30.0
    archive_years: float = 7.0
    workflows: dict[str, dict[str, float]] = field(default_factory=dict)
    tenants: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RetentionPolicy:
        section = config.get("retention", {})
        if not isinstance(section, dict):
            raise ConfigurationError("[tool.replayable.retention] must be a table")
        where = "[tool.replayable.retention]"

        def number(table: dict[str, Any], key: str, default: float, at: str) -> float:
            value = table.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{at} {key} must be a non-negative number, not {value!r}")
            return float(value)

        def tables(name: str) -> dict[str, dict[str, float]]:
            found = section.get(name) or {}
            if not isinstance(found, dict):
                raise ConfigurationError(f"{where} {name} must be a table")
            out: dict[str, dict[str, float]] = {}
            for key, table in found.items():
                at = f"{where} {name}.{key}"
                if not isinstance(table, dict):
                    raise ConfigurationError(f"{at} must be a table")
                out[key] = {
                    k: number(table, k, 0.0, at)
                    for k in ("hot_days", "archive_years")
                    if k in table
                }
            return out

        return cls(
            number(section, "hot_days", 30.0, where),
            number(section, "archive_years", 7.0, where),
            tables("workflows"),
            tables("tenants"),
        )

    def _setting(self, key: str, default: float, workflow: str, tenant: str | None) -> float:
        found = self.workflows.get(workflow, {}).get(key)
        if found is None:
            found = self.tenants.get(tenant or "", {}).get(key)
        return default if found is None else found

    def hot_seconds(self, workflow: str, tenant: str | None = None) -> float:
        return self._setting("hot_days", self.hot_days, workflow, tenant) * DAY

    def kept_seconds(self, workflow: str, tenant: str | None = None) -> float:
        """How long after a run started its payloads are kept at all (hot, then archived)."""
        years = self._setting("archive_years", self.archive_years, workflow, tenant)
        return self.hot_seconds(workflow, tenant) + years * YEAR


@dataclass
class ArchiveReport:
    parts: int = 0
    runs: int = 0
    events: int = 0
    resumed: int = 0
    dropped: int = 0
    blobs_dropped: int = 0
    nodes_dropped: int = 0
    #: The store has no blob drop: only references and inline text were dropped.
    blobs_kept: bool = False
    seconds: float = 0.0
    urls: list[str] = field(default_factory=list)


def _part_id(tenant: str, day: str, run_ids: Sequence[str]) -> str:
    h = hashlib.sha256(f"{tenant}\x00{day}\x00".encode())
    h.update("\x00".join(run_ids).encode())
    return h.hexdigest()[:24]


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def _partition(tenant: str) -> str:
    # Hive-style partition values: keep them to safe characters.
    return re.sub(r"[^A-Za-z0-9._-]", lambda m: f"%{ord(m.group()):02X}", tenant) or "_"


def archive(
    store: EventStore,
    dest: str,
    *,
    older_than: float | None = None,
    policy: RetentionPolicy | None = None,
    now: float | None = None,
    part_runs: int = 2_000,
    drop: bool = True,
    actor: Actor | None = None,
    progress: Callable[[str], None] | None = None,
) -> ArchiveReport:
    """Archive the finished runs started more than ``older_than`` seconds ago (else as the
    retention ``policy`` says per workflow) to ``dest``; see the module docs.

    With ``drop`` (the default) each part's hot payloads are dropped once its files
    were read back whole, then the blobs only archived runs used; ``drop=False`` keeps
    the hot copies (reads still go to the archive). Dropping needs the role admin (the
    maintenance login, on PostgreSQL) and is written to the audit trail."""
    t0 = time.perf_counter()
    now = time.time() if now is None else now
    policy = policy or RetentionPolicy()
    report = ArchiveReport()
    say = progress or (lambda _line: None)
    who = actor or Actor.current(store)
    if drop and who.role != "admin":
        raise AccessDeniedError(
            f"{who.user} (role {who.role}) may not drop hot payloads; that needs the role "
            "admin (and, on PostgreSQL, the maintenance login); --keep-hot archives only"
        )

    def finish(part: ArchivePart) -> None:
        _commit(store, part)
        if drop:
            n = _drop(store, part, who)
            report.dropped += n
            say(f"dropped the hot payloads of part {part.part_id}: {n} event(s)")

    for part in store.archive_pending():
        _write_part(store, part, {})
        finish(part)
        report.resumed += 1
        report.parts += 1
        report.runs += len(part.runs)
        say(f"resumed part {part.part_id}: {len(part.runs)} run(s)")
    done = store.archived_ids()
    groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
    listed: dict[str, Run] = {}
    for run in store.list_runs(RunFilter(limit=None)):
        if run.end is None or run.run_id in done:
            continue
        tenant = store.row_tenant(run.start) or ""
        age = older_than if older_than is not None else policy.hot_seconds(run.workflow, tenant)
        if run.started_at > now - age:
            continue
        day = dt.datetime.fromtimestamp(run.started_at, dt.UTC).strftime("%Y-%m-%d")
        groups.setdefault((tenant, day), []).append((run.run_id, run.end.event_count))
        listed[run.run_id] = run
    for (tenant, day), runs in sorted(groups.items()):
        runs.sort()
        chunk: list[str] = []
        events = 0
        for run_id, count in [*runs, ("", 0)]:
            full = len(chunk) >= part_runs or events + count > PART_EVENTS
            if chunk and (not run_id or full):
                part = _plan(store, dest, tenant, day, chunk, now)
                n = _write_part(store, part, listed)
                say(f"part {part.part_id}: {len(chunk)} run(s), {n} event(s) -> {part.events_url}")
                finish(part)
                report.parts += 1
                report.runs += len(chunk)
                report.events += n
                report.urls.append(part.events_url)
                chunk, events = [], 0
            if run_id:
                chunk.append(run_id)
                events += count
    if drop:
        # What a drop cut short left (a killed job's): indexed runs with hot payloads.
        archived = sorted(store.archived_ids())
        for start in range(0, len(archived), 1000):
            report.dropped += store.drop_archived_payloads(archived[start : start + 1000])
        dropped = drop_blobs(store)
        if dropped is None:
            report.blobs_kept = True
        else:
            report.blobs_dropped, report.nodes_dropped = dropped
    report.seconds = time.perf_counter() - t0
    return report


def drop_blobs(store: EventStore) -> tuple[int, int] | None:
    """The store's ``drop_archived_blobs()`` (blobs, nodes deleted), or ``None`` when the
    store has no such step and keeps its blob rows."""
    try:
        return store.drop_archived_blobs()
    except ConfigurationError:
        return None


def _drop(store: EventStore, part: ArchivePart, who: Actor) -> int:
    """Drop the hot payloads of an indexed part's runs, and say so in the audit trail."""
    n = 0
    for start in range(0, len(part.runs), 1000):
        n += store.drop_archived_payloads(part.runs[start : start + 1000])
    if n:
        log_reads(
            store,
            who,
            channel="cli",
            what=("archive-drop",),
            reads=[(None, part.tenant, ())],
            purpose=f"archive part {part.part_id}: hot payloads of {len(part.runs)} run(s) "
            f"({n} event(s)) dropped, kept in {part.events_url}",
        )
    return n


def _plan(
    store: EventStore, dest: str, tenant: str, day: str, run_ids: list[str], now: float
) -> ArchivePart:
    pid = _part_id(tenant, day, run_ids)
    where = (f"tenant={_partition(tenant)}", f"date={day}", f"part-{pid}.parquet")
    part = ArchivePart(
        pid,
        tenant,
        day,
        run_ids,
        _join(dest, "events", *where),
        _join(dest, "blobs", *where),
        now,
    )
    store.archive_plan(part)
    return part


def _commit(store: EventStore, part: ArchivePart) -> None:
    spaces = store.run_spaces(part.runs)
    store.archive_commit(part.part_id, [(r, spaces.get(r, "")) for r in part.runs], time.time())


def _write_part(store: EventStore, part: ArchivePart, listed: dict[str, Run]) -> int:
    """Write the part's three files (again, after a crash: the same content) and read
    them back (see :func:`_check_part`); its event count. ``listed`` holds the runs
    already read (others are read here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spaces = store.run_spaces(part.runs)
    _write_runs(store, part, listed, spaces)
    refs: dict[str, set[str]] = {}
    schema = pa.schema([(name, _EVENT_TYPES[name]) for name in EVENT_FIELDS])
    written = _Rows()
    fs, path = filesystem(part.events_url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as out, ThreadPoolExecutor(1, "replayable-archive") as pool:
        writer = pq.ParquetWriter(
            out,
            schema,
            compression="zstd",
            use_dictionary=_DICTIONARY_COLUMNS,
            write_statistics=_DICTIONARY_COLUMNS,
        )

        def write(table: Any) -> None:
            written.add(table)
            writer.write_table(table, table.num_rows)

        # A row group's digests are folded in and it is encoded and compressed (pyarrow
        # and hashlib, without the GIL) on the pool's thread while the next one is read
        # from the store and built here; one at a time, in order, so at most two are held.
        pending: Future[None] | None = None
        try:
            for table in _event_tables(store, sorted(part.runs), schema, spaces, refs):
                if pending is not None:
                    pending.result()
                pending = pool.submit(write, table)
            if pending is not None:
                pending.result()
                pending = None
            if not written.count:
                writer.write_table(schema.empty_table())
        finally:
            if pending is not None:
                pending.exception()  # the error being raised wins; the write is let finish
        writer.close()
        _sync(fs, out)
    total = written.count
    nodes: list[NodeRow] = []
    blobs: list[BlobRow] = []
    for key_space, wanted in refs.items():
        found_nodes, found_blobs = reachable(store, key_space, wanted)
        nodes += found_nodes
        blobs += found_blobs
    table = pa.table(
        {
            "kind": pa.array(["node"] * len(nodes) + ["blob"] * len(blobs), pa.string()),
            "space": pa.array([n.tenant for n in nodes] + [b.tenant for b in blobs], pa.string()),
            "digest": pa.array([n.digest for n in nodes] + [b.digest for b in blobs], pa.string()),
            "parent": pa.array([n.parent for n in nodes] + [None] * len(blobs), pa.string()),
            "body": pa.array([n.body for n in nodes] + [None] * len(blobs), pa.string()),
            "codec": pa.array([None] * len(nodes) + [b.codec for b in blobs], pa.string()),
            "data": pa.array([None] * len(nodes) + [b.data for b in blobs], pa.binary()),
            "size": pa.array([None] * len(nodes) + [b.size for b in blobs], pa.int64()),
        }
    )
    fs, path = filesystem(part.blobs_url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as out:
        # Blobs are compressed already; zstd here packs the node rows and the digests.
        pq.write_table(table, out, compression="zstd")
        _sync(fs, out)
    _sync_dirs(fs, [part.events_url, part.blobs_url, runs_url(part.events_url)])
    tier = {("node", n.tenant, n.digest) for n in nodes}
    tier.update(("blob", b.tenant, b.digest) for b in blobs)
    _check_part(part, written, tier)
    return total


def run_tags(metadata: dict[str, Any]) -> list[str]:
    """A run's metadata as the ``key=value`` tags ``--meta`` filters compare (the key
    JSON-quoted, so '=' in it is safe; nested values are not tags), as PostgreSQL keeps them."""
    tags = []
    for key, value in metadata.items():
        if isinstance(value, dict | list):
            continue
        text = tag_value(value)
        quoted = orjson.dumps(key).decode()
        tags.append(quoted if text is None else f"{quoted}={text}")
    return tags


def _write_runs(
    store: EventStore, part: ArchivePart, listed: dict[str, Run], spaces: dict[str, str]
) -> None:
    """The part's runs file: each run's tenant (exactly, not as escaped in the path),
    key space, workflow, start time, status and metadata tags."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    runs = [listed.get(r) or store.get_run(r) for r in sorted(part.runs)]
    table = pa.table(
        {
            "run_id": pa.array([r.run_id for r in runs], pa.string()),
            "tenant": pa.array([store.row_tenant(r.start) for r in runs], pa.string()),
            "space": pa.array([spaces.get(r.run_id, "") for r in runs], pa.string()),
            "workflow": pa.array([r.workflow for r in runs], pa.string()),
            "started_at": pa.array([r.start.started_at for r in runs], pa.float64()),
            "status": pa.array([r.status for r in runs], pa.string()),
            "parent_run_id": pa.array([r.start.parent_run_id for r in runs], pa.string()),
            "tags": pa.array(
                [run_tags(dict(r.start.metadata)) for r in runs], pa.list_(pa.string())
            ),
        }
    )
    assert table.column_names == list(RUN_FIELDS)
    fs, path = filesystem(runs_url(part.events_url))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as out:
        pq.write_table(table, out, compression="zstd")
        _sync(fs, out)


def _local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _sync(fs: Any, out: Any) -> None:
    """A part's file on a local disk on stable storage before the part is indexed and
    its hot payloads dropped (an object store has it once the upload completes): one
    fsync per file, none per row group."""
    if _local(fs):
        out.flush()
        os.fsync(out.fileno())


def _sync_dirs(fs: Any, urls: Sequence[str]) -> None:
    """The directory entries of a part's local files, up to the archive's root: each
    directory synced once."""
    if not _local(fs):
        return
    done: set[str] = set()
    for url in urls:
        _, path = filesystem(url)
        parts = path.split("/")
        # <root>/<events|blobs|runs>/tenant=<T>/date=<D>/part-<id>.parquet
        for up in range(len(parts) - 1, max(len(parts) - 5, 1), -1):
            directory = "/".join(parts[:up]) or "/"
            if directory in done:
                continue
            done.add(directory)
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class _Rows:
    """What an events file holds, in order: its rows, and a sha256 of each of the columns
    that name a row (run id, seq) and fix the rest of it (its hash), over the Arrow
    buffers themselves (values, then value lengths, then where the nulls are), so the
    digests neither loop in Python nor depend on how the rows are cut into row groups
    or chunks. Kept as the file is written, computed again from the file read back."""

    COLUMNS: Final = ("run_id", "seq", "hash")

    def __init__(self) -> None:
        self.count = 0
        # Per column: its values, their lengths, the row numbers of its nulls.
        self._digests = [tuple(hashlib.sha256() for _ in range(3)) for _ in self.COLUMNS]

    def add(self, table: Any) -> None:
        """Fold in the rows of ``table`` (a pyarrow Table holding :attr:`COLUMNS`)."""
        for name, digests in zip(self.COLUMNS, self._digests, strict=True):
            row = self.count
            column = table.column(name)
            for chunk in getattr(column, "chunks", [column]):
                _fold(chunk, row, *digests)
                row += len(chunk)
        self.count += table.num_rows

    def _key(self) -> tuple[int, list[bytes]]:
        return (self.count, [d.digest() for pair in self._digests for d in pair])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rows) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]


def _fold(chunk: Any, row: int, values: Any, lengths: Any, nulls: Any) -> None:
    """Add one Arrow array's values, value lengths and nulls (by row number, its first
    row being ``row``) to those three digests, reading only the array's own part of its
    buffers (it may be a slice)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(chunk):
        return
    kind = chunk.type
    if chunk.null_count:
        nulls.update(_int64_bytes(pc.add(pc.indices_nonzero(chunk.is_null()), row)))
        chunk = chunk.fill_null(0 if pa.types.is_integer(kind) else "")
    n, at = len(chunk), chunk.offset
    buffers = chunk.buffers()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        offsets = memoryview(buffers[1]).cast("q" if pa.types.is_large_string(kind) else "i")
        if buffers[2] is not None:
            values.update(memoryview(buffers[2])[offsets[at] : offsets[at + n]])
        lengths.update(_int64_bytes(pc.binary_length(chunk).cast(pa.int64())))
    elif kind == pa.int64():
        values.update(memoryview(buffers[1])[at * 8 : (at + n) * 8])
    else:
        raise StoreError(f"checking an archive column: {kind} is not a type it holds")


def _int64_bytes(array: Any) -> memoryview:
    """The values of an int64 array without nulls, as bytes."""
    return memoryview(array.buffers()[1])[array.offset * 8 : (array.offset + len(array)) * 8]


def _check_part(part: ArchivePart, written: _Rows, tier: set[tuple[str, str, str]]) -> None:
    """Read the part's files back from the archive: the events file must hold exactly the
    rows written (run, seq, hash), the blobs file every node and blob, the runs file the
    part's runs; else nothing is indexed (nor dropped) and the error names the file."""
    import pyarrow.parquet as pq

    try:
        fs, path = filesystem(part.events_url)
        found = _Rows()
        found.add(pq.read_table(path, filesystem=fs, columns=list(_Rows.COLUMNS)))
        fs, path = filesystem(part.blobs_url)
        table = pq.read_table(path, filesystem=fs, columns=["kind", "space", "digest"])
        stored = set(
            zip(*(table.column(c).to_pylist() for c in ("kind", "space", "digest")), strict=True)
        )
        fs, path = filesystem(runs_url(part.events_url))
        listed = pq.read_table(path, filesystem=fs, columns=["run_id"]).column(0).to_pylist()
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"archive part {part.part_id} was written but cannot be read back: {exc}; "
            "nothing of it was indexed or dropped (run the archive again)"
        ) from exc
    if found != written:
        raise StoreError(
            f"{part.events_url} does not hold what was written ({found.count} row(s) read "
            f"back, {written.count} written); nothing of it was indexed or dropped"
        )
    if sorted(listed) != sorted(part.runs):
        raise StoreError(
            f"{runs_url(part.events_url)} does not list the part's {len(part.runs)} run(s); "
            "nothing of the part was indexed or dropped"
        )
    if not tier <= stored:
        raise StoreError(
            f"{part.blobs_url} lacks {len(tier - stored)} of the {len(tier)} blob and node "
            "row(s) written; nothing of the part was indexed or dropped"
        )


def _event_tables(
    store: EventStore,
    run_ids: Sequence[str],
    schema: Any,
    spaces: dict[str, str],
    refs: dict[str, set[str]],
) -> Iterable[Any]:
    """The runs' stored rows (as stored, not decoded: a damaged row is archived as it is
    and named by whoever reads it) as tables of whole runs, about ROW_GROUP_ROWS rows
    each: one row group each; the payload references in them added to ``refs`` by key
    space. A table is written and let go soon after the next is read, so the memory of
    one is reused, not taken afresh for the whole part."""
    import pyarrow as pa

    fast = isinstance(store, SQLiteStore)

    def read(chunk: Sequence[str]) -> Any | None:
        if fast:
            assert isinstance(store, SQLiteStore)
            rows = read_rows(store, chunk)
            if not rows:
                return None
            table = event_table(store, rows, schema)
            if table is not None:
                # Only when the rows reference the tier: their stored values, as the
                # general path reads them.
                if any(table.column(i).null_count != len(rows) for i in (20, 21, 11)):
                    run_col, rq, rs, err = (list(map(itemgetter(i), rows)) for i in (0, 20, 21, 11))
                    _add_refs(run_col, rq, rs, err, spaces, refs)
                return table
        columns = store.stored_columns(chunk)
        if not columns or not len(columns[0]):
            return None
        return _event_table(pa, schema, columns, spaces, refs)

    pending: list[Any] = []
    rows_pending = 0
    at, step, seen_runs, seen_rows = 0, 1, 0, 0
    while at < len(run_ids):
        chunk = run_ids[at : at + step]
        at += len(chunk)
        table = read(chunk)
        rows = table.num_rows if table is not None else 0
        seen_runs += len(chunk)
        seen_rows += rows
        # As many runs next as make up the rest of a row group at the rows per run so far.
        per_run = max(seen_rows / seen_runs, 1.0)
        if rows:
            pending.append(table)
            rows_pending += rows
        if rows_pending >= ROW_GROUP_ROWS:
            yield pending[0] if len(pending) == 1 else pa.concat_tables(pending)
            pending, rows_pending = [], 0
        step = max(1, min(500, int((ROW_GROUP_ROWS - rows_pending) / per_run) or 1))
    if rows_pending:
        yield pending[0] if len(pending) == 1 else pa.concat_tables(pending)


def _event_table(
    pa: Any,
    schema: Any,
    columns: list[Any],
    spaces: dict[str, str],
    refs: dict[str, set[str]],
) -> Any:
    """The table of rows as :meth:`EventStore.stored_columns` gives them; the payload
    references in them added to ``refs`` by key space."""
    columns = list(columns)
    n = len(columns[0])
    # Most rows reference nothing in the tier: that is counted in C, not looped over.
    if any(columns[i].count(None) != n for i in (20, 21, 11)):
        _add_refs(columns[0], columns[20], columns[21], columns[11], spaces, refs)
    columns[12] = [True if v == 1 else False if v == 0 else None for v in columns[12]]
    return pa.table(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema,
    )


def _add_refs(
    run_ids: Sequence[Any],
    requests: Sequence[Any],
    responses: Sequence[Any],
    errors: Sequence[Any],
    spaces: dict[str, str],
    refs: dict[str, set[str]],
) -> None:
    """The payload references of rows (their stored values), added to ``refs`` by key
    space."""
    last = None
    mine: set[str] = set()
    for run_id, rq, rs, error in zip(run_ids, requests, responses, errors, strict=True):
        # An error the tier keeps (encrypted) is copied like the payloads.
        err = tier_ref(error) if type(error) is str else None
        if rq is not None or rs is not None or err is not None:
            if run_id != last:
                mine = refs.setdefault(spaces.get(run_id, ""), set())
                last = run_id
            if rq is not None:
                mine.add(rq)
            if rs is not None:
                mine.add(rs)
            if err is not None:
                mine.add(err)


def _types() -> dict[str, Any]:
    import pyarrow as pa

    s, i, f, b = pa.string(), pa.int64(), pa.float64(), pa.bool_()
    kinds = {"seq": i, "parent": i, "side_effect": b, "started_at": f, "duration_ns": i}
    kinds.update({"chain_index": i, "schema_version": pa.int32()})
    return {name: kinds.get(name, s) for name in EVENT_FIELDS}


class _Types(dict[str, Any]):
    def __missing__(self, key: str) -> Any:
        self.update(_types())
        return dict.__getitem__(self, key)


_EVENT_TYPES: Final = _Types()
