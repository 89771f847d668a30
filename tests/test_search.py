"""Impact queries: the same EventQuery answered alike by memory, SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from replayable.cli import app
from replayable.errors import ConfigurationError
from replayable.events.canonical import canonical, event_hash, genesis_hash
from replayable.events.model import Event, RunStart
from replayable.store import EventStore, MemoryStore, verify_run
from replayable.store.postgres import PostgresStore
from replayable.store.search import EventQuery, Predicate
from replayable.store.sqlite import SQLiteStore
from tests.pg_helpers import PgServer, pg
from tests.test_store_contract import make_end, new_id

__all__ = ["pg"]

NOW = 1_760_000_000.0
DAY = 86_400.0


def _event(
    run_id: str,
    seq: int,
    kind: str,
    name: str,
    request: Any,
    response: Any,
    started_at: float,
    prev: str,
) -> Event:
    draft = Event(
        run_id=run_id,
        seq=seq,
        kind=kind,
        name=name,
        key=f"r:{seq - 1}",
        parent=None,
        call_site=None,
        request=canonical(request).decode(),
        fingerprint=f"{seq:064x}",
        response=canonical(response).decode(),
        encoding="json",
        error=None,
        side_effect=False,
        started_at=started_at,
        duration_ns=1000 * seq,
        metadata={},
        chain_index=seq - 1,
        prev_hash=prev,
        hash="",
    )
    return msgspec.structs.replace(draft, hash=event_hash(draft))


def contract_review_month(store: EventStore) -> set[str]:
    """45 days of contract reviews, 4 a day; returns the ids of the 14 affected runs.

    Affected: in the last 30 days, the compliance tool was asked about a GB-prefixed
    jurisdiction and returned no rows. Decoys miss exactly one of those conditions.
    """
    affected: set[str] = set()
    starts: list[RunStart] = []
    events: list[Event] = []
    ends = []
    n = 0
    for day in range(45):
        for slot in range(4):
            n += 1
            rid = new_id(n)
            t = NOW - (44 - day) * DAY + slot * 3600
            recent = t >= NOW - 30 * DAY
            # Day-of-month patterns pick who is affected and what each decoy gets wrong.
            case = (day * 4 + slot) % 12
            jurisdiction, rows, tool, workflow = (
                "US-CA",
                [{"rule": "r1"}],
                "query_compliance_rules",
                "contract_review",
            )
            if case == 0:
                jurisdiction, rows = "GB-SCT", []
            elif case == 5:
                jurisdiction, rows = "GB", []
            elif case == 1:
                jurisdiction = "GB-ENG"  # rows present
            elif case == 2:
                rows = []  # not GB
            elif case == 3:
                jurisdiction, rows, tool = "GB-SCT", [], "query_sanctions"
            elif case == 4:
                jurisdiction, rows, workflow = "GB-WLS", [], "invoice_review"
            elif case == 6:
                jurisdiction, rows = "gb-sct", []
            is_hit = case in (0, 5) and recent
            if is_hit and len(affected) == 14:
                jurisdiction = "FR"
                is_hit = False
            if is_hit:
                affected.add(rid)
            start = RunStart(
                run_id=rid,
                workflow=workflow,
                entrypoint=f"agents:{workflow}",
                parent_run_id=None,
                parent_seq=None,
                root_run_id=rid,
                tenant=None,
                input=canonical({"args": [f"c-{n}"], "kwargs": {}}).decode(),
                metadata={"team": "legal", "n": n},
                code={},
                env_hash=None,
                lineage={},
                started_at=t,
            )
            e1 = _event(
                rid,
                1,
                "llm",
                "extract_terms",
                {"contract": f"c-{n}"},
                {"jurisdiction": jurisdiction},
                t + 1,
                genesis_hash(rid),
            )
            e2 = _event(
                rid,
                2,
                "tool",
                tool,
                {"jurisdiction": jurisdiction, "contract": n},
                {"rows": rows},
                t + 2,
                e1.hash,
            )
            e3 = _event(
                rid,
                3,
                "llm",
                "assess_risk",
                {"rows": rows},
                {"risk": "low" if not rows else "high"},
                t + 3,
                e2.hash,
            )
            starts.append(start)
            events.extend((e1, e2, e3))
            ends.append(make_end(rid, [e1, e2, e3], start=start, ended_at=t + 4))
    store.append(starts, events, ends)
    assert len(affected) == 14
    return affected


IMPACT = EventQuery(
    workflow="contract_review",
    kind="tool",
    name="query_compliance_rules",
    since=NOW - 30 * DAY,
    until=NOW,
    where=(Predicate.parse("response.rows empty"), Predicate.parse("request.jurisdiction ^= GB")),
    limit=5,
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """An empty store of each backend."""
    s: EventStore
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SQLiteStore(tmp_path / "runs.db")
    else:
        server: PgServer = request.getfixturevalue("pg")
        s = PostgresStore(server.url(server.new_schema("search")))
    yield s
    s.close()


def _all_pages(store: EventStore, query: EventQuery) -> list[Any]:
    hits = []
    offset: int | None = 0
    while offset is not None:
        page = store.search(query.page(offset))
        assert len(page.hits) <= query.limit
        hits.extend(page.hits)
        offset = page.next_offset
    return hits


def test_thirty_days_of_reviews_finds_exactly_the_14_affected(store: EventStore) -> None:
    """The seed's impact query finds exactly the 14 affected runs, newest first, paginated."""
    affected = contract_review_month(store)
    hits = _all_pages(store, IMPACT)
    assert {h.run_id for h in hits} == affected
    assert len(hits) == 14
    assert [h.run.started_at for h in hits] == sorted(
        (h.run.started_at for h in hits), reverse=True
    )
    for hit in hits:
        assert [(e.seq, e.name) for e in hit.events] == [(2, "query_compliance_rules")]
        assert hit.events[0].request_value()["jurisdiction"].startswith("GB")
        assert verify_run(store, hit.run_id).ok
    first = store.search(IMPACT)
    assert len(first.hits) == 5
    assert first.next_offset == 5


