"""The in-memory store: a real backend that passes the same contract as SQLite."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import msgspec
import orjson

from replayable.errors import AppendOnlyError, ConfigurationError, RunNotFoundError, StoreError
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store._memory_audit import MemoryAudit
from replayable.store.base import EventStore, RunFilter, check_range
from replayable.store.cold import (
    ArchivedRun,
    ArchivePart,
    ColdReader,
    PurgedDigest,
    PurgeRow,
)
from replayable.store.crypto import ErasureRow, KeyRow, enable_encryption
from replayable.store.payloads import (
    BlobRow,
    NodeRow,
    PayloadTier,
    TierRows,
    TierStats,
    kept_runs,
    node_digest,
    run_space,
    split_space,
    tier_ref,
)
from replayable.store.rows import event_to_row

__all__ = ["MemoryStore"]


class MemoryStore(MemoryAudit, EventStore):
    """Keeps everything in dicts; ``memory://name`` stores of one name are shared in a process."""

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        # Re-entrant: an append that seals a new key space makes its data key (key_rows,
        # put_key_rows) while it holds the lock.
        self._lock = threading.RLock()
        self._starts: dict[str, RunStart] = {}
        self._ends: dict[str, RunEnd] = {}
        self._events: dict[str, dict[int, Event]] = {}
        self._blobs: dict[str, bytes] = {}
        self._refs: dict[tuple[str, int], tuple[str | None, str | None]] = {}
        self._tier_blobs: dict[tuple[str, str], BlobRow] = {}
        self._tier_nodes: dict[tuple[str, str], NodeRow] = {}
        self._tier_dicts: dict[tuple[str, str], tuple[float, bytes]] = {}
        self.tier = PayloadTier()
        self._keys: dict[tuple[str, str, str, str], KeyRow] = {}
        self._erasures: list[ErasureRow] = []
        self._parts: dict[str, ArchivePart] = {}
        self._archived: dict[str, tuple[str, str, float]] = {}
        self._purges: dict[str, PurgeRow] = {}
        self._purged: dict[str, dict[int, tuple[str, str | None]]] = {}
        self.cold = ColdReader(self)
        enable_encryption(self)
        self._audit_init()

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """The process-wide store called ``name`` (``memory://name``)."""
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(f"memory://{name}")
            return store

    def append(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
    ) -> None:
        with self._lock:
            # Check the whole batch first, against the store and against itself
            # (as a database's unique keys do), so that a refused batch writes nothing.
            new_starts: set[str] = set()
            for s in starts:
                if s.run_id in self._starts or s.run_id in new_starts:
                    raise AppendOnlyError(f"run {s.run_id} already has a start record")
                new_starts.add(s.run_id)
            new_events: set[tuple[str, int]] = set()
            for e in events:
                if e.seq in self._events.get(e.run_id, {}) or (e.run_id, e.seq) in new_events:
                    raise AppendOnlyError(f"event {e.run_id}#{e.seq} is already recorded")
                new_events.add((e.run_id, e.seq))
            new_ends: set[str] = set()
            for end in ends:
                if end.run_id in self._ends or end.run_id in new_ends:
                    raise AppendOnlyError(f"run {end.run_id} already has an end record")
                new_ends.add(end.run_id)
            rows = TierRows()
            starts, ends = self.tier.seal_runs(
                self, starts, ends, lambda rid: self._tenant(rid, starts), rows
            )
            split = self.tier.split_events(
                self, events, lambda rid: self._tenant(rid, starts), rows
            )
            for s in starts:
                self._starts[s.run_id] = s
            for e, rq, rs in split:
                self._events.setdefault(e.run_id, {})[e.seq] = e
                if rq is not None or rs is not None:
                    self._refs[(e.run_id, e.seq)] = (rq, rs)
            for key, blob in rows.blobs.items():
                self._tier_blobs.setdefault(key, blob)
            for key, node in rows.nodes.items():
                self._tier_nodes.setdefault(key, node)
            self.tier.committed(rows)
            for end in ends:
                self._ends[end.run_id] = end

    def put_blob(self, digest: str, data: bytes) -> None:
        with self._lock:
            self._blobs.setdefault(digest, data)

    def get_blob(self, digest: str) -> bytes | None:
        return self._blobs.get(digest)

    def get_run(self, run_id: str) -> Run:
        start = self._starts.get(run_id)
        if start is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.url}")
        return self._joined_runs([Run(start=start, end=self._ends.get(run_id))])[0]

    def _joined_runs(self, runs: list[Run]) -> list[Run]:
        if not kept_runs(runs):
            return runs
        return self.tier.join_runs(self, runs, lambda rid: self._tenant(rid, ()))

    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        with self._lock:
            ids = [r for r in self._starts if r.startswith(prefix)]
        return sorted(ids)[:limit]

    def list_runs(self, filter: RunFilter | None = None) -> list[Run]:
        f = filter or RunFilter()
        with self._lock:
            runs = [Run(start=s, end=self._ends.get(r)) for r, s in self._starts.items()]
        runs = [r for r in runs if f.matches(r)]
        runs.sort(key=lambda r: (r.started_at, r.run_id), reverse=True)
        return self._joined_runs(runs if f.limit is None else runs[: f.limit])

    def events(self, run_id: str) -> list[Event]:
        cold = self._archived_one(run_id)
        if cold is not None:
            return self.cold.events(cold)
        return self.hot_events(run_id)

    def hot_events(self, run_id: str) -> list[Event]:
        with self._lock:
            by_seq = dict(self._events.get(run_id, {}))
        return self._joined([by_seq[s] for s in sorted(by_seq)])

    def events_range(self, run_id: str, first_seq: int, last_seq: int) -> list[Event]:
        check_range(first_seq, last_seq)
        cold = self._archived_one(run_id)
        if cold is not None:
            return [e for e in self.cold.events(cold) if first_seq <= e.seq <= last_seq]
        with self._lock:
            by_seq = self._events.get(run_id, {})
            found = [by_seq[s] for s in sorted(by_seq) if first_seq <= s <= last_seq]
        return self._joined(found)

    def event_at(self, run_id: str, seq: int) -> Event | None:
        cold = self._archived_one(run_id)
        if cold is not None:
            return next((e for e in self.cold.events(cold) if e.seq == seq), None)
        with self._lock:
            found = self._events.get(run_id, {}).get(seq)
        return None if found is None else self._joined([found])[0]

    # -- the payload tier ----------------------------------------------------------

    def _joined(self, events: list[Event]) -> list[Event]:
        refs = self._refs
        rows = [(e, *refs.get((e.run_id, e.seq), (None, None))) for e in events]
        return self.tier.join_events(self, rows, lambda rid: self._tenant(rid, ()))

    def _tenant(self, run_id: str, starts: Sequence[RunStart]) -> str:
        for s in starts:
            if s.run_id == run_id:
                return run_space(s, self.erasures(s.tenant or ""))
        found = self._starts.get(run_id)
        return run_space(found, self.erasures(found.tenant or "")) if found is not None else ""

    def tier_nodes(self, tenant: str, digests: Sequence[str]) -> list[NodeRow]:
        return [n for d in digests if (n := self._tier_nodes.get((tenant, d))) is not None]

    def tier_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]:
        return [b for d in digests if (b := self._tier_blobs.get((tenant, d))) is not None]

    def tier_dictionary(self, tenant: str, dict_id: str | None) -> tuple[str, bytes] | None:
        if dict_id is not None:
            found = self._tier_dicts.get((tenant, dict_id))
            return None if found is None else (dict_id, found[1])
        mine = sorted(
            ((at, d, data) for (t, d), (at, data) in self._tier_dicts.items() if t == tenant),
            reverse=True,
        )
        return (mine[0][1], mine[0][2]) if mine else None

    def tier_put_dictionary(self, tenant: str, dict_id: str, data: bytes, at: float) -> None:
        with self._lock:
            self._tier_dicts.setdefault((tenant, dict_id), (at, data))
        self.tier.forget_dictionaries()

    def tier_sample(self, tenant: str, limit: int) -> list[BlobRow]:
        mine = sorted(b for (t, _), b in self._tier_blobs.items() if split_space(t)[0] == tenant)
        return mine[:limit]

    def tier_stats(self) -> TierStats:
        blobs = list(self._tier_blobs.values())
        nodes = list(self._tier_nodes.values())
        return TierStats(
            len(blobs),
            sum(b.size for b in blobs),
            sum(len(b.data) for b in blobs),
            len(nodes),
            sum(len(n.digest) + len(n.parent or "") + len(n.body) for n in nodes),
        )

    def key_rows(self, tenant: str, subject: str | None) -> list[KeyRow]:
        with self._lock:
            return [
                r
                for r in self._keys.values()
                if r.tenant == tenant and (subject is None or r.subject == subject)
            ]

    def all_key_rows(self) -> list[KeyRow]:
        with self._lock:
            return list(self._keys.values())

    def put_key_rows(self, rows: Sequence[KeyRow]) -> None:
        with self._lock:
            for r in rows:
                self._keys.setdefault((r.tenant, r.subject, r.key_id, r.kek_id), r)

    def erase_keys(
        self, tenant: str, subjects: Sequence[str] | None, by: str, at: float
    ) -> list[str]:
        out: list[str] = []
        with self._lock:
            for subject in [None] if subjects is None else subjects:
                gone = [
                    k
                    for k, r in self._keys.items()
                    if r.tenant == tenant and (subject is None or r.subject == subject)
                ]
                ids = sorted({self._keys[k].key_id for k in gone})
                for k in gone:
                    del self._keys[k]
                self._erasures.append(ErasureRow(tenant, subject, at, by, tuple(ids)))
                out += ids
        return out

    def erasures(self, tenant: str) -> list[ErasureRow]:
        with self._lock:
            return [e for e in self._erasures if e.tenant == tenant]

    def tier_tenants(self) -> list[str]:
        return sorted({split_space(t)[0] for t, _ in self._tier_blobs})

    def event_run_ids(self) -> set[str]:
        with self._lock:
            return {r for r, events in self._events.items() if events}

    def iter_run_ids(self) -> Iterator[str]:
        with self._lock:
            ids = sorted(self._starts, key=lambda r: (self._starts[r].started_at, r))
        return iter(ids)

    # -- the archive index (see :mod:`replayable.store.cold`) ---------------------------

    def _archived_one(self, run_id: str) -> ArchivedRun | None:
        if run_id not in self._archived:  # the common case, without the lock
            return None
        return self.archived_runs([run_id]).get(run_id)

    def archived_runs(self, run_ids: Sequence[str]) -> dict[str, ArchivedRun]:
        out: dict[str, ArchivedRun] = {}
        with self._lock:
            for rid in run_ids:
                found = self._archived.get(rid)
                if found is None:
                    continue
                part_id, key_space, _ = found
                part = self._parts[part_id]
                purge = self._purges.get(part_id)
                out[rid] = ArchivedRun(
                    rid,
                    part_id,
                    part.events_url,
                    part.blobs_url,
                    key_space,
                    None if purge is None else purge.notice,
                )
        return out

    def dropped_ids(self) -> set[str]:
        with self._lock:
            return {
                rid
                for rid in self._archived
                if any(
                    e.request == "null" and e.response is None and (rid, seq) not in self._refs
                    for seq, e in self._events.get(rid, {}).items()
                )
            }

    def archived_ids(self) -> set[str]:
        with self._lock:
            return set(self._archived)

    def archive_plan(self, part: ArchivePart) -> None:
        with self._lock:
            self._parts.setdefault(part.part_id, part)

    def archive_pending(self) -> list[ArchivePart]:
        with self._lock:
            indexed = {p for p, _, _ in self._archived.values()}
            parts = [p for p in self._parts.values() if p.part_id not in indexed]
        return sorted(parts, key=lambda p: (p.planned_at, p.part_id))

    def archive_commit(self, part_id: str, runs: Sequence[tuple[str, str]], at: float) -> None:
        with self._lock:
            if part_id not in self._parts:
                raise StoreError(f"archive part {part_id} was never planned in {self.url}")
            for rid, key_space in runs:
                self._archived.setdefault(rid, (part_id, key_space, at))

    def stored_rows(self, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        with self._lock:
            for rid in sorted(run_ids):
                by_seq = self._events.get(rid, {})
                for seq in sorted(by_seq):
                    refs = self._refs.get((rid, seq), (None, None))
                    out.append((*event_to_row(by_seq[seq]), *refs))
        return out

    def run_spaces(self, run_ids: Sequence[str]) -> dict[str, str]:
        return {rid: self._tenant(rid, ()) for rid in run_ids}

    def drop_archived_payloads(self, run_ids: Sequence[str]) -> int:
        n = 0
        with self._lock:
            for rid in run_ids:
                if rid not in self._archived:
                    continue
                by_seq = self._events.get(rid, {})
                for seq, e in list(by_seq.items()):
                    refs = self._refs.pop((rid, seq), None)
                    if e.request == "null" and e.response is None and refs is None:
                        continue
                    by_seq[seq] = msgspec.structs.replace(e, request="null", response=None)
                    n += 1
        return n

    def drop_archived_blobs(self) -> tuple[int, int]:
        with self._lock:
            live_nodes: set[tuple[str, str]] = set()
            live_blobs: set[tuple[str, str]] = set()
            # What hot records reference: events' payloads and errors, and the run
            # records' input, output and error (never archived: always hot).
            held: list[tuple[str, tuple[str | None, ...]]] = [
                (rid, refs) for (rid, _), refs in self._refs.items()
            ]
            for rid, by_seq in self._events.items():
                held.append((rid, tuple(tier_ref(e.error) for e in by_seq.values())))
            for rid, start in self._starts.items():
                end = self._ends.get(rid)
                outcome = (None, None) if end is None else (end.output, end.error)
                held.append((rid, (tier_ref(start.input), *map(tier_ref, outcome))))
            for rid, refs in held:
                key_space = self._tenant(rid, ())
                for ref in refs:
                    if ref is None:
                        continue
                    if len(ref) == 64:
                        live_blobs.add((key_space, ref))
                        continue
                    at: str | None = ref[64:96]
                    while at is not None and (key_space, at) not in live_nodes:
                        node = self._tier_nodes.get((key_space, at))
                        if node is None:
                            break  # missing already: the reader names it
                        if node_digest(node.parent, node.body) != node.digest:
                            raise StoreError(
                                f"payload node {at[:12]} is altered: which blobs it needs is "
                                "unknown, so none were dropped"
                            )
                        live_nodes.add((key_space, at))
                        live_blobs.update((key_space, p[1]) for p in orjson.loads(node.body))
                        at = node.parent
            dead_blobs = [k for k in self._tier_blobs if k not in live_blobs]
            dead_nodes = [k for k in self._tier_nodes if k not in live_nodes]
            for k in dead_blobs:
                del self._tier_blobs[k]
            for k in dead_nodes:
                del self._tier_nodes[k]
            self.tier.forget_stored()
        return len(dead_blobs), len(dead_nodes)

    def archive_index(self) -> list[tuple[ArchivePart, PurgeRow | None]]:
        with self._lock:
            parts = sorted(self._parts.values(), key=lambda p: (p.planned_at, p.part_id))
            return [(p, self._purges.get(p.part_id)) for p in parts]

    def record_purge(self, part_id: str, digests: Sequence[PurgedDigest], at: float) -> PurgeRow:
        by = self.login_name()
        with self._lock:
            part = self._parts.get(part_id)
            if part is None:
                raise ConfigurationError(f"no archive part {part_id!r} in {self.url}")
            for rid, seq, request, response in digests:
                if self._archived.get(rid, ("",))[0] != part_id:
                    raise ConfigurationError(f"run {rid} is not in archive part {part_id}")
                self._purged.setdefault(rid, {}).setdefault(seq, (request, response))
            return self._purges.setdefault(part_id, PurgeRow(part_id, part.tenant, at, by))

    def purged_digests(self, run_id: str) -> dict[int, tuple[str, str | None]]:
        with self._lock:
            return dict(self._purged.get(run_id, {}))
