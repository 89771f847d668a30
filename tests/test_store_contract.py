"""The EventStore contract, written once and run against every backend.

:class:`StoreContract` holds the behaviour; each backend subclasses it and
supplies ``create_store()`` returning a new, empty store. Only the public
``EventStore`` API is used here, so another backend passes by subclassing.
SQLite-only behaviour (triggers, WAL, schema versions) and ``open_store`` URL
parsing follow at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from replayable.errors import (
    AmbiguousRunIdError,
    AppendOnlyError,
    ConfigurationError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
)
from replayable.events.canonical import event_hash, genesis_hash, run_seal
from replayable.events.ids import uuid7
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store import EventStore, MemoryStore, RunFilter, open_store, verify_run
from replayable.store.sqlite import _DB_VERSION, SQLiteStore
from tests.llm_corpus import chat

# -- record builders ------------------------------------------------------------

_BASE_MS = 1_700_000_000_000


def new_id(n: int, *, ms: int | None = None) -> str:
    """A UUIDv7 run id; ``n`` picks the time (unless ``ms`` is given) and the random part."""
    return uuid7(_BASE_MS + n * 1000 if ms is None else ms, n.to_bytes(10, "big"))


def make_start(
    run_id: str,
    *,
    workflow: str = "triage",
    started_at: float = 1000.0,
    metadata: dict[str, Any] | None = None,
    parent: tuple[str, int] | None = None,
    root: str | None = None,
    tenant: str | None = None,
) -> RunStart:
    """A run start record with every field filled in (remembered for ``make_end``'s seal)."""
    start = _STARTS[run_id] = RunStart(
        run_id=run_id,
        workflow=workflow,
        entrypoint=f"agents.{workflow}:main",
        parent_run_id=parent[0] if parent else None,
        parent_seq=parent[1] if parent else None,
        root_run_id=root or (parent[0] if parent else run_id),
        tenant=tenant,
        input='{"args":[],"kwargs":{"ticket":{"$t":"tuple","v":[1,"é"]}}}',
        metadata=dict(metadata or {}),
        code={
            "module": "agents",
            "file": "/srv/agents.py",
            "sha256": "ab" * 32,
            "git_commit": None,
        },
        env_hash=ENV_DIGEST,
        lineage={"replay_of": None, "note": "ünïcode"},
        started_at=started_at,
    )
    return start


_STARTS: dict[str, RunStart] = {}

#: The environment snapshot every test run points at (stored where a test verifies).
ENV_SNAPSHOT = b'{"python":"3.x","packages":{}}'
ENV_DIGEST = hashlib.sha256(ENV_SNAPSHOT).hexdigest()


def make_events(
    run_id: str,
    count: int,
    *,
    first_seq: int = 1,
    after: Event | None = None,
    salt: str = "",
) -> list[Event]:
    """``count`` chained events with varied fields, continuing the chain after ``after``."""
    events: list[Event] = []
    prev = after.hash if after is not None else genesis_hash(run_id)
    index = after.chain_index + 1 if after is not None else 0
    for i in range(count):
        seq = first_seq + i
        failed = seq % 4 == 0
        draft = Event(
            run_id=run_id,
            seq=seq,
            kind=("tool", "llm", "clock")[seq % 3],
            name=f"step_{seq}",
            key=f"r:{seq - 1}" if seq % 5 else None,
            parent=seq - 1 if seq % 2 == 0 else None,
            call_site=f"agents.py:{10 + seq} in main" if seq % 3 else None,
            request=f'{{"q":"question {seq}{salt}","tags":["a","ß"]}}',
            fingerprint=hashlib.sha256(f"{seq}{salt}".encode()).hexdigest(),
            response=None if failed else f'{{"answer":{seq},"text":"ok {salt}"}}',
            encoding="tagged" if seq % 2 else "json",
            error='{"args":["boom"],"message":"boom","type":"builtins:ValueError"}'
            if failed
            else None,
            side_effect=seq % 3 == 0,
            started_at=1000.0 + seq / 7,
            duration_ns=1_000_003 * seq,
            metadata={"model": "m-1", "temperature": 0.25, "seq": seq} if seq % 2 else {},
            chain_index=index,
            prev_hash=prev,
            hash="",
        )
        event = msgspec.structs.replace(draft, hash=event_hash(draft))
        events.append(event)
        prev = event.hash
        index += 1
    return events


def make_end(
    run_id: str,
    events: Sequence[Event],
    *,
    status: str = "completed",
    ended_at: float = 2000.0,
    start: RunStart | None = None,
) -> RunEnd:
    """The end record matching ``events``: their count and the chain head."""
    failed = status == "failed"
    return RunEnd(
        run_id=run_id,
        status=status,  # type: ignore[arg-type]
        output=None if failed else '{"$t":"tuple","v":["done",2]}',
        error='{"args":["nope"],"message":"nope","type":"builtins:RuntimeError"}'
        if failed
        else None,
        ended_at=ended_at,
        event_count=len(events),
        last_hash=run_seal(
            events[-1].hash if events else genesis_hash(run_id),
            start or _STARTS.get(run_id) or make_start(run_id),
            status,
            None if failed else '{"$t":"tuple","v":["done",2]}',
            '{"args":["nope"],"message":"nope","type":"builtins:RuntimeError"}' if failed else None,
            ended_at,
            len(events),
        ),
    )


def ids(runs: Sequence[Any]) -> list[str]:
    return [r.run_id for r in runs]


# -- the contract ---------------------------------------------------------------


class StoreContract:
    """Behaviour every EventStore backend shares. Subclasses implement ``create_store``."""

    tmp_path: Path

    def create_store(self) -> EventStore:
        """A new, empty store of the backend under test."""
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _stores(self, tmp_path: Path) -> Iterator[None]:
        self.tmp_path = tmp_path
        self._opened: list[EventStore] = []
        yield
        for store in self._opened:
            store.close()

    @pytest.fixture
    def store(self) -> EventStore:
        store = self.create_store()
        self._opened.append(store)
        store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
        return store

    @pytest.fixture
    def family(self, store: EventStore) -> dict[str, str]:
        """Three root runs (completed, failed, incomplete) and two children of the first."""
        r1, r2, r3, c1, c2 = (new_id(n) for n in (1, 2, 3, 4, 5))
        ev1, ev2, ev3 = make_events(r1, 3), make_events(r2, 2), make_events(r3, 1)
        store.append(
            [
                make_start(
                    r1, started_at=100.0, metadata={"team": "a", "urgent": True, "priority": 1}
                ),
                make_start(
                    r2, started_at=200.0, metadata={"team": "b", "urgent": False, "priority": 2}
                ),
                make_start(r3, workflow="report", started_at=300.0, metadata={"team": "a"}),
                make_start(c1, workflow="lookup", started_at=150.0, parent=(r1, 2)),
                make_start(c2, workflow="lookup", started_at=160.0, parent=(r1, 1)),
            ],
            [*ev1, *ev2, *ev3],
            [
                make_end(r1, ev1),
                make_end(r2, ev2, status="failed"),
                make_end(c1, []),
                make_end(c2, []),
            ],
        )
        return {"r1": r1, "r2": r2, "r3": r3, "c1": c1, "c2": c2}

    # -- append and read back -------------------------------------------------

    def test_run_start_reads_back_field_for_field(self, store: EventStore) -> None:
        """A run start record is read back equal in every field."""
        parent = new_id(1)
        start = make_start(
            new_id(2),
            metadata={"team": "a", "n": 3, "ok": True, "x": [1]},
            parent=(parent, 4),
            tenant="acme",
        )
        store.append([make_start(parent), start])
        run = store.get_run(start.run_id)
        assert run.start == start
        assert msgspec.structs.asdict(run.start) == msgspec.structs.asdict(start)
        assert run.end is None

    def test_events_read_back_field_for_field(self, store: EventStore) -> None:
        """Events are read back equal in every field, including None and error fields."""
        rid = new_id(1)
        events = make_events(rid, 8)
        store.append([make_start(rid)], events)
        stored = store.events(rid)
        assert [msgspec.structs.asdict(e) for e in stored] == [
            msgspec.structs.asdict(e) for e in events
        ]
        assert all(type(e.side_effect) is bool for e in stored)

    def test_end_record_reads_back_field_for_field(self, store: EventStore) -> None:
        """A run end record is read back equal in every field."""
        rid = new_id(1)
        events = make_events(rid, 2)
        end = make_end(rid, events, status="failed")
        store.append([make_start(rid)], events, [end])
        assert store.get_run(rid).end == end

    def test_events_are_ordered_by_seq(self, store: EventStore) -> None:
        """Events come back ordered by seq, whatever order they were appended in."""
        rid = new_id(1)
        events = make_events(rid, 6)
        store.append([make_start(rid)], [events[4], events[1]])
        store.append([], [events[5], events[0], events[3]])
        store.append([], [events[2]])
        assert [e.seq for e in store.events(rid)] == [1, 2, 3, 4, 5, 6]

    def test_events_of_a_run_are_its_own(self, store: EventStore) -> None:
        """``events`` returns only the named run's events; an unknown run has none."""
        a, b = new_id(1), new_id(2)
        store.append([make_start(a), make_start(b)], [*make_events(a, 2), *make_events(b, 3)])
        assert {e.run_id for e in store.events(a)} == {a}
        assert len(store.events(b)) == 3
        assert store.events(new_id(9)) == []

    def test_event_at_looks_up_one_event(self, store: EventStore) -> None:
        """``event_at`` finds one event by run and seq; a missing one is ``None``."""
        a, b = new_id(1), new_id(2)
        events = make_events(a, 4)
        store.append([make_start(a), make_start(b)], [*events, *make_events(b, 2)])
        assert store.event_at(a, 3) == events[2]
        assert store.event_at(a, 5) is None
        assert store.event_at(b, 2) is not None
        assert store.event_at(b, 2) != events[1]
        assert store.event_at(new_id(9), 1) is None

    def test_events_range_reads_a_slice_of_a_run(self, store: EventStore) -> None:
        """``events_range`` returns the run's events first..last (both ends inclusive) and
        no other run's; a range past the end is cut there, an empty one is empty."""
        a, b = new_id(1), new_id(2)
        events = make_events(a, 10)
        store.append([make_start(a), make_start(b)], [*events, *make_events(b, 12)])
        assert store.events_range(a, 3, 5) == events[2:5]
        assert store.events_range(a, 1, 1) == events[:1]
        assert store.events_range(a, 0, 2) == events[:2]
        assert store.events_range(a, 8, 50) == events[7:]
        assert store.events_range(a, 1, 2**40) == events
        assert store.events_range(a, 11, 20) == []
        assert store.events_range(a, 5, 4) == []
        assert store.events_range(new_id(9), 1, 10) == []
        assert {e.run_id for e in store.events_range(b, 1, 12)} == {b}
        assert store.events_until(a, 4) == events[:4]

    def test_events_range_follows_appends_out_of_order(self, store: EventStore) -> None:
        """A range holds what is stored in it, in seq order, whatever the append order;
        a gap in the run is not filled in."""
        rid = new_id(1)
        events = make_events(rid, 6)
        store.append([make_start(rid)], [events[4], events[1]])
        assert store.events_range(rid, 1, 6) == [events[1], events[4]]
        store.append([], [events[5], events[0], events[2]])
        assert [e.seq for e in store.events_range(rid, 2, 6)] == [2, 3, 5, 6]

    @pytest.mark.parametrize(
        "bounds", [("3", 5), (1, 5.0), (True, 4), (1, None)], ids=["str", "float", "bool", "none"]
    )
    def test_events_range_refuses_bounds_that_are_not_ints(
        self, store: EventStore, bounds: tuple[Any, Any]
    ) -> None:
        """A bound from a URL left as text (or a float, a bool) is refused, naming it."""
        rid = new_id(1)
        store.append([make_start(rid)], make_events(rid, 5))
        which = "first_seq" if type(bounds[0]) is not int else "last_seq"
        with pytest.raises(ConfigurationError, match=f"events_range: {which} must be an int"):
            store.events_range(rid, *bounds)

    def test_events_range_joins_payloads_in_the_blob_tier(self, store: EventStore) -> None:
        """A range of a run whose payloads left the row reads them back whole."""
        rid = new_id(63)
        big = "z" * 5000
        payloads = [
            (canonical({"doc": big, "n": i}), canonical({"rows": [big, i]}) if i % 2 else None)
            for i in range(6)
        ]
        events = payload_events(rid, payloads)
        store.append([make_start(rid)], events, [make_end(rid, events)])
        assert store.tier_stats().blobs >= 1
        store.tier._nodes.clear()
        store.tier._texts.clear()
        got = store.events_range(rid, 2, 4)
        assert got == events[1:4]
        assert all(not e.problems for e in got)
        assert store.events_range(rid, 6, 9) == events[5:]

    def test_events_range_reports_a_bad_blob_in_the_range(self, store: EventStore) -> None:
        """An altered blob in the range marks its event, and only it; a range beside it
        reads clean."""
        import zstandard

        rid = new_id(64)
        text = "ledger line " * 200
        events = payload_events(
            rid, [('{"q":1}', None), (canonical({"doc": text}), None), ('{"q":3}', None)]
        )
        store.append([make_start(rid)], events, [make_end(rid, events)])
        digest = hashlib.sha256(canonical(text).encode()).hexdigest()
        self.tamper_blob(store, digest, zstandard.compress(canonical(text + "!").encode()))
        store.tier._texts.clear()
        got = store.events_range(rid, 1, 3)
        assert [e.seq for e in got] == [1, 2, 3]
        assert [bool(e.problems) for e in got] == [False, True, False]
        assert f"blob {digest[:12]} does not match its hash" in str(got[1].problems)
        assert store.events_range(rid, 3, 3) == events[2:]

    def test_batches_may_span_transactions(self, store: EventStore) -> None:
        """A run's start, events and end may arrive in separate batches, durable or not."""
        rid = new_id(1)
        events = make_events(rid, 4)
        store.append([make_start(rid)], durable=True)
        store.append(events=events[:2])
        store.append(events=events[2:], durable=True)
        store.append(ends=[make_end(rid, events)])
        assert store.events(rid) == events
        assert store.get_run(rid).status == "completed"

    def test_stored_chain_verifies(self, store: EventStore) -> None:
        """Every hashed field survives storage: verify_run finds stored chains intact."""
        done, cut = new_id(1), new_id(2)
        ev_done, ev_cut = make_events(done, 7), make_events(cut, 3)
        store.append(
            [make_start(done), make_start(cut)], [*ev_done, *ev_cut], [make_end(done, ev_done)]
        )
        assert verify_run(store, done).ok
        assert verify_run(store, done).events_checked == 7
        # A run without an end record holds its chain, and is named as not sealed.
        cut_report = verify_run(store, cut)
        assert (cut_report.status, cut_report.events_checked) == ("unsealed", 3)

    # -- status -----------------------------------------------------------------

    def test_status_is_incomplete_without_end_record(self, store: EventStore) -> None:
        """A run with no end record is incomplete and has no end time."""
        rid = new_id(1)
        store.append([make_start(rid)], make_events(rid, 2))
        run = store.get_run(rid)
        assert run.status == "incomplete"
        assert run.ended_at is None

    @pytest.mark.parametrize("status", ["completed", "failed"])
    def test_status_comes_from_end_record(self, store: EventStore, status: str) -> None:
        """A run's status is the one its end record carries."""
        rid = new_id(1)
        events = make_events(rid, 2)
        store.append(
            [make_start(rid)], events, [make_end(rid, events, status=status, ended_at=1234.5)]
        )
        run = store.get_run(rid)
        assert run.status == status
        assert run.ended_at == 1234.5

    def test_get_run_unknown_raises_run_not_found(self, store: EventStore) -> None:
        """get_run of an unknown id raises RunNotFoundError, a LookupError."""
        store.append([make_start(new_id(1))])
        with pytest.raises(RunNotFoundError) as info:
            store.get_run(new_id(2))
        assert isinstance(info.value, LookupError)

    # -- resolving ids ------------------------------------------------------------

    def test_resolve_full_id(self, store: EventStore) -> None:
        """resolve returns a full id unchanged."""
        a, b = new_id(1, ms=_BASE_MS), new_id(2, ms=_BASE_MS)
        store.append([make_start(a), make_start(b)])
        assert store.resolve(a) == a
        assert store.resolve(b) == b

    def test_resolve_unique_prefix(self, store: EventStore) -> None:
        """resolve expands a unique prefix, ignoring case and surrounding blanks."""
        a, b = new_id(1), new_id(2)
        store.append([make_start(a), make_start(b)])
        common = len(_common_prefix(a, b))
        assert store.resolve(a[: common + 1]) == a
        assert store.resolve(f"  {b[: common + 2].upper()} ") == b
        assert store.run(b[: common + 1]).run_id == b

    def test_resolve_unknown_raises_run_not_found(self, store: EventStore) -> None:
        """An id or prefix no run has raises RunNotFoundError naming it."""
        store.append([make_start(new_id(1))])
        with pytest.raises(RunNotFoundError, match="ffff"):
            store.resolve("ffff")
        with pytest.raises(RunNotFoundError):
            store.resolve("   ")

    def test_resolve_ambiguous_prefix(self, store: EventStore) -> None:
        """A prefix shared by two runs raises AmbiguousRunIdError listing both."""
        a, b = new_id(1, ms=_BASE_MS), new_id(2, ms=_BASE_MS)
        store.append([make_start(a), make_start(b), make_start(new_id(3))])
        prefix = _common_prefix(a, b)
        assert len(prefix) >= 8
        with pytest.raises(AmbiguousRunIdError) as info:
            store.resolve(prefix)
        assert sorted(info.value.candidates) == sorted([a, b])
        assert isinstance(info.value, RunNotFoundError)

    def test_find_run_ids_honours_limit(self, store: EventStore) -> None:
        """find_run_ids returns at most ``limit`` ids, all with the prefix."""
        runs = [new_id(n, ms=_BASE_MS) for n in range(1, 6)]
        store.append([make_start(r) for r in runs])
        prefix = runs[0][:8]
        found = store.find_run_ids(prefix, limit=3)
        assert len(found) == 3
        assert set(found) <= set(runs)
        assert store.find_run_ids("0000", limit=3) == []

    # -- listing --------------------------------------------------------------------

    def test_list_runs_newest_first(self, store: EventStore, family: dict[str, str]) -> None:
        """list_runs returns runs newest first by start time."""
        f = family
        assert ids(store.list_runs()) == [f["r3"], f["r2"], f["c2"], f["c1"], f["r1"]]

    def test_list_runs_ties_broken_by_run_id(self, store: EventStore) -> None:
        """Runs started at the same instant are listed by run id, highest first."""
        runs = [new_id(n) for n in (3, 1, 2)]
        store.append([make_start(r, started_at=50.0) for r in runs])
        assert ids(store.list_runs()) == sorted(runs, reverse=True)

    def test_list_runs_by_workflow(self, store: EventStore, family: dict[str, str]) -> None:
        """The workflow filter keeps runs of that workflow only."""
        f = family
        assert ids(store.list_runs(RunFilter(workflow="triage"))) == [f["r2"], f["r1"]]
        assert ids(store.list_runs(RunFilter(workflow="lookup"))) == [f["c2"], f["c1"]]
        assert store.list_runs(RunFilter(workflow="nope")) == []

    @pytest.mark.parametrize(
        ("status", "expected"),
        [
            ("completed", ["c2", "c1", "r1"]),
            ("failed", ["r2"]),
            ("incomplete", ["r3"]),
        ],
    )
    def test_list_runs_by_status(
        self, store: EventStore, family: dict[str, str], status: str, expected: list[str]
    ) -> None:
        """The status filter distinguishes completed, failed and incomplete runs."""
        runs = store.list_runs(RunFilter(status=status))  # type: ignore[arg-type]
        assert ids(runs) == [family[k] for k in expected]
        assert {r.status for r in runs} == {status}

    @pytest.mark.parametrize(
        ("metadata", "expected"),
        [
            ({"team": "a"}, ["r3", "r1"]),
            ({"team": "b"}, ["r2"]),
            ({"urgent": True}, ["r1"]),
            ({"urgent": False}, ["r2"]),
            ({"priority": 2}, ["r2"]),
            ({"priority": 1}, ["r1"]),
            ({"team": "a", "urgent": True}, ["r1"]),
            ({"team": "b", "urgent": True}, []),
            ({"team": "zzz"}, []),
        ],
    )
    def test_list_runs_by_metadata(
        self,
        store: EventStore,
        family: dict[str, str],
        metadata: dict[str, Any],
        expected: list[str],
    ) -> None:
        """Metadata filters match key=value for str, bool and int values; all must hold."""
        assert ids(store.list_runs(RunFilter(metadata=metadata))) == [family[k] for k in expected]

    @pytest.mark.parametrize(
        ("run_filter", "expected"),
        [
            (RunFilter(limit=2), 5),
            (RunFilter(workflow="triage", limit=1), 2),
            (RunFilter(status="incomplete"), 1),
            (RunFilter(metadata={"team": "a"}, limit=1), 2),
            (RunFilter(metadata={"nested": {"x": 1}}), 0),
            (RunFilter(roots_only=True), 3),
        ],
    )
    def test_count_runs_ignores_the_limit(
        self, store: EventStore, family: dict[str, str], run_filter: RunFilter, expected: int
    ) -> None:
        """count_runs counts every run the filter passes, however many a listing shows."""
        assert store.count_runs(run_filter) == expected
        assert len(store.list_runs(run_filter.unlimited())) == expected

    def test_list_runs_metadata_none_needs_the_key(self, store: EventStore) -> None:
        """A key=None filter matches runs whose value is null, not runs without the key."""
        with_null, without = new_id(1), new_id(2)
        store.append(
            [
                make_start(with_null, metadata={"reviewer": None}),
                make_start(without, metadata={"team": "a"}),
            ]
        )
        assert ids(store.list_runs(RunFilter(metadata={"reviewer": None}))) == [with_null]

    def test_list_runs_metadata_float_matches_int(self, store: EventStore) -> None:
        """Metadata compares by its text form: 2.0 and 2 are the same tag, 2.5 another."""
        whole, half = new_id(1), new_id(2)
        store.append(
            [
                make_start(whole, metadata={"score": 2.0}),
                make_start(half, metadata={"score": 2.5}),
            ]
        )
        assert ids(store.list_runs(RunFilter(metadata={"score": 2}))) == [whole]
        assert ids(store.list_runs(RunFilter(metadata={"score": 2.5}))) == [half]

    def test_list_runs_metadata_containers_not_matched(self, store: EventStore) -> None:
        """Nested metadata values (dicts, lists) are not filterable: no filter matches them."""
        rid = new_id(1)
        store.append([make_start(rid, metadata={"tags": ["a"], "cfg": {"x": 1}, "team": "a"})])
        assert store.list_runs(RunFilter(metadata={"tags": ["a"]})) == []
        assert store.list_runs(RunFilter(metadata={"cfg": {"x": 1}})) == []
        assert ids(store.list_runs(RunFilter(metadata={"team": "a"}))) == [rid]

    def test_list_runs_since_until_inclusive(
        self, store: EventStore, family: dict[str, str]
    ) -> None:
        """since and until bound the start time, both ends included."""
        f = family
        assert ids(store.list_runs(RunFilter(since=200.0))) == [f["r3"], f["r2"]]
        assert ids(store.list_runs(RunFilter(until=150.0))) == [f["c1"], f["r1"]]
        assert ids(store.list_runs(RunFilter(since=150.0, until=200.0))) == [
            f["r2"],
            f["c2"],
            f["c1"],
        ]
        assert store.list_runs(RunFilter(since=301.0)) == []

    def test_list_runs_by_parent_and_roots(self, store: EventStore, family: dict[str, str]) -> None:
        """parent_run_id keeps one run's children; roots_only keeps runs with no parent."""
        f = family
        assert ids(store.list_runs(RunFilter(parent_run_id=f["r1"]))) == [f["c2"], f["c1"]]
        assert store.list_runs(RunFilter(parent_run_id=f["r2"])) == []
        assert ids(store.list_runs(RunFilter(roots_only=True))) == [f["r3"], f["r2"], f["r1"]]

    def test_list_runs_combines_filters(self, store: EventStore, family: dict[str, str]) -> None:
        """Every given condition must hold at once."""
        f = family
        flt = RunFilter(workflow="triage", metadata={"team": "a"}, status="completed")
        assert ids(store.list_runs(flt)) == [f["r1"]]
        assert store.list_runs(RunFilter(workflow="report", status="completed")) == []

    def test_list_runs_limit(self, store: EventStore, family: dict[str, str]) -> None:
        """limit keeps the newest runs; None lifts it."""
        f = family
        assert ids(store.list_runs(RunFilter(limit=2))) == [f["r3"], f["r2"]]
        assert len(store.list_runs(RunFilter(limit=None))) == 5

    def test_list_runs_default_limit_is_100(self, store: EventStore) -> None:
        """Without a filter at most 100 runs are listed, the newest."""
        runs = [new_id(n) for n in range(1, 106)]
        store.append([make_start(r, started_at=float(i)) for i, r in enumerate(runs)])
        listed = store.list_runs()
        assert len(listed) == 100
        assert ids(listed) == list(reversed(runs))[:100]

    def test_list_runs_carries_end_records(self, store: EventStore, family: dict[str, str]) -> None:
        """Listed runs carry their end records, so their status is known."""
        by_id = {r.run_id: r for r in store.list_runs()}
        assert by_id[family["r1"]].end == store.get_run(family["r1"]).end
        assert by_id[family["r1"]].status == "completed"
        assert by_id[family["r3"]].end is None

    def test_children_ordered_by_parent_step(
        self, store: EventStore, family: dict[str, str]
    ) -> None:
        """children lists a run's direct children by the step that started them."""
        f = family
        kids = store.children(f["r1"])
        assert ids(kids) == [f["c2"], f["c1"]]
        assert [k.start.parent_seq for k in kids] == [1, 2]
        assert store.children(f["c1"]) == []

    def test_iter_run_ids_oldest_first(self, store: EventStore, family: dict[str, str]) -> None:
        """iter_run_ids yields every run id, oldest first."""
        f = family
        assert list(store.iter_run_ids()) == [f["r1"], f["c1"], f["c2"], f["r2"], f["r3"]]

    # -- append-only -------------------------------------------------------------

    @pytest.fixture
    def recorded(self, store: EventStore) -> tuple[str, list[Event]]:
        """A run with a start record and three events, no end yet."""
        rid = new_id(1)
        events = make_events(rid, 3)
        store.append([make_start(rid, metadata={"team": "a"})], events)
        return rid, events

    def _assert_untouched(self, store: EventStore, rid: str, events: list[Event]) -> None:
        assert store.events(rid) == events
        assert store.get_run(rid).start == make_start(rid, metadata={"team": "a"})
        report = verify_run(store, rid)
        sealed = store.get_run(rid).end is not None
        status = "intact" if sealed else "unsealed"
        assert (report.status, report.events_checked) == (status, len(events)), report.message

    def test_duplicate_event_refuses_whole_batch(
        self, store: EventStore, recorded: tuple[str, list[Event]]
    ) -> None:
        """A batch holding an already recorded (run_id, seq) is refused and writes nothing."""
        rid, events = recorded
        other = new_id(2)
        forged = make_events(rid, 1, first_seq=2, salt="forged")[0]
        with pytest.raises(AppendOnlyError):
            store.append(
                [make_start(other, metadata={"team": "a"})],
                [
                    *make_events(other, 2),
                    make_events(rid, 1, first_seq=4, after=events[-1])[0],
                    forged,
                ],
                [make_end(other, [])],
            )
        self._assert_untouched(store, rid, events)
        with pytest.raises(RunNotFoundError):
            store.get_run(other)
        assert store.events(other) == []
        assert ids(store.list_runs(RunFilter(metadata={"team": "a"}))) == [rid]

    def test_duplicate_event_within_batch_refused(
        self, store: EventStore, recorded: tuple[str, list[Event]]
    ) -> None:
        """Two events with the same (run_id, seq) in one batch are refused; nothing is written."""
        rid, events = recorded
        nxt = make_events(rid, 1, first_seq=4, after=events[-1])[0]
        twin = make_events(rid, 1, first_seq=4, after=events[-1], salt="twin")[0]
        with pytest.raises(AppendOnlyError):
            store.append([], [nxt, twin])
        self._assert_untouched(store, rid, events)

    def test_second_start_record_refused(
        self, store: EventStore, recorded: tuple[str, list[Event]]
    ) -> None:
        """A second start record for a run is refused and its batch writes nothing."""
        rid, events = recorded
        more = make_events(rid, 1, first_seq=4, after=events[-1])
        with pytest.raises(AppendOnlyError):
            store.append([make_start(rid, workflow="forged")], more)
        self._assert_untouched(store, rid, events)

    def test_duplicate_start_within_batch_refused(self, store: EventStore) -> None:
        """Two start records for one run in a single batch are refused; nothing is written."""
        rid = new_id(1)
        with pytest.raises(AppendOnlyError):
            store.append([make_start(rid), make_start(rid, workflow="other")])
        with pytest.raises(RunNotFoundError):
            store.get_run(rid)

    def test_second_end_record_refused(
        self, store: EventStore, recorded: tuple[str, list[Event]]
    ) -> None:
        """A second end record is refused: a finished run's outcome cannot be rewritten."""
        rid, events = recorded
        end = make_end(rid, events)
        store.append(ends=[end])
        other = new_id(2)
        with pytest.raises(AppendOnlyError):
            store.append(
                [make_start(other)],
                [],
                [make_end(other, []), make_end(rid, events, status="failed")],
            )
        assert store.get_run(rid).end == end
        assert store.get_run(rid).status == "completed"
        with pytest.raises(RunNotFoundError):
            store.get_run(other)
        self._assert_untouched(store, rid, events)

    def test_duplicate_end_within_batch_refused(
        self, store: EventStore, recorded: tuple[str, list[Event]]
    ) -> None:
        """Two end records for one run in a single batch are refused; the run stays incomplete."""
        rid, events = recorded
        with pytest.raises(AppendOnlyError):
            store.append([], [], [make_end(rid, events), make_end(rid, events, status="failed")])
        assert store.get_run(rid).status == "incomplete"
        self._assert_untouched(store, rid, events)

    def test_store_usable_after_refused_batch(
        self, store: EventStore, recorded: tuple[str, list[Event]]
    ) -> None:
        """After a refused batch the next valid batch is written normally."""
        rid, events = recorded
        with pytest.raises(AppendOnlyError):
            store.append([], [events[0]])
        more = make_events(rid, 2, first_seq=4, after=events[-1])
        store.append([], more, [make_end(rid, [*events, *more])])
        assert [e.seq for e in store.events(rid)] == [1, 2, 3, 4, 5]
        assert verify_run(store, rid).ok

    # -- blobs -------------------------------------------------------------------

    def test_blobs_round_trip_and_are_idempotent(self, store: EventStore) -> None:
        """A blob reads back byte for byte; storing it again changes nothing."""
        data = b"\x00\xffbinary\x00" + "ünïcode".encode() * 100
        digest = hashlib.sha256(data).hexdigest()
        store.put_blob(digest, data)
        store.put_blob(digest, data)
        assert store.get_blob(digest) == data
        assert store.get_blob(hashlib.sha256(b"other").hexdigest()) is None

    # -- the payload tier ----------------------------------------------------------

    def tamper_blob(self, store: EventStore, digest: str, data: bytes) -> None:
        """Replace the stored bytes of payload blob ``digest`` behind the store's back."""
        raise NotImplementedError

    def test_large_payloads_round_trip_through_the_blob_tier(self, store: EventStore) -> None:
        """Payloads over the threshold leave the row and read back whole, chain intact."""
        rid = new_id(60)
        big = "x" * 5000
        payloads = [
            (canonical({"doc": big, "n": 1}), canonical({"summary": "é" * 3000})),
            ('{"q":"small"}', canonical({"rows": [big]})),
            (canonical({"doc": big, "n": 1}), None),
        ]
        events = payload_events(rid, payloads)
        store.append([make_start(rid)], events, [make_end(rid, events)])
        got = store.events(rid)
        assert [(e.request, e.response) for e in got] == [(e.request, e.response) for e in events]
        assert got == events
        assert store.event_at(rid, 2) == events[1]
        assert verify_run(store, rid).ok
        stats = store.tier_stats()
        # "x"*5000 is stored once although three payloads hold it.
        assert stats.blobs == 2
        assert stats.stored_bytes < stats.text_bytes / 10

    def test_small_payloads_stay_inline(self, store: EventStore) -> None:
        rid = new_id(61)
        events = make_events(rid, 3)
        store.append([make_start(rid)], events)
        assert store.tier_stats().blobs == 0
        assert store.events(rid) == events

    def test_chat_history_is_stored_once_per_message(self, store: EventStore) -> None:
        """A chat that re-sends its history costs linear, not quadratic, storage."""
        sizes = {}
        for turns in (10, 40):
            conversation = chat(turns, seed=turns)
            rid = new_id(62 + turns)
            events = payload_events(rid, conversation.calls)
            before = store.tier_stats()
            store.append([make_start(rid)], events, [make_end(rid, events)])
            after = store.tier_stats()
            stored = (after.text_bytes - before.text_bytes) + (after.node_bytes - before.node_bytes)
            sizes[turns] = stored / conversation.unique_chars
            assert [e.request for e in store.events(rid)] == [e.request for e in events]
            assert verify_run(store, rid).ok
        assert sizes[10] <= 1.5, sizes
        assert sizes[40] <= 1.5, sizes

    def test_each_data_subject_has_its_own_blobs(self, store: EventStore) -> None:
        """Runs naming a data subject share blobs within that subject only."""
        payload = canonical({"context": "q" * 4000})
        for n, subject in ((74, "customer-1"), (75, "customer-1"), (76, "customer-2"), (77, None)):
            rid = new_id(n)
            meta = {"data_subject": subject} if subject else {}
            store.append([make_start(rid, metadata=meta)], payload_events(rid, [(payload, None)]))
            assert store.events(rid)[0].request == payload
        assert store.tier_stats().blobs == 3

    def test_search_sees_payloads_in_the_blob_tier(self, store: EventStore) -> None:
        """Impact queries match on tiered payloads as on inline ones (and not on others)."""
        from replayable.store.search import EventQuery, Predicate

        rid = new_id(73)
        events = payload_events(
            rid,
            [
                (canonical({"jurisdiction": "GB-" + "w" * 2000}), canonical({"rows": []})),
                (canonical({"jurisdiction": "FR-" + "w" * 2000}), canonical({"rows": [1]})),
                ('{"jurisdiction":"GB-short"}', None),
            ],
        )
        store.append([make_start(rid)], events, [make_end(rid, events)])
        page = store.search(EventQuery(where=(Predicate.parse("request.jurisdiction ^= GB"),)))
        assert [(h.run_id, [e.seq for e in h.events]) for h in page.hits] == [(rid, [1, 3])]
        assert page.hits[0].events[0] == events[0]

    def test_chats_sharing_a_prompt_read_back_from_a_new_store_object(
        self, store: EventStore
    ) -> None:
        """Two chats that share the system prompt but not the first question: each reads
        back whole, also without the writer's caches."""
        first, second = chat(3, seed=1), chat(3, seed=2)
        shared = [(first.calls[0][0][:2200] + "x", None)]
        ids = []
        for n, calls in ((80, first.calls), (81, second.calls), (82, shared)):
            rid = new_id(n)
            store.append([make_start(rid)], payload_events(rid, calls))
            ids.append((rid, calls))
        store.tier._nodes.clear()
        store.tier._texts.clear()
        for rid, calls in ids:
            assert [e.request for e in store.events(rid)] == [c[0] for c in calls]

    def test_identical_payloads_across_runs_are_stored_once(self, store: EventStore) -> None:
        payload = canonical({"context": "y" * 4000})
        for n in (70, 71):
            rid = new_id(n)
            events = payload_events(rid, [(payload, payload)])
            store.append([make_start(rid)], events)
        assert store.tier_stats().blobs == 1
        for n in (70, 71):
            assert store.events(new_id(n))[0].response == payload

    def test_blob_that_does_not_match_its_hash_is_reported(self, store: EventStore) -> None:
        """An altered blob makes its event unreadable, named by the reader and by verify."""
        import zstandard

        rid = new_id(72)
        text = "secret plan " * 200
        events = payload_events(rid, [(canonical({"doc": text}), None), ('{"q":1}', None)])
        store.append([make_start(rid)], events, [make_end(rid, events)])
        digest = hashlib.sha256(canonical(text).encode()).hexdigest()
        self.tamper_blob(store, digest, zstandard.compress(canonical(text + "!").encode()))
        store.tier._texts.clear()
        got = store.events(rid)
        assert got[0].problems
        assert f"blob {digest[:12]} does not match its hash" in str(got[0].problems)
        assert not got[1].problems
        report = verify_run(store, rid)
        assert not report.ok
        assert "does not match its hash" in str(report)


def canonical(value: Any) -> str:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def payload_events(run_id: str, payloads: Sequence[tuple[str, str | None]]) -> list[Event]:
    """Chained events carrying the given (request, response) payloads."""
    out: list[Event] = []
    prev = genesis_hash(run_id)
    for i, (request, response) in enumerate(payloads):
        draft = msgspec.structs.replace(
            make_events(run_id, 1, first_seq=i + 1)[0],
            request=request,
            response=response,
            error=None,
            chain_index=i,
            prev_hash=prev,
        )
        event = msgspec.structs.replace(draft, hash=event_hash(draft))
        out.append(event)
        prev = event.hash
    return out


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


# -- backends ---------------------------------------------------------------------


class TestMemoryStore(StoreContract):
    """The contract against the in-memory store."""

    def create_store(self) -> EventStore:
        return MemoryStore()

    def tamper_blob(self, store: EventStore, digest: str, data: bytes) -> None:
        assert isinstance(store, MemoryStore)
        for key, row in list(store._tier_blobs.items()):
            if row.digest == digest:
                store._tier_blobs[key] = row._replace(data=data)


class TestSQLiteStore(StoreContract):
    """The contract against the SQLite store."""

    def create_store(self) -> EventStore:
        return SQLiteStore(self.tmp_path / f"runs-{len(self._opened)}.db")

    def tamper_blob(self, store: EventStore, digest: str, data: bytes) -> None:
        assert isinstance(store, SQLiteStore)
        with raw(store.path) as conn:
            conn.execute("DROP TRIGGER payload_blobs_no_update")
            conn.execute("UPDATE payload_blobs SET data = ? WHERE digest = ?", (data, digest))
            conn.commit()


# -- SQLite only ---------------------------------------------------------------------


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to ``path``, behind the store's back."""
    conn = sqlite3.connect(path)
    try:
        yield conn
    finally:
        conn.close()


def _filled(path: Path) -> tuple[SQLiteStore, str, list[Event]]:
    store = SQLiteStore(path)
    rid = new_id(1)
    events = make_events(rid, 3)
    store.append([make_start(rid, metadata={"team": "a"})], events, [make_end(rid, events)])
    store.put_blob("ab" * 32, b"blob")
    store.put_blob(ENV_DIGEST, ENV_SNAPSHOT)
    return store, rid, events


class TestSQLiteSpecifics:
    """What the SQLite backend does beyond the contract."""

    def test_wal_mode(self, sqlite_store: SQLiteStore, sqlite_path: Path) -> None:
        """The database is in WAL mode."""
        with raw(sqlite_path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    @pytest.mark.parametrize("table", ["events", "runs", "run_ends", "run_tags", "blobs"])
    @pytest.mark.parametrize("statement", ["UPDATE {t} SET rowid = rowid", "DELETE FROM {t}"])
    def test_triggers_refuse_update_and_delete(
        self, sqlite_path: Path, table: str, statement: str
    ) -> None:
        """A raw UPDATE or DELETE on any recorded table is refused by a trigger."""
        store, rid, events = _filled(sqlite_path)
        try:
            with raw(sqlite_path) as conn:
                count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                assert count > 0
                sql = statement.format(t=table)
                if table in ("events", "run_tags", "blobs"):  # WITHOUT ROWID tables
                    col = {"events": "response", "run_tags": "value", "blobs": "data"}[table]
                    sql = sql.replace("rowid = rowid", f"{col} = {col}")
                with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                    conn.execute(sql)
                conn.rollback()
                assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == count
            assert store.events(rid) == events
            assert verify_run(store, rid).ok
        finally:
            store.close()

    def test_reopen_keeps_data(self, sqlite_path: Path) -> None:
        """Closing and reopening a database keeps every record and blob."""
        store, rid, events = _filled(sqlite_path)
        run = store.get_run(rid)
        store.close()
        again = SQLiteStore(sqlite_path)
        try:
            assert again.get_run(rid) == run
            assert again.events(rid) == events
            assert again.get_blob("ab" * 32) == b"blob"
            assert ids(again.list_runs(RunFilter(metadata={"team": "a"}))) == [rid]
            more = new_id(2)
            again.append([make_start(more)])
            assert sorted(again.iter_run_ids()) == sorted([rid, more])
        finally:
            again.close()

    def test_newer_schema_version_refused(self, sqlite_path: Path) -> None:
        """A database written by a newer schema raises SchemaVersionError naming the version."""
        store, _, _ = _filled(sqlite_path)
        store.close()
        with raw(sqlite_path) as conn:  # meta carries no append-only trigger
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
            conn.commit()
        with pytest.raises(SchemaVersionError, match="99"):
            SQLiteStore(sqlite_path)
        with raw(sqlite_path) as conn:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
            assert version.fetchone()[0] == "99"

    def test_newer_schema_with_changed_tables_refused_untouched(self, sqlite_path: Path) -> None:
        """A newer database whose tables changed shape is refused by version, not by a
        failing CREATE, and nothing is added to it."""
        with raw(sqlite_path) as conn:
            conn.executescript(
                "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                "INSERT INTO meta VALUES ('schema_version', '99');"
                "CREATE TABLE events (run_id TEXT, position INTEGER, payload BLOB);"
            )
            before = conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
        with pytest.raises(SchemaVersionError, match="schema version 99"):
            SQLiteStore(sqlite_path)
        with raw(sqlite_path) as conn:
            after = conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
        assert after == before

    def test_garbage_file_refused(self, sqlite_path: Path) -> None:
        """A file that is not a SQLite database raises StoreError and is left as it was."""
        garbage = b"this is not a database, just some text\n" * 200
        sqlite_path.write_bytes(garbage)
        with pytest.raises(StoreError, match="not a usable replayable database") as info:
            SQLiteStore(sqlite_path)
        assert str(sqlite_path) in str(info.value)
        assert not isinstance(info.value, SchemaVersionError)
        assert sqlite_path.read_bytes() == garbage

    def test_primary_key_is_run_id_seq(self, sqlite_store: SQLiteStore, sqlite_path: Path) -> None:
        """events is keyed by (run_id, seq), which serves per-run reads in seq order."""
        with raw(sqlite_path) as conn:
            cols = conn.execute("PRAGMA table_info(events)").fetchall()
            pk = sorted((c[5], c[1]) for c in cols if c[5])
            assert pk == [(1, "run_id"), (2, "seq")]
            plan = conn.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM events WHERE run_id = ? ORDER BY seq", ("x",)
            ).fetchall()
        text = " ".join(str(row[-1]) for row in plan)
        # A rowid table serves the key through its automatic unique index.
        assert "PRIMARY KEY" in text or "sqlite_autoindex_events_1 (run_id=?)" in text
        assert "TEMP B-TREE" not in text

    def test_events_range_is_read_by_key(self, sqlite_path: Path) -> None:
        """A range is a search of the (run_id, seq) key, not a read of the run and a drop."""
        store, rid, _ = _filled(sqlite_path)
        store.close()
        with raw(sqlite_path) as conn:
            plan = conn.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM events "
                "WHERE run_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                (rid, 2, 3),
            ).fetchall()
        text = " ".join(str(row[-1]) for row in plan)
        assert "run_id=? AND seq>? AND seq<?" in text, text
        assert "TEMP B-TREE" not in text

    def test_events_range_reports_a_bad_row_and_reads_the_rest(self, sqlite_path: Path) -> None:
        """A row altered behind the store's back is read with a problem naming its column;
        the others of the range are read as stored."""
        store, rid, events = _filled(sqlite_path)
        store.close()
        with raw(sqlite_path) as conn:
            for (name,) in list(
                conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
            ):
                conn.execute(f"DROP TRIGGER {name}")
            conn.execute(
                "UPDATE events SET metadata = '{oops' WHERE run_id = ? AND seq = 2", (rid,)
            )
            conn.commit()
        again = SQLiteStore(sqlite_path)
        try:
            got = again.events_range(rid, 2, 3)
            assert [e.seq for e in got] == [2, 3]
            assert "metadata" in str(got[0].problems)
            assert got[1] == events[2]
        finally:
            again.close()

    def test_metadata_tags_indexed(self, sqlite_store: SQLiteStore, sqlite_path: Path) -> None:
        """Metadata tags live in run_tags, keyed so a key=value lookup is an index search."""
        rid = new_id(1)
        sqlite_store.append(
            [make_start(rid, metadata={"team": "a", "urgent": True, "n": 2, "nested": {"x": 1}})]
        )
        with raw(sqlite_path) as conn:
            rows = conn.execute("SELECT key, value FROM run_tags WHERE run_id = ?", (rid,))
            assert sorted(rows.fetchall()) == [("n", "2"), ("team", "a"), ("urgent", "true")]
            plan = conn.execute(
                "EXPLAIN QUERY PLAN SELECT run_id FROM run_tags WHERE key = ? AND value = ?",
                ("team", "a"),
            ).fetchall()
        text = " ".join(str(row[-1]) for row in plan)
        assert "SEARCH run_tags USING PRIMARY KEY" in text


