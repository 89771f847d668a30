"""The event store contract every backend implements.

A store holds three append-only record kinds (run starts, events, run ends)
and a content-addressed blob table. ``append`` writes one batch in one
transaction; everything else reads. There is no update and no delete.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from replayable.errors import AmbiguousRunIdError, ConfigurationError, RunNotFoundError
from replayable.events.model import Event, Run, RunEnd, RunStart, RunStatus
from replayable.store.audit_base import AuditStore
from replayable.store.payloads import BlobRow, NodeRow, PayloadTier, TierStats

if TYPE_CHECKING:
    from replayable.store.cold import ArchivedRun, ArchivePart, PurgedDigest, PurgeRow
    from replayable.store.crypto import ErasureRow, KeyRow
from replayable.store.search import EventQuery, SearchPage, search_in_python

__all__ = ["EventStore", "RunFilter"]


def check_range(first_seq: object, last_seq: object) -> None:
    """Refuse a range bound that is not an integer (a str from a URL, a float, a bool)."""
    for name, value in (("first_seq", first_seq), ("last_seq", last_seq)):
        if type(value) is not int:
            raise ConfigurationError(
                f"events_range: {name} must be an int step number, not {value!r}"
            )


class RunFilter:
    """Which runs ``list_runs`` returns; every given condition must hold."""

    __slots__ = (
        "limit",
        "metadata",
        "parent_run_id",
        "roots_only",
        "since",
        "status",
        "until",
        "workflow",
    )

    def __init__(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        metadata: Mapping[str, Any] | None = None,
        since: float | None = None,
        until: float | None = None,
        parent_run_id: str | None = None,
        roots_only: bool = False,
        limit: int | None = 100,
    ) -> None:
        self.workflow = workflow
        self.status = status
        self.metadata = dict(metadata or {})
        self.since = since
        self.until = until
        self.parent_run_id = parent_run_id
        self.roots_only = roots_only
        self.limit = limit

    def unlimited(self) -> RunFilter:
        """The same filter without a limit."""
        return RunFilter(
            workflow=self.workflow,
            status=self.status,
            metadata=self.metadata,
            since=self.since,
            until=self.until,
            parent_run_id=self.parent_run_id,
            roots_only=self.roots_only,
            limit=None,
        )

    def sql_conditions(self, ph: str) -> tuple[list[str], list[Any]]:
        """WHERE conditions the SQL backends share, over runs ``r`` left-joined to their
        end records ``e``; ``ph`` is the driver's placeholder. Metadata, whose indexing
        differs per backend, is left to the caller."""
        where: list[str] = []
        params: list[Any] = []
        if self.workflow is not None:
            where.append(f"r.workflow = {ph}")
            params.append(self.workflow)
        if self.status == "incomplete":
            where.append("e.run_id IS NULL")
        elif self.status is not None:
            where.append(f"e.status = {ph}")
            params.append(self.status)
        if self.since is not None:
            where.append(f"r.started_at >= {ph}")
            params.append(self.since)
        if self.until is not None:
            where.append(f"r.started_at <= {ph}")
            params.append(self.until)
        if self.parent_run_id is not None:
            where.append(f"r.parent_run_id = {ph}")
            params.append(self.parent_run_id)
        if self.roots_only:
            where.append("r.parent_run_id IS NULL")
        return where, params

    def matches(self, run: Run) -> bool:
        """Whether ``run`` passes this filter (used by backends that filter in Python)."""
        s = run.start
        if self.workflow is not None and s.workflow != self.workflow:
            return False
        if self.status is not None and run.status != self.status:
            return False
        if self.since is not None and s.started_at < self.since:
            return False
        if self.until is not None and s.started_at > self.until:
            return False
        if self.parent_run_id is not None and s.parent_run_id != self.parent_run_id:
            return False
        if self.roots_only and s.parent_run_id is not None:
            return False
        return all(_tag_matches(s.metadata, k, v) for k, v in self.metadata.items())


def _tag_matches(metadata: Mapping[str, Any], key: str, wanted: Any) -> bool:
    # As the indexed backends do: the key must be present (``None`` matches a null
    # value, not a missing key) and nested values are not tags, so never match.
    if key not in metadata:
        return False
    value = metadata[key]
    if isinstance(value, dict | list) or isinstance(wanted, dict | list):
        return False
    return tag_value(value) == tag_value(wanted)


def tag_value(value: Any) -> str | None:
    """How a metadata value is indexed and compared: its text (``true``, ``42``, ``GB``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)


