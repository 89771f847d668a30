"""The web interface on a real PostgreSQL: each user reaches the database as the login of
their role and tenant, so the database refuses what the app would, even if a route forgot."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from replayable.audit import Actor
from replayable.audit.annotations import annotate_run
from replayable.errors import AccessDeniedError
from replayable.store.postgres import PostgresStore, grant_tenant, init_roles
from replayable.web import UserDB, WebConfig, create_app
from replayable.web.auth import Principal
from tests.pg_helpers import PgServer, pg
from tests.web_runs import make_run, review_calls

__all__ = ["pg"]

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
#: Web role -> the replayable database role its login holds.
DB_ROLES = {"engineer": "writer", "analyst": "analyst", "auditor": "auditor", "admin": "admin"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class PgWorld:
    config: WebConfig
    tokens: dict[str, str]
    acme: str
    beta: str
    logins: dict[tuple[str, str], str]


@pytest.fixture(scope="module")
def world(pg: PgServer, tmp_path_factory: pytest.TempPathFactory) -> PgWorld:
    tag = f"wb{secrets.token_hex(3)}"
    schema = pg.new_schema("web")
    PostgresStore(pg.url(schema)).close()
    pg.role_prefixes.append(tag)
    with pg.connect() as conn:
        roles = init_roles(conn, schema, prefix=tag)
    logins: dict[tuple[str, str], str] = {}
    for tenant in ("acme", "beta"):
        for role, db_role in DB_ROLES.items():
            held = [getattr(roles, db_role)]
            if role == "admin":
                held.append(roles.analyst)  # an admin annotates too
            name = pg.login(f"{tag}_{tenant}_{role}", *held)
            logins[(tenant, role)] = name
            with pg.connect() as conn:
                grant_tenant(conn, schema, name, tenant, write=role == "engineer")
    runs = {}
    for tenant in ("acme", "beta"):
        writer = PostgresStore(pg.url(schema, user=logins[(tenant, "engineer")]))
        try:
            runs[tenant] = make_run(writer, review_calls(), tenant=tenant, workflow=f"{tenant}_wf")
        finally:
            writer.close()
    users = UserDB(tmp_path_factory.mktemp("pgweb") / "users.json", hasher=CHEAP)
    tokens = {}
    for role in DB_ROLES:
        users.add(f"acme_{role}", role, tenant="acme")
        tokens[role] = users.new_token(f"acme_{role}")[1]
    template = pg.url(schema, user="LOGIN").replace("LOGIN", tag + "_{tenant}_{role}")
    config = WebConfig(store_url=pg.url(schema), users=users, db_login=template, secret=b"p" * 32)
    return PgWorld(config, tokens, runs["acme"], runs["beta"], logins)


@pytest.fixture
async def client(world: PgWorld) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    app = create_app(world.config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
            yield c, app


def h(world: PgWorld, role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {world.tokens[role]}"}


def test_postgres_without_per_role_logins_is_refused(world: PgWorld) -> None:
    """Accounts on PostgreSQL need --db-login (or an explicit --one-login)."""
    from replayable.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="db-login"):
        create_app(WebConfig(store_url=world.config.store_url, users=world.config.users))


async def test_each_user_reads_through_their_own_login(
    client: tuple[httpx.AsyncClient, Any], world: PgWorld
) -> None:
    """The access log names the database login of each reader's role and tenant."""
    c, app = client
    for role in DB_ROLES:
        r = await c.get(f"/api/runs/{world.acme}/events/3", headers=h(world, role))
        assert r.status_code == 200, (role, r.text)
    store = app.state.web.pool.store_for(Principal("x", "auditor", "acme", "token"))
    entries = store.access_entries(run_id=world.acme)
    assert {e.login for e in entries} >= {world.logins[("acme", r)] for r in DB_ROLES}


async def test_the_database_keeps_tenants_apart_even_without_the_app(
    client: tuple[httpx.AsyncClient, Any], world: PgWorld
) -> None:
    """Through the app another tenant's run is not found; and the acme login itself sees
    no beta row, so a route that forgot the tenant check could not show one."""
    c, app = client
    assert (await c.get(f"/api/runs/{world.beta}", headers=h(world, "admin"))).status_code == 404
    for role in DB_ROLES:
        store = app.state.web.pool.store_for(Principal("x", role, "acme", "token"))
        assert {r.run_id for r in store.list_runs()} == {world.acme}, role
        assert store.events(world.beta) == []


async def test_the_database_refuses_an_auditor_annotation_the_app_let_through(
    client: tuple[httpx.AsyncClient, Any], world: PgWorld
) -> None:
    """The app answers 403; and a write through the auditor's login claiming the analyst
    role (a route bug) is refused by the database."""
    c, app = client
    r = await c.post(
        f"/api/runs/{world.acme}/annotations",
        headers=h(world, "auditor"),
        json={"verdict": "ok", "note": "cover it up"},
    )
    assert r.status_code == 403
    store = app.state.web.pool.store_for(Principal("olu", "auditor", "acme", "token"))
    pretender = Actor("olu", "analyst", store.login_name())
    with pytest.raises(AccessDeniedError):
        annotate_run(store, pretender, world.acme, verdict="ok", note="cover it up")
    made = await c.post(
        f"/api/runs/{world.acme}/annotations",
        headers=h(world, "analyst"),
        json={"step": 3, "verdict": "violation", "note": "empty lookup"},
    )
    assert made.status_code == 201, made.text
    assert made.json()["login"] == world.logins[("acme", "analyst")]


async def test_a_login_that_cannot_read_annotations_still_gets_its_page(
    client: tuple[httpx.AsyncClient, Any], world: PgWorld
) -> None:
    """The engineer's writer login may not read annotations: the run page says so."""
    c, _ = client
    r = await c.get(f"/api/runs/{world.acme}", headers=h(world, "engineer"))
    assert r.status_code == 200
    assert r.json()["annotations_denied"]
    page = await c.get(f"/runs/{world.acme}", headers=h(world, "engineer"))
    assert "Annotations:" in page.text
