"""The audit half of the store contract, written once and run against every backend.

Annotations (chained, corrected, retracted), the access log, anomaly flags and
scan marks, through the public ``replayable.audit`` API; then SQLite-only
tampering and append-only checks.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from replayable.audit import Actor, AuditReader, verify_annotations
from replayable.audit.annotations import AnnotationSet, annotate_run, new_id
from replayable.errors import (
    AccessDeniedError,
    AppendOnlyError,
    ConfigurationError,
    UnreadableRecordError,
)
from replayable.events.audit import Annotation, AnomalyFlag, annotation_hash
from replayable.events.chain import ChainKey
from replayable.store import EventStore, MemoryStore
from replayable.store.audit_base import stats_from
from replayable.store.integrity import Integrity
from replayable.store.keys import StaticKeys
from replayable.store.sqlite import SQLiteStore
from tests.test_store_contract import make_end, make_events, make_start
from tests.test_store_contract import new_id as run_id

ANALYST = Actor(user="dana", role="analyst", login="dana")
AUDITOR = Actor(user="olu", role="auditor", login="olu")


def recorded(store: EventStore, n: int = 1, *, events: int = 4, workflow: str = "triage") -> str:
    """A finished run with ``events`` events; returns its id."""
    rid = run_id(n)
    evs = make_events(rid, events)
    start = make_start(rid, workflow=workflow, started_at=1000.0 + n)
    store.append([start], evs, [make_end(rid, evs, start=start, ended_at=1010.0 + n)])
    return rid


def sample_flag(rid: str, rule: str = "empty_data_decision") -> AnomalyFlag:
    """A flag on run ``rid`` as a scan would store it."""
    return AnomalyFlag(
        flag_id=new_id(),
        rule=rule,
        run_id=rid,
        workflow="triage",
        steps=(3,),
        evidence={"tool": "lookup", "response": []},
        score=1.0,
        created_at=5.0,
        tenant=None,
    )


class AuditContract:
    """Audit behaviour every backend shares. Subclasses implement ``create_store``."""

    tmp_path: Path

    def create_store(self) -> EventStore:
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _paths(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        store = self.create_store()
        yield store
        store.close()

    # -- annotations ------------------------------------------------------------

    def test_annotation_reads_back_and_chain_verifies(self, store: EventStore) -> None:
        """An annotation on a step is stored field for field, and its chain verifies."""
        rid = recorded(store)
        made = annotate_run(
            store,
            ANALYST,
            rid[:13],
            step=3,
            verdict="violation",
            note="Rules lookup returned nothing; rated low anyway.",
            policy="CR-7",
        )
        assert made.run_id == rid
        assert (made.seq, made.author, made.role, made.verdict) == (
            3,
            "dana",
            "analyst",
            "violation",
        )
        stored = store.annotations(rid)
        assert [msgspec.structs.asdict(a) for a in stored] == [msgspec.structs.asdict(made)]
        report = verify_annotations(store, rid)
        assert report.ok, report.message
        assert report.checked == 1

    def test_annotation_head_is_the_last_link(self, store: EventStore) -> None:
        """``annotation_head`` is the newest annotation of the run's own chain (what the
        next one links to), ``None`` for a run without annotations or an unknown id."""
        rid, other = recorded(store, 1), recorded(store, 2)
        assert store.annotation_head(rid) is None
        made = [annotate_run(store, ANALYST, rid, verdict="ok", note=f"n{i}") for i in range(3)]
        annotate_run(store, ANALYST, other, verdict="concern", note="elsewhere")
        assert store.annotation_head(rid) == made[-1]
        assert made[-1].chain_index == 2
        assert store.annotation_head("no-such-run") is None

    def test_corrections_and_retractions_keep_history(self, store: EventStore) -> None:
        """A correction replaces its original in the current state; a retraction removes
        it; the history keeps every version in order."""
        rid = recorded(store)
        first = annotate_run(store, ANALYST, rid, step=2, verdict="concern", note="odd")
        fixed = annotate_run(
            store, ANALYST, rid, verdict="ok", note="checked: fine", amends=first.annotation_id[:14]
        )
        other = annotate_run(store, ANALYST, rid, verdict="needs-review", note="whole run")
        gone = annotate_run(
            store,
            ANALYST,
            rid,
            verdict=None,
            note="wrong run",
            amends=other.annotation_id,
            retract=True,
        )
        found = AnnotationSet(rid, tuple(store.annotations(rid)))
        assert [a.annotation_id for a in found.history] == [
            first.annotation_id,
            fixed.annotation_id,
            other.annotation_id,
            gone.annotation_id,
        ]
        assert found.current == [fixed]
        assert fixed.seq == 2  # a correction stays on the step it corrects
        assert found.versions(first.annotation_id) == [first, fixed]
        assert found.on_step(2) == [fixed]
        assert verify_annotations(store, rid).ok
        with pytest.raises(ConfigurationError, match="already amended"):
            annotate_run(store, ANALYST, rid, verdict="ok", note="x", amends=first.annotation_id)

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"verdict": "fine", "note": "x"}, "verdict 'fine' is not one of"),
            ({"verdict": "ok", "note": "  "}, "needs a note"),
            ({"verdict": "ok", "note": "x", "step": 99}, "has no step 99"),
            ({"verdict": "ok", "note": "x", "amends": "nope"}, "no annotation 'nope'"),
            ({"verdict": None, "note": "x", "retract": True}, "must name the annotation"),
            ({"verdict": "ok", "note": "x", "closes": ["f00"]}, "no anomaly flag 'f00'"),
        ],
    )
    def test_bad_annotation_refused_and_nothing_stored(
        self, store: EventStore, kwargs: dict[str, object], message: str
    ) -> None:
        """Bad input raises ConfigurationError naming what was wrong; nothing is stored."""
        rid = recorded(store)
        with pytest.raises(ConfigurationError, match=message):
            annotate_run(store, ANALYST, rid, **kwargs)  # type: ignore[arg-type]
        assert store.annotations(rid) == []

    @pytest.mark.parametrize("role", ["auditor", "engineer"])
    def test_roles_that_may_not_annotate_are_refused(self, store: EventStore, role: str) -> None:
        """Auditors and engineers may not annotate: AccessDeniedError, nothing stored."""
        rid = recorded(store)
        with pytest.raises(AccessDeniedError, match=f"role {role}"):
            annotate_run(store, Actor("x", role, "x"), rid, verdict="ok", note="n")
        assert store.annotations(rid) == []

    def test_taken_chain_position_refused_by_store(self, store: EventStore) -> None:
        """Two annotations claiming one chain position: the second batch is refused whole."""
        rid = recorded(store)
        made = annotate_run(store, ANALYST, rid, verdict="ok", note="a")
        clash = msgspec.structs.replace(made, annotation_id=new_id())
        with pytest.raises(AppendOnlyError):
            store.append_annotations([clash])
        assert store.annotations(rid) == [made]

    def test_concurrent_annotators_all_land_on_one_chain(self, store: EventStore) -> None:
        """Annotators racing on one run each get a position; the chain stays intact."""
        rid = recorded(store)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                annotate_run(store, ANALYST, rid, verdict="ok", note=f"note {i}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        chain = store.annotations(rid)
        assert sorted(a.note for a in chain) == [f"note {i}" for i in range(6)]
        assert [a.chain_index for a in chain] == list(range(6))
        assert verify_annotations(store, rid).ok

    def test_annotations_of_runs_are_their_own(self, store: EventStore) -> None:
        """Each run has its own annotation chain, starting at position 0."""
        a, b = recorded(store, 1), recorded(store, 2)
        annotate_run(store, ANALYST, a, verdict="ok", note="a")
        made = annotate_run(store, ANALYST, b, verdict="concern", note="b")
        assert made.chain_index == 0
        assert [x.note for x in store.annotations(a)] == ["a"]
        assert store.annotations(run_id(9)) == []

    # -- access log ----------------------------------------------------------------

    def test_reads_are_logged_before_they_return(self, store: EventStore) -> None:
        """Reading events, annotations and the access log each appends an entry naming
        the reader, the channel, the purpose, the run and the steps."""
        rid = recorded(store)
        analyst = AuditReader(store, ANALYST, channel="cli", purpose="INC-204")
        events = analyst.events(rid, steps=[2, 3])
        assert [e.seq for e in events] == [2, 3]
        analyst.annotations(rid)
        auditor = AuditReader(store, Actor("olu", "auditor", "olu"), channel="report")
        log = auditor.access_log(run=rid)
        assert [(e.user, e.channel, e.what) for e in log] == [
            ("dana", "cli", ("request", "response")),
            ("dana", "cli", ("annotations",)),
            ("olu", "report", ("access_log",)),
        ]
        assert log[0].steps == (2, 3)
        assert log[0].purpose == "INC-204"
        assert log[0].run_id == rid
        assert [e.user for e in store.access_entries(who="olu")] == ["olu"]
        assert len(store.access_entries(limit=2)) == 2
        assert store.access_entries(since=log[-1].at + 1) == []

    def test_only_auditors_and_admins_read_the_access_log(self, store: EventStore) -> None:
        """An analyst asking for the access log is refused, and nothing is logged."""
        with pytest.raises(AccessDeniedError, match="access log"):
            AuditReader(store, ANALYST).access_log()
        assert store.access_entries() == []

    # -- anomaly flags -------------------------------------------------------------

    def test_flags_and_scan_marks(self, store: EventStore) -> None:
        """Flags are stored with their scan marks; scanned runs are not offered again, and
        marking a run twice is refused whole."""
        a, b, c = recorded(store, 1), recorded(store, 2), recorded(store, 3)
        incomplete = run_id(4)
        store.append([make_start(incomplete, started_at=999.0)], make_events(incomplete, 1))
        assert [r.run_id for r in store.unscanned_runs()] == [a, b, c]
        flag = sample_flag(a)
        store.append_flags([flag], [a, b])
        assert store.flags() == [flag]
        assert store.flags(rule="other") == []
        assert store.flags(run_id=b) == []
        assert [r.run_id for r in store.unscanned_runs()] == [c]
        assert [r.run_id for r in store.unscanned_runs(after=(1000.0 + 3, c))] == []
        with pytest.raises(AppendOnlyError):
            store.append_flags([msgspec.structs.replace(flag, flag_id=new_id())], [c, a])
        assert store.flags() == [flag]
        assert [r.run_id for r in store.unscanned_runs(workflow="triage")] == [c]
        assert store.unscanned_runs(workflow="other") == []

    def test_workflow_stats_match_a_python_computation(self, store: EventStore) -> None:
        """Per-workflow LLM-call mean, deviation and median duration, as computed in Python."""
        rows = []
        for n, count in enumerate((3, 6, 9, 12, 15), start=1):
            rid = run_id(n)
            evs = make_events(rid, count)  # every third event is an llm call
            start = make_start(rid, workflow="w", started_at=100.0 * n)
            end = make_end(rid, evs, start=start, ended_at=100.0 * n + n * 1.5)
            store.append([start], evs, [end])
            rows.append((sum(1 for e in evs if e.kind == "llm"), n * 1.5))
        got = store.workflow_stats(["w", "none"])
        want = stats_from("w", rows)
        assert got["w"].runs == 5
        assert got["w"].llm_mean == pytest.approx(want.llm_mean)
        assert got["w"].llm_std == pytest.approx(want.llm_std)
        assert got["w"].median_duration == pytest.approx(want.median_duration)
        assert got["none"].runs == 0
        assert got["none"].median_duration is None

    def test_events_of_reads_several_runs(self, store: EventStore) -> None:
        """``events_of`` returns each run's events in seq order, empty for unknown runs."""
        a, b = recorded(store, 1, events=3), recorded(store, 2, events=5)
        got = store.events_of([a, b, run_id(9)])
        assert got[a] == store.events(a)
        assert [e.seq for e in got[b]] == [1, 2, 3, 4, 5]
        assert got[run_id(9)] == []


