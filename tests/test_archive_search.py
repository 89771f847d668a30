"""Impact queries over the Parquet archive on DuckDB: the same answers as SQLite and
PostgreSQL on the same runs, tenancy that no query value escapes, encrypted and erased
payloads, the access log, the command line, and a real S3 API (moto's server)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from replayable.archive.erasure import erase
from replayable.archive.parquet import archive
from replayable.archive.search import ArchiveSearch
from replayable.audit.access import AuditReader
from replayable.audit.actor import Actor
from replayable.cli import app
from replayable.errors import ConfigurationError, StoreError
from replayable.store import EventStore, MemoryStore
from replayable.store.postgres import PostgresStore
from replayable.store.search import DUCKDB, EventQuery, Predicate, event_filter
from replayable.store.sqlite import SQLiteStore
from tests.pg_helpers import PgServer, pg
from tests.test_archive import s3, s3_archive
from tests.test_crypto import kek
from tests.test_search import DAY, IMPACT, NOW, contract_review_month
from tests.test_store_contract import make_end, make_start, new_id, payload_events

__all__ = ["kek", "pg", "s3", "s3_archive"]

AFTER = NOW + DAY

PREDICATES = [
    "response.rows empty",
    "response.rows nonempty",
    'request.jurisdiction == "GB"',
    'request.jurisdiction != "US-CA"',
    "request.jurisdiction ~= SCT",
    "request.contract >= 170",
    "request.contract < 3",
    "request.contract > 9007199254740993",
    "response.rows.0.rule == r1",
    "response.rows.-1.rule == r1",
    'response.rows == [{"rule": "r1"}]',
    "response.risk exists",
    "response.risk missing",
    "request.contract == 7.0",
    "response.rows == []",
    "response nonempty",
    "error missing",
    "metadata.x missing",
]

QUERIES = [
    IMPACT,
    IMPACT.page(10),
    *(EventQuery(where=(Predicate.parse(p),), limit=1000) for p in PREDICATES),
    EventQuery(metadata={"n": 3}, kind="tool", limit=10),
    EventQuery(metadata={"team": "legal"}, name="assess_risk", limit=40),
    EventQuery(workflow="invoice_review", limit=3),
    EventQuery(kind="tool", since=NOW - 3 * DAY, limit=4),
    EventQuery(
        name="query_compliance_rules", where=(Predicate.parse("request.jurisdiction ^= FR"),)
    ),
]


def _answers(search: Any, query: EventQuery) -> list[tuple[int, list[tuple[str, list[int]]], Any]]:
    """Every page of ``query``: offset, (run, matching steps) per hit, next offset."""
    pages = []
    offset: int | None = query.offset
    while offset is not None and len(pages) < 30:
        page = search.search(query.page(offset))
        pages.append(
            (offset, [(h.run_id, [e.seq for e in h.events]) for h in page.hits], page.next_offset)
        )
        offset = page.next_offset
    return pages


@pytest.fixture(scope="module")
def reference() -> dict[int, Any]:
    store = MemoryStore()
    contract_review_month(store)
    return {i: _answers(store, q) for i, q in enumerate(QUERIES)}


@pytest.fixture(scope="module")
def sqlite_hot(sqlite_archived: tuple[SQLiteStore, str]) -> dict[int, Any]:
    return SQLITE_HOT


SQLITE_HOT: dict[int, Any] = {}


@pytest.fixture(scope="module")
def sqlite_archived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SQLiteStore, str]]:
    """The month of reviews in SQLite (its answers taken while hot), archived to a local
    directory, hot payloads dropped."""
    root = tmp_path_factory.mktemp("duckdb")
    store = SQLiteStore(root / "runs.db")
    contract_review_month(store)
    SQLITE_HOT.update({i: _answers(store, q) for i, q in enumerate(QUERIES)})
    report = archive(store, str(root / "archive"), older_than=0, now=AFTER)
    assert report.runs == 180
    assert report.dropped
    yield store, str(root / "archive")
    store.close()


@pytest.fixture(scope="module")
def pg_archived(
    pg: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PostgresStore, str]]:
    """The same month in PostgreSQL, archived with its hot payloads kept (so the SQL
    search over the hot rows answers too)."""
    root = tmp_path_factory.mktemp("duckdb-pg")
    store = PostgresStore(pg.url(pg.new_schema("duckdb")))
    contract_review_month(store)
    archive(store, str(root / "archive"), older_than=0, now=AFTER, drop=False)
    yield store, str(root / "archive")
    store.close()


@pytest.mark.parametrize("i", range(len(QUERIES)))
def test_three_backends_one_answer(
    i: int,
    reference: dict[int, Any],
    sqlite_archived: tuple[SQLiteStore, str],
    sqlite_hot: dict[int, Any],
    pg_archived: tuple[PostgresStore, str],
) -> None:
    """Each query, every page: SQLite, PostgreSQL and DuckDB over each one's archive
    give the Python reference's answer."""
    query = QUERIES[i]
    expected = reference[i]
    lite, lite_archive = sqlite_archived
    post, post_archive = pg_archived
    assert sqlite_hot[i] == expected
    assert _answers(post, query) == expected
    with ArchiveSearch(lite_archive, lite) as search:
        assert _answers(search, query) == expected
    if i < 4:  # the archive PostgreSQL wrote is read alike
        with ArchiveSearch(post_archive, post) as search:
            assert _answers(search, query) == expected
    if query is IMPACT:
        assert sum(len(p[1]) for p in expected) == 14


