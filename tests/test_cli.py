"""The ``replayable`` command line, driven in-process through Typer's runner."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import replayable
from replayable.cli import app
from replayable.cli.render import short_ids
from tests import agents_for_cli as agents


@pytest.fixture(autouse=True)
def _original_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "VARIANT", "original")
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
def url(db: Path) -> str:
    return f"sqlite:///{db}"


@pytest.fixture
def store(url: str) -> Iterator[replayable.EventStore]:
    s = replayable.open_store(url)
    yield s
    s.close()


def record(store: replayable.EventStore, fn: Any, *args: Any, **meta: Any) -> str:
    with replayable.recording(store, metadata=meta) as rec:
        try:
            fn(*args)
        except ValueError:
            pass  # a failed run is still a run
    return rec.run_ids[0]


def cli(url: str | None, *args: str, env: dict[str, str] | None = None) -> Result:
    argv = (["--store", url] if url else []) + list(args)
    return CliRunner().invoke(app, argv, env={"COLUMNS": "200", **(env or {})})


def new_incomplete_run(store: replayable.EventStore, workflow: str = "triage") -> str:
    """A run whose process died before its end record: status incomplete."""
    import time

    from tests.test_store_contract import make_start, new_id

    run_id = new_id(int(time.time() * 1000) % 100_000 + 7)
    store.append([make_start(run_id, workflow=workflow, started_at=time.time())])
    return run_id


#: Rich treats output as a terminal (without colour codes): what a person sees.
TERMINAL = {"FORCE_COLOR": "1", "NO_COLOR": "1"}


def tty(url: str | None, *args: str, columns: int = 200) -> Result:
    """The command as shown on a terminal ``columns`` wide."""
    return cli(url, *args, env={**TERMINAL, "COLUMNS": str(columns)})


def assert_one_line_error(result: Result, *needles: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in result.output


# -- runs -------------------------------------------------------------------------


def test_runs_lists_newest_first_with_workflow_status_and_event_count(store, url):
    """``runs`` shows one row per run, newest first, with status and event count."""
    first = record(store, agents.research, "alpha")
    second = record(store, agents.broken, "beta")
    result = tty(url, "runs")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "research" in line or "broken" in line]
    assert len(rows) == 2
    assert "broken" in rows[0]
    assert "failed" in rows[0]
    assert "research" in rows[1]
    assert "completed" in rows[1]
    assert rows[1].split("│")[5].strip() == "3"  # search_web, time, send_email
    full = tty(url, "runs", "--full").stdout
    assert first in full
    assert second in full


def test_piped_runs_is_a_tab_separated_table_of_whole_values(store, url):
    """Not a terminal: a header and one tab-separated line per run, ids and status whole."""
    done = record(store, agents.research, "alpha")
    cut = new_incomplete_run(store)
    result = cli(url, "runs", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == [
        "run",
        "workflow",
        "status",
        "started",
        "duration",
        "events",
        "parent",
    ]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert set(rows) == {done, cut}
    assert rows[cut][2] == "incomplete"
    assert rows[done][1:3] == ["research", "completed"]
    assert "…" not in result.stdout


def test_runs_on_a_narrow_terminal_keeps_ids_and_status_whole(store, url):
    """At 80 columns the listed prefixes and the status word are never cut."""
    cut = new_incomplete_run(store, workflow="a_rather_long_workflow_name_for_a_narrow_terminal")
    result = tty(url, "runs", columns=80)
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if cut[:8] in line]
    assert row.split("│")[0].strip() == cut[:8]
    assert row.split("│")[2].strip() == "incomplete"
    assert row.split("│")[1].strip().startswith("a_r")  # the workflow gives way


def test_runs_says_how_many_more_there_are(store, url):
    """A listing cut by --limit says 'N of M runs; --limit to see more' on stderr."""
    for topic in "abcde":
        record(store, agents.research, topic)
    result = cli(url, "runs", "--limit", "3")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "3 of 5 runs; --limit to see more"
    assert len(result.stdout.splitlines()) == 1 + 3
    every = cli(url, "runs", "--limit", "5")
    assert every.stderr == ""
    as_json = cli(url, "runs", "--json", "--limit", "2")
    assert len(json.loads(as_json.stdout)) == 2
    assert "2 of 5 runs" in as_json.stderr


def test_runs_short_ids_are_unique_prefixes(store, url):
    """Ids made in the same instant share leading characters; the listed prefixes still differ."""
    ids = [record(store, agents.research, t) for t in ("a", "b", "c")]
    shown = [line.split("│")[0].strip() for line in tty(url, "runs").stdout.splitlines()[2:]]
    assert len(shown) == 3
    for prefix in shown:
        assert len(prefix) >= 8
        assert sum(i.startswith(prefix) for i in ids) == 1
        assert cli(url, "show", prefix).exit_code == 0


def test_runs_filters_by_workflow_status_and_metadata(store, url):
    """``--workflow``, ``--status`` and ``--meta`` each narrow the listing."""
    ok = record(store, agents.research, "alpha", contract="C-1")
    failed = record(store, agents.broken, "beta", contract="C-2")

    def listed(*args: str) -> list[str]:
        result = cli(url, "runs", "--json", *args)
        assert result.exit_code == 0, result.output
        return [r["run_id"] for r in json.loads(result.stdout)]

    assert listed("--workflow", "research") == [ok]
    assert listed("--status", "failed") == [failed]
    assert listed("--meta", "contract=C-1") == [ok]
    assert listed("--meta", "contract=C-9") == []
    assert listed("--limit", "1") == [failed]


def test_runs_since_and_until_accept_ages_and_iso_dates(store, url):
    """A run made now is after ``2h`` ago, before tomorrow, and not before 1 hour ago."""
    run_id = record(store, agents.research, "alpha")
    assert [
        r["run_id"] for r in json.loads(cli(url, "runs", "--json", "--since", "2h").stdout)
    ] == [run_id]
    assert json.loads(cli(url, "runs", "--json", "--until", "1h").stdout) == []
    assert json.loads(cli(url, "runs", "--json", "--since", "2999-01-01").stdout) == []
    assert len(json.loads(cli(url, "runs", "--json", "--until", "2999-01-01T00:00").stdout)) == 1


def test_runs_json_has_stable_keys(store, url):
    """``runs --json`` gives one object per run with the documented keys."""
    run_id = record(store, agents.research, "alpha", team="legal")
    [row] = json.loads(cli(url, "runs", "--json").stdout)
    assert set(row) == {
        "run_id",
        "workflow",
        "entrypoint",
        "status",
        "started_at",
        "ended_at",
        "duration_s",
        "event_count",
        "parent_run_id",
        "tenant",
        "metadata",
        "flags",
    }
    assert row["flags"] == []  # what a reader found wrong with the run's rows
    assert row["run_id"] == run_id
    assert row["entrypoint"] == "tests.agents_for_cli:research"
    assert row["event_count"] == 3
    assert row["metadata"] == {"team": "legal"}


def test_runs_rejects_a_bad_time_in_one_line(url):
    """An unreadable ``--since`` is one error line naming the option."""
    assert_one_line_error(cli(url, "runs", "--since", "yesterday-ish"), "--since")


def test_runs_on_an_empty_store_says_so(store, url):
    """An empty store lists nothing and exits 0."""
    result = cli(url, "runs")
    assert result.exit_code == 0
    assert "no runs" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("runs",),
        ("show", "01a2"),
        ("verify", "--all"),
        ("replay", "01a2"),
        ("diff", "01a2", "01a3"),
        ("query",),
        ("report", "--out", "reports"),
        ("step", "01a2"),
    ],
)
def test_reading_a_store_that_does_not_exist_is_refused(tmp_path, args):
    """A mistyped path is an error naming it, and no empty database is left behind."""
    missing = tmp_path / "typo" / "runs.db"
    result = cli(f"sqlite:///{missing}", *args)
    assert result.exit_code == 2, result.output
    assert f"no store at {missing}; record a run first or check the path" in result.stderr
    assert not missing.parent.exists()


def test_postgres_url_without_psycopg_names_the_extra(monkeypatch):
    """Without psycopg, a postgresql:// store says which extra to install, in one line."""
    for name in [m for m in sys.modules if m.startswith(("replayable.store.postgres", "psycopg"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails
    with pytest.raises(
        replayable.ConfigurationError, match=r"pip install 'replayable\[postgres\]'"
    ):
        replayable.open_store("postgresql://agent@db.internal/agents")
    for args in (("runs",), ("db", "upgrade")):
        result = cli("postgresql://agent@db.internal/agents", *args)
        assert_one_line_error(result, "need psycopg", "pip install 'replayable[postgres]'")


@pytest.mark.parametrize("where", ["after", "before", "equals"])
def test_store_is_accepted_after_the_command_name(store, url, where):
    """``replayable runs --store X`` works like ``replayable --store X runs``."""
    run_id = record(store, agents.research, "alpha")
    argv = {
        "before": ["--store", url, "runs", "--json"],
        "after": ["runs", "--json", "--store", url],
        "equals": ["runs", f"--store={url}", "--json"],
    }[where]
    result = CliRunner().invoke(app, argv, env={"REPLAYABLE_STORE": "sqlite:///elsewhere.db"})
    assert result.exit_code == 0, result.output
    assert [r["run_id"] for r in json.loads(result.stdout)] == [run_id]
    shown = CliRunner().invoke(app, ["show", run_id[:10], "--store", url])
    assert shown.exit_code == 0, shown.output
    assert run_id in shown.stdout
    db = CliRunner().invoke(app, ["db", "upgrade", "--store", url])
    assert db.exit_code == 2
    assert "needs a PostgreSQL store" in db.stderr


def test_a_later_store_option_wins_and_nothing_after_a_double_dash_moves():
    """--store after the command overrides one before it; '--' ends the search."""
    from replayable.cli._context import hoist_store

    assert hoist_store(["--store", "a", "runs", "--store", "b"]) == [
        "--store",
        "a",
        "--store",
        "b",
        "runs",
    ]
    assert hoist_store(["show", "--", "--store", "x"]) == ["show", "--", "--store", "x"]
    assert hoist_store(["runs", "--store=x", "--json"]) == ["--store=x", "runs", "--json"]


# -- show -------------------------------------------------------------------------


def test_show_prints_header_and_timeline(store, url):
    """``show`` prints the run's facts and one summarised row per event."""
    run_id = record(store, agents.research, "Q3 revenue", contract="C-7")
    result = cli(url, "show", run_id)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert run_id in out
    assert "tests.agents_for_cli:research" in out
    assert "contract='C-7'" in out
    assert "query='Q3 revenue' → 3 results" in out
    assert "send_email *" in out  # the side-effect marker
    assert "side-effect tool" in out
    seqs = [line.split("│")[0].strip() for line in out.splitlines() if "│" in line]
    assert seqs[-3:] == ["1", "2", "3"]


@replayable.tool(name="query_compliance_rules_for_jurisdiction")
def _long_named_tool(code: str) -> list[str]:
    return [f"rule for {code}"]


@replayable.workflow("a_workflow_whose_name_is_longer_than_twenty")
def _long_named_flow(code: str) -> int:
    return len(_long_named_tool(code))


def test_piped_show_prints_names_and_ids_whole(store, url):
    """Not a terminal: show keeps boundary names past 20 characters and ids whole."""
    run_id = record(store, _long_named_flow, "GB")
    result = cli(url, "show", run_id[:10], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "query_compliance_rules_for_jurisdiction" in result.stdout
    assert "a_workflow_whose_name_is_longer_than_twenty" in result.stdout
    assert run_id in result.stdout
    assert "…" not in result.stdout
    on_terminal = tty(url, "show", run_id[:10], columns=80)
    assert "query_compliance_ru…" in on_terminal.stdout  # a terminal still fits the width


def test_show_shows_a_recorded_failure(store, url):
    """A failed run shows its error in the header."""
    run_id = record(store, agents.broken, "beta")
    out = cli(url, "show", run_id).stdout
    assert "failed" in out
    assert "ValueError: cannot summarise beta" in out


def test_show_json_is_machine_readable(store, url):
    """``show --json`` holds the run and its events in seq order with parsed payloads."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "show", run_id, "--json")
    data = json.loads(result.stdout)
    assert data["run"]["run_id"] == run_id
    assert data["run"]["output"]["hits"] == ["alpha result 1", "alpha result 2", "alpha result 3"]
    assert [(e["seq"], e["kind"], e["name"]) for e in data["events"]] == [
        (1, "tool", "search_web"),
        (2, "clock", "time"),
        (3, "tool", "send_email"),
    ]
    assert data["events"][0]["request"] == {"query": "alpha"}
    assert data["events"][2]["side_effect"] is True
    assert all(len(e["hash"]) == 64 for e in data["events"])


def test_show_lists_child_runs(store, url):
    """A parent run's ``show`` names its children; the children point back at it."""
    parent = record(store, agents.fanout, ["a", "b"])
    data = json.loads(cli(url, "show", parent, "--json").stdout)
    children = data["run"]["children"]
    assert len(children) == 2
    assert "children" in cli(url, "show", parent).stdout
    child = json.loads(cli(url, "show", children[0], "--json").stdout)
    assert child["run"]["parent_run_id"] == parent
    listing = json.loads(cli(url, "runs", "--json", "--roots").stdout)
    assert [r["run_id"] for r in listing] == [parent]


def test_show_accepts_a_unique_prefix(store, url):
    """A unique prefix of a run id names that run."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "show", run_id[:10], "--json")
    assert json.loads(result.stdout)["run"]["run_id"] == run_id


def test_ambiguous_prefix_is_one_line_error(store, url):
    """A prefix shared by two runs is refused in one line that names the candidates."""
    a = record(store, agents.research, "a")
    b = record(store, agents.research, "b")
    shared = 0
    while a[shared] == b[shared]:
        shared += 1
    common = a[:shared]
    assert common
    assert_one_line_error(cli(url, "show", common), "ambiguous", a, b)


def test_unknown_run_is_one_line_error(store, url):
    """An id that matches nothing is refused in one line naming it and the store."""
    record(store, agents.research, "a")
    assert_one_line_error(cli(url, "show", "zzzz"), "'zzzz'", url)


def test_bad_store_urls_are_one_line_errors():
    """A store URL with no scheme or an unknown one is refused in one line."""
    assert_one_line_error(cli("runs.db", "runs"), "no scheme")
    assert_one_line_error(cli("ftp://host/runs", "runs"), "unknown store scheme")


def test_store_comes_from_the_environment(store, url):
    """``$REPLAYABLE_STORE`` chooses the store when ``--store`` is not given."""
    run_id = record(store, agents.research, "alpha")
    result = cli(None, "runs", "--json", env={"REPLAYABLE_STORE": url})
    assert [r["run_id"] for r in json.loads(result.stdout)] == [run_id]


def test_corrupt_database_is_one_line_error(tmp_path):
    """A file that is not a database is refused in one line, without a traceback."""
    bad = tmp_path / "garbage.db"
    bad.write_bytes(os.urandom(64) + b"definitely not sqlite" * 200)
    assert_one_line_error(cli(f"sqlite:///{bad}", "runs"), str(bad))


# -- verify -----------------------------------------------------------------------


def test_verify_a_run_and_all_runs(store, url):
    """An untouched store verifies: one run by prefix, and every run with ``--all``."""
    a = record(store, agents.research, "a")
    b = record(store, agents.broken, "b")
    one = cli(url, "verify", short_ids([a, b])[a])
    assert one.exit_code == 0, one.output
    assert "chain intact (3 events)" in one.stdout
    every = cli(url, "verify", "--all")
    assert every.exit_code == 0
    assert "2 runs checked, 0 broken" in every.stdout


def test_verify_names_the_tampered_event(store, url, db):
    """Editing a stored response (past the append-only trigger) fails verify at that seq."""
    run_id = record(store, agents.research, "alpha")
    other = record(store, agents.research, "beta")
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER events_no_update")
        conn.execute("UPDATE events SET response = ? WHERE run_id = ? AND seq = 2", ("1.0", run_id))
    conn.close()
    result = cli(url, "verify", run_id)
    assert result.exit_code == 1
    assert f"run {run_id}: event 2:" in result.stdout
    assert "altered" in result.stdout
    every = cli(url, "verify", "--all", "--json")
    assert every.exit_code == 1
    reports = {r["run_id"]: r for r in json.loads(every.stdout)}
    assert reports[run_id]["first_bad_seq"] == 2
    assert not reports[run_id]["ok"]
    assert reports[other]["ok"]


@pytest.mark.parametrize(
    ("args", "label"),
    [(("verify", "--all"), "verifying"), (("report", "--out", "{tmp}"), "writing reports")],
)
def test_long_commands_show_a_progress_bar_on_a_terminal_only(store, url, tmp_path, args, label):
    """verify --all and report draw a progress bar on a terminal; piped, only the result."""
    for topic in "abc":
        record(store, agents.research, topic)
    argv = [a.replace("{tmp}", str(tmp_path / "r")) for a in args]
    on_terminal = tty(url, *argv)
    assert on_terminal.exit_code == 0, on_terminal.output
    assert label in on_terminal.stdout
    piped_out = cli(url, *argv)
    assert piped_out.exit_code == 0, piped_out.output
    assert label not in piped_out.stdout
    assert "\x1b" not in piped_out.stdout


def test_verify_needs_a_run_or_all(url):
    """``verify`` with neither a run nor ``--all`` is a one-line error."""
    assert_one_line_error(cli(url, "verify"), "--all")


# -- replay -----------------------------------------------------------------------


def test_replay_identical_exits_zero(store, url):
    """Replaying an unchanged agent is identical, serves every event and exits 0."""
    run_id = record(store, agents.research, "alpha")
    result = cli(url, "replay", run_id[:12])
    assert result.exit_code == 0, result.output
    assert "identical" in result.stdout
    assert "events served: 3" in result.stdout
    assert "alpha result 1" in result.stdout


def test_replay_json(store, url):
    """``replay --json`` reports status, events served and the output."""
    run_id = record(store, agents.research, "alpha")
    data = json.loads(cli(url, "replay", run_id, "--json").stdout)
    assert data["status"] == "identical"
    assert data["events_served"] == 3
    assert data["output"]["topic"] == "alpha"
    assert data["divergence"] is None


def test_replay_of_a_changed_agent_diverges_and_exits_one(store, url, monkeypatch):
    """When the code now asks something the tape does not hold, replay says so and exits 1."""
    run_id = record(store, agents.research, "alpha")
    monkeypatch.setattr(agents, "VARIANT", "changed")
    result = cli(url, "replay", run_id)
    assert result.exit_code == 1
    assert "diverged" in result.stdout
    assert "search_web" in result.stdout
    data = json.loads(cli(url, "replay", run_id, "--json").stdout)
    assert data["status"] == "diverged"
    assert data["divergence"]["step"] == 1


def test_replay_of_a_recorded_failure_is_identical(store, url):
    """A run that raised replays to the same exception: identical, exit 0."""
    run_id = record(store, agents.broken, "beta")
    result = cli(url, "replay", run_id)
    assert result.exit_code == 0, result.output
    assert "raised ValueError: cannot summarise beta" in result.stdout


def test_replay_with_missing_entrypoint_is_one_line_error(store, url):
    """A run whose entry function cannot be imported is refused in one line, exit 3
    (the replay could not start)."""

    @replayable.workflow("local")
    def local_agent() -> int:
        return 1

    run_id = record(store, local_agent)
    assert_one_line_error(cli(url, "replay", run_id), "local_agent", code=3)


def test_replay_imports_the_entrypoint_from_the_working_directory(
    store, url, tmp_path, monkeypatch
):
    """An agent module that lives in the current directory is importable by ``replay``."""
    # "" on the path would make the working directory importable without the CLI's help.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    (tmp_path / "cwd_agent.py").write_text(
        "import replayable\n\n"
        "@replayable.workflow('cwd')\n"
        "def run() -> float:\n"
        "    return replayable.now()\n"
    )
    sys.path.insert(0, str(tmp_path))
    import cwd_agent

    run_id = record(store, cwd_agent.run)
    sys.path.remove(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cwd_agent")
    monkeypatch.chdir(tmp_path)
    result = cli(url, "replay", run_id)
    assert result.exit_code == 0, result.output
    assert "identical" in result.stdout


def test_show_marks_a_failed_tool_call(store, url):
    """A tool call that raised is summarised as ``raised Type: message``."""
    run_id = record(store, agents.recovering, "Acme")
    out = cli(url, "show", run_id).stdout
    assert "company='Acme' → raised LookupError: no filing for Acme" in out
    data = json.loads(cli(url, "show", run_id, "--json").stdout)
    assert data["events"][0]["error"]["message"] == "no filing for Acme"


def test_replay_strict_stops_at_the_divergence(store, url, monkeypatch):
    """``--strict`` turns a divergence into exit 1 with the divergence explained."""
    run_id = record(store, agents.research, "alpha")
    monkeypatch.setattr(agents, "VARIANT", "changed")
    result = cli(url, "replay", "--strict", run_id)
    assert result.exit_code == 1
    assert "diverged" in result.stdout
    assert "alpha (revised)" in result.stdout
    assert "Traceback" not in result.output


HOSTILE = "[green]spoof[/green]\x1b[31mRED\x07\rOVER\x9b2J"


@replayable.tool
def _hostile_tool(x: str) -> dict[str, str]:
    return {"msg": HOSTILE}


@replayable.workflow(HOSTILE)
def _hostile_workflow() -> dict[str, str]:
    return _hostile_tool(HOSTILE)


@pytest.mark.parametrize("terminal", [False, True])
def test_recorded_text_cannot_style_or_drive_the_terminal(
    store: replayable.EventStore, url: str, terminal: bool
) -> None:
    """A recorded name or value (a workflow's name, a tool's result, metadata: text an
    agent, its inputs or a hostile row chose) is shown as text: Rich markup in it is
    not applied and its control characters (escape sequences, bell, carriage return,
    8-bit CSI) reach the terminal as visible escapes. Markup in a workflow's name made
    `runs` and `show` print it styled, and an escape sequence in it reached the
    terminal as it was (so a stored run could fake or hide what an auditor reads)."""
    run_id = record(store, _hostile_workflow, note=HOSTILE)
    env = {"FORCE_COLOR": "1", "TERM": "xterm-256color"} if terminal else {}
    for args in (("runs",), ("show", run_id), ("runs", "--workflow", HOSTILE)):
        result = cli(url, *args, env=env)
        assert result.exit_code == 0, result.output
        out = result.output
        assert "[green]spoof[/green]" in out, out
        for raw in ("\x07", "\r", "\x9b", "\x1b[31mRED"):
            assert raw not in out, (args, raw, out)
        assert "\\x1b[31mRED" in out