class TestMemoryAudit(AuditContract):
    def create_store(self) -> EventStore:
        return MemoryStore()


class TestSQLiteAudit(AuditContract):
    def create_store(self) -> EventStore:
        return SQLiteStore(self.tmp_path / "audit.db")


# -- SQLite only --------------------------------------------------------------------


@pytest.mark.parametrize("table", ["annotations", "access_log", "anomaly_flags", "anomaly_scanned"])
def test_sqlite_audit_tables_refuse_update_and_delete(tmp_path: Path, table: str) -> None:
    """Every audit table refuses UPDATE and DELETE by trigger."""
    store = SQLiteStore(tmp_path / "a.db")
    rid = recorded(store)
    annotate_run(store, ANALYST, rid, verdict="ok", note="n")
    AuditReader(store, ANALYST).events(rid)
    store.append_flags([sample_flag(rid)], [rid])
    store.close()
    conn = sqlite3.connect(tmp_path / "a.db")
    try:
        for statement in (f"UPDATE {table} SET run_id = 'x'", f"DELETE FROM {table}"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                conn.execute(statement)
    finally:
        conn.close()


def _three_annotations_then(
    tmp_path: Path, change: str
) -> tuple[SQLiteStore, str, list[Annotation]]:
    """A run with three annotations, ``change`` made to them behind the store's back;
    the store opened again on it."""
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    rid = recorded(store)
    made = [annotate_run(store, ANALYST, rid, verdict="violation", note=f"n{i}") for i in range(3)]
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER annotations_no_update")
    conn.execute("DROP TRIGGER annotations_no_delete")
    conn.execute(change)
    conn.commit()
    conn.close()
    return SQLiteStore(path), rid, made


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("UPDATE annotations SET note = 'all fine' WHERE chain_index = 1", "altered"),
        ("UPDATE annotations SET verdict = 'ok' WHERE chain_index = 0", "altered"),
        ("DELETE FROM annotations WHERE chain_index = 1", "removed"),
        ("UPDATE annotations SET chain_index = 5 WHERE chain_index = 2", "removed"),
        ("UPDATE annotations SET amends = 'x' WHERE chain_index = 2", "altered"),
    ],
)
def test_verify_names_a_tampered_annotation(tmp_path: Path, change: str, reason: str) -> None:
    """An annotation edited or removed behind the store's back is named by verify."""
    store, rid, made = _three_annotations_then(tmp_path, change)
    try:
        report = verify_annotations(store, rid)
        assert not report.ok
        assert reason in report.reason
        assert report.first_bad in {m.annotation_id for m in made}
    finally:
        store.close()


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [("note", "CAST(X'6eff' AS TEXT)", "not valid UTF-8"), ("closes", "'[oops'", "not valid JSON")],
)
def test_an_unreadable_annotation_is_named_not_a_crash(
    tmp_path: Path, column: str, value: str, what: str
) -> None:
    """A stored annotation whose column holds what it cannot (bytes that are not UTF-8,
    JSON that does not parse) fails verify naming the annotation and the column; every
    reader of the run's annotations says the same instead of a TypeError or a decoder's
    error."""
    store, rid, made = _three_annotations_then(
        tmp_path, f"UPDATE annotations SET {column} = {value} WHERE chain_index = 1"
    )
    try:
        report = verify_annotations(store, rid)
        assert not report.ok
        assert made[1].annotation_id in report.reason
        assert f"column {column} is {what}" in report.reason
        with pytest.raises(UnreadableRecordError, match=f"column {column} is {what}"):
            store.annotations(rid)
    finally:
        store.close()


