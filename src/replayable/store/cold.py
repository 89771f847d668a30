"""Reading archived runs back from Parquet, so that old runs replay, show and diff.

``replayable archive`` (:mod:`replayable.archive.parquet`) writes a run's
events and the blob-tier rows its payloads need to Parquet files on an
fsspec filesystem, and records in the store which file holds each run
(``archived_runs`` → ``archive_parts``). From then on the store reads that
run's events from the archive: the row groups holding the run (files are
sorted by run and seq, so row-group statistics find them), joined with the
archived blobs, which stay compressed and encrypted as they were in the hot
store, so erasing a data key erases archived payloads too.

Once retention purged a run's part (:mod:`replayable.archive.purge`), its events
are read from the hot rows (metadata and hashes) with the payloads' sha256 the
purge kept, and the notice "purged on DATE by WHO" in the payloads' place, so
the chain still verifies (:func:`purged_events`). An archive that cannot be read
is named in a :class:`StoreError`, never read as empty payloads.

Recently read runs are cached. pyarrow and fsspec are imported on first use
(``pip install 'replayable[archive]'``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import msgspec
import orjson

from replayable.errors import ConfigurationError, StoreError, StoreUnavailableError
from replayable.events.model import Event
from replayable.store.payloads import BlobRow, NodeRow
from replayable.store.rows import event_from_row

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = [
    "ENV_ARCHIVE_OPTIONS",
    "EVENT_FIELDS",
    "RUN_FIELDS",
    "ArchivePart",
    "ArchivedRun",
    "ColdReader",
    "PurgeRow",
    "PurgedDigest",
    "filesystem",
    "purged_events",
    "purged_notice",
    "runs_url",
]

#: JSON object of fsspec storage options for the archive (an S3 endpoint, credentials).
ENV_ARCHIVE_OPTIONS: Final = "REPLAYABLE_ARCHIVE_OPTIONS"

#: The event columns of an archive file, in the store's row order, then the references.
EVENT_FIELDS: Final = (
    "run_id",
    "seq",
    "kind",
    "name",
    "key",
    "parent",
    "call_site",
    "request",
    "fingerprint",
    "response",
    "encoding",
    "error",
    "side_effect",
    "started_at",
    "duration_ns",
    "metadata",
    "chain_index",
    "prev_hash",
    "hash",
    "schema_version",
    "request_ref",
    "response_ref",
)


#: The columns of an archive's runs file (``runs/``, beside ``events/`` and ``blobs/``).
RUN_FIELDS: Final = (
    "run_id",
    "tenant",
    "space",
    "workflow",
    "started_at",
    "status",
    "parent_run_id",
    "tags",
)


def runs_url(events_url: str) -> str:
    """The runs file of the part whose events file is ``events_url``."""
    root, sep, where = events_url.rpartition("/events/")
    if not sep:
        raise ConfigurationError(f"{events_url!r} is not an archive events file")
    return f"{root}/runs/{where}"


class ArchivePart(NamedTuple):
    """One archive file pair, planned before it is written: its runs are fixed, so a
    rerun after a crash writes the same files again and nothing is archived twice."""

    part_id: str
    tenant: str
    day: str
    runs: list[str]
    events_url: str
    blobs_url: str
    planned_at: float

    def values(self) -> tuple[str, str, str, str, str, str, float]:
        """The part as an ``archive_parts`` row (its runs as JSON text)."""
        return (
            self.part_id,
            self.tenant,
            self.day,
            orjson.dumps(self.runs).decode(),
            self.events_url,
            self.blobs_url,
            self.planned_at,
        )

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> ArchivePart:
        """The part from an ``archive_parts`` row in :meth:`values` order."""
        return cls(r[0], r[1], r[2], orjson.loads(r[3]), r[4], r[5], r[6])


#: The planned parts not written yet (no run of theirs indexed), oldest first: one
#: query for every backend.
PENDING_PARTS_SQL: Final = (
    "SELECT part_id, tenant, day, runs, events_url, blobs_url, planned_at "
    "FROM archive_parts p WHERE NOT EXISTS "
    "(SELECT 1 FROM archived_runs a WHERE a.part_id = p.part_id) ORDER BY planned_at"
)
#: Every part with its purge, if any, in plan order: one query for every backend.
PART_INDEX_SQL: Final = (
    "SELECT p.part_id, p.tenant, p.day, p.runs, p.events_url, p.blobs_url, "
    "p.planned_at, g.purged_at, g.purged_by FROM archive_parts p "
    "LEFT JOIN archive_purges g ON g.part_id = p.part_id ORDER BY p.planned_at, p.part_id"
)


class ArchivedRun(NamedTuple):
    """Where an archived run's events and blobs are (``purged``: the notice, "purged on
    DATE by WHO", once retention removed its part's files)."""

    run_id: str
    part_id: str
    events_url: str
    blobs_url: str
    space: str
    purged: str | None = None