class TestOpenStore:
    """open_store: backends chosen by URL."""

    def test_sqlite_relative_path(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """sqlite:///name.db is a path relative to the current directory when opened,
        and stays that file after the directory changes."""
        monkeypatch.chdir(tmp_path)
        store = open_store("sqlite:///relative.db")
        try:
            assert isinstance(store, SQLiteStore)
            assert store.path == tmp_path / "relative.db"
            assert store.url == f"sqlite:///{tmp_path / 'relative.db'}"
            assert (tmp_path / "relative.db").is_file()
            (tmp_path / "other").mkdir()
            monkeypatch.chdir(tmp_path / "other")
            start = make_start(new_id(7))
            # A reading thread opens its own connection: it must open the same file.
            reader = ThreadPoolExecutor(1)
            store.append([start])
            assert reader.submit(lambda: store.get_run(start.run_id).run_id).result() == (
                start.run_id
            )
            reader.shutdown()
            assert not (tmp_path / "other" / "relative.db").exists()
        finally:
            store.close()

    def test_sqlite_absolute_path(self, tmp_path: Path) -> None:
        """sqlite:////abs/path.db is an absolute path; missing directories are created."""
        target = tmp_path / "deep" / "dir" / "abs.db"
        store = open_store(f"sqlite:///{target}")
        try:
            assert isinstance(store, SQLiteStore)
            assert store.path == target
            assert target.is_file()
            assert store.url == f"sqlite:///{target}"
        finally:
            store.close()

    def test_memory_unnamed_is_private(self) -> None:
        """memory:// gives a new, empty store each time."""
        a, b = open_store("memory://"), open_store("memory://")
        assert isinstance(a, MemoryStore)
        assert a is not b
        a.append([make_start(new_id(1))])
        assert list(b.iter_run_ids()) == []

    def test_memory_named_is_shared(self) -> None:
        """memory://name gives the same store to every caller in the process."""
        name = f"shared-{uuid.uuid4().hex}"
        a = open_store(f"memory://{name}")
        b = open_store(f"memory://{name}")
        assert a is b
        a.append([make_start(new_id(1))])
        assert list(b.iter_run_ids()) == [new_id(1)]
        assert open_store(f"memory://{name}-other") is not a

    def test_store_instance_passes_through(self, memory_store: MemoryStore) -> None:
        """An EventStore given to open_store is returned as is."""
        assert open_store(memory_store) is memory_store

    @pytest.mark.parametrize(
        "url", ["postgres://db/runs", "redis://localhost", "runs.db", "/tmp/runs.db", "sqlite://"]
    )
    def test_bad_url_names_it(self, url: str) -> None:
        """An unknown scheme, a missing scheme or an empty path raises ConfigurationError."""
        with pytest.raises(ConfigurationError) as info:
            open_store(url)
        assert repr(url) in str(info.value)
        assert isinstance(info.value, ValueError)

    def test_environment_default_memory(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With no URL, $REPLAYABLE_STORE chooses the store."""
        name = f"env-{uuid.uuid4().hex}"
        monkeypatch.setenv("REPLAYABLE_STORE", f"memory://{name}")
        assert open_store() is MemoryStore.named(name)
        assert open_store(None) is open_store()

    def test_environment_default_sqlite(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """$REPLAYABLE_STORE may name a SQLite file."""
        target = tmp_path / "env.db"
        monkeypatch.setenv("REPLAYABLE_STORE", f"sqlite:///{target}")
        store = open_store()
        try:
            assert isinstance(store, SQLiteStore)
            assert store.path == target
        finally:
            store.close()

    def test_default_without_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With neither URL nor $REPLAYABLE_STORE, ./.replayable/runs.db is used."""
        monkeypatch.delenv("REPLAYABLE_STORE", raising=False)
        monkeypatch.chdir(tmp_path)
        store = open_store()
        try:
            assert isinstance(store, SQLiteStore)
            assert (tmp_path / ".replayable" / "runs.db").is_file()
        finally:
            store.close()


def test_sqlite_append_is_not_starved_by_a_busy_agent_thread(tmp_path: Path) -> None:
    """A batch commits promptly while another thread keeps the interpreter busy.

    Stepping one row per GIL hand-off made a 2,048-event batch take 15 s next to a
    CPU-bound thread; multi-row statements take the lock back a few times a batch.
    """
    import threading
    import time

    store = SQLiteStore(tmp_path / "busy.db")
    rid = new_id(1)
    events = make_events(rid, 2048)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    hog = threading.Thread(target=spin)
    hog.start()
    try:
        started = time.perf_counter()
        store.append([make_start(rid)], events, [])
        took = time.perf_counter() - started
    finally:
        stop.set()
        hog.join()
        store.close()
    assert took < 3.0, f"append of 2048 events took {took:.1f}s beside a busy thread"


def test_v2_database_upgrades_to_the_blob_tier(tmp_path: Path) -> None:
    """A version 2 database (payloads inline, no tier tables) upgrades in place: its runs
    read and verify as before, and new large payloads go to the tier."""
    path = tmp_path / "v2.db"
    store = SQLiteStore(path)
    store.close()
    with raw(path) as conn:
        conn.executescript(
            "DROP TABLE payload_blobs; DROP TABLE payload_nodes; DROP TABLE payload_dicts;"
            "DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete;"
            "ALTER TABLE events DROP COLUMN request_ref;"
            "ALTER TABLE events DROP COLUMN response_ref;"
            "ALTER TABLE events DROP COLUMN site; DROP TABLE call_sites;"
            "UPDATE meta SET value = '2' WHERE key = 'schema_version';"
        )
        old = new_id(90)
        big = canonical({"doc": "z" * 3000})
        events = payload_events(old, [(big, big)])
        start = make_start(old)
        conn.execute(
            "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                start.run_id,
                start.workflow,
                start.entrypoint,
                None,
                None,
                start.root_run_id,
                None,
                start.input,
                "{}",
                canonical(start.code),
                start.env_hash,
                canonical(start.lineage),
                start.started_at,
                1,
                None,
            ),
        )
        from replayable.store.rows import event_to_row

        conn.execute(f"INSERT INTO events VALUES ({','.join('?' * 20)})", event_to_row(events[0]))
        conn.commit()
    reopened = SQLiteStore(path)
    try:
        assert reopened.events(old) == events
        assert reopened.tier_stats().blobs == 0
        fresh = new_id(91)
        more = payload_events(fresh, [(big, None)])
        reopened.append([make_start(fresh)], more)
        assert reopened.events(fresh) == more
        assert reopened.tier_stats().blobs == 1
    finally:
        reopened.close()
    with raw(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(_DB_VERSION),
        )
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM payload_blobs")
