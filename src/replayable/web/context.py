"""Per-request context: the principal, their store, their audit reader, and the route table
that says which role may do what.

Every route is registered through :func:`route`, which names the action it
needs (``read``, ``annotate``, ``replay``, ``read_access_log``, ``admin``,
``signed_in`` or ``public``); the check runs before the handler. The table
(:data:`ACTIONS` on the app) is what the role tests walk, so a route
registered without an action cannot exist.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from fastapi import FastAPI, HTTPException, Request
from fastapi.templating import Jinja2Templates

from replayable.audit.access import AuditReader
from replayable.audit.actor import Actor
from replayable.errors import ConfigurationError
from replayable.events.model import Run
from replayable.store import EventStore, open_store
from replayable.web.auth import Principal, Session
from replayable.web.config import WebConfig
from replayable.web.throttle import LoginThrottle

__all__ = ["ACTIONS", "Ctx", "StorePool", "WebState", "route"]

#: Every action a route may require.
ACTIONS: Final = ("public", "signed_in", "read", "annotate", "replay", "read_access_log", "admin")


class StorePool:
    """One store per database login: the ``--store`` store, or with ``db_login`` the
    login its template names for each (role, tenant)."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._stores: dict[str, EventStore] = {}

    def url_for(self, principal: Principal) -> str | None:
        template = self.config.db_login
        if not template:
            return self.config.store_url
        if "{tenant}" in template and principal.tenant is None:
            raise HTTPException(
                403,
                f"{principal.name} has no tenant, and the database login is chosen by tenant; "
                "an admin sets one with `replayable users set-role NAME ROLE --tenant T`",
            )
        return template.format(role=principal.role, tenant=principal.tenant or "")

    def store_for(self, principal: Principal) -> EventStore:
        url = self.url_for(principal)
        key = url or ""
        with self._lock:
            found = self._stores.get(key)
            if found is None:
                found = self._stores[key] = open_store(url, create=False)
            return found

    def default(self) -> EventStore:
        with self._lock:
            key = self.config.store_url or ""
            if key not in self._stores:
                self._stores[key] = open_store(self.config.store_url, create=False)
            return self._stores[key]

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()


@dataclass
class WebState:
    """What the app holds for its lifetime."""

    config: WebConfig
    secret: bytes
    pool: StorePool
    templates: Jinja2Templates
    actions: dict[tuple[str, str], str] = field(default_factory=dict)
    jobs: Any = None
    #: Failed sign-ins, and how long the next must wait (see ``web.throttle``).
    throttle: LoginThrottle = field(default_factory=LoginThrottle)


@dataclass
class Ctx:
    """One request's view of the world."""

    request: Request
    state: WebState
    maybe_principal: Principal | None
    session: Session | None
    api: bool

    @property
    def principal(self) -> Principal:
        if self.maybe_principal is None:
            raise HTTPException(401, "sign in first")
        return self.maybe_principal

    @property
    def store(self) -> EventStore:
        return self.state.pool.store_for(self.principal)

    def actor(self) -> Actor:
        try:
            return Actor(self.principal.name, self.principal.role, self.store.login_name())
        except ConfigurationError as exc:
            raise HTTPException(403, str(exc)) from exc

    def reader(self) -> AuditReader:
        """An audit reader as this user, channel ``web`` (a page) or ``api`` (JSON)."""
        purpose = self.request.query_params.get("purpose") or self.request.headers.get("x-purpose")
        return AuditReader(
            self.store, self.actor(), channel="api" if self.api else "web", purpose=purpose
        )

    def may(self, action: str) -> bool:
        return self.maybe_principal is not None and self.maybe_principal.may(action)

    def sees(self, run: Run) -> bool:
        """The application's tenant check (the database login checks again on PostgreSQL)."""
        tenant = self.principal.tenant
        return tenant is None or (run.start.tenant or "") == tenant

    def run(self, ref: str) -> Run:
        """The run named by ``ref`` (id or prefix), 404 when unknown or another tenant's."""
        from replayable.errors import AmbiguousRunIdError, RunNotFoundError

        try:
            found = self.store.run(ref)
        except AmbiguousRunIdError as exc:
            raise HTTPException(400, str(exc)) from exc
        except RunNotFoundError as exc:
            raise HTTPException(404, f"no run {ref!r}") from exc
        if not self.sees(found):
            raise HTTPException(404, f"no run {ref!r}")
        return found

    @property
    def csrf(self) -> str:
        return "" if self.session is None else self.session.csrf


def route(
    app: FastAPI,
    state: WebState,
    method: str,
    path: str,
    action: str,
    guard: Callable[[str], Any],
    **options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a handler for ``method path`` that needs ``action``; ``guard(action)``
    is the dependency that checks it before the handler runs (see ``app.py``)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        from fastapi import Depends

        state.actions[(method, path)] = action
        if not path.startswith("/api/"):
            options.setdefault("include_in_schema", False)
        app.add_api_route(
            path, fn, methods=[method], dependencies=[Depends(guard(action))], **options
        )
        return fn

    return register
