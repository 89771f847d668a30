"""Every file replayable creates is 0600 and every directory 0700, even under umask 0o000."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import replayable
from replayable._files import private_dir, write_private
from replayable.capture.writer.spool import Spool, append_rejects
from replayable.cli import app
from replayable.store.sqlite import SQLiteStore


@pytest.fixture(autouse=True)
def _open_umask() -> Iterator[None]:
    """The most permissive umask: nothing is masked away."""
    old = os.umask(0o000)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@replayable.tool
def double(x: int) -> int:
    return 2 * x


@replayable.workflow
def modes_agent(n: int) -> int:
    return sum(double(i) for i in range(n))


def test_sqlite_database_wal_and_shm_are_private(tmp_path: Path) -> None:
    """The database, its -wal and -shm files are 0600; the directories made for it 0700."""
    db = tmp_path / "a" / "b" / "runs.db"
    store = SQLiteStore(db)
    try:
        with replayable.recording(store, durability="durable"):
            assert modes_agent(3) == 6
        wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
        assert wal.exists()
        assert shm.exists()
        assert {p.name: mode(p) for p in (db, wal, shm)} == {
            "runs.db": 0o600,
            "runs.db-wal": 0o600,
            "runs.db-shm": 0o600,
        }
        assert mode(db.parent) == 0o700
        assert mode(db.parent.parent) == 0o700
    finally:
        store.close()


def test_existing_directory_and_database_modes_are_left_alone(tmp_path: Path) -> None:
    """A directory the user made keeps its mode: only what replayable creates is set."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    SQLiteStore(shared / "runs.db").close()
    assert mode(shared) == 0o755
    assert mode(shared / "runs.db") == 0o600


def test_spool_and_rejects_files_are_private(tmp_path: Path) -> None:
    """A spool file, the rejects file and the spool directory are owner-only."""
    directory = tmp_path / "spool" / "deep"
    spool = Spool.create(directory, "sqlite:///x.db")
    rejects = append_rejects(directory, "sqlite:///x.db", iter([]))
    try:
        assert mode(spool.path) == 0o600
        assert mode(rejects) == 0o600
        assert mode(directory) == 0o700
        assert mode(directory.parent) == 0o700
    finally:
        spool.remove()


def test_reports_are_private(tmp_path: Path) -> None:
    """`replayable report` writes its directory 0700 and each report 0600."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = replayable.open_store(url)
    try:
        with replayable.recording(store):
            modes_agent(2)
    finally:
        store.close()
    out = tmp_path / "reports" / "today"
    result = CliRunner().invoke(app, ["--store", url, "report", "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(out.iterdir())
    assert [p.suffix for p in files] == [".html", ".json", ".md"]
    assert {mode(p) for p in files} == {0o600}
    assert mode(out) == 0o700
    assert mode(out.parent) == 0o700


def test_a_rewritten_file_is_made_private(tmp_path: Path) -> None:
    """write_private tightens a file that existed with a wider mode."""
    path = tmp_path / "r.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    write_private(path, b"new")
    assert path.read_bytes() == b"new"
    assert mode(path) == 0o600
    assert mode(private_dir(tmp_path / "x" / "y")) == 0o700