class PurgeRow(NamedTuple):
    """A purged archive part: when, by which login."""

    part_id: str
    tenant: str
    purged_at: float
    purged_by: str

    @property
    def notice(self) -> str:
        day = dt.datetime.fromtimestamp(self.purged_at, dt.UTC).strftime("%Y-%m-%d")
        return f"purged on {day} by {self.purged_by}"


#: What a purge keeps of each event's payloads: (run id, seq, request sha256, response
#: sha256 or None when the event had no response), so that its hash still verifies.
PurgedDigest = tuple[str, int, str, str | None]


def purged_notice(purged_at: float, purged_by: str) -> str:
    return PurgeRow("", "", purged_at, purged_by).notice


def purged_events(
    events: Sequence[Event], digests: dict[int, tuple[str, str | None]], notice: str
) -> list[Event]:
    """The hot events of a purged run (their payloads gone) with the notice in the
    payloads' place and the recorded sha256 standing in for them in the hash, as for an
    erased payload. An event whose digests were not recorded is named unreadable."""
    out = []
    for e in events:
        found = digests.get(e.seq)
        if found is None:
            out.append(
                msgspec.structs.replace(
                    e,
                    request="null",
                    response=None,
                    problems=(*e.problems, f"request: {notice}, and its sha256 was not kept"),
                )
            )
            continue
        text = orjson.dumps(notice).decode()
        request_digest, response_digest = found
        problems = [*e.problems, f"request: {notice}"]
        if response_digest is not None:
            problems.append(f"response: {notice}")
        out.append(
            msgspec.structs.replace(
                e,
                request=text,
                request_digest=request_digest,
                response=text if response_digest is not None else None,
                response_digest=response_digest,
                erased=notice,
                problems=tuple(problems),
            )
        )
    return out


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem and path for ``url`` (options from ``$REPLAYABLE_ARCHIVE_OPTIONS``)."""
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - the extra names it
        raise ConfigurationError(
            "the archive needs pyarrow and fsspec: pip install 'replayable[archive]'"
        ) from exc
    options: dict[str, Any] = {}
    raw = os.environ.get(ENV_ARCHIVE_OPTIONS)
    if raw:
        try:
            options = json.loads(raw)
        except ValueError as exc:
            raise ConfigurationError(f"{ENV_ARCHIVE_OPTIONS} is not JSON: {exc}") from None
        if not isinstance(options, dict):
            raise ConfigurationError(f"{ENV_ARCHIVE_OPTIONS} must be a JSON object")
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    scoped = options.get(scheme, options) if isinstance(options.get(scheme), dict) else options
    fs, path = fsspec.core.url_to_fs(url, **(scoped if scheme != "file" else {}))
    return fs, path


class _ColdTier:
    """The tier rows of one archived blobs file, as a :class:`TierBackend`."""

    def __init__(self, store: EventStore, nodes: list[NodeRow], blobs: list[BlobRow]) -> None:
        self.store = store
        self.nodes = {(n.tenant, n.digest): n for n in nodes}
        self.blobs = {(b.tenant, b.digest): b for b in blobs}

    def tier_nodes(self, tenant: str, digests: Sequence[str]) -> list[NodeRow]:
        return [n for d in digests if (n := self.nodes.get((tenant, d))) is not None]

    def tier_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]:
        return [b for d in digests if (b := self.blobs.get((tenant, d))) is not None]

    def tier_dictionary(self, tenant: str, dict_id: str | None) -> tuple[str, bytes] | None:
        return self.store.tier_dictionary(tenant, dict_id)


class ColdReader:
    """Reads archived runs for one store; keeps the last runs and blob files it read."""

    def __init__(self, store: EventStore, runs: int = 64, parts: int = 8) -> None:
        self.store = store
        self._runs: OrderedDict[str, list[Event]] = OrderedDict()
        self._parts: OrderedDict[str, _ColdTier] = OrderedDict()
        self._max_runs = runs
        self._max_parts = parts
        self._lock = threading.Lock()

    def events(self, where: ArchivedRun) -> list[Event]:
        if where.purged is not None:
            hot = self.store.hot_events(where.run_id)
            return purged_events(hot, self.store.purged_digests(where.run_id), where.purged)
        fresh = self.store.tier.fresh
        if fresh is not None:
            fresh()  # runs read before an erasure are held decrypted: not any more
        with self._lock:
            found = self._runs.get(where.run_id)
            if found is not None:
                self._runs.move_to_end(where.run_id)
                return list(found)
        events = self._read(where)
        with self._lock:
            self._runs[where.run_id] = events
            while len(self._runs) > self._max_runs:
                self._runs.popitem(last=False)
        return list(events)

    def forget(self) -> None:
        with self._lock:
            self._runs.clear()
            self._parts.clear()

    def _read(self, where: ArchivedRun) -> list[Event]:
        import pyarrow.parquet as pq

        try:
            fs, path = filesystem(where.events_url)
            table = pq.read_table(
                path, filesystem=fs, filters=[("run_id", "=", where.run_id)], columns=None
            )
        except (OSError, ValueError) as exc:
            # Unreachable (no file, no network) is an outage; a damaged file is not.
            kind = StoreUnavailableError if isinstance(exc, OSError) else StoreError
            raise kind(
                f"run {where.run_id} is archived in {where.events_url}, which cannot be read: {exc}"
            ) from exc
        columns = [table.column(name).to_pylist() for name in EVENT_FIELDS]
        rows = sorted(zip(*columns, strict=True), key=lambda r: r[1])
        split = [(event_from_row(r[:20]), r[20], r[21]) for r in rows]
        if not self.store.tier.needs_join(split):
            return [e for e, _, _ in split]
        tier = self._tier(where)
        return self.store.tier.join_events(tier, split, lambda _rid: where.space)

    def blobs(self, where: ArchivedRun) -> _ColdTier:
        """The archived blobs file of ``where`` (cached), as a tier backend."""
        return self._tier(where)

    def _tier(self, where: ArchivedRun) -> _ColdTier:
        with self._lock:
            found = self._parts.get(where.blobs_url)
            if found is not None:
                self._parts.move_to_end(where.blobs_url)
                return found
        import pyarrow.parquet as pq

        try:
            fs, path = filesystem(where.blobs_url)
            table = pq.read_table(path, filesystem=fs)
        except (OSError, ValueError) as exc:
            kind = StoreUnavailableError if isinstance(exc, OSError) else StoreError
            raise kind(
                f"the blobs of run {where.run_id} are archived in {where.blobs_url}, which "
                f"cannot be read: {exc}"
            ) from exc
        cols = {name: table.column(name).to_pylist() for name in table.column_names}
        nodes: list[NodeRow] = []
        blobs: list[BlobRow] = []
        for i, kind in enumerate(cols["kind"]):
            if kind == "node":
                nodes.append(
                    NodeRow(cols["space"][i], cols["digest"][i], cols["parent"][i], cols["body"][i])
                )
            else:
                blobs.append(
                    BlobRow(
                        cols["space"][i],
                        cols["digest"][i],
                        cols["codec"][i],
                        bytes(cols["data"][i]),
                        cols["size"][i],
                    )
                )
        tier = _ColdTier(self.store, nodes, blobs)
        with self._lock:
            self._parts[where.blobs_url] = tier
            while len(self._parts) > self._max_parts:
                self._parts.popitem(last=False)
        return tier
