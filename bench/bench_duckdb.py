"""Queries over the Parquet archive on DuckDB: the seed's impact query over 1M and 10M
archived events.

The archive is generated once and cached under the system's temp directory, keyed by
the archive layout (the event and run columns) and this generator's version, so later
runs measure the query only; generating it is not the figure measured. It is written
straight with pyarrow in ``replayable archive``'s real layout (``events/``, ``runs/``
and ``blobs/`` per tenant and date, zstd, row groups cut at run boundaries near
``ROW_GROUP_ROWS``, parts of at most 2,000 runs), not recorded event by event:

- 50 events a run over 90 days, four tenants (one of them "no tenant"), four workflows;
  LLM and retrieval payloads in the blob tier (the row holds ``null`` and the
  reference, as the archive writes a payload over 1 KB), tool, HTTP, clock and random
  payloads inline as JSON text; keys, fingerprints and hash chains high-entropy like
  real ones (random hex: what DuckDB must skip over, not compress away).
- ``contract_review`` runs ask ``query_compliance_rules`` at step 2 about one of nine
  jurisdictions (four GB-prefixed) and get no rows 2% of the time: about 15 affected
  runs in 1M events, 150 in 10M.
- The blobs files hold 64 distinct 40 KB payloads per part (what deduplication leaves
  of repeated prompts); the impact query never reads them.

The catalog beside it is a SQLite store holding every run's record (the hot store
keeps metadata; the archive the payloads): the hits' run records come from it.
Measured: the impact query (workflow, kind, name, the last 30 days, ``response.rows
empty``, ``request.jurisdiction ^= GB``) through :class:`ArchiveSearch`, every
affected run, cold (a new search object: DuckDB connection, file listing, footers)
and warm (median of repeats), reader seeing every tenant.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Config, Section, Target
from replayable.archive.parquet import ROW_GROUP_ROWS, _partition, run_tags
from replayable.archive.search import ArchiveSearch
from replayable.events.model import RunEnd, RunStart
from replayable.store.cold import EVENT_FIELDS, RUN_FIELDS
from replayable.store.search import EventQuery, Predicate
from replayable.store.sqlite import SQLiteStore

#: Bump when what is generated changes (the columns are in the key already).
GENERATOR = 2
EVENTS_PER_RUN = 50
DAYS = 90
DAY = 86_400.0
#: The archive's newest moment; the query's "last 30 days" end here.
END = 1_764_460_800.0  # 2025-11-30 00:00 UTC
TENANTS: tuple[str | None, ...] = ("acme", "globex", "initech", None)
WORKFLOWS = ("contract_review", "invoice_review", "support_chat", "triage")
JURISDICTIONS = ("US-CA", "US-NY", "GB", "GB-SCT", "GB-ENG", "GB-WLS", "FR", "DE", "gb-sct")
PART_RUNS = 2_000
BLOBS_PER_PART = 64

# One run's 50 steps: kind, name, whether its payloads are in the blob tier.
_STEPS: list[tuple[str, str, bool]] = [("llm", "extract_terms", True), ("tool", "", False)]
_CYCLE = [
    ("llm", "chat.completions.create", True),
    ("tool", "search_documents", False),
    ("clock", "time.time", False),
    ("llm", "chat.completions.create", True),
    ("tool", "lookup_customer", False),
    ("http", "GET api.example.com", False),
    ("random", "random.random", False),
    ("retrieval", "vector_search", True),
    ("llm", "chat.completions.create", True),
    ("tool", "update_ticket", False),
    ("clock", "time.time", False),
    ("tool", "send_email", False),
]
while len(_STEPS) < EVENTS_PER_RUN:
    _STEPS.append(_CYCLE[(len(_STEPS) - 2) % len(_CYCLE)])
_TOOL_OF = {
    "contract_review": "query_compliance_rules",
    "invoice_review": "lookup_invoice",
    "support_chat": "search_kb",
    "triage": "fetch_ticket",
}


def impact_query(limit: int = 10_000) -> EventQuery:
    """The seed's: the compliance tool returned nothing for a GB-prefixed jurisdiction,
    in the last 30 days, in contract reviews (as ``replayable query`` builds it)."""
    return EventQuery(
        workflow="contract_review",
        kind="tool",
        name="query_compliance_rules",
        since=END - 30 * DAY,
        until=END,
        where=(
            Predicate.parse("response.rows empty"),
            Predicate.parse("request.jurisdiction ^= GB"),
        ),
        limit=limit,
    )


def _key(events: int) -> str:
    layout = "|".join((*EVENT_FIELDS, "/", *RUN_FIELDS, f"g{GENERATOR}", f"rg{ROW_GROUP_ROWS}"))
    return f"v{hashlib.sha256(layout.encode()).hexdigest()[:12]}-{events}"


def _hex(n: int, rng: random.Random) -> Any:
    """``n`` random 64-character hex strings, as one Arrow array (no per-row Python)."""
    import pyarrow as pa

    data = rng.randbytes(32 * n).hex().encode()
    offsets = pa.array(range(0, 64 * (n + 1), 64), pa.int32())
    return pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(data))


def _run_id(n: int, started_at: float) -> str:
    from replayable.events.ids import uuid7

    return uuid7(int(started_at * 1000), n.to_bytes(10, "big"))


def generate(root: Path, events: int) -> dict[str, Any]:
    """Write the archive (``root/archive``) and its catalog (``root/catalog.db``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replayable.archive.parquet import _types

    t0 = time.perf_counter()
    rng = random.Random(17)
    runs_total = events // EVENTS_PER_RUN
    types = _types()
    schema = pa.schema([(name, types[name]) for name in EVENT_FIELDS])
    # Every run: tenant, workflow, start; grouped into parts by tenant and day.
    plan: dict[tuple[str | None, str], list[tuple[str, str, float]]] = {}
    for n in range(runs_total):
        started = END - DAYS * DAY + (n + rng.random()) * (DAYS * DAY / runs_total)
        started = min(started, END - EVENTS_PER_RUN * 2.0 - 1)
        tenant = TENANTS[n % len(TENANTS)]
        workflow = WORKFLOWS[rng.randrange(len(WORKFLOWS))]
        day = time.strftime("%Y-%m-%d", time.gmtime(started))
        plan.setdefault((tenant, day), []).append((_run_id(n, started), workflow, started))
    catalog = SQLiteStore(root / "catalog.db")
    archive_url = root / "archive"
    affected = 0
    for (tenant, day), runs in sorted(plan.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        runs.sort()
        for at in range(0, len(runs), PART_RUNS):
            chunk = runs[at : at + PART_RUNS]
            pid = hashlib.sha256(f"{tenant}{day}{chunk[0][0]}".encode()).hexdigest()[:24]
            where = (f"tenant={_partition(tenant or '')}", f"date={day}", f"part-{pid}.parquet")
            affected += _write_part(pa, pq, schema, archive_url, where, tenant, chunk, rng)
            starts, ends = [], []
            for rid, workflow, started in chunk:
                starts.append(_start(rid, tenant, workflow, started))
                ends.append(_end(rid, started))
            catalog.append(starts, [], ends)
    catalog.close()
    size = sum(p.stat().st_size for p in archive_url.rglob("*.parquet"))
    return {
        "events": runs_total * EVENTS_PER_RUN,
        "runs": runs_total,
        "affected": affected,
        "archive_bytes": size,
        "generate_s": time.perf_counter() - t0,
    }


def _start(rid: str, tenant: str | None, workflow: str, started: float) -> RunStart:
    return RunStart(
        run_id=rid,
        workflow=workflow,
        entrypoint=f"agents.{workflow}:main",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=rid,
        tenant=tenant,
        input='{"args":[],"kwargs":{}}',
        metadata=_meta(workflow),
        code={},
        env_hash=None,
        lineage={},
        started_at=started,
    )


def _meta(workflow: str) -> dict[str, str]:
    return {"team": "legal" if workflow == "contract_review" else "ops"}


def _end(rid: str, started: float) -> RunEnd:
    return RunEnd(
        run_id=rid,
        status="completed",
        output="1",
        error=None,
        ended_at=started + EVENTS_PER_RUN * 2.0,
        event_count=EVENTS_PER_RUN,
        last_hash="0" * 64,
    )


def _write_part(
    pa: Any,
    pq: Any,
    schema: Any,
    root: Path,
    where: tuple[str, str, str],
    tenant: str | None,
    runs: list[tuple[str, str, float]],
    rng: random.Random,
) -> int:
    """One part's three files; returns how many of its runs the impact query matches."""
    n = len(runs) * EVENTS_PER_RUN
    bodies, blob_digests = _blobs()
    cols: dict[str, Any] = {name: [] for name in ("run_id", "started_at", "request", "response")}
    refs_rq: list[str | None] = []
    refs_rs: list[str | None] = []
    affected = 0
    for rid, workflow, started in runs:
        cols["run_id"] += [rid] * EVENTS_PER_RUN
        cols["started_at"] += [started + 1.0 + 2.0 * i for i in range(EVENTS_PER_RUN)]
        jurisdiction = JURISDICTIONS[rng.randrange(len(JURISDICTIONS))]
        empty = rng.random() < 0.02
        if (
            workflow == "contract_review"
            and empty
            and jurisdiction.startswith("GB")
            and started + 3.0 >= END - 30 * DAY
        ):
            affected += 1
        contract = rng.randrange(10**6)
        for i, (_, _, tiered) in enumerate(_STEPS):
            if tiered:
                cols["request"].append("null")
                cols["response"].append(None)
                refs_rq.append(blob_digests[rng.randrange(BLOBS_PER_PART)])
                refs_rs.append(blob_digests[rng.randrange(BLOBS_PER_PART)])
                continue
            refs_rq.append(None)
            refs_rs.append(None)
            if i == 1:
                cols["request"].append(
                    f'{{"contract":"c-{contract}","jurisdiction":"{jurisdiction}"}}'
                )
                rows = "[]" if empty else f'[{{"rule":"r{contract % 97}","severity":"high"}}]'
                cols["response"].append(f'{{"rows":{rows}}}')
            else:
                cols["request"].append(f'{{"q":"item {contract + i}","limit":10}}')
                cols["response"].append(f'{{"ok":true,"n":{(contract * i) % 1000}}}')
    kinds = [k for k, _, _ in _STEPS]
    per_run_names = {wf: [(name or _TOOL_OF[wf]) for _, name, _ in _STEPS] for wf in WORKFLOWS}
    names = [name for _, wf, _ in runs for name in per_run_names[wf]]
    seqs = list(range(1, EVENTS_PER_RUN + 1))
    table = pa.table(
        {
            "run_id": pa.array(cols["run_id"], pa.string()),
            "seq": pa.array(seqs * len(runs), pa.int64()),
            "kind": pa.array(kinds * len(runs), pa.string()),
            "name": pa.array(names, pa.string()),
            "key": pa.array([f"r:{i}" for i in range(EVENTS_PER_RUN)] * len(runs), pa.string()),
            "parent": pa.nulls(n, pa.int64()),
            "call_site": pa.array(
                [f"agents/flow.py:{40 + i % 12}" for i in range(EVENTS_PER_RUN)] * len(runs),
                pa.string(),
            ),
            "request": pa.array(cols["request"], pa.string()),
            "fingerprint": _hex(n, rng),
            "response": pa.array(cols["response"], pa.string()),
            "encoding": pa.array(["json"] * n, pa.string()),
            "error": pa.nulls(n, pa.string()),
            "side_effect": pa.array([k == "tool" for k in kinds] * len(runs), pa.bool_()),
            "started_at": pa.array(cols["started_at"], pa.float64()),
            "duration_ns": pa.array(
                [rng.randrange(10**5, 10**9) for _ in range(EVENTS_PER_RUN)] * len(runs),
                pa.int64(),
            ),
            "metadata": pa.array(["{}"] * n, pa.string()),
            "chain_index": pa.array([s - 1 for s in seqs] * len(runs), pa.int64()),
            "prev_hash": _hex(n, rng),
            "hash": _hex(n, rng),
            "schema_version": pa.array([2] * n, pa.int32()),
            "request_ref": pa.array(refs_rq, pa.string()),
            "response_ref": pa.array(refs_rs, pa.string()),
        },
        schema=schema,
    )
    events_path = root / "events" / Path(*where)
    events_path.parent.mkdir(parents=True, exist_ok=True)
    # Row groups cut at run boundaries near ROW_GROUP_ROWS, as the archive writer does.
    group = max(1, ROW_GROUP_ROWS // EVENTS_PER_RUN) * EVENTS_PER_RUN
    pq.write_table(table, events_path, compression="zstd", row_group_size=group)
    runs_table = pa.table(
        {
            "run_id": pa.array([r for r, _, _ in runs], pa.string()),
            "tenant": pa.array([tenant] * len(runs), pa.string()),
            "space": pa.array([tenant or ""] * len(runs), pa.string()),
            "workflow": pa.array([w for _, w, _ in runs], pa.string()),
            "started_at": pa.array([s for _, _, s in runs], pa.float64()),
            "status": pa.array(["completed"] * len(runs), pa.string()),
            "parent_run_id": pa.nulls(len(runs), pa.string()),
            "tags": pa.array(
                [run_tags(_meta(w)) for _, w, _ in runs],
                pa.list_(pa.string()),
            ),
        }
    )
    runs_path = root / "runs" / Path(*where)
    runs_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(runs_table, runs_path, compression="zstd")
    blobs = pa.table(
        {
            "kind": pa.array(["blob"] * len(bodies), pa.string()),
            "space": pa.array([tenant or ""] * len(bodies), pa.string()),
            "digest": pa.array(blob_digests, pa.string()),
            "parent": pa.nulls(len(bodies), pa.string()),
            "body": pa.nulls(len(bodies), pa.string()),
            "codec": pa.array(["zstd/-/-"] * len(bodies), pa.string()),
            "data": pa.array(bodies, pa.binary()),
            "size": pa.array([40_000] * len(bodies), pa.int64()),
        }
    )
    blobs_path = root / "blobs" / Path(*where)
    blobs_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(blobs, blobs_path, compression="zstd")
    return affected


_BLOBS: list[tuple[list[bytes], list[str]]] = []


def _blobs() -> tuple[list[bytes], list[str]]:
    """64 distinct 40 KB payloads, zstd-compressed as the tier stores them, and their
    digests (the same in every part: each part's file carries its own copy)."""
    if not _BLOBS:
        import zstandard

        packer = zstandard.ZstdCompressor(level=3)
        rng = random.Random(3)
        texts = [rng.randbytes(10_000).hex().encode() * 2 for _ in range(BLOBS_PER_PART)]
        _BLOBS.append(
            ([packer.compress(t) for t in texts], [hashlib.sha256(t).hexdigest() for t in texts])
        )
    return _BLOBS[0]


def cached_archive(events: int) -> tuple[Path, dict[str, Any]]:
    """The generated archive of ``events`` events (made now if not cached yet)."""
    import json

    base = Path(tempfile.gettempdir()) / "replayable-bench-archive" / _key(events)
    done = base / "complete.json"
    if done.exists():
        info = json.loads(done.read_text())
        info["cached"] = True
        return base, info
    shutil.rmtree(base, ignore_errors=True)
    layout = _key(0).rsplit("-", 1)[0]
    for old in base.parent.glob("v*-*"):
        if not old.name.startswith(layout + "-"):
            shutil.rmtree(old, ignore_errors=True)  # another layout's: never read again
    base.mkdir(parents=True)
    info = generate(base, events)
    done.write_text(json.dumps(info))
    info["cached"] = False
    return base, info


def _measure(base: Path, repeats: int) -> dict[str, Any]:
    catalog = SQLiteStore(base / "catalog.db")
    try:
        query = impact_query()
        t0, c0 = time.perf_counter(), time.process_time()
        with ArchiveSearch(str(base / "archive"), catalog) as search:
            page = search.search(query)
            cold = time.perf_counter() - t0
            cold_cpu = time.process_time() - c0
            warm, warm_cpu = [], []
            for _ in range(repeats):
                t1, c1 = time.perf_counter(), time.process_time()
                again = search.search(query)
                warm.append(time.perf_counter() - t1)
                warm_cpu.append(time.process_time() - c1)
                assert [h.run_id for h in again.hits] == [h.run_id for h in page.hits]
            first = impact_query(limit=50)
            t2 = time.perf_counter()
            search.search(first)
            first_page = time.perf_counter() - t2
    finally:
        catalog.close()
    return {
        "found": len(page.hits),
        "cold_s": cold,
        "cold_cpu_s": cold_cpu,
        "warm_s": statistics.median(warm),
        "warm_cpu_s": statistics.median(warm_cpu),
        "first_page_s": first_page,
    }


def _encrypted_runs(store: SQLiteStore, runs: int) -> int:
    """``runs`` contract reviews of 10 events over 60 days (recorded for real, through
    the store: its blob tier, and its data key when it has one); how many events the
    impact query's kind, name, time and workflow leave as candidates."""
    import msgspec

    from replayable.events.canonical import event_hash, fingerprint, genesis_hash
    from replayable.events.model import Event

    rng = random.Random(5)
    starts, events, ends = [], [], []
    candidates = 0
    for n in range(runs):
        started = END - 60 * DAY + n * (60 * DAY / runs)
        rid = _run_id(n, started)
        jurisdiction = JURISDICTIONS[rng.randrange(len(JURISDICTIONS))]
        rows = "[]" if rng.random() < 0.1 else '[{"rule":"r1"}]'
        calls = [
            ("llm", "extract_terms", '{"prompt":"' + "terms " * 300 + '"}', '{"j":"x"}'),
            (
                "tool",
                "query_compliance_rules",
                f'{{"jurisdiction":"{jurisdiction}"}}',
                f'{{"rows":{rows}}}',
            ),
        ] + [("tool", "lookup", f'{{"i":{i}}}', '{"ok":true}') for i in range(8)]
        prev = genesis_hash(rid)
        for i, (kind, name, request, response) in enumerate(calls):
            e = Event(
                run_id=rid, seq=i + 1, kind=kind, name=name, key=f"r:{i}", parent=None,
                call_site=None, request=request,
                fingerprint=fingerprint(kind, name, request.encode()), response=response,
                encoding="json", error=None, side_effect=False, started_at=started + 1 + i,
                duration_ns=1000, metadata={}, chain_index=i, prev_hash=prev, hash="",
            )  # fmt: skip
            e = msgspec.structs.replace(e, hash=event_hash(e))
            events.append(e)
            prev = e.hash
        if started + 2 >= END - 30 * DAY:
            candidates += 1
        starts.append(_start(rid, None, "contract_review", started))
        ends.append(_end(rid, started))
    store.append(starts, events, ends)
    return candidates


def _encrypted(sec: Section, cfg: Config) -> None:
    """What encryption costs the impact query: every payload is in the blob tier, so
    each candidate event is read with its blob, decrypted and checked in Python."""
    import base64

    from replayable.archive.parquet import archive
    from replayable.store.crypto import ENV_DATA_KEY

    runs = cfg.pick(2_000, 200)
    figures: dict[str, float] = {}
    candidates = 0
    saved = os.environ.pop(ENV_DATA_KEY, None)
    tmp = Path(tempfile.mkdtemp(prefix="replayable-bench-duckdb-"))
    try:
        for mode in ("plain", "encrypted"):
            if mode == "encrypted":
                os.environ[ENV_DATA_KEY] = "kek1:" + base64.b64encode(bytes(range(32))).decode()
            store = SQLiteStore(tmp / f"{mode}.db")
            try:
                candidates = _encrypted_runs(store, runs)
                archive(store, str(tmp / mode), older_than=0, now=END + DAY)
                times = []
                for _ in range(3):
                    with ArchiveSearch(str(tmp / mode), store) as search:
                        t0 = time.perf_counter()
                        found = search.search(impact_query())
                        times.append(time.perf_counter() - t0)
                figures[mode] = statistics.median(times)
                figures[f"{mode}_found"] = len(found.hits)
            finally:
                store.close()
    finally:
        os.environ.pop(ENV_DATA_KEY, None)
        if saved is not None:
            os.environ[ENV_DATA_KEY] = saved
        shutil.rmtree(tmp, ignore_errors=True)
    if figures["plain_found"] != figures["encrypted_found"]:
        raise AssertionError("encrypted and plain archives gave different answers")
    extra = (figures["encrypted"] - figures["plain"]) / max(candidates, 1)
    sec.row(
        f"impact query, encrypted archive ({runs:,} runs)",
        f"{figures['encrypted']:.2f} s",
        f"plain {figures['plain']:.2f} s ({figures['encrypted'] / figures['plain']:.1f}x): "
        f"{candidates:,} candidate events decrypted and checked in Python, "
        + (f"{extra * 1e6:,.0f} µs more each" if extra > 0 else "no measurable cost over plain")
        + f"; {int(figures['plain_found'])} affected runs either way",
    )
    sec.data["encrypted"] = {**figures, "candidates": candidates, "per_candidate_s": extra}


def run(cfg: Config) -> Section:
    sec = Section("duckdb", "impact query over the Parquet archive on DuckDB")
    load = os.getloadavg()
    sec.notes.append(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    sizes = [50_000] if cfg.quick else [1_000_000, 10_000_000]
    for events in sizes:
        base, info = cached_archive(events)
        figures = _measure(base, repeats=3 if cfg.quick else 5)
        if figures["found"] != info["affected"]:
            raise AssertionError(
                f"the impact query found {figures['found']} runs, the generator made "
                f"{info['affected']} affected"
            )
        label = f"{events / 1e6:g}M events" if events >= 1_000_000 else f"{events:,} events"
        made = "cached" if info["cached"] else f"generated in {info['generate_s']:.0f} s"
        sec.row(
            f"impact query, {label}",
            f"{figures['warm_s']:.2f} s",
            f"{figures['found']} affected runs of {info['runs']:,}; cold {figures['cold_s']:.2f} s "
            f"(new search: connection, listing, footers); CPU {figures['cold_cpu_s']:.2f} s cold, "
            f"{figures['warm_cpu_s']:.2f} s warm (both cores); first page of 50 "
            f"{figures['first_page_s']:.2f} s; archive {info['archive_bytes'] / 1e9:.2f} GB "
            f"({made})",
        )
        sec.data[f"events_{events}"] = {**info, **figures}
        if events == max(sizes):
            sec.targets.append(
                Target(f"impact query over {label} (cold)", figures["cold_s"], 2.0, "s", op="<=")
            )
    _encrypted(sec, cfg)
    load = os.getloadavg()
    sec.notes.append(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return sec
