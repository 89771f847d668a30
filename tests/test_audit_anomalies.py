"""Anomaly rules 1-7, the incremental scan, thresholds per workflow, custom rules, the queue."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

import replayable.audit
from replayable.audit import Actor, AnomalyConfig, Finding, Scanner, anomaly_queue
from replayable.audit.annotations import annotate_run
from replayable.audit.rules import find_rule, registry
from replayable.cli import app
from replayable.errors import ConfigurationError
from replayable.events.canonical import run_seal
from replayable.events.model import Event, RunEnd
from replayable.store import EventStore, MemoryStore
from replayable.store.audit_base import RunSummary, summarize
from replayable.store.postgres import PostgresStore
from replayable.store.sqlite import SQLiteStore
from tests.audit_runs import Call, llm, record, tool
from tests.pg_helpers import PgServer, pg

__all__ = ["pg"]

ANALYST = Actor("dana", "analyst", "dana")


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """The same rules on every backend (PostgreSQL: a fresh schema on the test server)."""
    s: EventStore
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SQLiteStore(tmp_path / "a.db")
    else:
        server: PgServer = request.getfixturevalue("pg")
        s = PostgresStore(server.url(server.new_schema("anom")))
    yield s
    s.close()


def flags_of(store: EventStore, rule: str) -> dict[str, tuple[int, ...]]:
    return {f.run_id: f.steps for f in store.flags(rule=rule)}


# -- one rule at a time ------------------------------------------------------------------


def test_rule5_empty_data_then_a_decision(store: EventStore) -> None:
    """An empty tool result followed by a model decision is flagged (steps: the tool and
    the decision); data found on a retry, a side-effect tool, a failed run, and data that
    is not empty are not."""
    hit = record(
        store, [tool("read", {"id": 1}, {"t": "x"}), tool("rules", {"j": "GB-SCT"}, []), llm()]
    )
    rows = record(store, [tool("rules", {"j": "X"}, {"rows": [], "count": 0}), llm()])
    record(store, [tool("rules", {"j": "GB"}, [{"r": 1}]), llm()])
    record(store, [tool("rules", {"j": "A"}, []), tool("rules", {"j": "A*"}, [{"r": 1}]), llm()])
    record(store, [tool("file", {"r": 1}, None, side_effect=True)])
    record(store, [tool("rules", {"j": "Z"}, []), llm()], status="failed")
    record(store, [tool("rules", {"j": "Z"}, None)], output=None)
    Scanner(store, rules=["empty_data_decision"]).scan()
    assert flags_of(store, "empty_data_decision") == {hit: (2, 3), rows: (1, 2)}
    flag = store.flags(run_id=hit)[0]
    assert flag.evidence["request"] == {"j": "GB-SCT"}
    assert flag.evidence["response"] == []
    assert flag.evidence["decided_at"] == 3


def test_rule2_tool_error_without_handling(store: EventStore) -> None:
    """A raised or error-shaped tool result in a completed run is flagged unless the tool
    was retried or a fallback ran."""
    raised = record(store, [tool("pay", {"a": 1}, error="card declined"), llm()])
    shaped = record(store, [tool("lookup", {}, {"status": "error", "detail": "x"})])
    field = record(store, [tool("lookup", {}, {"error": {"code": 7}})])
    http = record(store, [Call("http", "GET api", {"url": "u"}, {"status": 503, "body": "x"})])
    record(store, [tool("pay", {}, error="x"), tool("pay", {}, {"ok": True})])
    record(store, [tool("pay", {}, error="x"), tool("pay_fallback", {}, {"ok": True})])
    record(store, [tool("pay", {}, error="x")], status="failed")
    record(store, [Call("http", "GET api", {}, {"status": 200, "body": "x"})])
    Scanner(store, rules=["2"]).scan()
    assert flags_of(store, "unhandled_tool_error") == {
        raised: (1,),
        shaped: (1,),
        field: (1,),
        http: (1,),
    }
    why = {f.run_id: f.evidence["why"] for f in store.flags()}
    assert why[raised] == "raised"
    assert why[http] == "HTTP 503"


def test_rule4_refusal_not_routed(store: EventStore) -> None:
    """A refusal in an LLM answer (text or the refusal field) is flagged unless a fallback ran."""
    text = record(store, [llm("I'm sorry, but I can’t help with that request.")])
    body = {"choices": [{"message": {"content": None, "refusal": "Not allowed."}}]}
    field = record(store, [Call("llm", "chat", {}, body)])
    record(store, [llm("I cannot help with that."), Call("span", "refusal_fallback")])
    record(store, [llm("Happy to help with that.")])
    Scanner(store, rules=["unrouted_refusal"]).scan()
    assert flags_of(store, "unrouted_refusal") == {text: (1,), field: (1,)}


def test_rule6_same_call_three_times_in_a_row(store: EventStore) -> None:
    """Three identical consecutive tool calls are flagged; two, or changed arguments, are not."""
    looped = record(store, [llm(), *[tool("search", {"q": "a"}, [1])] * 4, llm()])
    record(store, [tool("search", {"q": "a"}, [1])] * 2)
    record(store, [tool("search", {"q": str(i)}, [1]) for i in range(4)])
    Scanner(store, rules=["repeated_call"]).scan()
    assert flags_of(store, "repeated_call") == {looped: (2, 3, 4, 5)}
    assert store.flags()[0].evidence["times"] == 4


def test_rule7_guard_blocked_in_a_fork(store: EventStore) -> None:
    """A fork whose side-effect guard blocked a call is flagged with its lineage."""
    blocked = Call("tool", "file_report", {}, {"ok": 1}, side_effect=True)
    blocked.metadata = {"side_effect_blocked": True}
    fork = record(
        store, [tool("read", {}, {"a": 1}), blocked], lineage={"forked_from": "r0", "fork_step": 1}
    )
    record(store, [tool("read", {}, {"a": 1})])
    Scanner(store, rules=["guard_blocked"]).scan()
    assert flags_of(store, "guard_blocked") == {fork: (2,)}
    assert store.flags()[0].evidence["lineage"] == {"forked_from": "r0", "fork_step": 1}


def test_rule1_llm_calls_above_two_sigma(store: EventStore) -> None:
    """A run with far more LLM calls than its workflow's mean plus two standard deviations
    is flagged; the rest of the workflow, and a small workflow (under min_runs), are not."""
    for i in range(19):
        record(store, [llm(), tool("t", {"i": i}, [1]), llm()], started_at=1e9 + i)
    loop = record(store, [llm()] * 10, started_at=1e9 + 50)
    record(store, [llm()] * 10, workflow="tiny")
    result = Scanner(store, rules=["llm_loop"]).scan()
    assert result.runs == 21
    assert list(flags_of(store, "llm_loop")) == [loop]
    evidence = store.flags()[0].evidence
    assert evidence["llm_calls"] == 10
    assert evidence["workflow_mean"] == pytest.approx(2.4)
    assert evidence["runs_compared"] == 20


def test_rule3_premature_exit(store: EventStore) -> None:
    """A completed run under 10% of its workflow's median duration is flagged."""
    for i in range(12):
        record(store, [tool("t", {}, [1])], duration=10.0 + i, started_at=1e9 + i)
    quick = record(store, [tool("t", {}, [1])], duration=0.4, started_at=1e9 + 30)
    record(store, [tool("t", {}, [1])], duration=0.4, started_at=1e9 + 31, status="failed")
    Scanner(store, rules=["premature_exit"]).scan()
    assert list(flags_of(store, "premature_exit")) == [quick]