@pytest.mark.parametrize(
    "predicate",
    [
        "response.rows empty",
        "response.rows nonempty",
        'request.jurisdiction == "GB"',
        'request.jurisdiction != "US-CA"',
        "request.jurisdiction ~= SCT",
        "request.contract >= 170",
        "request.contract < 3",
        "response.rows.0.rule == r1",
        "response.risk exists",
        "response.risk missing",
        "request.contract == 7.0",
        "response.rows == []",
        "response nonempty",
    ],
)
def test_backends_agree_with_the_python_reference(store: EventStore, predicate: str) -> None:
    """Each backend returns what the Python reference evaluation returns for a predicate."""
    reference = MemoryStore()
    contract_review_month(reference)
    contract_review_month(store)
    query = EventQuery(where=(Predicate.parse(predicate),), limit=1000)
    expected = [(h.run_id, [e.seq for e in h.events]) for h in reference.search(query).hits]
    found = [(h.run_id, [e.seq for e in h.events]) for h in store.search(query).hits]
    assert found == expected
    assert found


def test_metadata_filter_applies_to_the_run(store: EventStore) -> None:
    """Run metadata narrows the search like list_runs' metadata filter."""
    contract_review_month(store)
    page = store.search(EventQuery(metadata={"n": 3}, kind="tool", limit=10))
    assert [h.run_id for h in page.hits] == [new_id(3)]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("response.rows", "cannot read predicate"),
        ("output.rows empty", "'output' is not one of"),
        ("response.rows blank", "unknown operator 'blank'"),
        ("request.n > abc", "needs a number"),
        ("request.n ==", "has no value after =="),
    ],
)
def test_bad_predicate_named(text: str, fragment: str) -> None:
    """A predicate that cannot be read raises ConfigurationError saying what is wrong."""
    with pytest.raises(ConfigurationError, match=fragment):
        Predicate.parse(text)