def test_hits_are_whole_events(sqlite_archived: tuple[SQLiteStore, str]) -> None:
    """A hit's events are the archived events as the store reads them, payloads and all."""
    store, url = sqlite_archived
    page = ArchiveSearch(url, store).search(IMPACT)
    for hit in page.hits:
        assert hit.run == store.get_run(hit.run_id)
        assert hit.events == [e for e in store.events(hit.run_id) if e.seq == 2]
        assert hit.events[0].request_value()["jurisdiction"].startswith("GB")


# -- tenancy: the partition and the exact tenant column, every value bound ---------------

TENANTS = ["acme", "globex", "_", None, "x' OR '1'='1", "../globex", "a/b%2F"]


def _tenant_run(store: EventStore, n: int, tenant: str | None, secret: str) -> str:
    rid = new_id(n)
    events = payload_events(
        rid, [('{"jurisdiction":"GB-SCT","secret":' + json.dumps(secret) + "}", '{"rows":[]}')]
    )
    start = make_start(rid, started_at=NOW - n, tenant=tenant, metadata={"n": n})
    store.append([start], events, [make_end(rid, events, start=start)])
    return rid


@pytest.fixture(scope="module")
def tenants_archived(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SQLiteStore, str, dict[str | None, str]]]:
    root = tmp_path_factory.mktemp("duckdb-tenants")
    store = SQLiteStore(root / "runs.db")
    runs = {t: _tenant_run(store, 700 + i, t, f"secret of {t}") for i, t in enumerate(TENANTS)}
    archive(store, str(root / "archive"), older_than=0, now=AFTER)
    yield store, str(root / "archive"), runs
    store.close()


HOSTILE = [
    'request.jurisdiction == "x\' OR 1=1 --"',
    "request.jurisdiction ^= ') OR TRUE OR ('",
    "request.secret ~= globex",
    "request.x'y exists",
    'request.a"b missing',
    "request.jurisdiction != \"'; SELECT * FROM read_parquet('/etc/passwd'); --\"",
]


@pytest.mark.parametrize("tenant", TENANTS)
def test_a_reader_sees_its_tenant_only_whatever_the_query_says(
    tenants_archived: tuple[SQLiteStore, str, dict[str | None, str]],
    tenant: str | None,
) -> None:
    """A search for one tenant returns that tenant's runs only, whatever the predicate
    values, paths and workflow say; '_' and 'no tenant' share a partition, not runs."""
    store, url, runs = tenants_archived
    search = ArchiveSearch(url, store, tenants={tenant})
    assert search.readable_tenants() == [tenant]
    for query in (
        *(EventQuery(where=(Predicate.parse(w),), limit=100) for w in HOSTILE),
        EventQuery(workflow="triage' OR '1'='1", limit=100),
        EventQuery(metadata={"n' OR '1'='1": "1"}, limit=100),
        EventQuery(limit=100),
    ):
        found = {h.run_id for h in search.search(query).hits}
        assert found <= {runs[tenant]}, (tenant, query)
    everything = search.search(EventQuery(limit=100))
    assert [h.run_id for h in everything.hits] == [runs[tenant]]
    assert everything.hits[0].run.start.tenant == tenant


