"""PostgreSQL store: sustained ingest against a raw COPY, capture overhead, metadata lookup.

Needs a server: ``$REPLAYABLE_BENCH_PG`` (default
``postgresql://postgres@127.0.0.1:5432/test``); each run works in fresh
schemas it drops afterwards. Runnable alone: ``python bench/bench_postgres.py [--quick]``.

(a) ``PostgresStore.append`` of writer-built events in the writer's batch size,
buffered (``synchronous_commit`` off per transaction), as a ratio to a raw COPY
of the same rows measured in the same run: the rows the store writes, built
before the clock starts, COPY'd into the ``agent_execution_events`` table of a
fresh store schema (the same columns, generated JSONB columns, constraint,
indexes and append-only triggers) in the format the store uses (binary), one
transaction per batch with ``synchronous_commit`` off. What the ratio leaves to
the store is its own work: turning events into rows, the batch digest that
makes a retry idempotent, the run record, the round trips. For reference, a
raw COPY of comparable rows into the classic ``agent_execution_events`` table
(JSONB input/output/metadata only, UNIQUE (run_id, sequence), three indexes).
(b) end-to-end recording into PostgreSQL and into SQLite: µs per call in the agent.
(c) list_runs by a metadata value among 1,000,000 events (10,000 runs).
(d) the same append as (a) by a writer login of one tenant: row-level security
on, rows staged and checked by the tenant policies.
"""

from __future__ import annotations

import gc
import os
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import msgspec
import orjson
import psycopg
from psycopg import sql
from psycopg.types.string import BytesBinaryDumper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import batches, record, writer_batch_size
from harness import Config, Section, Target, rate, temp_dir
from replayable.events.model import Event, RunStart
from replayable.store import MemoryStore, RunFilter
from replayable.store.postgres import PostgresStore, grant_tenant, init_roles
from replayable.store.sqlite import SQLiteStore

