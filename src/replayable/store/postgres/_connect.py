"""Store URLs and connections: ``postgresql://user@host:port/db?tenant=…&schema=…``.

replayable's own query parameters (``tenant``, ``schema``, ``migrate``,
``connect_timeout``) are taken out of the URL; the rest reach libpq as given.
Every psycopg error is translated here, once, into the replayable error tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors

from replayable.errors import (
    AccessDeniedError,
    AppendOnlyError,
    ConfigurationError,
    StoreAuthenticationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from replayable.store.postgres._schema import valid_identifier

__all__ = ["PgTarget", "connect_error", "parse_url", "raise_store_error"]

_SCHEMES = ("postgresql", "postgresql+psycopg")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class PgTarget:
    """Where a PostgreSQL store lives and how replayable uses it."""

    #: The libpq connection string, password included: never shown (see ``display``).
    dsn: str = field(repr=False)
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

    def url(self) -> str:
        """A URL that opens this very store, credentials and options included (never shown)."""
        options = {
            "schema": self.schema,
            "migrate": "true" if self.migrate else "false",
            "connect_timeout": f"{self.connect_timeout:g}",
        }
        if self.tenant is not None:
            options["tenant"] = self.tenant
        sep = "&" if urlsplit(self.dsn).query else "?"
        return self.dsn + sep + urlencode(options, quote_via=quote)


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
        raise connect_error(exc, target) from exc
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


#: libpq's words for a login the server refused (it gives no SQLSTATE before a session).
_REFUSED_LOGIN = (
    "authentication failed",
    "no password supplied",
    "is not permitted to log in",
    "no pg_hba.conf entry",
    "permission denied for database",
)


def connect_error(exc: psycopg.Error, target: PgTarget) -> StoreError:
    """The replayable error for a failed connection attempt: a refused login or a missing
    database is permanent (:class:`StoreAuthenticationError`, :class:`StoreRefusedError`);
    anything else (no server, a timeout, too many clients) is an outage."""
    reason = _reason(exc)
    text = str(exc)
    user = urlsplit(target.dsn).username or "(default)"
    if any(words in text for words in _REFUSED_LOGIN) or (
        "role " in text and "does not exist" in text
    ):
        return StoreAuthenticationError(
            f"authentication failed for user {user} at {target.where}: {reason}"
        )
    if "database " in text and "does not exist" in text:
        return StoreRefusedError(f"cannot connect to {target.where}: {reason}")
    return StoreUnavailableError(f"cannot connect to {target.where}: {reason}")


def raise_store_error(exc: psycopg.Error, target: PgTarget, action: str) -> NoReturn:
    """Raise the replayable error matching a psycopg error (the one translation point)."""
    sqlstate = getattr(exc, "sqlstate", None)
    reason = _reason(exc)
    if isinstance(exc, psycopg.errors.UniqueViolation) or sqlstate == "RPL01":
        raise AppendOnlyError(f"{target.display} refused the batch: {reason}") from exc
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        tenant = f" for tenant {target.tenant!r}" if target.tenant else ""
        hint = ""
        if "row-level security" in reason:
            hint = (
                f"; the login may not write tenant {target.tenant or ''!r}: an admin grants "
                "it with `replayable db grant-tenant LOGIN TENANT --write`"
            )
        raise AccessDeniedError(
            f"{action} in {target.display} was refused{tenant}: {reason}{hint}"
        ) from exc
    if isinstance(exc, psycopg.errors.UndefinedTable):
        raise StoreRefusedError(
            f"{target.display} has no replayable tables in schema {target.schema!r}; "
            f"run `replayable db upgrade` ({reason})"
        ) from exc
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        raise StoreUnavailableError(f"{action} failed: lost {target.where}: {reason}") from exc
    # Any other database error (data, integrity, a constraint) refuses the data itself.
    raise StoreRefusedError(f"{action} in {target.display} failed: {reason}") from exc