# -- scanning ------------------------------------------------------------------------


def test_scan_is_incremental_and_filters(store: EventStore) -> None:
    """A second scan takes only runs finished since; ``since`` and ``workflow`` narrow it;
    a run that ends after a scan is picked up by the next one; no run is flagged twice."""
    a = record(store, [tool("q", {}, []), llm()], started_at=1e9)
    record(store, [tool("q", {}, []), llm()], started_at=1e9 + 1, workflow="other")
    late = record(store, [tool("q", {}, []), llm()], started_at=1e9 - 100, end=False)
    first = Scanner(store).scan(workflow="review")
    assert first.runs == 1
    assert [f.run_id for f in first.flags] == [a]
    assert Scanner(store).scan(since=1e9 + 5).runs == 0
    again = Scanner(store).scan()
    assert again.runs == 1  # the other workflow's run; the unfinished one waits
    run = store.get_run(late)
    events = store.events(late)
    ended = run.started_at + 5
    seal = run_seal(events[-1].hash, run.start, "completed", '"done"', None, ended, len(events))
    store.append(
        ends=[RunEnd(run_id=late, status="completed", output='"done"', error=None,
                     ended_at=ended, event_count=len(events), last_hash=seal)]
    )  # fmt: skip
    b = record(store, [tool("q", {}, []), llm()], started_at=1e9 - 200)
    third = Scanner(store).scan()
    assert sorted(f.run_id for f in third.flags) == sorted([b, late])
    assert Scanner(store).scan().runs == 0
    assert len(store.flags(rule="empty_data_decision")) == 4