SERVER = os.environ.get("REPLAYABLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_EVENTS_PER_S = 30_000
TARGET_RATIO = 0.9
TARGET_LOOKUP_MS = 10.0

_RAW_TABLE = """
CREATE TABLE {s}.agent_execution_events (
    id BIGSERIAL PRIMARY KEY, run_id UUID NOT NULL, parent_run_id UUID,
    sequence INTEGER NOT NULL, event_type VARCHAR(50) NOT NULL,
    input_payload JSONB NOT NULL, output_payload JSONB, timestamp_utc DOUBLE PRECISION NOT NULL,
    metadata JSONB DEFAULT '{{}}', created_at TIMESTAMPTZ DEFAULT NOW(),
    UNIQUE (run_id, sequence)
)
"""
_RAW_INDEXES = (
    "CREATE INDEX ON {s}.agent_execution_events (run_id, sequence ASC)",
    "CREATE INDEX ON {s}.agent_execution_events (parent_run_id)",
    "CREATE INDEX ON {s}.agent_execution_events (event_type)",
)


@contextmanager
def schemas() -> Iterator[list[str]]:
    """Names for fresh schemas, all dropped at the end."""
    made: list[str] = []
    try:
        yield made
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            for name in made:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


def fresh(made: list[str], stem: str) -> str:
    name = f"bench_{stem}_{secrets.token_hex(3)}"
    made.append(name)
    return name


def store_url(schema: str) -> str:
    sep = "&" if "?" in SERVER else "?"
    return f"{SERVER}{sep}schema={schema}"


def classic_copy_rate(schema: str, chunks: Sequence[Sequence[Event]]) -> float:
    """Rows/s of a plain COPY of the events into the classic JSONB table (for reference)."""
    with psycopg.connect(SERVER, autocommit=True) as conn:
        s = sql.Identifier(schema)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
        conn.execute(sql.SQL(_RAW_TABLE).format(s=s))
        for statement in _RAW_INDEXES:
            conn.execute(sql.SQL(statement).format(s=s))
        copy_sql = sql.SQL(
            "COPY {}.agent_execution_events (run_id, parent_run_id, sequence, event_type, "
            "input_payload, output_payload, timestamp_utc, metadata) FROM STDIN"
        ).format(s)
        rows = [
            [
                (e.run_id, None, e.seq, e.kind, e.request, e.response, e.started_at, "{}")
                for e in chunk
            ]
            for chunk in chunks
        ]
        n = sum(len(c) for c in rows)
        gc.collect()
        t0 = time.perf_counter()
        for chunk in rows:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = off")
                with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    for row in chunk:
                        copy.write_row(row)
        return n / (time.perf_counter() - t0)


#: The store's event columns and their binary COPY types (a UUID as its 16 bytes).
_STORE_COLUMNS = (
    ("run_id", "bytea"),
    ("parent_run_id", "bytea"),
    ("sequence", "int4"),
    ("event_type", "text"),
    ("name", "text"),
    ("key", "text"),
    ("parent", "int4"),
    ("call_site", "text"),
    ("request_text", "text"),
    ("fingerprint", "text"),
    ("response_text", "text"),
    ("encoding", "text"),
    ("error_text", "text"),
    ("side_effect", "bool"),
    ("timestamp_utc", "float8"),
    ("duration_ns", "int8"),
    ("metadata_text", "text"),
    ("chain_index", "int4"),
    ("prev_hash", "text"),
    ("hash", "text"),
    ("schema_version", "int4"),
    ("tenant", "text"),
    ("request_ref", "text"),
    ("response_ref", "text"),
)


def store_rows(events: Sequence[Event]) -> list[tuple[object, ...]]:
    """The rows ``PostgresStore.append`` writes for ``events`` (a root run, no tenant)."""
    runs = {e.run_id: uuid.UUID(e.run_id).bytes for e in events}
    return [
        (
            runs[e.run_id],
            None,
            e.seq,
            e.kind,
            e.name,
            e.key,
            e.parent,
            e.call_site,
            e.request,
            e.fingerprint,
            e.response,
            e.encoding,
            e.error,
            e.side_effect,
            e.started_at,
            e.duration_ns,
            orjson.dumps(e.metadata, option=orjson.OPT_SORT_KEYS).decode(),
            e.chain_index,
            e.prev_hash,
            e.hash,
            e.schema_version,
            None,
            None,
            None,
        )
        for e in events
    ]


def same_rows_copy_rate(schema: str, chunks: Sequence[Sequence[Event]]) -> float:
    """Rows/s of a raw binary COPY of the store's own rows into a fresh store schema."""
    PostgresStore(store_url(schema)).close()
    rows = [store_rows(chunk) for chunk in chunks]
    n = sum(len(c) for c in rows)
    with psycopg.connect(SERVER, autocommit=True) as conn:
        # The compiled bytes dumper (psycopg's default for the bytea oid is a Python one).
        conn.adapters.register_dumper(bytes, BytesBinaryDumper)
        copy_sql = sql.SQL("COPY {}.agent_execution_events ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(schema), sql.SQL(", ").join(sql.Identifier(c) for c, _ in _STORE_COLUMNS)
        )
        types = [t for _, t in _STORE_COLUMNS]
        gc.collect()
        t0 = time.perf_counter()
        for chunk in rows:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = off")
                with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    copy.set_types(types)
                    for row in chunk:
                        copy.write_row(row)
        return n / (time.perf_counter() - t0)


@contextmanager
def tenant_writer(schema: str) -> Iterator[str]:
    """A store URL for a writer login of one tenant (row-level security applies), for ``schema``."""
    PostgresStore(store_url(schema)).close()
    prefix = f"bench_{secrets.token_hex(3)}"
    login = f"{prefix}_acme"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        roles = init_roles(conn, schema, prefix=prefix)
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(login), sql.Identifier(roles.writer)
            )
        )
        grant_tenant(conn, schema, login, "acme", write=True)
    parts = urlsplit(store_url(schema))
    host = parts.netloc.rsplit("@", 1)[-1]
    try:
        yield urlunsplit(parts._replace(netloc=f"{login}@{host}"))
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            for name in (login, *(f"{prefix}_{r}" for r in _ROLE_SUFFIXES)):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


