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
from replayable.store.cold import EVENT_FIELDS, ArchivedRun, ColdReader, filesystem, runs_url
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
        for path in self._ls(f"{self.root}/events"):
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
            # Archive files do not change once written: a footer read by the scan is
            # reused by the fetch of the hits' rows and by the next query.
            con.execute("SET parquet_metadata_cache = true")
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
        if not events:
            return SearchPage([], query.offset, None)
        cond = event_filter(query, DUCKDB)
        ordered = self._ordered(query, cond, tenants, events)
        need = query.offset + query.limit + 1
        where_of = {rid: (filename, space) for rid, _, filename, space in ordered}
        confirmed: list[str] = []
        checked: dict[str, list[Event]] = {}
        todo = [rid for rid, sure, _, _ in ordered if not sure]
        at = 0
        for rid, sure, _, _ in ordered:
            if not sure and rid not in checked:
                batch = todo[at : at + _CHECK_BATCH]
                at += len(batch)
                checked.update(self._candidates(query, cond, batch, where_of))
            if sure or checked.get(rid):
                confirmed.append(rid)
                if len(confirmed) == need:
                    break
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

    def _ordered(
        self, query: EventQuery, cond: EventFilter, tenants: list[str | None], events: list[str]
    ) -> list[tuple[str, bool, str, str]]:
        """Every run with a candidate event and passing the run conditions, newest first:
        (run id, whether a candidate surely matches, its events file, its key space).

        The events are scanned first, on their filter columns only; then the runs files
        of the parts holding candidates are read (a narrow query opens few of them)."""
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
        found = self._sql(
            "SELECT e.run_id, any_value(e.filename), "
            f"bool_or(coalesce({cond.certain}, TRUE)) "
            f"FROM read_parquet(?{_OPTS}, filename = true) e "
            f"WHERE {cond.where} GROUP BY e.run_id",
            [*cond.certain_params, events, *cond.params],
        )
        if not found:
            return []
        runs = sorted({runs_url(filename) for _, filename, _ in found})
        try:
            kept = self._sql(
                f"SELECT r.run_id, r.space, r.started_at FROM read_parquet(?{_OPTS}) r "
                f"WHERE {' AND '.join(run_where)} AND r.run_id IN (SELECT unnest(?::VARCHAR[]))",
                [runs, *run_params, [rid for rid, _, _ in found]],
            )
        except StoreError as exc:
            missing = [u for u in runs if not self.fs.exists(u.removeprefix(self._prefix))]
            if not missing:
                raise
            raise StoreError(
                f"the archive {self.url} has events without their runs file ({missing[0]}"
                f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}): a part "
                "written before archives kept runs files cannot be queried over the archive"
            ) from exc
        of = {rid: (filename, bool(sure)) for rid, filename, sure in found}
        kept.sort(key=lambda r: (r[2], r[0]), reverse=True)
        return [(rid, of[rid][1], of[rid][0], space) for rid, space, _ in kept]

    def _candidates(
        self,
        query: EventQuery,
        cond: EventFilter,
        run_ids: list[str],
        where_of: dict[str, tuple[str, str]],
    ) -> dict[str, list[Event]]:
        """The matching events of ``run_ids`` (each run's list, maybe empty): candidates
        read whole from the row groups holding their runs only (one statement per file,
        so each file's run ids prune its row groups), tier payloads joined (decrypted),
        and checked in Python where SQL was not certain."""
        if not run_ids:
            return {}
        by_file: dict[str, list[str]] = {}
        for rid in run_ids:
            by_file.setdefault(where_of[rid][0], []).append(rid)
        columns = ", ".join(f"e.{c}" for c in EVENT_FIELDS)
        selects: list[str] = []
        params: list[Any] = []
        for filename, ids in sorted(by_file.items()):
            selects.append(
                f"SELECT {columns}, coalesce({cond.certain}, TRUE) AS sure, ? AS filename "
                f"FROM read_parquet(?{_OPTS}) e WHERE e.run_id IN ({', '.join('?' * len(ids))}) "
                f"AND {cond.where}"
            )
            params += [*cond.certain_params, filename, filename, *ids, *cond.params]
        rows = self._sql(" UNION ALL ".join(selects), params)
        out: dict[str, list[Event]] = {rid: [] for rid in run_ids}
        groups: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for row in rows:
            groups.setdefault((row[-1], where_of[row[0]][1]), []).append(row)
        for (filename, space), group in groups.items():
            split = [(event_from_row(r[:20]), r[20], r[21]) for r in group]
            if self.store.tier.needs_join(split):
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