# -- keyed annotation chains ------------------------------------------------------------

KEY_A = ChainKey("ka", b"a" * 32)
KEY_B = ChainKey("kb", b"b" * 32)


def test_keyed_annotations_verify_only_with_their_key(tmp_path: Path) -> None:
    """With a chain key configured, annotations are HMAC-linked under it: they verify
    with the key, name it, and cannot be verified (or forged) without it."""
    store = SQLiteStore(tmp_path / "k.db")
    try:
        rid = recorded(store)
        keyed = Integrity(StaticKeys([KEY_A]))
        made = annotate_run(store, ANALYST, rid, verdict="ok", note="n", integrity=keyed)
        assert made.key_id == "ka"
        assert store.annotations(rid)[0].key_id == "ka"
        assert verify_annotations(store, rid, integrity=keyed).ok
        missing = verify_annotations(store, rid, integrity=Integrity(StaticKeys([KEY_B])))
        assert not missing.ok
        assert "key 'ka', which is not configured" in missing.reason
        # An unkeyed rewrite of the same content cannot pass as keyed, and an unkeyed
        # annotation is refused while a key is configured.
        forged = msgspec.structs.replace(made, key_id=None, annotation_id=new_id())
        forged = msgspec.structs.replace(
            forged, prev_hash=made.hash, chain_index=1, hash=annotation_hash(forged)
        )
        forged = msgspec.structs.replace(forged, hash=annotation_hash(forged))
        store.append_annotations([forged])
        report = verify_annotations(store, rid, integrity=keyed)
        assert not report.ok
        assert report.first_bad == forged.annotation_id
        assert "unkeyed while a chain key is configured" in report.reason
        assert verify_annotations(store, rid, integrity=keyed, allow_unkeyed=True).ok
    finally:
        store.close()


