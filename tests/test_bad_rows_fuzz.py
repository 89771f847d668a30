"""Readers survive bad rows: random columns of random rows corrupted, on SQLite and
PostgreSQL, and ``verify``, ``runs``, ``show`` and ``replay`` never print a traceback.

Documented exit codes: ``verify`` 1 once a stored byte changed; ``runs`` and ``show``
0 (``show`` 2 when the run id itself no longer names a run); ``replay`` 1 when the run
holds an unreadable event (a divergence at that step), else 0-3, never a traceback.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer
from click.testing import CliRunner, Result
from psycopg import sql

import replayable
from replayable.cli import app
from replayable.store.postgres import PostgresStore
from replayable.store.sqlite import SQLiteStore
from tests import agents_for_cli as agents
from tests.pg_helpers import PgServer, pg

__all__ = ["pg"]

SQLITE_CASES = 200
PG_CASES = 200

# Values an unlucky disk, a buggy tool or a hostile writer might leave in a column.
SQLITE_JUNK: list[Any] = [
    "{not json",
    "",
    None,
    "seventeen",
    -1,
    2**62,
    3.5,
    b"\x00\xff",
    "[1, 2]",
    '"just a string"',
    "NaN",
]
PG_TEXT_JUNK = ["{not json", "", "[1,2]", '"s"', "\x01 ctl", "ünï"]
PG_JSON_JUNK = ["[1,2]", '"s"', "7", "null", '{"x":1}']
PG_INT_JUNK = [-1, 0, 2**30, 999]


@pytest.fixture(autouse=True)
def _original_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "VARIANT", "original")
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)
    monkeypatch.delenv("REPLAYABLE_CHAIN_KEY", raising=False)
    monkeypatch.delenv("REPLAYABLE_ANCHOR", raising=False)


def _record(store: replayable.EventStore) -> str:
    with replayable.recording(store) as rec:
        agents.research("fuzz")
    return rec.run_ids[0]


# Built once: building the command from the app is most of a small command's cost.
_COMMAND = typer.main.get_command(app)


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(_COMMAND, ["--store", url, *args], env={"COLUMNS": "200"})


def _check(url: str, run_id: str, changed: bool, unreadable_event: bool) -> None:
    results = {
        "verify": _cli(url, "verify", "--all"),
        "runs": _cli(url, "runs"),
        "show": _cli(url, "show", run_id),
        "replay": _cli(url, "replay", run_id),
    }
    for name, result in results.items():
        assert "Traceback" not in result.output, f"{name}:\n{result.output}"
        if result.exception is not None:
            assert isinstance(result.exception, SystemExit), f"{name}: {result.exception!r}"
    if changed:
        assert results["verify"].exit_code == 1, results["verify"].output
    assert results["runs"].exit_code == 0, results["runs"].output
    assert results["show"].exit_code in (0, 2), results["show"].output
    assert results["replay"].exit_code in (0, 1, 2, 3), results["replay"].output
    if unreadable_event:
        assert results["replay"].exit_code == 1, results["replay"].output


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("fuzz") / "template.db"
    store = SQLiteStore(path)
    run_id = _record(store)
    store.close()
    return path, run_id


def _sqlite_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


@pytest.mark.parametrize("case", range(SQLITE_CASES))
def test_sqlite_bad_row_never_crashes_a_reader(
    case: int, sqlite_template: tuple[Path, str], tmp_path: Path
) -> None:
    """A random column of a random row holds junk; every reader reports it and goes on."""
    rng = random.Random(case)
    template, run_id = sqlite_template
    path = tmp_path / "runs.db"
    shutil.copy(template, path)
    conn = sqlite3.connect(path)
    for (name,) in list(conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")):
        conn.execute(f"DROP TRIGGER {name}")
    table = rng.choice(["events", "events", "events", "runs", "run_ends"])
    column = rng.choice([c for c in _sqlite_columns(conn, table) if c != "run_id"])
    rowids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table}")] if table != "events" else []
    value = rng.choice(SQLITE_JUNK)
    if table == "events":
        seq = rng.choice([r[0] for r in conn.execute("SELECT seq FROM events")])
        where, params = "seq = ?", (seq,)
    else:
        where, params = "rowid = ?", (rng.choice(rowids),)
    before = conn.execute(f"SELECT {column} FROM {table} WHERE {where}", params).fetchone()
    try:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (value, *params))
    except sqlite3.IntegrityError:
        value = before[0]  # a NOT NULL column: the database itself refused the junk
    after = conn.execute(f"SELECT {column} FROM {table} WHERE {where}", params).fetchone()
    conn.commit()
    conn.close()
    changed = before != after or type(before[0]) is not type(after[0])
    store = SQLiteStore(path)
    try:
        unreadable = any(e.problems for e in store.events(run_id))
    finally:
        store.close()
    _check(f"sqlite:///{path}", run_id, changed, unreadable)


# -- PostgreSQL -----------------------------------------------------------------------

_PG_TARGETS: dict[str, list[tuple[str, str]]] = {
    "agent_execution_events": [
        ("name", "text"),
        ("key", "text"),
        ("call_site", "text"),
        ("fingerprint", "text"),
        ("encoding", "text"),
        ("prev_hash", "text"),
        ("hash", "text"),
        ("metadata_text", "json"),
        ("request_text", "json"),
        ("response_text", "json"),
        ("error_text", "json"),
        ("sequence", "int"),
        ("chain_index", "int"),
        ("parent", "int"),
        ("schema_version", "int"),
        ("duration_ns", "int"),
    ],
    "runs": [
        ("workflow", "text"),
        ("entrypoint", "text"),
        ("env_hash", "text"),
        ("chain", "text"),
        ("metadata_text", "json"),
        ("code_text", "json"),
        ("lineage_text", "json"),
        ("input_text", "json"),
        ("schema_version", "int"),
        ("parent_seq", "int"),
    ],
    "run_ends": [
        ("last_hash", "text"),
        ("signature", "text"),
        ("output_text", "json"),
        ("event_count", "int"),
        ("schema_version", "int"),
    ],
}


@pytest.fixture(scope="module")
def pg_fuzz(pg: PgServer) -> Iterator[tuple[str, str, psycopg.Connection[Any]]]:
    """One recorded run in its own schema, and a superuser connection with triggers off."""
    schema = pg.new_schema("fz")
    url = pg.url(schema)
    store = PostgresStore(url)
    run_id = _record(store)
    store.close()
    conn = psycopg.connect(f"{pg.server}/{pg.database}", autocommit=True)
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    conn.execute("SET session_replication_role = replica")
    yield url, run_id, conn
    conn.close()


@pytest.mark.parametrize("case", range(PG_CASES))
def test_postgres_bad_row_never_crashes_a_reader(
    case: int, pg_fuzz: tuple[str, str, psycopg.Connection[Any]]
) -> None:
    """A random column of a random row holds junk the column type allows; readers go on."""
    rng = random.Random(10_000 + case)
    url, run_id, conn = pg_fuzz
    table = rng.choice(list(_PG_TARGETS))
    column, kind = rng.choice(_PG_TARGETS[table])
    junk = {"text": [*PG_TEXT_JUNK, None], "json": PG_JSON_JUNK, "int": [*PG_INT_JUNK, None]}
    value = rng.choice(junk[kind])
    ident = sql.Identifier(column)
    if table == "agent_execution_events":
        seqs = [r[0] for r in conn.execute("SELECT sequence FROM agent_execution_events")]
        where = sql.SQL("run_id = %s AND sequence = %s")
        params: tuple[Any, ...] = (run_id, rng.choice(seqs))
    else:
        where, params = sql.SQL("run_id = %s"), (run_id,)
    select = sql.SQL("SELECT {} FROM {} WHERE ").format(ident, sql.Identifier(table)) + where
    (before,) = conn.execute(select, params).fetchone() or (None,)
    update = sql.SQL("UPDATE {} SET {} = %s WHERE ").format(sql.Identifier(table), ident) + where
    try:
        conn.execute(update, (value, *params))
    except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
        return  # the column's type or constraint itself refuses the junk
    # The readers use their own connections, so the change is committed, then undone.
    try:
        (after,) = conn.execute(select, params).fetchone() or (None,)
        store = PostgresStore(url)
        try:
            unreadable = any(e.problems for e in store.events(run_id))
        finally:
            store.close()
        _check(url, run_id, before != after, unreadable)
    finally:
        conn.execute(update, (before, *params))
