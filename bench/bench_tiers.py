"""Storage tiers: ingest with blobs, 40 KB payloads, chat storage, dictionaries, the archive.

Every ratio is against a baseline measured in the same run: the same store with
the blob tier switched off (its threshold above every payload: today's inline
rows), and a hot replay for the archived one.
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

import replayable
from harness import Config, Section, Target, payload_1kb, temp_dir
from replayable.archive.parquet import archive
from replayable.events.canonical import event_hash, fingerprint, genesis_hash
from replayable.events.model import Event, RunStart
from replayable.store.base import EventStore
from replayable.store.payloads import train_dictionary
from replayable.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import agents_chat  # noqa: E402
from tests.llm_corpus import chat, llm_payloads  # noqa: E402

INLINE = 10**12  # a threshold no payload reaches: the tier off, as before it existed


def _start(run_id: str, started_at: float = 1000.0) -> RunStart:
    return RunStart(
        run_id=run_id,
        workflow="bench.tiers",
        entrypoint="bench:tiers",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata={},
        code={},
        env_hash=None,
        lineage={},
        started_at=started_at,
    )


def _events(run_id: str, payloads: Sequence[tuple[str, str | None]]) -> list[Event]:
    out: list[Event] = []
    prev = genesis_hash(run_id)
    for i, (request, response) in enumerate(payloads):
        e = Event(
            run_id=run_id,
            seq=i + 1,
            kind="llm",
            name="chat.completions.create",
            key=f"r:{i}",
            parent=None,
            call_site=None,
            request=request,
            fingerprint=fingerprint("llm", "chat.completions.create", request.encode()),
            response=response,
            encoding="json",
            error=None,
            side_effect=False,
            started_at=1000.0 + i,
            duration_ns=1000,
            metadata={},
            chain_index=i,
            prev_hash=prev,
            hash="",
        )
        e = msgspec.structs.replace(e, hash=event_hash(e))
        out.append(e)
        prev = e.hash
    return out


def _run_id(n: int) -> str:
    from replayable.events.ids import uuid7

    return uuid7(1_700_000_000_000 + n, n.to_bytes(10, "big"))


def _append_rate(store: EventStore, events: list[Event], batch: int = 2048) -> float:
    """Events/s of ``store.append`` in writer-sized batches (the run's start first)."""
    gc.collect()
    t0 = time.perf_counter()
    store.append([_start(events[0].run_id)], [], [])
    for i in range(0, len(events), batch):
        store.append([], events[i : i + batch], [])
    return len(events) / (time.perf_counter() - t0)


def _end(run_id: str, count: int) -> Any:
    from replayable.events.model import RunEnd

    return RunEnd(
        run_id=run_id,
        status="completed",
        output="1",
        error=None,
        ended_at=2000.0,
        event_count=count,
        last_hash="x",
    )


def _trim(base: dict[str, Any], i: int) -> str:
    """``base`` with request id ``i`` and one record fewer: about 1 KB, under the threshold."""
    smaller = {**base, "id": i, "rows": base["rows"][:-1]}
    return orjson.dumps(smaller, option=orjson.OPT_SORT_KEYS).decode()


def _pg_store() -> EventStore | None:
    url = os.environ.get("REPLAYABLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        from replayable.store.postgres import PostgresStore

        schema = f"bench_tiers_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
        return PostgresStore(f"{url}?schema={schema}")
    except Exception:
        return None


def _drop_pg(store: EventStore) -> None:
    from replayable.store.postgres import PostgresStore
    from replayable.store.postgres._connect import connect

    assert isinstance(store, PostgresStore)
    schema = store.target.schema
    store.close()
    with connect(store.target) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _ingest(sec: Section, cfg: Config, tmp: Path) -> None:
    n = cfg.pick(40_000, 8_000)
    # Every payload distinct (a request id in each), so nothing is deduplicated away.
    base = payload_1kb()
    reply = '{"ok":true,"n":3}'
    under = [(_trim(base, i), reply) for i in range(n)]  # 1,000 B: stays in the row
    over = [  # 1,090 B: just over the threshold, so every request becomes a blob
        (orjson.dumps({**base, "id": i}, option=orjson.OPT_SORT_KEYS).decode(), reply)
        for i in range(n)
    ]
    for label, payloads in (("1 KB events", under), ("1.1 KB events, all tiered", over)):
        for backend in ("sqlite", "postgresql"):
            rates: dict[str, list[float]] = {"inline": [], "tier": []}
            for rep in range(cfg.pick(3, 1)):
                for mode in ("inline", "tier"):
                    rid = _run_id(hash((label, backend, mode, rep)) % 10**6)
                    events = _events(rid, payloads)
                    if backend == "sqlite":
                        store: EventStore | None = SQLiteStore(
                            tmp / f"i-{mode}-{rep}-{len(label)}.db"
                        )
                    else:
                        store = _pg_store()
                        if store is None:
                            continue
                    assert store is not None
                    try:
                        if mode == "inline":
                            store.tier.threshold = INLINE
                        rates[mode].append(_append_rate(store, events))
                    finally:
                        if backend == "sqlite":
                            store.close()
                        else:
                            _drop_pg(store)
            if not rates["inline"]:
                sec.notes.append(f"{backend}: no server, skipped")
                continue
            inline, tier = statistics.median(rates["inline"]), statistics.median(rates["tier"])
            ratio = tier / inline
            sec.row(
                f"{backend} ingest, {label}",
                f"{tier:,.0f} ev/s",
                f"inline {inline:,.0f} ev/s; ratio {ratio:.2f}x",
            )
            sec.data[f"ingest_{backend}_{label}"] = {"tier": tier, "inline": inline}
            sec.targets.append(
                Target(f"{backend} ingest with blobs, {label}", ratio, 0.8, "x", op=">=")
            )


def _big_payloads(sec: Section, cfg: Config, tmp: Path) -> None:
    n = cfg.pick(400, 100)
    payloads = llm_payloads(n, size=40_000)
    mb = sum(len(a) + len(b or "") for a, b in payloads) / 1e6
    out: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for mode in ("inline", "tier"):
        path = tmp / f"big-{mode}.db"
        store = SQLiteStore(path)
        try:
            if mode == "inline":
                store.tier.threshold = INLINE
            events = _events(_run_id(7 if mode == "tier" else 8), payloads)
            out[mode] = _append_rate(store, events, batch=64) * mb / n
        finally:
            store.close()
        sizes[mode] = sum(p.stat().st_size for p in tmp.glob(f"big-{mode}.db*"))
    sec.row(
        "40 KB LLM payloads, SQLite",
        f"{out['tier']:.1f} MB/s",
        f"inline {out['inline']:.1f} MB/s; ratio {out['tier'] / out['inline']:.2f}x; "
        f"file {sizes['tier'] / 1e6:.1f} MB vs {sizes['inline'] / 1e6:.1f} MB inline",
    )
    sec.data["big_payloads"] = {"mb_s": out, "file_bytes": sizes}


def _chats(sec: Section, cfg: Config, tmp: Path) -> None:
    worst = 0.0
    for turns in (10, 25, 50, 100):
        conversation = chat(turns, seed=turns)
        store = SQLiteStore(tmp / f"chat-{turns}.db")
        try:
            store.append([_start(_run_id(turns))], _events(_run_id(turns), conversation.calls))
            st = store.tier_stats()
        finally:
            store.close()
        inline = sum(len(a) + len(b or "") for a, b in conversation.calls)
        stored = st.stored_bytes + st.node_bytes
        logical = st.text_bytes + st.node_bytes
        unique = conversation.unique_chars
        worst = max(worst, stored / unique)
        sec.row(
            f"chat, {turns} turns",
            f"{stored / unique:.2f}x unique",
            f"on disk {stored:,} B (blobs {st.stored_bytes:,} + refs {st.node_bytes:,}); before "
            f"compression {logical / unique:.2f}x; inline today {inline / unique:.1f}x "
            f"({inline:,} B); unique {unique:,} B",
        )
        sec.data[f"chat_{turns}"] = {
            "stored": stored,
            "logical": logical,
            "inline": inline,
            "unique": unique,
        }
    sec.targets.append(Target("50-turn chat storage vs unique content", worst, 1.5, "x"))


def _dictionary(sec: Section, cfg: Config, tmp: Path) -> None:
    store = SQLiteStore(tmp / "dict.db")
    try:
        payloads = llm_payloads(cfg.pick(400, 150), size=1_500, seed=3)
        store.append([_start(_run_id(30))], _events(_run_id(30), payloads))
        report = train_dictionary(store, "", size=16_384, samples=2_000, at=time.time())
    finally:
        store.close()
    sec.row(
        "dictionary, synthetic LLM traffic",
        f"{report.dict_ratio:.2f}x",
        f"zstd alone {report.plain_ratio:.2f}x over {report.samples} blobs "
        f"({report.sample_bytes:,} B)",
    )
    _demo_dictionary(sec, cfg, tmp)
    demo = SQLiteStore(tmp / "chat-agent.db")
    try:
        with replayable.recording(demo):
            for i in range(cfg.pick(30, 10)):
                agents_chat.chat_agent(3, topic=f" #{i}")
        r2 = train_dictionary(demo, "", size=8_192, samples=2_000, at=time.time())
        sec.row(
            "dictionary, the chat agent's payloads",
            f"{r2.dict_ratio:.2f}x",
            f"zstd alone {r2.plain_ratio:.2f}x over {r2.samples} blobs",
        )
    except ValueError as exc:
        sec.notes.append(f"chat agent dictionary: {exc}")
    finally:
        demo.close()


def _demo_dictionary(sec: Section, cfg: Config, tmp: Path) -> None:
    """zstd with and without a trained dictionary on the payloads `replayable demo` records
    (small: most stay in their rows, so this is what a dictionary would do for them)."""
    import subprocess

    import zstandard

    db = tmp / "demo.db"
    argv = [sys.executable, "-m", "replayable.cli", "demo", "--store", f"sqlite:///{db}"]
    argv += ["--reruns", str(cfg.pick(20, 8))]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if not db.exists():
        sec.notes.append(f"demo did not record: {done.stderr[-200:]}")
        return
    store = SQLiteStore(db)
    try:
        texts = [
            t.encode()
            for run_id in store.iter_run_ids()
            for e in store.events(run_id)
            for t in (e.request, e.response)
            if t
        ]
    finally:
        store.close()
    trained = zstandard.train_dictionary(8_192, texts)
    plain = zstandard.ZstdCompressor(level=3)
    with_dict = zstandard.ZstdCompressor(level=3, dict_data=trained)
    raw = sum(map(len, texts))
    p = sum(len(plain.compress(t)) for t in texts)
    d = sum(len(with_dict.compress(t)) for t in texts)
    sec.row(
        "dictionary, the demo's payloads",
        f"{raw / d:.2f}x",
        f"zstd alone {raw / p:.2f}x over {len(texts)} payloads ({raw:,} B, one at a time)",
    )


def _archive_once(
    tmp: Path, runs: int, per: int, body: str, n: int
) -> tuple[Any, float, float, float, int]:
    """One archive of ``runs`` runs of ``per`` events from a fresh store: the report, its
    wall and CPU seconds, and the seconds and count of dropping the hot payloads after."""
    from replayable.events.model import RunEnd

    store = SQLiteStore(tmp / f"arch{n}.db")
    try:
        for r in range(runs):
            rid = _run_id(1000 + r)
            events = _events(rid, [(body, '{"ok":true}')] * per)
            store.append([_start(rid)], events)
            store.append(
                [],
                [],
                [
                    RunEnd(
                        run_id=rid,
                        status="completed",
                        output="1",
                        error=None,
                        ended_at=2000.0,
                        event_count=per,
                        last_hash="x",
                    )
                ],
            )
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        rep = archive(store, str(tmp / f"parquet{n}"), older_than=0.0, drop=False)
        write_s, write_cpu = time.perf_counter() - t0, time.process_time() - c0
        t1 = time.perf_counter()
        dropped = store.drop_archived_payloads(sorted(store.archived_ids()))
        drop_s = time.perf_counter() - t1
    finally:
        store.close()
    return rep, write_s, write_cpu, drop_s, dropped


def _archive(sec: Section, cfg: Config, tmp: Path) -> None:
    runs, per = cfg.pick(100, 20), 1_000
    body = orjson.dumps(payload_1kb(), option=orjson.OPT_SORT_KEYS).decode()[:400]
    # Steady state: pyarrow and fsspec's local filesystem loaded by a first small job.
    warm = SQLiteStore(tmp / "warm.db")
    try:
        wid = _run_id(999)
        warm.append([_start(wid)], _events(wid, [(body, "1")]), [_end(wid, 1)])
        archive(warm, str(tmp / "warm"), older_than=0.0)
    finally:
        warm.close()
    # One archive takes about a second: a median of several, each from its own store (an
    # archived run is not archived again), so that one slow moment does not make the figure.
    tries = [_archive_once(tmp, runs, per, body, n) for n in range(cfg.pick(5, 1))]
    rates = sorted(t[0].events / t[1] for t in tries)
    rate = statistics.median(rates)
    rep, write_s, write_cpu, drop_s, dropped = sorted(tries, key=lambda t: t[1])[len(tries) // 2]
    sec.row(
        "archive to local Parquet",
        f"{rate:,.0f} ev/s",
        f"median of {len(tries)} ({rates[0]:,.0f}-{rates[-1]:,.0f}); {rep.events:,} events, "
        f"{rep.parts} part(s) in {write_s:.2f}s ({rep.events / write_cpu:,.0f} ev per "
        f"CPU-second); dropping {dropped:,} hot payloads {drop_s:.2f}s more "
        f"({rep.events / (write_s + drop_s):,.0f} ev/s with it)",
    )
    sec.targets.append(Target("archive to local Parquet", rate, 100_000, "events/s", op=">="))


@replayable.tool
def _fetch(i: int) -> dict[str, Any]:
    return {"i": i, "rows": [1, 2, 3]}


@replayable.workflow("bench.tiers.long")
def _long_run(n: int) -> int:
    for i in range(n):
        _fetch(i)
    return n


def _replay_archived(sec: Section, cfg: Config, tmp: Path) -> None:
    n = cfg.pick(10_000, 2_000)
    url = f"sqlite:///{tmp / 'replay.db'}"
    store = replayable.open_store(url)
    try:
        with replayable.recording(store) as rec:
            _long_run(n)
        run_id = rec.run_ids[0]
    finally:
        store.close()

    def replay_s() -> float:
        s = replayable.open_store(url)  # a new store object: nothing cached
        try:
            t0 = time.perf_counter()
            result = replayable.replay(run_id, store=s)
            took = time.perf_counter() - t0
            assert result.status == "identical", result.divergence
            if result.events_served != n:
                raise RuntimeError(f"the replay served {result.events_served} of {n} events")
            return took
        finally:
            s.close()

    hot = statistics.median(replay_s() for _ in range(cfg.pick(3, 1)))
    store = replayable.open_store(url)
    try:
        archive(store, str(tmp / "replay-parquet"), older_than=0.0)
    finally:
        store.close()
    cold = statistics.median(replay_s() for _ in range(cfg.pick(3, 1)))
    sec.row(
        f"replay of an archived {n:,}-event run",
        f"{cold:.2f}s",
        f"hot {hot:.2f}s; ratio {cold / hot:.2f}x (cold cache, local disk)",
    )
    sec.targets.append(Target("archived replay vs hot replay", cold / hot, 2.0, "x"))
    s3 = _s3_replay(url, run_id, tmp, n)
    if s3 is not None:
        sec.row(f"replay of an archived {n:,}-event run, S3 (moto)", f"{s3:.2f}s", "cold cache")


def _s3_replay(url: str, run_id: str, tmp: Path, n: int) -> float | None:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    old = os.environ.get("REPLAYABLE_ARCHIVE_OPTIONS")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        os.environ["REPLAYABLE_ARCHIVE_OPTIONS"] = orjson.dumps(
            {
                "s3": {
                    "key": "bench",
                    "secret": "bench",
                    "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
                }
            }
        ).decode()
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket="bench")
        db = tmp / "replay-s3.db"
        shutil.copy(tmp / "replay.db", db)
        s3_url = f"sqlite:///{db}"
        store = replayable.open_store(s3_url)
        try:
            # Only runs not yet archived go: archive a fresh copy of the hot run.
            rid = _copy_hot_run(store, run_id, tmp)
            archive(store, "s3://bench/runs", older_than=0.0)
        finally:
            store.close()
        store = replayable.open_store(s3_url)
        try:
            t0 = time.perf_counter()
            events = store.events(rid)
            took = time.perf_counter() - t0
            if len(events) != n:
                raise RuntimeError(f"the S3-archived run read back {len(events)} of {n} events")
            return took
        finally:
            store.close()
    finally:
        if old is None:
            os.environ.pop("REPLAYABLE_ARCHIVE_OPTIONS", None)
        else:
            os.environ["REPLAYABLE_ARCHIVE_OPTIONS"] = old
        server.stop()


def _copy_hot_run(store: EventStore, run_id: str, tmp: Path) -> str:
    """A new run with the archived run's events (read back whole), for the S3 archive."""
    from replayable.events.model import RunEnd

    events = store.events(run_id)
    rid = _run_id(99_999)
    copied = _events(rid, [(e.request, e.response) for e in events])
    store.append([_start(rid)], copied)
    store.append(
        [],
        [],
        [
            RunEnd(
                run_id=rid,
                status="completed",
                output="1",
                error=None,
                ended_at=2000.0,
                event_count=len(copied),
                last_hash="x",
            )
        ],
    )
    return rid


def run(cfg: Config) -> Section:
    sec = Section("tiers", "storage tiers: blobs, chats, dictionaries, the Parquet archive")
    load = os.getloadavg()
    sec.notes.append(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with temp_dir("tiers") as tmp:
        for part in (_ingest, _big_payloads, _chats, _dictionary, _archive, _replay_archived):
            part(sec, cfg, tmp)
    load = os.getloadavg()
    sec.notes.append(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return sec