def test_thresholds_per_workflow_and_switching_off() -> None:
    """pyproject-style settings override a rule's defaults globally and per workflow."""
    config = AnomalyConfig(
        {
            "repeated_call": {"min_repeats": 5},
            "workflows": {"billing": {"repeated_call": {"min_repeats": 2}}},
        }
    )
    r = find_rule("6")
    assert config.params(r, "review")["min_repeats"] == 5
    assert config.params(r, "billing")["min_repeats"] == 2
    store = MemoryStore()
    four = [tool("s", {"q": 1}, [1])] * 4
    record(store, four)
    billed = record(store, four, workflow="billing")
    Scanner(store, rules=["repeated_call"], config=config).scan()
    assert list(flags_of(store, "repeated_call")) == [billed]
    off = AnomalyConfig({"empty_data_decision": {"enabled": False}})
    record(store, [tool("q", {}, []), llm()])
    assert Scanner(store, config=off).scan().flags == []
    with pytest.raises(ConfigurationError, match="table of thresholds"):
        AnomalyConfig({"llm_loop": 3})


def test_custom_rule_and_a_failing_rule() -> None:
    """A rule registered with ``replayable.audit.rule`` runs in the scan; a rule that raises
    is reported (warning, ``errors``) and the scan still stores the other rules' flags."""
    store = MemoryStore()

    @replayable.audit.rule("slow_tool", description="a tool took too long", max_ms=0.5)
    def slow_tool(ctx: replayable.audit.RuleContext) -> Finding | None:
        slow = [e.seq for e in ctx.events if e.duration_ns / 1e6 > ctx.params["max_ms"]]
        return Finding(steps=tuple(slow), evidence={"n": len(slow)}) if slow else None

    @replayable.audit.rule("broken")
    def broken(ctx: replayable.audit.RuleContext) -> None:
        raise KeyError("payload")

    try:
        rid = record(store, [tool("q", {}, []), llm()])
        with pytest.warns(RuntimeWarning, match="rule broken failed"):
            result = Scanner(store).scan()
        assert result.errors == [(rid, "broken", "KeyError: 'payload'")]
        assert sorted(f.rule for f in result.flags) == ["empty_data_decision", "slow_tool"]
        assert find_rule("slow_tool").description == "a tool took too long"
    finally:
        registry.pop("slow_tool")
        registry.pop("broken")
    with pytest.raises(ConfigurationError, match="no anomaly rule 'nope'"):
        find_rule("nope")


def test_queue_closes_a_flag_with_an_annotation(store: EventStore) -> None:
    """A flag is open until an annotation names it; ``--open`` leaves it out then."""
    a = record(store, [tool("q", {}, []), llm()])
    b = record(store, [tool("q", {}, []), llm()], started_at=2e9)
    Scanner(store).scan()
    queue = anomaly_queue(store, open_only=True)
    assert {i.flag.run_id for i in queue} == {a, b}
    flag = next(i.flag for i in queue if i.flag.run_id == a)
    note = annotate_run(
        store, ANALYST, a, verdict="violation", note="empty rules", closes=[flag.flag_id[:20]]
    )
    assert note.closes == (flag.flag_id,)
    assert {i.flag.run_id for i in anomaly_queue(store, open_only=True)} == {b}
    closed = [i for i in anomaly_queue(store) if not i.open]
    assert [(i.flag.flag_id, i.closed_by) for i in closed] == [(flag.flag_id, note.annotation_id)]
    assert anomaly_queue(store, rule="6") == []


