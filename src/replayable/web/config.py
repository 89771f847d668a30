"""How the web interface is set up: the store, who may sign in, which database login serves whom.

Three ways people are identified, checked in this order on every request:

1. an API token (``Authorization: Bearer rpl_…``) of a local account;
2. a trusted proxy: with ``proxy_header`` set, a request from one of
   ``trusted_proxies`` names its user in that header (an SSO proxy in front);
   the user's role and tenant come from the accounts file, or from
   ``proxy_role_header`` when the proxy sends one;
3. a session cookie from signing in with a local account's password.

With no account and no proxy (the embedded default), every request acts as
the local user, as admin, and the pages say so; that is refused on any
address other than loopback.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from replayable._files import private_file, write_private
from replayable.errors import ConfigurationError
from replayable.web.users import UserDB

__all__ = ["WebConfig", "is_loopback", "load_secret"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_secret(path: Path) -> bytes:
    """The key that signs session cookies: ``$REPLAYABLE_WEB_SECRET``, else a random key
    kept in ``path`` (0600, made on first use)."""
    env = os.environ.get("REPLAYABLE_WEB_SECRET")
    if env:
        if len(env) < 16:
            raise ConfigurationError("$REPLAYABLE_WEB_SECRET needs at least 16 characters")
        return env.encode()
    if private_file(path) or path.stat().st_size == 0:
        write_private(path, secrets.token_hex(32).encode())
    return path.read_bytes().strip()


@dataclass
class WebConfig:
    """Everything ``create_app`` needs. ``db_login`` is a store URL template with
    ``{role}`` and ``{tenant}``: each user's requests go through the database login it
    names (PostgreSQL enforces that login's role and tenants)."""

    store_url: str | None = None
    users: UserDB = field(default_factory=UserDB)
    host: str = "127.0.0.1"
    port: int = 8600
    db_login: str | None = None
    one_login: bool = False
    proxy_header: str | None = None
    proxy_role_header: str | None = None
    trusted_proxies: tuple[str, ...] = ()
    secret: bytes | None = None
    secure_cookies: bool = True
    session_hours: float = 12.0
    page_size: int = 100
    payload_limit: int = 16_384

    def auth_configured(self) -> bool:
        return self.users.configured() or self.proxy_header is not None

    def check(self) -> None:
        """Refuse a setup that would expose runs: a non-loopback address without sign-in,
        a proxy mode without trusted addresses, a shared PostgreSQL login for many roles."""
        if not is_loopback(self.host) and not self.auth_configured():
            raise ConfigurationError(
                f"serving on {self.host} needs sign-in: add accounts with `replayable users add` "
                "or set a trusted proxy (--proxy-header with --trusted-proxy); without them "
                "only 127.0.0.1 is allowed"
            )
        if self.proxy_header and not self.trusted_proxies:
            raise ConfigurationError(
                "--proxy-header needs --trusted-proxy ADDRESS: the header is believed only "
                "from the proxy's own address"
            )
        for p in self.trusted_proxies:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError as exc:
                raise ConfigurationError(f"--trusted-proxy {p!r} is not an address") from exc
        url = self.store_url or os.environ.get("REPLAYABLE_STORE") or ""
        postgres = url.startswith(("postgresql://", "postgresql+psycopg://"))
        if postgres and self.auth_configured() and not self.db_login and not self.one_login:
            raise ConfigurationError(
                "on PostgreSQL each role must reach the database as its own login: pass "
                "--db-login 'postgresql://web_{tenant}_{role}@host/db?schema=…' "
                "(or --one-login to let the application alone enforce roles)"
            )
        if self.db_login:
            try:
                self.db_login.format(role="r", tenant="t")
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigurationError(
                    f"--db-login {self.db_login!r}: only {{role}} and {{tenant}} may be named"
                ) from exc

    def trusted(self, client: str | None) -> bool:
        """Whether a request from ``client`` may name its user in the proxy header."""
        if client is None or not self.proxy_header:
            return False
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(p, strict=False) for p in self.trusted_proxies)
