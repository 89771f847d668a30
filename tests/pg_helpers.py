"""A real PostgreSQL server for the tests: one fresh database per test session.

The server is ``$REPLAYABLE_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432``).
When it cannot be reached the PostgreSQL tests are skipped with the reason, or
fail under ``CI=true``, where a missing server is a broken build.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql

SERVER = os.environ.get("REPLAYABLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
#: The roles ``init_roles`` makes for a prefix, dropped with the test database.
ROLE_SUFFIXES = ("writer", "auditor", "maintenance", "analyst", "admin", "steward")


@dataclass
class PgServer:
    """A throwaway database on the test server, and role prefixes to drop with it."""

    server: str
    database: str
    role_prefixes: list[str] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)

    def url(
        self,
        schema: str,
        *,
        user: str | None = None,
        tenant: str | None = None,
        server: str | None = None,
    ) -> str:
        base = server or self.server
        if user is not None:
            scheme, rest = base.split("://", 1)
            base = f"{scheme}://{user}@{rest.split('@', 1)[-1]}"
        url = f"{base}/{self.database}?schema={schema}"
        return url + (f"&tenant={tenant}" if tenant else "")

    def connect(self, user: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
        base = self.server
        if user is not None:
            scheme, rest = base.split("://", 1)
            base = f"{scheme}://{user}@{rest.split('@', 1)[-1]}"
        return psycopg.connect(f"{base}/{self.database}", autocommit=True)

    def login(self, name: str, *member_of: str) -> str:
        """A login role ``name`` holding ``member_of``, dropped at the end of the session."""
        self.logins.insert(0, name)
        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            for role in member_of:
                conn.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(name))
                )
        return name

    def new_schema(self, stem: str = "s") -> str:
        return f"{stem}_{secrets.token_hex(4)}"


def _unreachable(reason: str) -> None:
    message = f"PostgreSQL at {SERVER} is not reachable: {reason}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message + " (CI=true: the PostgreSQL tests must run)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """A fresh database for this session, dropped (with the roles made in it) at the end."""
    try:
        admin = psycopg.connect(f"{SERVER}/postgres", autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        _unreachable(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
        raise AssertionError("unreachable") from exc  # pragma: no cover - _unreachable raised
    name = f"replayable_test_{secrets.token_hex(6)}"
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    server = PgServer(SERVER, name)
    try:
        yield server
    finally:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        names = [*server.logins]
        for prefix in server.role_prefixes:
            names += [f"{prefix}_{suffix}" for suffix in ROLE_SUFFIXES]
        for name in names:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
        admin.close()