def test_cli_scan_and_queue(tmp_path: Path) -> None:
    """``anomalies scan`` reports runs/s and flags per rule; ``anomalies --open --rule``
    lists the queue and the listing is written to the access log."""
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    rid = record(store, [tool("q", {"j": "GB-SCT"}, []), llm()])
    record(store, [tool("q", {"j": "GB"}, [1]), llm()])
    store.close()
    url = f"sqlite:///{path}"
    runner = CliRunner()
    env = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}
    out = runner.invoke(app, ["--store", url, "anomalies", "scan", "--since", "100000d"], env=env)
    assert out.exit_code == 0, out.output
    assert "scanned 2 run(s)" in out.stdout
    assert "runs/s" in out.stdout
    assert "empty_data_decision 1" in out.stdout
    listed = runner.invoke(
        app, ["--store", url, "anomalies", "--open", "--rule", "5", "--json"], env=env
    )
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["run_id"], r["rule"], r["closed_by"]) for r in rows] == [
        (rid, "empty_data_decision", None)
    ]
    again = runner.invoke(app, ["--store", url, "anomalies", "scan"], env=env)
    assert "scanned 0 run(s)" in again.stdout
    rules = runner.invoke(app, ["--store", url, "anomalies", "rules"], env=env)
    assert "5. empty_data_decision" in rules.stdout
    store = SQLiteStore(path)
    try:
        assert [e.what for e in store.access_entries()] == [("flags",)]
    finally:
        store.close()


