"""Local accounts of the web interface: names, roles, tenants, argon2 password hashes, tokens.

Accounts live in one JSON file (``$REPLAYABLE_USERS``, default
``./.replayable/users.json``, 0600), managed with ``replayable users
add/remove/set-role/token``. Passwords are stored as argon2id hashes; API
tokens as the sha256 of a 32-byte random secret (a token is long and random,
so a fast hash is enough), shown once when made.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from replayable._files import write_private
from replayable.errors import ConfigurationError
from replayable.events.audit import ROLES

__all__ = ["DEFAULT_USERS_PATH", "Account", "UserDB", "check_name"]

DEFAULT_USERS_PATH: Final = "./.replayable/users.json"
_TOKEN_PREFIX: Final = "rpl_"
_HASHER: Final = PasswordHasher()


def check_name(name: str) -> str:
    """``name`` if it is a usable login name (1-64 printable characters, no spaces)."""
    if not name or len(name) > 64 or not name.isprintable() or any(c.isspace() for c in name):
        raise ConfigurationError(
            f"user name {name!r} must be 1-64 printable characters without spaces"
        )
    return name


def _check_role(role: str) -> str:
    role = role.strip().lower()
    if role not in ROLES:
        raise ConfigurationError(f"role {role!r} is not one of {', '.join(ROLES)}")
    return role


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Account:
    """One user: ``role`` and ``tenant`` (``None``: every tenant the database login sees)."""

    name: str
    role: str
    tenant: str | None = None
    password: str | None = field(default=None, repr=False)
    tokens: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    def public(self) -> dict[str, Any]:
        """What the admin page shows: no hashes."""
        return {
            "name": self.name,
            "role": self.role,
            "tenant": self.tenant,
            "has_password": self.password is not None,
            "tokens": [{"id": t["id"], "created_at": t["created_at"]} for t in self.tokens],
        }


class UserDB:
    """The accounts file. Every change rewrites it whole (0600); reads see the latest file."""

    def __init__(
        self, path: Path | str | None = None, *, hasher: PasswordHasher | None = None
    ) -> None:
        self.path = Path(path or os.environ.get("REPLAYABLE_USERS") or DEFAULT_USERS_PATH)
        self.hasher = hasher or _HASHER
        self._lock = threading.Lock()
        self._cache: tuple[float, dict[str, Account]] | None = None

    def _dummy(self) -> str:
        # Verified against when the name is unknown: a wrong name costs what a wrong
        # password does, so timing does not tell which names exist.
        found: str | None = self.__dict__.get("_dummy_hash")
        if found is None:
            found = self.__dict__["_dummy_hash"] = self.hasher.hash("not a password")
        return found

    # -- reading ------------------------------------------------------------------

    def _load(self) -> dict[str, Account]:
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if self._cache is not None and self._cache[0] == stamp:
            return self._cache[1]
        try:
            data = orjson.loads(self.path.read_bytes())
            users = {
                name: Account(
                    name=name,
                    role=_check_role(str(u["role"])),
                    tenant=u.get("tenant"),
                    password=u.get("password"),
                    tokens=tuple(u.get("tokens", ())),
                )
                for name, u in data["users"].items()
            }
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigurationError(f"cannot read the accounts file {self.path}: {exc}") from exc
        self._cache = (stamp, users)
        return users

    def accounts(self) -> list[Account]:
        """Every account, by name."""
        return sorted(self._load().values(), key=lambda a: a.name)

    def get(self, name: str) -> Account | None:
        return self._load().get(name)

    def configured(self) -> bool:
        """Whether any account exists (then the web app asks everyone to sign in)."""
        return bool(self._load())

    # -- checking -------------------------------------------------------------------

    def check_password(self, name: str, password: str) -> Account | None:
        """The account if ``password`` is its password, else ``None`` (same cost either way)."""
        account = self.get(name)
        stored = account.password if account is not None else None
        try:
            self.hasher.verify(stored or self._dummy(), password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        return account if stored is not None else None

    def check_token(self, token: str) -> Account | None:
        """The account holding this API token, or ``None``."""
        if not token.startswith(_TOKEN_PREFIX):
            return None
        wanted = _digest(token)
        for account in self._load().values():
            for t in account.tokens:
                if hmac.compare_digest(str(t.get("sha256", "")), wanted):
                    return account
        return None

    # -- changing -------------------------------------------------------------------

    def _save(self, users: dict[str, Account]) -> None:
        data = {
            "version": 1,
            "users": {
                a.name: {
                    "role": a.role,
                    "tenant": a.tenant,
                    "password": a.password,
                    "tokens": list(a.tokens),
                }
                for a in sorted(users.values(), key=lambda a: a.name)
            },
        }
        write_private(self.path, orjson.dumps(data, option=orjson.OPT_INDENT_2))
        self._cache = None

    def add(
        self, name: str, role: str, *, password: str | None = None, tenant: str | None = None
    ) -> Account:
        """Create an account; a name already taken is refused."""
        with self._lock:
            users = dict(self._load())
            if check_name(name) in users:
                raise ConfigurationError(f"user {name!r} exists; use set-role or remove it first")
            if password is not None and len(password) < 8:
                raise ConfigurationError("a password needs at least 8 characters")
            account = Account(
                name=name,
                role=_check_role(role),
                tenant=tenant,
                password=None if password is None else self.hasher.hash(password),
            )
            users[name] = account
            self._save(users)
            return account

    def _change(self, name: str, **changes: Any) -> Account:
        with self._lock:
            users = dict(self._load())
            if name not in users:
                raise ConfigurationError(f"no user {name!r} in {self.path}")
            old = users[name]
            account = Account(
                name=name,
                role=changes.get("role", old.role),
                tenant=changes.get("tenant", old.tenant),
                password=changes.get("password", old.password),
                tokens=changes.get("tokens", old.tokens),
            )
            users[name] = account
            self._save(users)
            return account

    def set_role(self, name: str, role: str, *, tenant: str | None = None) -> Account:
        """Change an account's role (and tenant, when given)."""
        changes: dict[str, Any] = {"role": _check_role(role)}
        if tenant is not None:
            changes["tenant"] = tenant or None
        return self._change(name, **changes)

    def set_password(self, name: str, password: str) -> Account:
        if len(password) < 8:
            raise ConfigurationError("a password needs at least 8 characters")
        return self._change(name, password=self.hasher.hash(password))

    def new_token(self, name: str) -> tuple[Account, str]:
        """A fresh API token for ``name``: the account and the token (shown only now)."""
        token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
        account = self.get(name)
        if account is None:
            raise ConfigurationError(f"no user {name!r} in {self.path}")
        entry = {"id": secrets.token_hex(4), "sha256": _digest(token), "created_at": time.time()}
        return self._change(name, tokens=(*account.tokens, entry)), token

    def remove(self, name: str) -> None:
        """Delete an account (its tokens and sessions stop working at once)."""
        with self._lock:
            users = dict(self._load())
            if users.pop(name, None) is None:
                raise ConfigurationError(f"no user {name!r} in {self.path}")
            self._save(users)
