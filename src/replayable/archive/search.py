"""Impact queries over the Parquet archive, on DuckDB: ``replayable query --archive URL``.

:class:`ArchiveSearch` answers an :class:`~replayable.store.search.EventQuery` over an
archive that ``replayable archive`` wrote (a local directory or ``s3://…``, any fsspec
filesystem), with the same predicates and the same answers as the hot stores: the
conditions come from the shared query builder (:data:`~replayable.store.search.DUCKDB`).

How a query runs:

1. **Tenancy first.** Only the files under the partitions of the tenants the reader
   may read are opened (``events/tenant=<T>/…``; which tenants, the catalog store
   says: :meth:`~replayable.store.base.EventStore.sees_tenant`), and the runs they
   join are kept by the exact ``tenant`` column of the runs files: the partition
   escaping is not trusted to keep ``_`` and "no tenant" apart (and DuckDB's reading
   of ``key=value`` directories as columns is off: it would put the path's ``tenant``
   in place of the file's). Every value of the
   query (workflow, names, paths, predicate values) is a bound parameter, never SQL.
2. **Metadata in DuckDB.** Kind, name, time, the run's workflow and metadata tags,
   and the payload predicates on payloads held inline in the event rows are all
   evaluated by DuckDB over the Parquet columns (row-group statistics skip most of
   the files' rows for a time window).
3. **Payloads in Python, on candidates only.** A payload in the blob tier (every
   payload of an encrypting store, and any over the threshold) is not in the event
   row: its event is a *candidate*. Candidates are read with their blobs, decrypted
   and decompressed with the catalog's data keys, and checked with
   :meth:`EventQuery.matches_event` — only for the runs a page needs, newest first.
   An erased payload (its key destroyed) reads as its erasure notice and so matches
   no payload predicate; the event's metadata still does.

The catalog store gives the runs' records for the hits (the hot store keeps every
run's metadata; the archive only its payloads) and receives the access log entries
when the search goes through :class:`~replayable.audit.access.AuditReader`.

``duckdb`` is imported on first use (``pip install 'replayable[archive]'``).
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Final

from replayable.archive.parquet import _partition
from replayable.errors import ConfigurationError, RunNotFoundError, StoreError
from replayable.events.model import Event
from replayable.store.cold import EVENT_FIELDS, ArchivedRun, ColdReader, filesystem
from replayable.store.rows import event_from_row
from replayable.store.search import (
    DUCKDB,
    EventFilter,
    EventQuery,
    SearchHit,
    SearchPage,
    event_filter,
)

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["ArchiveSearch"]

_DATE: Final = re.compile(r"/date=(\d{4}-\d{2}-\d{2})/")
#: The path's key=value directories are not columns: the files' own columns are read.
_OPTS: Final = ", hive_partitioning = false"
#: Candidate runs read per round while a page fills with checked runs.
_CHECK_BATCH: Final = 64


def _unescape(partition: str) -> list[str | None]:
    """The tenants a partition directory can hold (``_`` is also "no tenant")."""
    text = re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), partition)
    return [text, "", None] if partition == "_" else [text]


class ArchiveSearch:
    """``search(query)`` over the archive at ``url``, for the readers of ``store``.

    ``tenants`` narrows the tenants read (``None`` in it: runs without one); by default,
    every tenant of the archive that ``store`` may read.
    """

    def __init__(
        self,
        url: str,
        store: EventStore,
        *,
        tenants: Collection[str | None] | None = None,
    ) -> None:
        if not url:
            raise ConfigurationError("--archive needs a directory or an s3:// URL")
        self.url = url.rstrip("/")
        self.store = store
        self._tenants = None if tenants is None else set(tenants)
        self._lock = threading.Lock()
        self._con: Any = None
        self._cold = ColdReader(store)
        self.fs, self.root = filesystem(self.url)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self._prefix = "" if protocol in ("file", "local") else f"{protocol}://"

    def close(self) -> None:
        """Release DuckDB's connection (and with it the filesystem it was lent)."""
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
        self._cold.forget()

    def __enter__(self) -> ArchiveSearch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- what may be read ---------------------------------------------------------------

    def readable_tenants(self) -> list[str | None]:
        """The tenants whose archived runs this search reads."""
        found: list[str | None] = []
        for path in self._ls(f"{self.root}/runs"):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith("tenant="):
                continue
            for tenant in _unescape(name[len("tenant=") :]):
                if tenant in found:
                    continue
                if self._tenants is not None and tenant not in self._tenants:
                    continue
                if self.store.sees_tenant(tenant):
                    found.append(tenant)
        return found

    def _ls(self, path: str) -> list[str]:
        try:
            return [str(p) for p in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"the archive {self.url} cannot be listed: {exc}") from exc

    def _files(self, kind: str, tenants: Sequence[str | None], until: float | None) -> list[str]:
        """The ``kind`` files (events, runs) of ``tenants``' partitions; dates after
        ``until`` skipped (a run's events start on or after its start date)."""
        last = None if until is None else dt.datetime.fromtimestamp(until, dt.UTC).date()
        files: list[str] = []
        for partition in sorted({_partition(t or "") for t in tenants}):
            pattern = f"{self.root}/{kind}/tenant={partition}/date=*/part-*.parquet"
            try:
                found = sorted(str(p) for p in self.fs.glob(pattern))
            except OSError as exc:
                raise StoreError(f"the archive {self.url} cannot be listed: {exc}") from exc
            for path in found:
                m = _DATE.search(path)
                if m is None or f"/tenant={partition}/" not in path:
                    continue
                if last is not None and dt.date.fromisoformat(m.group(1)) > last:
                    continue
                files.append(self._prefix + path)
        return files

    def _connection(self) -> Any:
        if self._con is None:
            try:
                import duckdb
            except ImportError as exc:  # pragma: no cover - the extra names it
                raise ConfigurationError(
                    "queries over the archive need duckdb: pip install 'replayable[archive]'"
                ) from exc
            con = duckdb.connect(":memory:")
            if self._prefix:
                con.register_filesystem(self.fs)
            self._con = con
        return self._con

    def _sql(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            con = self._connection()
            import duckdb

            try:
                return list(con.execute(sql, params).fetchall())
            except duckdb.Error as exc:
                raise StoreError(f"querying the archive {self.url} failed: {exc}") from exc

    # -- the query ----------------------------------------------------------------------

    def search(self, query: EventQuery) -> SearchPage:
        """Runs with events matching ``query``, newest first, paginated by run."""
        tenants = self.readable_tenants()
        if not tenants or any(isinstance(v, dict | list) for v in query.metadata.values()):
            return SearchPage([], query.offset, None)
        events = self._files("events", tenants, query.until)
        runs = self._files("runs", tenants, query.until)
        if not events or not runs:
            return SearchPage([], query.offset, None)
        from replayable.archive.parquet import run_tags

        run_where = ["(" + " OR ".join(["r.tenant IS NOT DISTINCT FROM ?"] * len(tenants)) + ")"]
        run_params: list[Any] = list(tenants)
        if query.workflow is not None:
            run_where.append("r.workflow = ?")
            run_params.append(query.workflow)
        tags = run_tags(dict(query.metadata))
        if tags:
            run_where.append("list_has_all(r.tags, ?::VARCHAR[])")
            run_params.append(tags)
        cond = event_filter(query, DUCKDB)
        # Parameters in the order their placeholders appear in the statement.
        sql = (
            f"WITH r AS (SELECT run_id, space, started_at FROM read_parquet(?{_OPTS}) r "
            f"WHERE {' AND '.join(run_where)}), "
            "m AS (SELECT e.run_id, any_value(e.filename) AS filename, "
            f"bool_or(coalesce({cond.certain}, TRUE)) AS sure "
            f"FROM read_parquet(?{_OPTS}, filename = true) e WHERE {cond.where} "
            "GROUP BY e.run_id) "
            "SELECT r.run_id, m.sure, m.filename, r.space FROM r JOIN m ON m.run_id = r.run_id "
            "ORDER BY r.started_at DESC, r.run_id DESC LIMIT ?"
        )
        params = [runs, *run_params, *cond.certain_params, events, *cond.params]
        need = query.offset + query.limit + 1
        confirmed: list[str] = []
        checked: dict[str, list[Event]] = {}
        where_of: dict[str, tuple[str, str]] = {}
        limit = need
        while True:
            rows = self._sql(sql, [*params, limit])
            where_of.update((rid, (filename, space)) for rid, _, filename, space in rows)
            confirmed = []
            todo = [rid for rid, sure, _, _ in rows if not sure and rid not in checked]
            at = 0
            for rid, sure, _, _ in rows:
                if not sure and rid not in checked:
                    batch = todo[at : at + _CHECK_BATCH]
                    at += len(batch)
                    checked.update(self._candidates(query, cond, batch, where_of))
                if sure or checked.get(rid):
                    confirmed.append(rid)
                    if len(confirmed) == need:
                        break
            if len(confirmed) == need or len(rows) < limit:
                break
            limit *= 4
        page_ids = confirmed[query.offset : query.offset + query.limit]
        more = len(confirmed) > query.offset + query.limit
        if not page_ids:
            return SearchPage([], query.offset, None)
        matching = self._candidates(
            query, cond, [r for r in page_ids if r not in checked], where_of
        )
        matching.update({r: checked[r] for r in page_ids if r in checked})
        hits = []
        for rid in page_ids:
            try:
                run = self.store.get_run(rid)
            except RunNotFoundError:
                raise StoreError(
                    f"run {rid} is in the archive {self.url} but not in {self.store.url}: "
                    "query the archive with the store it was archived from"
                ) from None
            hits.append(SearchHit(run, matching[rid]))
        return SearchPage(hits, query.offset, query.offset + query.limit if more else None)

    def _candidates(
        self,
        query: EventQuery,
        cond: EventFilter,
        run_ids: list[str],
        where_of: dict[str, tuple[str, str]],
    ) -> dict[str, list[Event]]:
        """The matching events of ``run_ids`` (each run's list, maybe empty): candidates
        read whole from their runs' files only, tier payloads joined (decrypted), and
        checked in Python where SQL was not certain."""
        if not run_ids:
            return {}
        files = sorted({where_of[r][0] for r in run_ids})
        columns = ", ".join(f"e.{c}" for c in EVENT_FIELDS)
        rows = self._sql(
            f"SELECT {columns}, coalesce({cond.certain}, TRUE), e.filename "
            f"FROM read_parquet(?{_OPTS}, filename = true) e WHERE {cond.where} "
            "AND e.run_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY e.run_id, e.seq",
            [*cond.certain_params, files, *cond.params, run_ids],
        )
        out: dict[str, list[Event]] = {rid: [] for rid in run_ids}
        by_file: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for row in rows:
            space = where_of[row[0]][1]
            by_file.setdefault((row[-1], space), []).append(row)
        for (filename, space), group in by_file.items():
            split = [(event_from_row(r[:20]), r[20], r[21]) for r in group]
            if any(rq is not None or rs is not None for _, rq, rs in split):
                root, _, rest = filename.rpartition("/events/")
                where = ArchivedRun(group[0][0], "", filename, f"{root}/blobs/{rest}", space)
                tier = self._cold.blobs(where)
                joined = self.store.tier.join_events(tier, split, _const(space))
            else:
                joined = [e for e, _, _ in split]
            for event, row in zip(joined, group, strict=True):
                if row[22] or query.matches_event(event):
                    out[event.run_id].append(event)
        for found in out.values():
            found.sort(key=lambda e: e.seq)
        return out


def _const(space: str) -> Callable[[str], str]:
    """Every run of one group is in one key space."""
    return lambda _run_id: space
