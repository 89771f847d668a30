"""``replayable annotate``, ``annotations``, ``access-log`` and ``show`` with annotations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replayable.cli import app
from replayable.store.sqlite import SQLiteStore
from tests.test_audit_store import recorded

ENV = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    rid = recorded(store, events=4)
    store.close()
    return f"sqlite:///{path}", rid


def run(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--store", url, *args], env=ENV)
    return result.exit_code, result.stdout, result.stderr


def test_annotate_then_list_show_and_correct(db: tuple[str, str]) -> None:
    """An analyst annotates a step; ``annotations`` and ``show`` print it under its event;
    a correction replaces it and ``--history`` keeps both."""
    url, rid = db
    code, out, err = run(
        url, "annotate", rid[:13], "--step", "3", "--verdict", "violation",
        "--note", "Empty rules; rated low.", "--policy", "CR-7",
        "--as", "dana", "--role", "analyst", "--json",
    )  # fmt: skip
    assert code == 0, err
    made = json.loads(out)
    assert (made["seq"], made["verdict"], made["author"]) == (3, "violation", "dana")

    code, out, _ = run(url, "annotations", rid, "--as", "olu", "--role", "auditor")
    assert code == 0
    assert "violation" in out
    assert "Empty rules; rated low." in out
    assert "policy CR-7" in out

    code, out, _ = run(url, "show", rid, "--as", "olu", "--role", "auditor", "--purpose", "INC-9")
    assert code == 0
    lines = out.splitlines()
    step3 = next(i for i, line in enumerate(lines) if line.strip().startswith("3 "))
    assert "violation" in lines[step3 + 1]
    assert "Empty rules; rated low." in lines[step3 + 2]

    code, out, err = run(
        url, "annotate", rid, "--amends", made["annotation_id"][:14], "--verdict", "concern",
        "--note", "Rules existed upstream.", "--as", "dana", "--role", "analyst",
    )  # fmt: skip
    assert code == 0, err
    code, out, _ = run(url, "annotations", rid, "--json")
    data = json.loads(out)
    assert [h["verdict"] for h in data["history"]] == ["violation", "concern"]
    assert [h["current"] for h in data["history"]] == [False, True]
    code, out, _ = run(url, "annotations", rid)
    assert "violation" not in out
    assert "2 versions in all" in out


def test_auditor_cannot_annotate(db: tuple[str, str]) -> None:
    """``annotate --role auditor`` exits 2 with one error line, and nothing is stored."""
    url, rid = db
    code, _, err = run(
        url, "annotate", rid, "--verdict", "ok", "--note", "n", "--as", "olu", "--role", "auditor"
    )
    assert code == 2
    assert err.startswith("error: olu (role auditor) may not annotate runs")
    code, out, _ = run(url, "annotations", rid, "--json")
    assert json.loads(out)["history"] == []


def test_access_log_shows_reads_and_its_own(db: tuple[str, str]) -> None:
    """``show`` and ``annotations`` are logged with user, channel and purpose; reading the
    access log is logged too, and ``--who``/``--run`` filter it."""
    url, rid = db
    assert run(url, "show", rid, "--as", "dana", "--purpose", "INC-204")[0] == 0
    assert run(url, "annotations", rid, "--as", "olu", "--role", "auditor")[0] == 0
    code, out, _ = run(url, "access-log", "--as", "olu", "--role", "auditor", "--json")
    assert code == 0
    entries = [json.loads(line) for line in out.splitlines()]
    assert [(e["user"], e["channel"], e["what"]) for e in entries] == [
        ("dana", "cli", ["request", "response", "annotations"]),
        ("olu", "cli", ["annotations"]),
        ("olu", "cli", ["access_log"]),
    ]
    assert entries[0]["purpose"] == "INC-204"
    assert entries[0]["steps"] == [1, 2, 3, 4]
    code, out, _ = run(url, "access-log", "--who", "dana", "--run", rid[:13], "--json")
    assert [json.loads(line)["user"] for line in out.splitlines()] == ["dana"]
    code, out, _ = run(url, "access-log", "--since", "1h")
    assert code == 0
    assert "INC-204" in out
    code, _, err = run(url, "access-log", "--role", "analyst")
    assert code == 2
    assert "may not read the access log" in err


def test_verify_checks_annotation_chains_too(tmp_path: Path) -> None:
    """``verify`` names an annotation altered behind the store's back and exits 1."""
    import sqlite3

    from tests.audit_runs import record, tool

    path = tmp_path / "v.db"
    store = SQLiteStore(path)
    rid = record(store, [tool("lookup", {"q": 1}, [1])])
    store.close()
    url = f"sqlite:///{path}"
    assert run(url, "annotate", rid, "--verdict", "violation", "--note", "bad")[0] == 0
    code, out, _ = run(url, "verify", rid, "--json")
    assert code == 0, out
    assert json.loads(out)[0]["annotations"]["ok"] is True
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER annotations_no_update")
    conn.execute("UPDATE annotations SET verdict = 'ok'")
    conn.commit()
    conn.close()
    code, out, _ = run(url, "verify", rid)
    assert code == 1
    assert "annotation" in out
    assert "altered" in out
