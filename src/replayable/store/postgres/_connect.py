"""Store URLs and connections: ``postgresql://user@host:port/db?tenant=…&schema=…``.

replayable's own query parameters (``tenant``, ``schema``, ``migrate``,
``connect_timeout``) are taken out of the URL; the rest reach libpq as given.
Every psycopg error is translated here, once, into the replayable error tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors

from replayable.errors import AppendOnlyError, ConfigurationError, StoreError
from replayable.store.postgres._schema import valid_identifier

__all__ = ["PgTarget", "parse_url", "raise_store_error"]

_SCHEMES = ("postgresql", "postgresql+psycopg")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class PgTarget:
    """Where a PostgreSQL store lives and how replayable uses it."""

    dsn: str
    display: str
    host: str
    port: int
    database: str
    schema: str = "replayable"
    tenant: str | None = None
    migrate: bool = True
    connect_timeout: float = 5.0

    @property
    def where(self) -> str:
        return f"PostgreSQL at {self.host}:{self.port} (database {self.database!r})"


def parse_url(url: str) -> PgTarget:
    """Split a ``postgresql://`` URL into the libpq DSN and replayable's own options."""
    try:
        parts = urlsplit(url)
        port = parts.port or 5432
    except ValueError as exc:
        raise ConfigurationError(f"store URL {url!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in _SCHEMES:
        raise ConfigurationError(f"store URL {url!r} is not a postgresql:// URL")
    options: dict[str, str] = {}
    passthrough: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in ("tenant", "schema", "migrate", "connect_timeout"):
            options[key] = value
        else:
            passthrough.append((key, value))
    schema = options.get("schema", "replayable")
    if not valid_identifier(schema):
        raise ConfigurationError(
            f"store URL {_mask(url)!r}: schema {schema!r} must be a lower-case identifier"
        )
    tenant = options.get("tenant") or None
    migrate_text = options.get("migrate", "true").lower()
    if migrate_text not in _TRUE | _FALSE:
        raise ConfigurationError(
            f"store URL {_mask(url)!r}: migrate={migrate_text!r} must be true or false"
        )
    try:
        timeout = float(options.get("connect_timeout", "5"))
    except ValueError as exc:
        raise ConfigurationError(
            f"store URL {_mask(url)!r}: connect_timeout must be a number of seconds"
        ) from exc
    netloc = parts.netloc
    # quote, not quote_plus: libpq reads a '+' in a URI as a plus, so
    # options=-c statement_timeout=2000 must travel as %20, not '+'.
    query = urlencode(passthrough, quote_via=quote)
    dsn = urlunsplit(("postgresql", netloc, parts.path, query, ""))
    return PgTarget(
        dsn=dsn,
        display=_mask(url),
        host=parts.hostname or "localhost",
        port=port,
        database=parts.path.lstrip("/") or (parts.username or "postgres"),
        schema=schema,
        tenant=tenant,
        migrate=migrate_text in _TRUE,
        connect_timeout=timeout,
    )


def _mask(url: str) -> str:
    """The URL with its password replaced, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def connect(target: PgTarget) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection with the store's tenant set; StoreError if unreachable.

    The ``replayable.tenant`` setting only narrows what the login may see to
    one of its tenants; which tenants those are is the membership table's.
    """
    try:
        conn = psycopg.connect(
            target.dsn,
            autocommit=True,
            connect_timeout=max(1, round(target.connect_timeout)),
            application_name="replayable",
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to {target.where}: {_reason(exc)}") from exc
    try:
        conn.execute(
            "SELECT set_config('replayable.tenant', %s, false), "
            "set_config('search_path', %s, false)",
            (target.tenant or "", f'"{target.schema}", pg_catalog'),
        )
    except psycopg.Error as exc:
        conn.close()
        raise_store_error(exc, target, "setting up the connection")
    return conn


def _reason(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def raise_store_error(exc: psycopg.Error, target: PgTarget, action: str) -> NoReturn:
    """Raise the replayable error matching a psycopg error (the one translation point)."""
    sqlstate = getattr(exc, "sqlstate", None)
    reason = _reason(exc)
    if isinstance(exc, psycopg.errors.UniqueViolation) or sqlstate == "RPL01":
        raise AppendOnlyError(f"{target.display} refused the batch: {reason}") from exc
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        tenant = f" for tenant {target.tenant!r}" if target.tenant else ""
        raise StoreError(f"{action} in {target.display} was refused{tenant}: {reason}") from exc
    if isinstance(exc, psycopg.errors.UndefinedTable):
        raise StoreError(
            f"{target.display} has no replayable tables in schema {target.schema!r}; "
            f"run `replayable db upgrade` ({reason})"
        ) from exc
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        raise StoreError(f"{action} failed: lost {target.where}: {reason}") from exc
    raise StoreError(f"{action} in {target.display} failed: {reason}") from exc
