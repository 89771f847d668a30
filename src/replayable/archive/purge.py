"""Retention's end: purge archived payloads kept longer than the policy's ``archive_years``.

A run's payloads are kept ``hot_days`` in the hot store, then ``archive_years``
in the archive (:class:`~replayable.archive.parquet.RetentionPolicy`, per tenant
and workflow). ``purge`` removes the archive parts whose every run is past that
limit. For each such part, in this order:

1. the hot copies of its runs' payloads are dropped (in case the archive kept them
   hot), through the maintenance procedure;
2. the sha256 of every event's request and response is read from the part's
   events file and recorded in the store with the purge (when, by which login),
   in one transaction: what a version 2 event's hash covers, so every chain still
   verifies once the payloads are gone;
3. the part's files (events, blobs, runs) are deleted.

A rerun after a crash finishes what was recorded (deletes the files left) and
purges what was not. Runs, events' metadata (kind, name, times, hashes) and the
index stay; the payloads read as "purged on DATE by WHO" wherever they would be
shown. A part holding a run whose limit is later (another workflow's) waits for it.
Maintenance only (role admin; on PostgreSQL the maintenance login, enforced by
the database), and each purged part is written to the audit trail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from replayable.archive.parquet import RetentionPolicy, drop_blobs
from replayable.audit.access import log_reads
from replayable.audit.actor import Actor
from replayable.errors import AccessDeniedError, StoreError
from replayable.events.canonical import payload_digest
from replayable.store.base import EventStore, RunFilter
from replayable.store.cold import ArchivePart, PurgedDigest, filesystem, runs_url

__all__ = ["PurgeReport", "purge"]


@dataclass
class PurgeReport:
    parts: int = 0
    runs: int = 0
    events: int = 0
    #: Parts recorded as purged by an earlier, interrupted job whose files were left.
    finished: int = 0
    #: Parts not yet due because one of their runs is kept longer.
    waiting: int = 0
    by: str = ""
    at: float = 0.0
    urls: list[str] = field(default_factory=list)


def purge(
    store: EventStore,
    *,
    policy: RetentionPolicy | None = None,
    now: float | None = None,
    actor: Actor | None = None,
    dry_run: bool = False,
    progress: Callable[[str], None] | None = None,
) -> PurgeReport:
    """Purge the archive parts past retention (see the module docs); ``dry_run`` only
    counts them."""
    policy = policy or RetentionPolicy()
    now = time.time() if now is None else now
    say = progress or (lambda _line: None)
    who = actor or Actor.current(store)
    if who.role != "admin":
        raise AccessDeniedError(
            f"{who.user} (role {who.role}) may not purge archived payloads; that needs the "
            "role admin (and, on PostgreSQL, the maintenance login)"
        )
    report = PurgeReport(by=who.login, at=now)
    index = store.archive_index()
    pending = {p.part_id for p in store.archive_pending()}
    runs = {r.run_id: r for r in store.list_runs(RunFilter(limit=None))} if index else {}
    for part, purged in index:
        if purged is not None:
            if not dry_run and _delete_files(part):
                report.finished += 1
                say(f"finished purging part {part.part_id}: its files are deleted")
            continue
        if part.part_id in pending:
            continue  # never indexed: the archive job finishes it first
        limits = [
            runs[rid].started_at + policy.kept_seconds(runs[rid].workflow, part.tenant or None)
            for rid in part.runs
            if rid in runs
        ]
        if not limits:
            continue
        if max(limits) > now:
            if min(limits) <= now:
                report.waiting += 1
            continue
        report.parts += 1
        report.runs += len(part.runs)
        if dry_run:
            report.urls.append(part.events_url)
            continue
        store.drop_archived_payloads(part.runs)
        digests = _digests(part)
        row = store.record_purge(part.part_id, digests, now)
        report.by = row.purged_by
        report.events += len(digests)
        _delete_files(part)
        report.urls.append(part.events_url)
        log_reads(
            store,
            who,
            channel="cli",
            what=("archive-purge",),
            reads=[(None, part.tenant, ())],
            purpose=f"retention: archive part {part.part_id} purged ({len(part.runs)} run(s), "
            f"{len(digests)} event(s)) from {part.events_url}",
            now=now,
        )
        say(f"purged part {part.part_id}: {len(part.runs)} run(s), {len(digests)} event(s)")
    if report.parts and not dry_run:
        drop_blobs(store)
        cold = store.__dict__.get("cold")
        if cold is not None:
            cold.forget()
    return report


def _digests(part: ArchivePart) -> list[PurgedDigest]:
    """Each archived event's (run, seq, request sha256, response sha256 or None), read
    from the part's events file: the reference's head for a payload in the blob tier,
    the text's sha256 for one stored inline."""
    import pyarrow.parquet as pq

    columns = ["run_id", "seq", "request", "response", "request_ref", "response_ref"]
    try:
        fs, path = filesystem(part.events_url)
        table = pq.read_table(path, filesystem=fs, columns=columns)
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"cannot purge archive part {part.part_id}: {part.events_url} cannot be read "
            f"({exc}), and the sha256 of its payloads must be kept so that the runs still "
            "verify; nothing of the part was purged"
        ) from exc
    out: list[PurgedDigest] = []
    cols = [table.column(c).to_pylist() for c in columns]
    for run_id, seq, request, response, rq, rs in zip(*cols, strict=True):
        req = rq[:64] if rq else payload_digest(request if request is not None else "null")
        if rs:
            resp: str | None = rs[:64]
        else:
            resp = None if response is None else payload_digest(response)
        out.append((run_id, int(seq), req, resp))
    return out


def _delete_files(part: ArchivePart) -> bool:
    """Delete the part's files; whether any was still there."""
    gone = False
    for url in (part.events_url, part.blobs_url, runs_url(part.events_url)):
        try:
            fs, path = filesystem(url)
            if fs.exists(path):
                fs.rm(path)
                gone = True
        except OSError as exc:
            raise StoreError(f"purging {url} failed: {exc}") from exc
    return gone
