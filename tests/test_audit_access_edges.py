"""``replay``, ``step``, ``diff`` and ``query`` write the access log, on SQLite and PostgreSQL.

Each command reads recorded payloads (a tape served to agent code, two runs
compared, payloads matched by a query), so each is logged with who, which run
and steps, through what and why, before anything is shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import replayable
from replayable.cli import app
from replayable.events.audit import AccessEntry
from replayable.store import EventStore, open_store
from tests import agents_for_cli as agents
from tests.pg_helpers import PgServer, pg

__all__ = ["pg"]

ENV = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}
ENGINEER = ("--as", "eve", "--role", "engineer", "--purpose", "INC-204")


@pytest.fixture(autouse=True)
def _original_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "VARIANT", "original")
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    server: PgServer = request.getfixturevalue("pg")
    return server.url(server.new_schema("edges"))


@pytest.fixture
def store(url: str) -> Iterator[EventStore]:
    s = open_store(url)
    yield s
    s.close()


def record(store: EventStore, fn: Any, *args: Any) -> str:
    with replayable.recording(store) as rec:
        fn(*args)
    return rec.run_ids[0]


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(app, ["--store", url, *args], env=ENV)


def logged(store: EventStore, run_id: str) -> list[AccessEntry]:
    return store.access_entries(run_id=run_id)


def assert_entry(store: EventStore, entry: AccessEntry, what: str, steps: list[int]) -> None:
    """Who (the user typed, the login the store sees), through what, why, what and where."""
    assert (entry.user, entry.role, entry.login) == ("eve", "engineer", store.login_name())
    assert (entry.channel, entry.purpose) == ("cli", "INC-204")
    assert what in entry.what
    assert list(entry.steps) == steps


def test_replay_is_logged_with_its_tape(store: EventStore, url: str) -> None:
    """``replay`` logs the run and every step of its tape, as the acting user, with the
    purpose, before the agent code is served anything."""
    rid = record(store, agents.research, "alpha")
    seqs = [e.seq for e in store.events(rid)]
    assert logged(store, rid) == []
    result = cli(url, "replay", rid[:13], *ENGINEER)
    assert result.exit_code == 0, result.output
    assert "identical" in result.stdout
    (entry,) = logged(store, rid)
    assert_entry(store, entry, "replay", seqs)
    assert {"request", "response"} <= set(entry.what)


def test_replay_logs_the_child_runs_served_from_their_tapes(store: EventStore, url: str) -> None:
    """A parent's replay serves its children from their tapes: each child's read is logged."""
    rid = record(store, agents.fanout, ["a", "b"])
    kids = [c.run_id for c in store.children(rid)]
    assert len(kids) == 2
    result = cli(url, "replay", rid, *ENGINEER)
    assert result.exit_code == 0, result.output
    for kid in kids:
        (entry,) = logged(store, kid)
        assert_entry(store, entry, "replay", [e.seq for e in store.events(kid)])


def test_auditor_may_not_replay_and_nothing_runs(store: EventStore, url: str) -> None:
    """An auditor reads events without triggering replays: ``replay`` is refused in one
    line, before any agent code runs."""
    rid = record(store, agents.research, "alpha")
    result = cli(url, "replay", rid, "--as", "olu", "--role", "auditor")
    assert result.exit_code == 2
    assert "olu (role auditor) may not replay runs" in result.stderr
    assert logged(store, rid) == []


def test_step_is_logged(store: EventStore, url: str) -> None:
    """Stepping through a replay reads the tape: logged like a replay."""
    rid = record(store, agents.research, "alpha")
    result = CliRunner().invoke(
        app, ["--store", url, "step", rid, *ENGINEER], input="continue\nquit\n", env=ENV
    )
    assert result.exit_code == 0, result.output
    (entry,) = logged(store, rid)
    assert_entry(store, entry, "replay", [e.seq for e in store.events(rid)])


def test_diff_logs_both_runs(store: EventStore, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``diff`` logs a read of each run's aligned steps."""
    a = record(store, agents.research, "alpha")
    monkeypatch.setattr(agents, "VARIANT", "revised")
    b = record(store, agents.research, "alpha")
    result = cli(url, "diff", a, b[:13], *ENGINEER)
    assert result.exit_code == 1, result.output  # they differ
    for rid in (a, b):
        (entry,) = logged(store, rid)
        assert_entry(store, entry, "diff", [e.seq for e in store.events(rid)])


def test_query_logs_each_run_found_with_its_matching_steps(store: EventStore, url: str) -> None:
    """``query`` logs one ``search`` entry per run it lists, naming the matching steps;
    a run it does not list is not logged."""
    hit = record(store, agents.research, "alpha")
    miss = record(store, agents.recovering, "acme")
    result = cli(url, "query", "--name", "send_email", "--json", *ENGINEER)
    assert result.exit_code == 0, result.output
    assert hit in result.stdout
    assert miss not in result.stdout
    matching = [e.seq for e in store.events(hit) if e.name == "send_email"]
    (entry,) = logged(store, hit)
    assert_entry(store, entry, "search", matching)
    assert entry.what == ("search",)
    assert logged(store, miss) == []


def test_the_access_log_shows_these_reads_and_its_own(store: EventStore, url: str) -> None:
    """An auditor reading the access log sees the replay, and the read of the log itself."""
    rid = record(store, agents.research, "alpha")
    assert cli(url, "replay", rid, *ENGINEER).exit_code == 0
    result = cli(url, "access-log", "--run", rid, "--as", "olu", "--role", "auditor", "--json")
    assert result.exit_code == 0, result.output
    kinds = [e.what for e in logged(store, rid)]
    assert kinds == [("request", "response", "replay"), ("access_log",)]
    assert '"replay"' in result.stdout
    assert '"access_log"' in result.stdout