def test_scan_reads_events_as_the_store_does_and_survives_a_bad_row(tmp_path: Path) -> None:
    """The scan's bulk reader gives the same events as ``store.events``; a row with a
    payload that is not JSON is reported by the rule that reads it, and the scan goes on."""
    import sqlite3

    path = tmp_path / "bad.db"
    store = SQLiteStore(path)
    good = record(store, [tool("q", {"j": 1}, []), llm()], started_at=1e9)
    bad = record(store, [tool("q", {"j": 2}, []), llm()], started_at=1e9 + 1)
    assert store.events_of([good])[good] == store.events(good)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute(
        """UPDATE events SET response = '{"rows": [' WHERE run_id = ? AND seq = 1""", (bad,)
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        with pytest.warns(RuntimeWarning, match=f"failed on run {bad}"):
            result = Scanner(store, rules=["empty_data_decision"]).scan()
        assert result.runs == 2
        assert [f.run_id for f in result.flags] == [good]
        assert [(r, name) for r, name, _ in result.errors] == [(bad, "empty_data_decision")]
    finally:
        store.close()


def test_follow_keeps_scanning_new_runs() -> None:
    """``follow`` scans again on each interval and picks up runs finished in between."""
    store = MemoryStore()
    record(store, [tool("q", {}, []), llm()], started_at=1e9)
    seen: list[int] = []

    def on_result(result: replayable.audit.ScanResult) -> None:
        seen.append(result.runs)
        if len(seen) == 1:
            record(store, [tool("q", {}, []), llm()], started_at=1e9 + 1)

    Scanner(store).follow(interval=0.05, on_result=on_result, stop=lambda: len(seen) >= 3)
    assert seen == [1, 1, 0]
    assert len(store.flags(rule="empty_data_decision")) == 2


# -- run summaries: what the scan reads before a run's events ---------------------------


def _mixed_corpus(store: EventStore) -> list[str]:
    """Runs touching every summary count, and payloads the SQL must quote right."""
    odd = {"text": 'it\'s 100% "quoted" $t and {braces}', "status": "ok"}
    return [
        record(store, [tool("rules", {"j": "GB"}, []), llm(), llm("I'm SORRY, but I can't")]),
        record(store, [tool("rules", {"j": "X"}, {"rows": [], "count": 0}), llm()]),
        record(store, [tool("rules", {"j": "Y"}, None), tool("file", {}, [], side_effect=True)]),
        record(store, [tool("fetch", {"u": 1}, error="registry down"), llm()]),
        record(store, [Call("http", "GET /x", {"u": "x"}, {"status": 503, "body": "busy"})]),
        record(store, [tool("poll", {"n": 1}, [1])] * 3 + [tool("poll", {"n": 2}, [1])]),
        record(store, [tool("a", {}, [1]), tool("b", {}, [1]), tool("a", {}, [1])]),
        record(
            store,
            [tool("send", {}, "ok", side_effect=True, metadata={"side_effect_blocked": True})],
        ),
        record(store, [tool("read", {"id": 1}, odd), llm("fine"), llm("no refusal here")]),
        record(store, [Call("retrieval", "search", {"q": "x"}, {"hits": []})], status="failed"),
        record(store, []),
    ]


def test_run_summaries_in_the_database_match_the_python_reference(store: EventStore) -> None:
    """Every backend counts what the rules could find exactly as ``summarize`` does over
    the run's events (the SQL stores count in the database)."""
    ids = _mixed_corpus(store)
    got = store.run_summaries([*ids, "00000000-0000-7000-8000-000000000000"])
    for rid in ids:
        assert got[rid] == summarize(rid, store.events(rid)), rid
    assert got[ids[0]].refusals == 1
    assert got[ids[0]].empty_results == 1
    assert got[ids[2]].empty_results == 1  # the side-effect tool's [] is not data
    assert got[ids[3]].tool_errors == 1
    assert got[ids[4]].tool_errors == 1
    assert got[ids[5]].repeats == 2
    assert got[ids[6]].repeats == 0
    assert got[ids[7]].blocked == 1
    assert (got[ids[8]].refusals, got[ids[8]].empty_results, got[ids[8]].llm_calls) == (0, 0, 2)
    assert got["00000000-0000-7000-8000-000000000000"].llm_calls == 0


def _unscreened(scanner: Scanner) -> Scanner:
    import dataclasses

    scanner.rules = [dataclasses.replace(r, screen=None) for r in scanner.rules]
    return scanner


def _found(store: EventStore) -> list[tuple[str, str, tuple[int, ...], str]]:
    return sorted(
        (f.run_id, f.rule, f.steps, json.dumps(f.evidence, sort_keys=True)) for f in store.flags()
    )


def test_screens_never_hide_a_finding() -> None:
    """Scanning with the rules' screens finds exactly what reading every run's events
    finds, rule by rule (including rules 1 and 3 against workflow statistics)."""
    flagged: list[list[tuple[str, str, tuple[int, ...], str]]] = []
    for screened in (True, False):
        s = MemoryStore()
        ids = _mixed_corpus(s)
        for n in range(12):  # a workflow with statistics: one loop, one quick exit
            calls = [llm()] * (12 if n == 0 else 2)
            took = 0.01 if n == 1 else 10.0
            ids.append(record(s, calls, workflow="stats", started_at=1e9 + n, duration=took))
        scanner = Scanner(s) if screened else _unscreened(Scanner(s))
        scanner.scan()
        found = _found(s)
        rules = {f[1] for f in found}
        assert rules >= {"llm_loop", "premature_exit", "unrouted_refusal", "repeated_call"}
        assert rules >= {"empty_data_decision", "unhandled_tool_error", "guard_blocked"}
        # Run ids differ between the two stores; their places in the corpus do not.
        flagged.append(sorted((str(ids.index(run)), *rest) for run, *rest in found))
    assert flagged[0] == flagged[1]


def test_runs_no_rule_can_flag_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan reads the events of the runs a rule may flag, not of the clean ones; a
    rule without a screen (a user's rule) makes it read every run."""
    s = MemoryStore()
    clean = [record(s, [tool("read", {"id": n}, {"t": "x"}), llm()]) for n in range(5)]
    suspect = record(s, [tool("rules", {"j": "GB"}, []), llm()])
    read: list[str] = []
    real = MemoryStore.events_of

    def spy(self: MemoryStore, run_ids: Sequence[str]) -> dict[str, list[Event]]:
        read.extend(run_ids)
        return real(self, run_ids)

    def summaries(self: MemoryStore, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        return {r: summarize(r, evs) for r, evs in real(self, run_ids).items()}

    monkeypatch.setattr(MemoryStore, "events_of", spy)
    monkeypatch.setattr(MemoryStore, "run_summaries", summaries)
    Scanner(s).scan()
    assert read == [suspect]
    assert [f.run_id for f in s.flags()] == [suspect]
    assert len(clean) == 5

    seen: list[str] = []

    @replayable.audit.rule("sees_all")
    def sees_all(ctx: replayable.audit.RuleContext) -> None:
        seen.append(ctx.run.run_id)
        assert len(ctx.events) == 2

    try:
        t = MemoryStore()
        ids = [record(t, [tool("read", {"id": n}, {"t": "x"}), llm()]) for n in range(3)]
        Scanner(t).scan()
        assert sorted(seen) == sorted(ids)
    finally:
        del registry["sees_all"]