def test_a_store_limits_the_tenants_it_may_read(
    tenants_archived: tuple[SQLiteStore, str, dict[str | None, str]],
) -> None:
    """By default the tenants are the catalog store's readable ones (PostgreSQL: the
    login's); a store that sees none reads nothing from the archive."""
    store, url, runs = tenants_archived

    class Scoped(SQLiteStore):
        def sees_tenant(self, tenant: str | None) -> bool:
            return tenant == "acme"

    scoped = Scoped(Path(store.url.removeprefix("sqlite:///")))
    try:
        search = ArchiveSearch(url, scoped)
        assert search.readable_tenants() == ["acme"]
        assert [h.run_id for h in search.search(EventQuery(limit=100)).hits] == [runs["acme"]]
    finally:
        scoped.close()
    assert set(ArchiveSearch(url, store).readable_tenants()) == {*TENANTS, ""}


def test_every_value_is_a_bound_parameter() -> None:
    """The SQL text of a query holds no value of it: paths and values are parameters."""
    query = EventQuery(
        kind="k'1",
        name="n'2",
        where=(Predicate.parse("request.p'3 == \"v'4\""), Predicate.parse("response.q'5 ^= w'6")),
    )
    sql = event_filter(query, DUCKDB)
    for marker in ("'1", "'2", "'3", "'4", "'5", "'6"):
        assert marker not in sql.where + sql.certain
    assert {"k'1", "/p'3", "v'4"} <= set(sql.params)


# -- encrypted and erased payloads ------------------------------------------------------


def test_encrypted_payloads_are_decrypted_for_candidates_and_erased_ones_never_match(
    tmp_path: Path, kek: None
) -> None:
    """With a data key every payload is in the blob tier, encrypted: DuckDB narrows on
    the metadata columns, the candidates are decrypted and checked in Python, and the
    answers are the hot store's. After crypto-shredding a subject its runs no longer
    match payload predicates (nothing can be read to match), though they still match
    on kind and name, and the hit reads as erased."""
    store = SQLiteStore(tmp_path / "runs.db")
    runs = []
    for n in range(1, 41):
        rid = new_id(900 + n)
        where = "GB-SCT" if n % 3 == 0 else "US-CA"
        events = payload_events(
            rid,
            [
                ('{"contract":' + str(n) + "}", '{"jurisdiction":"' + where + '"}'),
                ('{"jurisdiction":"' + where + '"}', '{"rows":[]}' if n % 2 else '{"rows":[1]}'),
            ],
        )
        start = make_start(
            rid, started_at=NOW - n * 60, metadata={"data_subject": f"s{n % 4}", "n": n}
        )
        store.append([start], events, [make_end(rid, events, start=start)])
        runs.append(rid)
    url = str(tmp_path / "archive")
    archive(store, url, older_than=0, now=AFTER)
    search = ArchiveSearch(url, store)
    impact = EventQuery(
        where=(
            Predicate.parse("response.rows empty"),
            Predicate.parse("request.jurisdiction ^= GB"),
        ),
        limit=2,
    )
    # The store's own search fetches the archived (and dropped) payloads when asked to.
    on_store = dataclasses.replace(impact, include_archived=True)
    affected = [new_id(900 + n) for n in range(1, 41) if n % 3 == 0 and n % 2]
    assert _answers(search, impact) == _answers(store, on_store)
    assert [r for p in _answers(search, impact) for r, _ in p[1]] == affected
    cond = event_filter(impact, DUCKDB)
    rows = search._sql(
        f"SELECT count(*), count(*) FILTER (WHERE {cond.certain}) "
        f"FROM read_parquet(?) e WHERE {cond.where}",
        [*cond.certain_params, search._files("events", [None], None), *cond.params],
    )
    assert rows[0] == (80, 0)  # every event a candidate, none certain
    erase(store, subject="s1", actor=Actor(user="dpo", role="admin", login="dpo"))
    erased = {new_id(900 + n) for n in range(1, 41) if n % 4 == 1}
    after = [r for p in _answers(search, impact) for r, _ in p[1]]
    assert after == [r for r in affected if r not in erased]
    assert after == [r for p in _answers(store, on_store) for r, _ in p[1]]
    by_kind = ArchiveSearch(url, store).search(EventQuery(metadata={"n": 1}, limit=5))
    assert [h.run_id for h in by_kind.hits] == [new_id(901)]
    assert all(e.erased for e in by_kind.hits[0].events)
    store.close()


