"""Signing in and out, and the accounts page (admins)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from replayable.errors import ConfigurationError
from replayable.web.app import ctx_of
from replayable.web.auth import new_session
from replayable.web.context import Ctx, WebState

Deco = Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]

__all__ = ["register"]

CtxDep = Annotated[Ctx, Depends(ctx_of)]


def _next(target: str | None) -> str:
    # Only a path of this site: never an absolute or scheme-relative URL.
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/runs"
    return target


def _retention() -> dict[str, Any]:
    """The retention policy ``replayable archive`` applies (read-only here: it is set in
    ``[tool.replayable.retention]`` of pyproject.toml)."""
    import os

    from replayable._pyproject import project_config
    from replayable.archive.parquet import RetentionPolicy

    try:
        found = project_config()
        policy = RetentionPolicy.from_config(found)
    except ConfigurationError as exc:
        return {"error": str(exc)}
    section = found.get("retention", {})
    return {
        "hot_days": policy.hot_days,
        "archive_years": policy.archive_years,
        "workflows": policy.workflows,
        "archive": os.environ.get("REPLAYABLE_ARCHIVE") or section.get("archive"),
    }


def register(
    both: Deco,
    page: Deco,
    api: Deco,
    out: Callable[..., Response],
    state: WebState,
    roles: list[str],
) -> None:
    config = state.config

    @page("/login", "public")
    def login_page(ctx: CtxDep, next: str | None = None) -> Response:
        return out(ctx, "login.html", {"next": _next(next), "failed": False})

    @page("/login", "public", method="POST")
    async def login(ctx: CtxDep, request: Request) -> Response:
        form = await request.form()
        name, password = form.get("name"), form.get("password")
        target = _next(form.get("next") if isinstance(form.get("next"), str) else None)  # type: ignore[arg-type]
        account = None
        address = request.client.host if request.client is not None else "?"
        who = name.strip() if isinstance(name, str) else ""
        throttle = state.throttle
        wait = throttle.wait_s(address, who)
        if wait > 0:
            data = {"next": target, "failed": False, "wait": math.ceil(wait)}
            refused = out(ctx, "login.html", data, 429)
            refused.headers["Retry-After"] = str(math.ceil(wait))
            return refused
        if isinstance(name, str) and isinstance(password, str):
            account = config.users.check_password(who, password)
        if account is None:
            throttle.failed(address, who)
            return out(ctx, "login.html", {"next": target, "failed": True}, 401)
        throttle.succeeded(address, who)
        # A new session (and CSRF token) at sign-in: no fixation of the anonymous one.
        request.state.session = new_session(account.name, config.session_hours)
        request.state.set_session = True
        return RedirectResponse(target, 303)

    @page("/logout", "signed_in", method="POST")
    def logout(ctx: CtxDep) -> Response:
        ctx.request.state.session = new_session(None, config.session_hours)
        ctx.request.state.set_session = True
        return RedirectResponse("/login", 303)

    @both("/admin/users", "admin")
    def users(ctx: CtxDep) -> Response:
        """Local accounts, their roles and tenants (admins). Passwords and tokens are
        managed with ``replayable users``."""
        data = {
            "path": str(config.users.path),
            "users": [a.public() for a in config.users.accounts()],
            "roles": roles,
            "retention": _retention(),
        }
        return out(ctx, "users.html", data)

    @page("/admin/users", "admin", method="POST")
    async def add_user(ctx: CtxDep, request: Request) -> Response:
        form = await request.form()
        fields = {k: form.get(k) for k in ("name", "role", "tenant", "password")}
        text = {k: v.strip() if isinstance(v, str) else "" for k, v in fields.items()}
        try:
            config.users.add(
                text["name"],
                text["role"] or "auditor",
                password=text["password"] or None,
                tenant=text["tenant"] or None,
            )
        except ConfigurationError as exc:
            raise HTTPException(400, str(exc)) from exc
        return RedirectResponse("/admin/users", 303)

    @page("/admin/users/{name}/remove", "admin", method="POST")
    def remove_user(ctx: CtxDep, name: str) -> Response:
        if name == ctx.principal.name:
            raise HTTPException(400, "you cannot remove your own account here")
        try:
            config.users.remove(name)
        except ConfigurationError as exc:
            raise HTTPException(404, str(exc)) from exc
        return RedirectResponse("/admin/users", 303)

    @page("/admin/users/{name}/role", "admin", method="POST")
    async def set_role(ctx: CtxDep, name: str, request: Request) -> Response:
        form = await request.form()
        role, tenant = form.get("role"), form.get("tenant")
        if not isinstance(role, str):
            raise HTTPException(400, "no role given")
        try:
            config.users.set_role(name, role, tenant=tenant if isinstance(tenant, str) else None)
        except ConfigurationError as exc:
            raise HTTPException(400, str(exc)) from exc
        return RedirectResponse("/admin/users", 303)