_ROLE_SUFFIXES = ("writer", "auditor", "maintenance", "analyst", "admin", "steward")


def append_rate(
    schema: str, start: RunStart, chunks: Sequence[Sequence[Event]], url: str | None = None
) -> float:
    """Events/s of ``PostgresStore.append`` (buffered), one batch per chunk."""
    store = PostgresStore(url or store_url(schema))
    try:
        n = sum(len(c) for c in chunks)
        gc.collect()
        t0 = time.perf_counter()
        for i, chunk in enumerate(chunks):
            store.append([start] if i == 0 else [], chunk, [])
        return n / (time.perf_counter() - t0)
    finally:
        store.close()


def fill_for_lookup(store: PostgresStore, runs: int, per_run: int, template: Event) -> float:
    """Write ``runs`` runs of ``per_run`` events each, tagged ticket=T-<i>; returns events/s."""
    size = writer_batch_size()
    starts: list[RunStart] = []
    events: list[Event] = []
    t0 = time.perf_counter()
    written = 0
    for i in range(runs):
        rid = str(uuid.UUID(int=(0x0190 << 112) | (i + 1)))
        starts.append(
            RunStart(
                run_id=rid,
                workflow="bench.lookup",
                entrypoint="bench:lookup",
                parent_run_id=None,
                parent_seq=None,
                root_run_id=rid,
                tenant=None,
                input='{"args":[],"kwargs":{}}',
                metadata={"ticket": f"T-{i}", "customer": f"c{i % 500}"},
                code={},
                env_hash=None,
                lineage={},
                started_at=1.7e9 + i,
            )
        )
        for seq in range(1, per_run + 1):
            events.append(
                msgspec.structs.replace(template, run_id=rid, seq=seq, chain_index=seq - 1)
            )
        if len(events) >= size:
            store.append(starts, events, [])
            written += len(events)
            starts, events = [], []
    if starts or events:
        store.append(starts, events, [])
        written += len(events)
    return written / (time.perf_counter() - t0)


def lookup_ms(store: PostgresStore, runs: int, samples: int) -> list[float]:
    out = []
    for k in range(samples):
        ticket = f"T-{(k * 7919) % runs}"
        t0 = time.perf_counter()
        found = store.list_runs(RunFilter(metadata={"ticket": ticket}))
        out.append((time.perf_counter() - t0) * 1000)
        assert len(found) == 1, (ticket, len(found))
    return out


