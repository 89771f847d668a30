"""The web interface: server time of its pages, measured in-process through the ASGI app.

Runnable alone: ``python bench/bench_web.py [--quick]``.

(a) the run page of a 10,000-event run (its first 100 cards, its last 100, and a jump
to step 5,000, HTML), beside the store's range read of those 100 events (and of the
last 100, and the read of the whole run up to them) and the app's floor (``/api/me``),
in the same run;
(b) expanding one payload (the HTML fragment, logged to the access log);
(c) the diff page of two 10,000-event runs, beside ``replayable.diff`` of them;
(d) run search among 1,000,000 events on PostgreSQL (10,000 runs of 100 events):
the impact query of the seed (a tool name, an empty response, a jurisdiction
prefix) and a metadata filter, through ``/api/runs``.

A request's time is from the ASGI call to the last byte of the response, through
``httpx.ASGITransport`` (no socket): the server's time plus the client's parsing.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Config, Section, Target, temp_dir
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store import EventStore
from replayable.store.sqlite import SQLiteStore
from replayable.web import UserDB, WebConfig, create_app

SERVER = os.environ.get("REPLAYABLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
RUN_PAGE_MS, PAYLOAD_MS, DIFF_MS, SEARCH_MS = 150.0, 30.0, 1000.0, 100.0


def _event(run_id: str, seq: int, started: float, variant: int) -> Event:
    kind, name = ("llm", "openai.chat.completions.create") if seq % 5 == 2 else ("tool", "lookup")
    if seq % 50 == 3:
        name = "query_compliance_rules"
    request: Any = {"jurisdiction": "GB-SCT" if seq % 2 else "DE", "page": seq, "q": "x" * 200}
    response: Any = [] if name == "query_compliance_rules" else {"rows": [seq, variant], "ok": True}
    if kind == "llm":
        request = {"messages": [{"role": "user", "content": f"step {seq} " + "y" * 300}]}
        response = {"choices": [{"message": {"role": "assistant", "content": f"answer {variant}"}}]}
    text = orjson.dumps(request).decode()
    return Event(
        run_id=run_id,
        seq=seq,
        kind=kind,
        name=name,
        key=f"r:{seq}",
        parent=None,
        call_site=None,
        request=text,
        fingerprint=hashlib.sha256(f"{kind}{name}{text}".encode()).hexdigest(),
        response=orjson.dumps(response).decode(),
        encoding="json",
        error=None,
        side_effect=False,
        started_at=started + seq * 0.001,
        duration_ns=500_000,
        metadata={},
        chain_index=seq - 1,
        prev_hash="0" * 64,
        hash="0" * 64,
    )


def _start(run_id: str, started: float, metadata: dict[str, Any], workflow: str) -> RunStart:
    return RunStart(
        run_id=run_id,
        workflow=workflow,
        entrypoint="bench:web",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata=metadata,
        code={},
        env_hash=None,
        lineage={},
        started_at=started,
    )


def _end(run_id: str, started: float, n: int) -> RunEnd:
    return RunEnd(
        run_id=run_id,
        status="completed",
        output='{"risk":"low"}',
        error=None,
        ended_at=started + n * 0.001 + 1,
        event_count=n,
        last_hash="0" * 64,
    )


def fill(store: EventStore, runs: int, per_run: int, *, variant_every: int = 0) -> list[str]:
    """``runs`` finished runs of ``per_run`` events; returns their ids."""
    ids = []
    batch_starts: list[RunStart] = []
    batch_events: list[Event] = []
    batch_ends: list[RunEnd] = []
    for i in range(runs):
        rid = str(uuid.UUID(int=(0x0191 << 112) | (secrets.randbits(64) << 16) | i))
        started = 1.79e9 + i
        batch_starts.append(_start(rid, started, {"ticket": f"T-{i}"}, "bench.web"))
        for seq in range(1, per_run + 1):
            variant = 1 if variant_every and i % 2 and seq % variant_every == 0 else 0
            batch_events.append(_event(rid, seq, started, variant))
        batch_ends.append(_end(rid, started, per_run))
        ids.append(rid)
        if len(batch_events) >= 20_000:
            store.append(batch_starts, batch_events, batch_ends)
            batch_starts, batch_events, batch_ends = [], [], []
    if batch_starts:
        store.append(batch_starts, batch_events, batch_ends)
    return ids


def _client_times(app: Any, token: str, urls: list[str], repeats: int) -> dict[str, list[float]]:
    """Milliseconds per request of each URL, ``repeats`` times (one warm-up first)."""

    async def go() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {u: [] for u in urls}
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": f"Bearer {token}", "x-fragment": "1"}
        async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
            for url in urls:
                r = await c.get(url, headers=headers)
                assert r.status_code == 200, (url, r.status_code, r.text[:300])
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    r = await c.get(url, headers=headers)
                    out[url].append((time.perf_counter() - t0) * 1000)
                    assert r.status_code == 200
        return out

    return asyncio.run(go())


def _app(url: str, root: Path, **kw: Any) -> tuple[Any, str]:
    users = UserDB(root / "users.json")
    users.add("bench", "admin")
    token = users.new_token("bench")[1]
    return create_app(WebConfig(store_url=url, users=users, secret=b"b" * 32, **kw)), token


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


@contextmanager
def _pg_schema() -> Iterator[str]:
    name = f"bench_web_{secrets.token_hex(4)}"
    try:
        yield name
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def run(cfg: Config) -> Section:
    from replayable.diff import diff

    sec = Section("web", "web: run page, payload, diff page, run search on PostgreSQL")
    per_run = cfg.pick(10_000, 2_000)
    repeats = cfg.pick(30, 8)
    med = statistics.median
    with temp_dir("web") as tmp:
        store = SQLiteStore(tmp / "runs.db")
        try:
            a, b = fill(store, 2, per_run, variant_every=97)
        finally:
            store.close()
        app, token = _app(f"sqlite:///{tmp / 'runs.db'}", tmp)
        urls = [f"/runs/{a}", f"/runs/{a}/events/{per_run // 2}", "/api/me"]
        last_page = f"/runs/{a}?page={per_run // 100}"
        jump = f"/runs/{a}?step={per_run // 2}"
        times = _client_times(app, token, [*urls, last_page, jump], repeats)
        diff_times = _client_times(app, token, [f"/diff?a={a}&b={b}"], cfg.pick(5, 3))
        reader = SQLiteStore(tmp / "runs.db")
        try:
            read_100 = _timed(lambda: reader.events_range(a, 1, 101), repeats)
            read_last = _timed(lambda: reader.events_range(a, per_run - 99, per_run + 1), repeats)
            read_before = _timed(lambda: reader.events_until(a, per_run + 1), repeats)
            lib_diff = _timed(lambda: diff(a, b, store=reader), cfg.pick(3, 2))
        finally:
            reader.close()
    page, payload, floor = (med(times[u]) for u in urls)
    diff_page = med(next(iter(diff_times.values())))
    sec.row(
        f"run page, {per_run:,}-event run, first 100 cards",
        f"{page:.1f} ms",
        f"median of {repeats}; store read of those events {med(read_100):.1f} ms; "
        f"app floor (/api/me) {floor:.2f} ms",
    )
    last_ms, jump_ms = med(times[last_page]), med(times[jump])
    sec.row(
        "run page, its last 100 cards",
        f"{last_ms:.1f} ms",
        f"{last_ms / page:.2f}x the first page; the store's range read of them "
        f"{med(read_last):.1f} ms (reading the run up to them: {med(read_before):.1f} ms)",
    )
    sec.row(
        f"run page, jump to step {per_run // 2:,}",
        f"{jump_ms:.1f} ms",
        f"{jump_ms / page:.2f}x the first page",
    )
    sec.row(
        "expanding one payload (HTML fragment)", f"{payload:.1f} ms", "logged to the access log"
    )
    sec.row(
        f"diff page, two {per_run:,}-event runs",
        f"{diff_page:.0f} ms",
        f"replayable.diff of them {med(lib_diff):.0f} ms ({diff_page / med(lib_diff):.2f}x)",
    )
    sec.targets += [
        Target("run page, first 100 cards", page, RUN_PAGE_MS, "ms"),
        Target("run page, last 100 cards", last_ms, RUN_PAGE_MS, "ms"),
        Target(f"run page, jump to step {per_run // 2:,}", jump_ms, RUN_PAGE_MS, "ms"),
        Target("expanding a payload", payload, PAYLOAD_MS, "ms"),
        Target("diff page of two 10,000-event runs", diff_page, DIFF_MS, "ms"),
    ]
    sec.data.update(
        run_page_ms=page,
        last_page_ms=last_ms,
        jump_ms=jump_ms,
        range_read_last_ms=med(read_last),
        read_until_last_ms=med(read_before),
        payload_ms=payload,
        floor_ms=floor,
        diff_page_ms=diff_page,
    )
    try:
        _pg_search(cfg, sec)
    except psycopg.OperationalError as exc:
        sec.notes.append(f"PostgreSQL half did not run: {exc}"[:200])
    return sec


def _pg_search(cfg: Config, sec: Section) -> None:
    from replayable.store.postgres import PostgresStore

    runs, per_run = cfg.pick(10_000, 1_000), 100
    with _pg_schema() as schema, temp_dir("web-pg") as tmp:
        url = f"{SERVER}?schema={schema}"
        store = PostgresStore(url)
        try:
            t0 = time.perf_counter()
            fill(store, runs, per_run)
            fill_s = time.perf_counter() - t0
        finally:
            store.close()
        with psycopg.connect(SERVER, autocommit=True) as conn:
            for table in ("runs", "agent_execution_events", "run_ends"):
                conn.execute(
                    sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
                )
        app, token = _app(url, tmp, one_login=True)
        impact = (
            "/api/runs?name=query_compliance_rules&where=response+empty"
            "&where=request.jurisdiction+%5E%3D+GB"
        )
        with_kind = impact + "&kind=tool"
        meta = f"/api/runs?meta=ticket%3DT-{runs // 3}"
        times = _client_times(app, token, [impact, with_kind, meta, "/runs"], cfg.pick(5, 3))
    impact_ms, kind_ms, meta_ms, listing_ms = (statistics.median(v) for v in times.values())
    events = runs * per_run
    sec.row(
        f"run search, impact query, {events:,} events (PostgreSQL)",
        f"{impact_ms:.1f} ms",
        f"first page of 50 runs; 20,000 events match, in every run; "
        f"filled at {events / fill_s:,.0f} events/s",
    )
    sec.row(
        "the same with kind=tool",
        f"{kind_ms:.1f} ms",
        "the store's (event_type, name) index applies only with a kind",
    )
    sec.row("run search, metadata key=value", f"{meta_ms:.1f} ms", "PostgreSQL")
    sec.row("runs page, newest 50 (HTML)", f"{listing_ms:.1f} ms", "PostgreSQL")
    sec.targets.append(Target(f"run search among {events:,} events", impact_ms, SEARCH_MS, "ms"))
    sec.data.update(
        search_impact_ms=impact_ms,
        search_impact_kind_ms=kind_ms,
        search_meta_ms=meta_ms,
        listing_ms=listing_ms,
    )


if __name__ == "__main__":
    from harness import format_section

    started = time.perf_counter()
    section = run(Config(quick="--quick" in sys.argv))
    section.seconds = time.perf_counter() - started
    print(format_section(section))