def test_keyed_annotation_altered_with_a_recomputed_unkeyed_hash_is_caught(
    tmp_path: Path,
) -> None:
    """Editing a keyed annotation and recomputing its hash the unkeyed way fails verify."""
    path = tmp_path / "k.db"
    store = SQLiteStore(path)
    keyed = Integrity(StaticKeys([KEY_A]))
    rid = recorded(store)
    made = annotate_run(store, ANALYST, rid, verdict="violation", note="bad", integrity=keyed)
    store.close()
    edited = msgspec.structs.replace(made, verdict="ok", note="fine")
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER annotations_no_update")
    conn.execute(
        "UPDATE annotations SET verdict = 'ok', note = 'fine', hash = ?",
        (annotation_hash(edited),),
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        report = verify_annotations(store, rid, integrity=keyed)
        assert not report.ok
        assert "altered" in report.reason
    finally:
        store.close()


def test_an_earlier_sqlite_audit_layout_gains_the_key_column(tmp_path: Path) -> None:
    """A database whose annotations table predates ``key_id`` is upgraded on open."""
    path = tmp_path / "old.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE annotations")
    conn.execute(
        "CREATE TABLE annotations (annotation_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, "
        "seq INTEGER, author TEXT NOT NULL, role TEXT NOT NULL, login TEXT NOT NULL, "
        "created_at REAL NOT NULL, verdict TEXT, policy TEXT, note TEXT NOT NULL, amends TEXT, "
        "retract INTEGER NOT NULL, closes TEXT NOT NULL, tenant TEXT, chain_index INTEGER "
        "NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL, schema_version INTEGER NOT "
        "NULL, UNIQUE (run_id, chain_index))"
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        rid = recorded(store)
        annotate_run(store, ANALYST, rid, verdict="ok", note="n")
        assert verify_annotations(store, rid).ok
    finally:
        store.close()


def test_sqlite_workflow_stats_count_calls_through_the_run_key(tmp_path: Path) -> None:
    """The LLM calls of a workflow's runs are counted through each run's key, never by
    reading the store's every LLM event for each run (the kind index)."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        for n in range(1, 6):
            recorded(store, n, events=6, workflow="w")
        issued: list[str] = []
        reader = store._reader()
        reader.set_trace_callback(issued.append)
        try:
            assert store.workflow_stats(["w"])["w"].runs == 5
        finally:
            reader.set_trace_callback(None)
        (statement,) = [s for s in issued if "run_ends" in s]
        plan = " ".join(str(row[3]) for row in reader.execute("EXPLAIN QUERY PLAN " + statement))
        assert "events_kind_name" not in plan, plan
        assert "SEARCH v USING INDEX sqlite_autoindex_events_1 (run_id=?)" in plan, plan
    finally:
        store.close()
