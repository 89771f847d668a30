"""The writer decides retries from replayable's own error names, which each driver maps once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from replayable.capture.writer.batches import Stalled, is_permanent
from replayable.errors import (
    AppendOnlyError,
    SchemaVersionError,
    StoreAuthenticationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from replayable.store.postgres._connect import connect_error, parse_url, raise_store_error
from replayable.store.sqlite import SQLiteStore, store_error


def test_retries_follow_our_names_not_the_drivers() -> None:
    """An unavailable store is retried whatever its cause is called; a refusal is not."""
    unavailable = StoreUnavailableError("lost the server")
    unavailable.__cause__ = psycopg.errors.DataError("looks like a refusal")
    refused = StoreRefusedError("bad value")

    class OperationalError(Exception):  # a driver class name the old rule trusted
        pass

    refused.__cause__ = OperationalError("looks like an outage")
    assert not is_permanent(unavailable)
    assert is_permanent(refused)
    assert is_permanent(AppendOnlyError("duplicate"))
    assert is_permanent(SchemaVersionError("newer"))
    assert not is_permanent(StoreAuthenticationError("no such role")), "the records wait"
    assert not is_permanent(Stalled("no answer"))
    assert not is_permanent(StoreError("anything else the store says"))
    assert not is_permanent(OSError("disk"))
    assert is_permanent(TypeError("a bug in a store recurs"))


def test_sqlite_errors_are_mapped_once() -> None:
    """The SQLite store names a locked database unavailable and a constraint a refusal."""
    assert isinstance(
        store_error(sqlite3.OperationalError("database is locked"), "x"), StoreUnavailableError
    )
    assert isinstance(store_error(sqlite3.IntegrityError("UNIQUE"), "x"), AppendOnlyError)
    assert isinstance(store_error(sqlite3.DataError("too big"), "x"), StoreRefusedError)
    assert isinstance(store_error(OSError("no space"), "x"), StoreUnavailableError)
    mapped = store_error(sqlite3.DataError("too big"), "x")
    assert isinstance(mapped.__cause__, sqlite3.DataError)


def test_a_file_that_is_no_database_is_refused(tmp_path: Path) -> None:
    """A file that is not SQLite at all is a refusal, not an outage to retry."""
    path = tmp_path / "not.db"
    path.write_bytes(b"this is not a database, just some bytes " * 100)
    with pytest.raises(StoreRefusedError, match="not a usable replayable database"):
        SQLiteStore(path)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ('FATAL:  password authentication failed for user "agent"', StoreAuthenticationError),
        ('FATAL:  role "agent" does not exist', StoreAuthenticationError),
        ('FATAL:  role "agent" is not permitted to log in', StoreAuthenticationError),
        ('FATAL:  permission denied for database "agents"', StoreAuthenticationError),
        ('FATAL:  database "agents" does not exist', StoreRefusedError),
        ("Connection refused\n\tIs the server running", StoreUnavailableError),
        ("timeout expired", StoreUnavailableError),
    ],
)
def test_postgres_connection_errors_are_mapped_once(message: str, expected: type) -> None:
    """libpq's refused logins are permanent and say which user; no server is an outage."""
    target = parse_url("postgresql://agent:s3cret@db.example:5432/agents")
    error = connect_error(psycopg.OperationalError(message), target)
    assert type(error) is expected
    if expected is StoreAuthenticationError:
        assert "authentication failed for user agent" in str(error)
    assert "s3cret" not in str(error)


def test_postgres_query_errors_are_mapped_once() -> None:
    """A lost connection is an outage; a privilege or data error refuses the data."""
    target = parse_url("postgresql://agent@db.example/agents")
    with pytest.raises(StoreUnavailableError):
        raise_store_error(psycopg.OperationalError("server closed"), target, "writing")
    with pytest.raises(StoreRefusedError):
        raise_store_error(psycopg.errors.InsufficientPrivilege("no"), target, "writing")
    with pytest.raises(StoreRefusedError):
        raise_store_error(psycopg.errors.DataError("bad"), target, "writing")