def test_query_and_report_commands(tmp_path: Path) -> None:
    """`replayable query` lists the affected runs; `replayable report` writes one report each."""
    db = tmp_path / "runs.db"
    store = SQLiteStore(db)
    affected = contract_review_month(store)
    store.close()
    runner = CliRunner()
    args = ["--store", f"sqlite:///{db}"]
    filters = [
        "--workflow",
        "contract_review",
        "--name",
        "query_compliance_rules",
        "--since",
        str(NOW - 30 * DAY),
        "--until",
        str(NOW),
        "--query",
        "response.rows empty",
        "--query",
        "request.jurisdiction ^= GB",
    ]
    result = runner.invoke(app, [*args, "query", *filters, "--json", "--limit", "100"])
    assert result.exit_code == 0, result.output
    listed = [json.loads(line) for line in result.output.splitlines()]
    assert {row["run_id"] for row in listed} == affected
    out = tmp_path / "reports"
    result = runner.invoke(app, [*args, "report", *filters, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "14 report(s)" in result.output
    assert {p.stem for p in out.glob("*.json")} == affected
    assert {p.stem for p in out.glob("*.md")} == affected
    some = sorted(affected)[0]
    data = json.loads((out / f"{some}.json").read_text())
    assert [s["seq"] for s in data["matching_steps"]] == [2]
    assert data["chain"]["ok"] is True
    assert [t["matches"] for t in data["timeline"]] == [False, True, False]
    text = (out / f"{some}.md").read_text()
    assert "## Timeline" in text
    assert "## Lineage" in text
    assert "**match**" in text


def test_query_bad_since_is_a_clear_error(tmp_path: Path) -> None:
    """An unreadable --since exits 2 with one line naming the option."""
    result = CliRunner().invoke(
        app, ["--store", f"sqlite:///{tmp_path / 'r.db'}", "query", "--since", "last tuesday"]
    )
    assert result.exit_code == 2
    assert "--since 'last tuesday' is not a time" in result.output


def _many_runs(store: EventStore, runs: int) -> None:
    """``runs`` runs of two tool calls: ``lookup`` in every run, with an empty result in
    every 3rd run and a GB jurisdiction in every 97th; ``rare_tool`` in every 150th."""
    starts, events, ends = [], [], []
    for n in range(1, runs + 1):
        rid = new_id(10_000 + n)
        t = NOW + n * 60
        starts.append(
            RunStart(
                run_id=rid, workflow="many", entrypoint="agents:many", parent_run_id=None,
                parent_seq=None, root_run_id=rid, tenant=None,
                input=canonical({"args": [n], "kwargs": {}}).decode(), metadata={"n": n},
                code={}, env_hash=None, lineage={}, started_at=t,
            )
        )  # fmt: skip
        where = "GB-SCT" if n % 97 == 0 else "US-CA"
        rows: list[Any] = [] if n % 3 == 0 else [{"rule": "r1"}]
        e1 = _event(rid, 1, "tool", "lookup", {"jurisdiction": where}, {"rows": rows}, t + 1,
                    genesis_hash(rid))  # fmt: skip
        name = "rare_tool" if n % 150 == 0 else "other_tool"
        e2 = _event(rid, 2, "tool", name, {"n": n}, {"ok": True}, t + 2, e1.hash)
        events.extend((e1, e2))
        ends.append(make_end(rid, [e1, e2], start=starts[-1], ended_at=t + 3))
    store.append(starts, events, ends)


@pytest.mark.parametrize(
    "query",
    [
        EventQuery(name="lookup", where=(Predicate.parse("response.rows empty"),), limit=7),
        EventQuery(name="lookup", where=(Predicate.parse("request.jurisdiction ^= GB"),), limit=2),
        EventQuery(name="rare_tool", limit=1),
        EventQuery(name="lookup", where=(Predicate.parse("request.jurisdiction ^= FR"),)),
        EventQuery(kind="tool", limit=40),
        EventQuery(where=(Predicate.parse("response.rows empty"),), limit=25),
        EventQuery(metadata={"n": 291}),
    ],
    ids=["dense", "sparse", "rare-name", "none", "every-run", "no-name", "metadata"],
)
def test_every_plan_pages_like_the_python_reference(store: EventStore, query: EventQuery) -> None:
    """More runs than a walk looks through before switching plans: dense matches (found
    by walking the newest runs), sparse ones (the walk gives up; the index plan), a rare
    name, none at all: every page is the reference's page."""
    reference = MemoryStore()
    _many_runs(reference, 600)
    _many_runs(store, 600)

    def pages(s: EventStore) -> list[tuple[int, list[tuple[str, list[int]]], int | None]]:
        out = []
        offset: int | None = 0
        while offset is not None and len(out) < 12:
            page = s.search(query.page(offset))
            out.append((offset, [(h.run_id, [e.seq for e in h.events]) for h in page.hits],
                        page.next_offset))  # fmt: skip
            offset = page.next_offset
        return out

    expected = pages(reference)
    assert pages(store) == expected
    if query.name == "lookup" and "FR" in repr(query.where):
        assert expected == [(0, [], None)]
    else:
        assert expected[0][1]  # the data has matches for every other query