#: What :meth:`EventStore.notice_erasures` has seen before its first look.
_UNSEEN: Any = object()


class EventStore(AuditStore, ABC):
    """Append-only storage for runs, events and blobs, and the audit records beside them."""

    url: str

    #: Whether :meth:`append_bounded` ends within its bound by itself: it waits for no
    #: lock, peer or network longer than that, and fails (:class:`StoreUnavailableError`)
    #: instead. A writer then makes a durable caller's commit on the caller's own thread
    #: rather than on a committer thread it can stop waiting for (two thread hand-offs
    #: less per durable boundary). Only the disk's own time is not bounded: a disk that
    #: stops answering holds the call, as it would hold a spool written to it.
    bounds_own_waits: ClassVar[bool] = False

    @abstractmethod
    def append(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
    ) -> None:
        """Write one batch atomically. ``durable`` asks for it to reach stable storage."""

    def append_bounded(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
        within: float,
    ) -> None:
        """:meth:`append`, waiting at most ``within`` seconds for anything but the disk
        (only where :attr:`bounds_own_waits`)."""
        raise NotImplementedError(f"{type(self).__name__} does not bound its own waits")

    @abstractmethod
    def put_blob(self, digest: str, data: bytes) -> None:
        """Store ``data`` under its sha256 ``digest``; storing it twice is a no-op."""

    @abstractmethod
    def get_blob(self, digest: str) -> bytes | None:
        """The blob stored under ``digest``, or ``None``."""

    # -- the payload tier (see :mod:`replayable.store.payloads`) --------------------

    #: Splits large payloads into blobs on append and joins them on read.
    tier: PayloadTier

    @abstractmethod
    def tier_nodes(self, tenant: str, digests: Sequence[str]) -> list[NodeRow]:
        """The stored payload nodes of ``tenant`` among ``digests``."""

    @abstractmethod
    def tier_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]:
        """The stored payload blobs of ``tenant`` among ``digests`` (as stored: packed)."""

    @abstractmethod
    def tier_dictionary(self, tenant: str, dict_id: str | None) -> tuple[str, bytes] | None:
        """Compression dictionary ``dict_id`` of ``tenant``, the newest when ``None``."""

    @abstractmethod
    def tier_put_dictionary(self, tenant: str, dict_id: str, data: bytes, at: float) -> None:
        """Store a trained dictionary; writes from now on compress with it."""

    @abstractmethod
    def tier_sample(self, tenant: str, limit: int) -> list[BlobRow]:
        """Up to ``limit`` of ``tenant``'s blobs (what a dictionary is trained on)."""

    @abstractmethod
    def tier_stats(self) -> TierStats:
        """How many blobs and nodes the tier holds, and their bytes."""

    @abstractmethod
    def tier_tenants(self) -> list[str]:
        """The tenants with blobs in the tier ('' for none)."""

    # -- data keys (see :mod:`replayable.store.crypto`) ------------------------------

    @abstractmethod
    def key_rows(self, tenant: str, subject: str | None) -> list[KeyRow]:
        """The wrapped data keys of ``tenant``: of one subject ('' for the tenant's own),
        or of all its subjects when ``subject`` is ``None``."""

    @abstractmethod
    def all_key_rows(self) -> list[KeyRow]:
        """Every wrapped data key this store may read (what rotation re-wraps)."""

    @abstractmethod
    def put_key_rows(self, rows: Sequence[KeyRow]) -> None:
        """Store wrapped data keys (a key id wrapped again is a new row)."""

    @abstractmethod
    def erase_keys(
        self, tenant: str, subjects: Sequence[str] | None, by: str, at: float
    ) -> list[str]:
        """Destroy the data keys of a tenant (``subjects`` ``None``: all its subjects) or
        of the subjects named (a data subject and each epoch of its key space), all or
        none, and record an erasure for each (maintenance only); returns the key ids
        destroyed."""

    @abstractmethod
    def erasures(self, tenant: str) -> list[ErasureRow]:
        """The erasures recorded for ``tenant``, oldest first."""

    def erasure_mark(self) -> object:
        """A value that changes whenever an erasure is recorded, by any process. A store
        that only its own process reaches keeps the default (its ``erase`` forgets)."""
        return None

    def forget_payloads(self) -> None:
        """Drop the payloads, data keys and archived runs this object holds in memory:
        after an erasure, nothing it read before may be shown again."""
        keys = self.__dict__.get("data_keys")
        if keys is not None:
            keys.forget()
        self.tier.forget_texts()
        cold = self.__dict__.get("cold")
        if cold is not None:
            cold.forget()

    def notice_erasures(self) -> None:
        """Before payloads are read: forget what this object holds in memory if an
        erasure was recorded since it last looked (``replayable erase`` runs in another
        process than a web server or a writer that read the payloads before)."""
        mark = self.erasure_mark()
        seen = self.__dict__.get("_erasure_mark", _UNSEEN)
        if mark != seen:
            if seen is not _UNSEEN:
                self.forget_payloads()
            self.__dict__["_erasure_mark"] = mark

    # -- the archive index (see :mod:`replayable.store.cold`) -------------------------
    # Stores that cannot be archived keep these defaults.

    def archived_runs(self, run_ids: Sequence[str]) -> dict[str, ArchivedRun]:
        """Where each archived run among ``run_ids`` lives (runs not archived are left out)."""
        return {}

    def archived_ids(self) -> set[str]:
        """Every archived run's id."""
        return set()

    def archive_plan(self, part: ArchivePart) -> None:
        """Record a part about to be written (its runs fixed)."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def archive_pending(self) -> list[ArchivePart]:
        """Parts planned whose runs were never indexed (a crashed archive job's)."""
        return []

    def archive_commit(self, part_id: str, runs: Sequence[tuple[str, str]], at: float) -> None:
        """Index ``runs`` (run id, key space) as living in part ``part_id``."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def stored_rows(self, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        """The runs' event rows as stored, undecoded, ordered by run and seq: the event
        columns (``rows.EVENT_COLUMNS``) then the two tier references."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def stored_columns(self, run_ids: Sequence[str]) -> list[Sequence[Any]]:
        """:meth:`stored_rows` as columns (a store may build them without the rows)."""
        rows = self.stored_rows(run_ids)
        if not rows:
            return []
        return list(zip(*rows, strict=True))

    def run_spaces(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The key space of each run's payloads."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def drop_archived_payloads(self, run_ids: Sequence[str]) -> int:
        """Clear the hot payloads of archived runs (maintenance); the rows changed."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def drop_archived_blobs(self) -> tuple[int, int]:
        """Delete the blobs and nodes no hot event references any more (maintenance, after
        :meth:`drop_archived_payloads`); returns (blobs, nodes) deleted."""
        raise ConfigurationError(f"{self.url} cannot drop archived blobs")

    def dropped_ids(self) -> set[str]:
        """The archived runs whose hot payloads were dropped (what a search of the hot
        store cannot test: their payloads are only in the archive)."""
        return set()

    def hot_events(self, run_id: str) -> list[Event]:
        """The run's events as the hot store holds them (no archive read): for an archived
        run whose payloads were dropped, its metadata and hashes only."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def archive_index(self) -> list[tuple[ArchivePart, PurgeRow | None]]:
        """Every planned archive part, oldest first, with its purge record if purged."""
        return []

    def record_purge(self, part_id: str, digests: Sequence[PurgedDigest], at: float) -> PurgeRow:
        """Record that retention purged part ``part_id`` (maintenance only), keeping each
        of its events' payload sha256 so that their hashes still verify; returns the
        record, naming the login that purged."""
        raise ConfigurationError(f"{self.url} cannot be archived (use SQLite or PostgreSQL)")

    def purged_digests(self, run_id: str) -> dict[int, tuple[str, str | None]]:
        """The payload sha256s a purge kept for ``run_id``'s events, by seq."""
        return {}

    @abstractmethod
    def get_run(self, run_id: str) -> Run:
        """The run with exactly this id; raises :class:`RunNotFoundError`."""

    @abstractmethod
    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        """Up to ``limit`` run ids starting with ``prefix``."""

    @abstractmethod
    def list_runs(self, filter: RunFilter | None = None) -> list[Run]:
        """Runs passing ``filter``, newest first."""

    def count_runs(self, filter: RunFilter | None = None) -> int:
        """How many runs pass ``filter``, its ``limit`` ignored (``runs`` says "50 of 212")."""
        f = filter or RunFilter()
        return len(self.list_runs(f.unlimited()))

    @abstractmethod
    def events(self, run_id: str) -> list[Event]:
        """The run's events ordered by seq (empty for an unknown run)."""

    def events_until(self, run_id: str, seq: int) -> list[Event]:
        """The run's events up to and including ``seq`` (what a partial replay loads)."""
        return [e for e in self.events(run_id) if e.seq <= seq]

    def events_range(self, run_id: str, first_seq: int, last_seq: int) -> list[Event]:
        """The run's events with ``first_seq <= seq <= last_seq``, ordered by seq: a page
        of a long run, read by key (the SQL backends) instead of everything before it.

        Both ends are inclusive, as in :meth:`events_until`; a range holding no event
        (``last_seq < first_seq``, past the run's end, an unknown run) is empty.
        """
        check_range(first_seq, last_seq)
        if last_seq < first_seq:
            return []
        return [e for e in self.events_until(run_id, last_seq) if e.seq >= first_seq]

    def event_at(self, run_id: str, seq: int) -> Event | None:
        """The run's event ``seq``, or ``None`` (backends look it up by key)."""
        found = [e for e in self.events_until(run_id, seq) if e.seq == seq]
        return found[0] if found else None

    @abstractmethod
    def iter_run_ids(self) -> Iterator[str]:
        """Every run id, oldest first."""

    def search(self, query: EventQuery) -> SearchPage:
        """Runs with events matching ``query``, newest first, each with its matching steps.

        Backends may answer in their query language; this default evaluates in Python.
        """
        return search_in_python(self, query)

    # -- what verify needs beyond the records ----------------------------------------

    def store_id(self) -> str:
        """A random id the store was given when created: anchor entries name their store by it.

        Backends that persist keep it in the database; this default lasts as long
        as the object (right for a store that lives only in memory).
        """
        found: str | None = self.__dict__.get("_store_id")
        if found is None:
            import uuid

            found = self.__dict__["_store_id"] = str(uuid.uuid4())
        return found

    def row_tenant(self, start: RunStart) -> str | None:
        """The tenant a run's rows are stored under (anchor entries carry it)."""
        return start.tenant

    def sees_tenant(self, tenant: str | None) -> bool:
        """Whether this store can read rows stored under ``tenant``."""
        return True

    def tag_problem(self, run: Run) -> str | None:
        """What is wrong with the run's stored tags (the index ``--meta`` filters use),
        or ``None`` when they are exactly what its metadata makes. Default: none kept."""
        return None

    def event_run_ids(self) -> set[str]:
        """Every run id that has events stored (a run row may be missing for some)."""
        return {e.run_id for run_id in self.iter_run_ids() for e in self.events(run_id)}

    def close(self) -> None:
        """Flush pending writes and release connections; the store is unusable afterwards."""
        self.run_close_hooks()

    def connect_url(self) -> str:
        """The URL another process opens this very store with, credentials included.

        Only for handing the store to the writer process: never print or log it
        (``url`` is the one to show, with any password masked).
        """
        return self.url

    def interrupt(self) -> None:
        """Abort a store call that hangs in another thread (a network read that will
        never be answered), so it fails and releases the store. No-op by default."""

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` first thing when the store closes (the writer flushes here)."""
        self.__dict__.setdefault("_close_hooks", []).append(hook)

    def run_close_hooks(self) -> None:
        hooks = self.__dict__.pop("_close_hooks", [])
        for hook in hooks:
            hook()

    # -- shared helpers ---------------------------------------------------------

    def resolve(self, run_id_or_prefix: str) -> str:
        """The full run id for an id or a unique prefix of one."""
        prefix = run_id_or_prefix.strip().lower()
        if not prefix:
            raise RunNotFoundError("empty run id")
        found = self.find_run_ids(prefix)
        if not found:
            raise RunNotFoundError(f"no run matches {run_id_or_prefix!r} in {self.url}")
        if len(found) > 1 and prefix not in found:
            raise AmbiguousRunIdError(run_id_or_prefix, found)
        return prefix if prefix in found else found[0]

    def run(self, run_id_or_prefix: str) -> Run:
        """The run named by an id or unique prefix."""
        return self.get_run(self.resolve(run_id_or_prefix))

    def children(self, run_id: str) -> list[Run]:
        """Child runs started from inside ``run_id``, oldest first."""
        kids = self.list_runs(RunFilter(parent_run_id=run_id, limit=None))
        return sorted(kids, key=lambda r: (r.start.parent_seq or 0, r.started_at))

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
