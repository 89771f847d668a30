"""Who is asking: the principal of a request, session cookies and CSRF tokens.

A session is a signed cookie (HMAC-SHA256 under the app's secret) holding
the account name, when it expires and the session's CSRF token; nothing
else is kept on the server, and the account is looked up again on every
request, so a removed account or a changed role takes effect at once. Every
form carries the CSRF token and every POST is refused without it (API calls
with a bearer token carry no cookie and need none).
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.requests import Request

from replayable.audit.actor import PERMISSIONS
from replayable.web.config import WebConfig
from replayable.web.users import Account

__all__ = [
    "COOKIE",
    "Principal",
    "Session",
    "identify",
    "sign_session",
]

COOKIE: Final = "replayable_session"


@dataclass(frozen=True, slots=True)
class Principal:
    """The person behind a request: ``name``, ``role``, ``tenant`` and how they were known
    (``local`` embedded mode, ``session``, ``token``, ``proxy``)."""

    name: str
    role: str
    tenant: str | None
    via: str

    def may(self, action: str) -> bool:
        """Whether the role allows ``action``: the library's permissions, plus ``admin``
        (accounts) for the admin role."""
        if action == "admin":
            return self.role == "admin"
        return action in PERMISSIONS.get(self.role, frozenset())


@dataclass(frozen=True, slots=True)
class Session:
    """What the session cookie holds."""

    user: str | None
    csrf: str
    expires: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_session(secret: bytes, session: Session) -> str:
    body = _b64(orjson.dumps({"u": session.user, "c": session.csrf, "e": session.expires}))
    mac = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def read_session(secret: bytes, cookie: str | None, now: float | None = None) -> Session | None:
    """The session in a cookie, or ``None`` when it is missing, forged or expired."""
    if not cookie or "." not in cookie:
        return None
    body, _, mac = cookie.partition(".")
    want = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), want):
            return None
        data: Any = orjson.loads(_unb64(body))
        session = Session(user=data["u"], csrf=str(data["c"]), expires=float(data["e"]))
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None
    if session.expires < (time.time() if now is None else now):
        return None
    return session


def new_session(user: str | None, hours: float) -> Session:
    return Session(user=user, csrf=secrets.token_urlsafe(24), expires=time.time() + hours * 3600)


def local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


def _from_account(account: Account, via: str) -> Principal:
    return Principal(account.name, account.role, account.tenant, via)


def identify(request: Request, config: WebConfig, session: Session | None) -> Principal | None:
    """The principal of ``request``, or ``None`` when nobody is signed in."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        account = config.users.check_token(header[7:].strip())
        return None if account is None else _from_account(account, "token")
    client = request.client.host if request.client else None
    if config.proxy_header and config.trusted(client):
        name = request.headers.get(config.proxy_header, "").strip()
        if name:
            account = config.users.get(name)
            if account is not None:
                return _from_account(account, "proxy")
            role = (
                request.headers.get(config.proxy_role_header, "").strip().lower()
                if config.proxy_role_header
                else ""
            )
            if role in PERMISSIONS:
                return Principal(name, role, None, "proxy")
            return None
    if not config.auth_configured():
        return Principal(local_user(), "admin", None, "local")
    if session is not None and session.user:
        account = config.users.get(session.user)
        if account is not None:
            return _from_account(account, "session")
    return None