def run(cfg: Config) -> Section:
    sec = Section("postgres", "postgres: ingest vs raw COPY, capture overhead, metadata lookup")
    n_store = cfg.pick(100_000, 20_000)
    n_e2e = cfg.pick(50_000, 10_000)
    repeats = cfg.pick(3, 2)
    lookup_runs, per_run = cfg.pick(10_000, 1_000), 100
    size = writer_batch_size()

    mem = MemoryStore()
    run_id, _, _ = record(mem, n_store)
    events = mem.events(run_id)
    start = mem.get_run(run_id).start
    mem.close()
    chunks = batches(events, size)

    with schemas() as made:
        ours, raw, classic, tenant_rate = [], [], [], []
        for _ in range(repeats):
            raw.append(same_rows_copy_rate(fresh(made, "raw"), chunks))
            ours.append(append_rate(fresh(made, "store"), start, chunks))
            classic.append(classic_copy_rate(fresh(made, "classic"), chunks))
            with tenant_writer(fresh(made, "rls")) as url:
                tenant_rate.append(append_rate("", start, chunks, url))
        pg_e2e, sqlite_e2e = [], []
        for r in range(cfg.pick(2, 1)):
            pg_store = PostgresStore(store_url(fresh(made, "e2e")))
            try:
                _, calls_s, flush_s = record(pg_store, n_e2e)
            finally:
                pg_store.close()
            pg_e2e.append((calls_s, flush_s))
            with temp_dir("pg-bench") as tmp:
                lite = SQLiteStore(tmp / f"e2e-{r}.db")
                try:
                    _, lcalls_s, lflush_s = record(lite, n_e2e)
                finally:
                    lite.close()
            sqlite_e2e.append((lcalls_s, lflush_s))
        lookup_store = PostgresStore(store_url(fresh(made, "lookup")))
        try:
            fill_rate = fill_for_lookup(lookup_store, lookup_runs, per_run, events[0])
            with psycopg.connect(SERVER, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ANALYZE {}.runs").format(sql.Identifier(lookup_store.target.schema))
                )
            lookups = lookup_ms(lookup_store, lookup_runs, cfg.pick(200, 50))
        finally:
            lookup_store.close()

    store_rate, raw_rate = statistics.median(ours), statistics.median(raw)
    ratio = statistics.median(o / r for o, r in zip(ours, raw, strict=True))
    e2e_rate = statistics.median(n_e2e / (c + f) for c, f in pg_e2e)
    pg_call_us = statistics.median(c / n_e2e * 1e6 for c, _ in pg_e2e)
    lite_call_us = statistics.median(c / n_e2e * 1e6 for c, _ in sqlite_e2e)
    lookup = statistics.median(lookups)

    sec.row(
        f"PostgresStore.append, {n_store:,} events",
        rate(store_rate),
        f"median of {repeats}; batches of {size}; buffered",
    )
    sec.row("raw COPY of the same rows", rate(raw_rate), "same schema, same batches, binary format")
    classic_ratio = statistics.median(o / c for o, c in zip(ours, classic, strict=True))
    sec.row(
        "raw COPY, classic JSONB table",
        rate(statistics.median(classic)),
        f"for reference: fewer columns; the store {classic_ratio:.2f}x it",
    )
    rls_rate = statistics.median(tenant_rate)
    sec.row(
        "PostgresStore.append as a tenant's writer",
        rate(rls_rate),
        f"row-level security on; {rls_rate / store_rate:.2f}x the owner's append",
    )
    sec.row("ratio store / raw COPY", f"{ratio:.2f}", "median of per-repeat ratios")
    sec.row(
        f"end-to-end into PostgreSQL, {n_e2e:,} calls",
        rate(e2e_rate),
        "recording incl. final flush",
    )
    sec.row(
        "capture overhead per call",
        f"{pg_call_us:.1f} µs",
        f"PostgreSQL; SQLite {lite_call_us:.1f} µs ({pg_call_us / lite_call_us:.2f}x)",
    )
    sec.row(
        f"metadata lookup, {lookup_runs * per_run:,} events",
        f"{lookup:.2f} ms",
        f"median of {len(lookups)}; filled at {rate(fill_rate)}",
    )
    sec.targets += [
        Target("sustained ingest", store_rate, TARGET_EVENTS_PER_S, "events/s", op=">="),
        Target("ingest / raw COPY", ratio, TARGET_RATIO, "x", op=">="),
        Target("metadata lookup median", lookup, TARGET_LOOKUP_MS, "ms", op="<="),
    ]
    sec.data = {
        "store_append_events_per_s": ours,
        "raw_copy_rows_per_s": raw,
        "classic_copy_rows_per_s": classic,
        "tenant_writer_append_events_per_s": tenant_rate,
        "ratio": ratio,
        "ratio_to_classic_table": classic_ratio,
        "e2e_events_per_s": e2e_rate,
        "capture_us_per_call_pg": pg_call_us,
        "capture_us_per_call_sqlite": lite_call_us,
        "lookup_ms": lookups,
        "lookup_events": lookup_runs * per_run,
        "lookup_fill_events_per_s": fill_rate,
    }
    return sec


if __name__ == "__main__":
    from harness import format_section

    t = time.perf_counter()
    section = run(Config(quick="--quick" in sys.argv))
    section.seconds = time.perf_counter() - t
    print(format_section(section))