# -- the access log, the command line, S3 -----------------------------------------------


def test_archive_searches_are_access_logged(sqlite_archived: tuple[SQLiteStore, str]) -> None:
    """A search through the audit reader logs one entry per run found, as on the store."""
    store, url = sqlite_archived
    actor = Actor(user="ana", role="auditor", login="ana")
    reader = AuditReader(store, actor, channel="cli", purpose="INC-7")
    before = len(store.access_entries(limit=None))
    page = reader.search(IMPACT, ArchiveSearch(url, store))
    entries = store.access_entries(limit=None)[before:]
    assert sorted(e.run_id for e in entries) == sorted(h.run_id for h in page.hits)
    assert all(e.what == ("search",) and e.steps == (2,) and e.user == "ana" for e in entries)


def test_query_command_over_the_archive(sqlite_archived: tuple[SQLiteStore, str]) -> None:
    store, url = sqlite_archived
    filters = [
        "--workflow", "contract_review", "--name", "query_compliance_rules",
        "--since", str(NOW - 30 * DAY), "--until", str(NOW),
        "--where", "response.rows empty", "--where", "request.jurisdiction ^= GB",
    ]  # fmt: skip
    args = ["--store", store.url, "query", "--archive", url, *filters, "--json", "--limit", "100"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    listed = [json.loads(line) for line in result.output.splitlines()]
    expected = store.search(dataclasses.replace(IMPACT, limit=100, include_archived=True)).hits
    assert [r["run_id"] for r in listed] == [h.run_id for h in expected]
    assert len(listed) == 14
    out = Path(url).parent / "reports"
    args = ["--store", store.url, "report", "--archive", url, *filters, "--format", "json"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {p.stem for p in out.glob("*.json")} == {h.run_id for h in expected}
    report = json.loads((out / f"{expected[0].run_id}.json").read_text())
    assert [s["seq"] for s in report["matching_steps"]] == [2]


def test_an_unreadable_archive_is_a_clear_error(tmp_path: Path) -> None:
    """No URL, no archive, a part whose runs file is gone: each says what is wrong."""
    with SQLiteStore(tmp_path / "runs.db") as store:
        with pytest.raises(ConfigurationError, match="--archive"):
            ArchiveSearch("", store)
        empty = ArchiveSearch(str(tmp_path / "nothing-here"), store)
        assert empty.search(IMPACT).hits == []
        _tenant_run(store, 950, "acme", "x")
        url = str(tmp_path / "archive")
        archive(store, url, older_than=0, now=AFTER)
        for path in Path(url, "runs").rglob("*.parquet"):
            path.unlink()
        with pytest.raises(StoreError, match="without their runs file"):
            ArchiveSearch(url, store).search(EventQuery())


def test_query_over_an_archive_on_s3(s3_archive: str, tmp_path: Path) -> None:
    """DuckDB reads the archive through the same fsspec filesystem, here a real S3 API."""
    store = SQLiteStore(tmp_path / "runs.db")
    runs = {t: _tenant_run(store, 800 + i, t, "s3") for i, t in enumerate(["acme", None, "_"])}
    archive(store, s3_archive + "/duckdb", older_than=0, now=AFTER)
    query = EventQuery(where=(Predicate.parse("request.jurisdiction ^= GB"),))
    with ArchiveSearch(s3_archive + "/duckdb", store) as search:
        assert [h.run_id for h in search.search(query).hits] == [runs[t] for t in runs]
    with ArchiveSearch(s3_archive + "/duckdb", store, tenants={"_"}) as search:
        page = search.search(query)
        assert [h.run_id for h in page.hits] == [runs["_"]]
        assert page.hits[0].events == store.events(runs["_"])
    store.close()
