"""The ASGI application: middleware for sessions and security headers, the permission guard,
error pages, and the routes of :mod:`replayable.web.pages`.

>>> from replayable.web import WebConfig, create_app
>>> app = create_app(WebConfig(store_url="sqlite:///./.replayable/runs.db"))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.datastructures import URL

from replayable import __version__
from replayable.errors import (
    AccessDeniedError,
    ConfigurationError,
    ReplayableError,
    RunNotFoundError,
    StoreUnavailableError,
)
from replayable.web.auth import COOKIE, identify, new_session, read_session, sign_session
from replayable.web.config import WebConfig, is_loopback, load_secret
from replayable.web.context import Ctx, StorePool, WebState
from replayable.web.views import visible

__all__ = ["create_app"]

HERE: Final = Path(__file__).resolve().parent
_SAFE: Final = frozenset({"GET", "HEAD", "OPTIONS"})

#: No inline script or style, nothing from elsewhere, no framing, forms post here only.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS: Final = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-store",
}


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True
    # Every value printed passes here before it is escaped: control characters
    # (terminal escapes in a payload, a note or a name) are shown, never sent.
    # Markup (a macro's output) is made of values that passed here already.
    env.finalize = lambda v: v if isinstance(v, Markup) or not isinstance(v, str) else visible(v)
    env.globals["version"] = __version__
    return templates


async def _csrf_ok(request: Request, expected: str) -> bool:
    import hmac

    given = request.headers.get("x-csrf-token")
    if given is None:
        kind = request.headers.get("content-type", "")
        if kind.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            form = await request.form()
            value = form.get("csrf")
            given = value if isinstance(value, str) else None
    return bool(given) and bool(expected) and hmac.compare_digest(given or "", expected)


def _guard(state: WebState) -> Callable[[str], Callable[[Request], Awaitable[None]]]:
    def need(action: str) -> Callable[[Request], Awaitable[None]]:
        async def check(request: Request) -> None:
            session = request.state.session
            api = request.url.path.startswith("/api/")
            principal = identify(request, state.config, session)
            ctx = Ctx(request, state, principal, session, api)
            request.state.ctx = ctx
            # A bearer token is not sent by a browser on its own: only cookie-borne
            # identities (sessions, the local user, a proxy's header) need the token.
            cookie_borne = principal is None or principal.via != "token"
            if request.method not in _SAFE and cookie_borne:
                expected = session.csrf if session else ""
                if not await _csrf_ok(request, expected):
                    raise HTTPException(403, "missing or wrong CSRF token; reload the page")
            if action == "public":
                return
            if principal is None:
                raise HTTPException(401, "sign in first")
            if action != "signed_in" and not principal.may(action):
                raise HTTPException(
                    403, f"{principal.name} (role {principal.role}) may not do this ({action})"
                )

        return check

    return need


def create_app(config: WebConfig) -> FastAPI:
    """The web interface over ``config.store_url``; checks ``config`` first."""
    config.check()
    secret = config.secret or load_secret(config.users.path.parent / "web-secret")
    state = WebState(config=config, secret=secret, pool=StorePool(config), templates=_templates())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if state.jobs is not None:
                state.jobs.shutdown()
            state.pool.close()

    app = FastAPI(
        title="replayable",
        version=__version__,
        description="The audit interface of replayable: runs, timelines, diffs, annotations, "
        "anomaly flags, reports and replay jobs. Every page has its JSON twin here. "
        "Authenticate with `Authorization: Bearer <token>` (`replayable users token NAME`).",
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
        lifespan=lifespan,
    )
    app.state.web = state
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.middleware("http")
    async def session_and_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        host = (request.headers.get("host") or "").rsplit(":", 1)[0]
        if not config.auth_configured() and not is_loopback(host):
            # Without sign-in only a loopback name may reach us (no DNS rebinding).
            return JSONResponse({"detail": f"host {host!r} refused"}, 421, headers=_HEADERS)
        session = read_session(secret, request.cookies.get(COOKIE))
        fresh = session is None
        if session is None:
            session = new_session(None, config.session_hours)
        request.state.session = session
        request.state.set_session = fresh
        response = await call_next(request)
        for k, v in _HEADERS.items():
            response.headers.setdefault(k, v)
        if request.url.path.startswith("/static/"):
            response.headers["cache-control"] = "public, max-age=3600"
        if request.state.set_session:
            secure = config.secure_cookies and (
                request.url.scheme == "https" or not is_loopback(config.host)
            )
            response.set_cookie(
                COOKIE,
                sign_session(secret, request.state.session),
                max_age=int(config.session_hours * 3600),
                httponly=True,
                secure=secure,
                samesite="strict",
                path="/",
            )
        return response

    def error_response(request: Request, status: int, detail: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": detail}, status)
        if status == 401 and request.method in _SAFE:
            target = URL("/login").include_query_params(next=str(request.url.path))
            return RedirectResponse(str(target), 303)
        ctx = getattr(request.state, "ctx", None)
        return state.templates.TemplateResponse(
            request,
            "error.html",
            {"ctx": ctx, "status": status, "detail": detail, "title": f"{status}"},
            status_code=status,
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(request, exc.status_code, str(exc.detail))

    @app.exception_handler(ReplayableError)
    async def library_error(request: Request, exc: ReplayableError) -> Response:
        status = 400
        if isinstance(exc, RunNotFoundError):
            status = 404
        elif isinstance(exc, AccessDeniedError):
            status = 403
        elif isinstance(exc, StoreUnavailableError):
            status = 503
        elif not isinstance(exc, ConfigurationError):
            status = 422
        return error_response(request, status, " ".join(str(exc).split()))

    from replayable.web import pages

    pages.register(app, state, _guard(state))
    return app


def ctx_of(request: Request) -> Ctx:
    """The request's :class:`Ctx`, set by the guard every route depends on."""
    found: Any = request.state.ctx
    assert isinstance(found, Ctx)
    return found
