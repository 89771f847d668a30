"""The web interface in-process through ``httpx.ASGITransport``: every route for every role,
CSRF, sessions, tenants, the access log on each payload read, and hostile payloads."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from replayable.errors import ConfigurationError
from replayable.events.audit import AnomalyFlag
from replayable.events.model import Event
from replayable.store.sqlite import SQLiteStore
from replayable.web import UserDB, WebConfig, create_app
from tests.web_runs import Call, make_run, review_calls, tool

pytestmark = pytest.mark.anyio

ROLES = ("engineer", "analyst", "auditor", "admin")
HOSTILE = (
    "<script>alert('pwned')</script><img src=x onerror=alert(1)>"
    "[click me](javascript:alert(2)) \x1b[31mred\x1b[0m </pre></details>"
)
BIG = "A" * 2_000_000
#: Argon2id at its smallest: the tests check hashing happens, not its cost.
CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class World:
    store: SQLiteStore
    users: UserDB
    url: str
    run: str
    hostile: str
    acme: str
    beta: str
    flag: str
    tokens: dict[str, str]


def _build(tmp_path: Path, *, big: str = BIG) -> World:
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    run = make_run(store, review_calls(), metadata={"contract_id": "C-1"})
    hostile = make_run(
        store,
        [
            tool("fetch_page", {"url": HOSTILE}, {"body": HOSTILE, "big": big}),
            tool("summarize", {"text": HOSTILE}, HOSTILE),
        ],
        workflow="hostile",
        metadata={"note": HOSTILE},
    )
    acme = make_run(store, review_calls(), tenant="acme", workflow="acme_review")
    beta = make_run(store, review_calls(), tenant="beta", workflow="beta_review")
    flag = AnomalyFlag(
        flag_id="01a20000-0000-7000-8000-00000000f1a9",
        rule="empty_data_decision",
        run_id=run,
        workflow="contract_review",
        steps=(3,),
        evidence={"tool": "query_compliance_rules", "response": []},
        score=1.0,
        created_at=1_790_000_100.0,
        tenant=None,
    )
    store.append_flags([flag], [run])
    users = UserDB(tmp_path / "users.json", hasher=CHEAP)
    tokens = {}
    for role in ROLES:
        users.add(role[:3], role, password=f"{role}-password")
        tokens[role] = users.new_token(role[:3])[1]
    users.add("acme_aud", "auditor", tenant="acme", password="acme-password")
    tokens["acme_auditor"] = users.new_token("acme_aud")[1]
    return World(store, users, f"sqlite:///{path}", run, hostile, acme, beta, flag.flag_id, tokens)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    built = _build(tmp_path)
    yield built
    built.store.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One store for the role table, whose requests change nothing."""
    built = _build(tmp_path_factory.mktemp("roles"), big="small")
    yield built
    built.store.close()


def _app(world: World, **kw: Any) -> Any:
    return create_app(WebConfig(store_url=world.url, users=world.users, secret=b"s" * 32, **kw))


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    app = _app(world)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
            yield c


def bearer(world: World, role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {world.tokens[role]}"}


# -- every route, every role --------------------------------------------------------

READERS = set(ROLES)
#: What each route needs, written out (not derived from the app's own table).
ALLOWED: dict[str, set[str]] = {
    "read": READERS,
    "annotate": {"analyst", "admin"},
    "replay": {"engineer", "admin"},
    "read_access_log": {"auditor", "admin"},
    "admin": {"admin"},
    "signed_in": READERS,
    "public": READERS,
}
ROUTES: list[tuple[str, str, str]] = [
    ("GET", "/", "signed_in"),
    ("GET", "/api/me", "signed_in"),
    ("GET", "/runs", "read"),
    ("GET", "/api/runs", "read"),
    ("GET", "/runs/{run}", "read"),
    ("GET", "/api/runs/{run}", "read"),
    ("GET", "/runs/{run}/events/{seq}", "read"),
    ("GET", "/api/runs/{run}/events/{seq}", "read"),
    ("GET", "/api/runs/{run}/verify", "read"),
    ("GET", "/diff", "read"),
    ("GET", "/api/diff", "read"),
    ("GET", "/anomalies", "read"),
    ("GET", "/api/anomalies", "read"),
    ("GET", "/api/runs/{run}/annotations", "read"),
    ("POST", "/api/runs/{run}/annotations", "annotate"),
    ("POST", "/runs/{run}/annotate", "annotate"),
    ("GET", "/runs/{run}/report", "read"),
    ("GET", "/api/runs/{run}/report", "read"),
    ("GET", "/reports", "read"),
    ("GET", "/api/reports", "read"),
    ("GET", "/access-log", "read_access_log"),
    ("GET", "/api/access-log", "read_access_log"),
    ("POST", "/api/runs/{run}/replay", "replay"),
    ("POST", "/runs/{run}/replay", "replay"),
    ("GET", "/jobs", "replay"),
    ("GET", "/api/jobs", "replay"),
    ("GET", "/jobs/{job_id}", "replay"),
    ("GET", "/api/jobs/{job_id}", "replay"),
    ("GET", "/login", "public"),
    ("POST", "/login", "public"),
    ("POST", "/logout", "signed_in"),
    ("GET", "/admin/users", "admin"),
    ("GET", "/api/admin/users", "admin"),
    ("POST", "/admin/users", "admin"),
    ("POST", "/admin/users/{name}/remove", "admin"),
    ("POST", "/admin/users/{name}/role", "admin"),
]


def test_the_role_table_covers_every_route(world: World) -> None:
    """Each route the app serves is in this table with the action it needs, and no other."""
    app = _app(world)
    served = dict(app.state.web.actions)
    assert served == {(m, p): a for m, p, a in ROUTES}
    registered = {
        (m, r.path)
        for r in app.routes
        if hasattr(r, "methods") and not r.path.startswith("/api/openapi")
        for m in r.methods - {"HEAD"}
    }
    assert registered == set(served)


def _request(world: World, method: str, path: str) -> tuple[str, dict[str, Any]]:
    # A name no account has: an allowed removal is a 404, and changes nothing.
    url = path.format(run=world.run, seq=3, job_id="nosuchjob", name="nobody")
    kw: dict[str, Any] = {}
    if method == "POST" and url.startswith("/api/") and url.endswith("/annotations"):
        kw["json"] = {"verdict": "nonsense", "note": "x"}  # refused by the library: 400
    elif method == "POST" and url.endswith("/replay"):
        if url.startswith("/api/"):
            kw["json"] = {"mode": "partial"}  # no step: 400 before any job starts
        else:
            kw["data"] = {"mode": "partial"}
    elif method == "POST":
        kw["data"] = {"verdict": "nonsense", "note": "x", "role": "nonsense", "name": "a b"}
    return url, kw


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("method", "path", "action"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES]
)
async def test_route_allows_exactly_its_roles(
    shared: World, role: str, method: str, path: str, action: str
) -> None:
    """Allowed roles get past the permission check; every other role gets 403."""
    world = shared
    url, kw = _request(world, method, path)
    app = _app(world)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
            r = await c.request(method, url, headers=bearer(world, role), **kw)
    if action == "public":
        assert r.status_code != 403, (role, url, r.status_code, r.text[:300])
    elif role in ALLOWED[action]:
        assert r.status_code not in (401, 403), (role, url, r.status_code, r.text[:300])
    else:
        assert r.status_code == 403, (role, url, r.status_code, r.text[:300])
        assert role in r.text or "may not" in r.text


async def test_nobody_signed_in_is_sent_to_the_login_page(
    client: httpx.AsyncClient, world: World
) -> None:
    """With accounts configured, a page asks to sign in and the API answers 401."""
    r = await client.get(f"/runs/{world.run}")
    assert r.status_code == 303
    assert r.headers["location"].startswith("/login?next=")
    assert (await client.get("/api/runs")).status_code == 401
    assert (
        await client.get("/api/runs", headers={"authorization": "Bearer rpl_forged"})
    ).status_code == 401


# -- sessions and CSRF ---------------------------------------------------------------


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the form"
    return found.group(1)


async def _sign_in(client: httpx.AsyncClient, name: str, password: str) -> str:
    page = await client.get("/login")
    r = await client.post(
        "/login",
        data={"name": name, "password": password, "csrf": _csrf(page.text), "next": "/runs"},
    )
    assert r.status_code == 303, r.text[:300]
    runs = await client.get("/runs")
    assert runs.status_code == 200
    return _csrf(runs.text)


async def test_login_needs_the_csrf_token_and_the_right_password(client: httpx.AsyncClient) -> None:
    """A login post without the form's token is refused; a wrong password is a 401."""
    await client.get("/login")
    r = await client.post("/login", data={"name": "ana", "password": "analyst-password"})
    assert r.status_code == 403
    page = await client.get("/login")
    r = await client.post(
        "/login", data={"name": "ana", "password": "wrong-password", "csrf": _csrf(page.text)}
    )
    assert r.status_code == 401
    assert "Wrong name or password" in r.text


async def test_session_cookie_is_httponly_strict_and_secure(client: httpx.AsyncClient) -> None:
    """The session cookie cannot be read by script, is not sent cross-site, and needs HTTPS."""
    r = await client.get("/login")
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert "secure" in cookie


async def test_every_form_post_needs_the_sessions_csrf_token(
    client: httpx.AsyncClient, world: World
) -> None:
    """Signed in as the analyst: annotating without the token, or with another, is refused;
    with the session's token it is written."""
    token = await _sign_in(client, "ana", "analyst-password")
    form = {"step": "3", "verdict": "violation", "note": "empty lookup", "policy": "CR-7"}
    assert (await client.post(f"/runs/{world.run}/annotate", data=form)).status_code == 403
    bad = {**form, "csrf": "x" * len(token)}
    assert (await client.post(f"/runs/{world.run}/annotate", data=bad)).status_code == 403
    api = await client.post(
        f"/api/runs/{world.run}/annotations", json={"verdict": "ok", "note": "n"}
    )
    assert api.status_code == 403  # cookie-borne JSON needs the header too
    assert world.store.annotations(world.run) == []
    r = await client.post(f"/runs/{world.run}/annotate", data={**form, "csrf": token})
    assert r.status_code == 303
    [made] = world.store.annotations(world.run)
    assert (made.author, made.role, made.seq, made.verdict) == ("ana", "analyst", 3, "violation")
    page = await client.get(f"/runs/{world.run}?step=3")
    assert "empty lookup" in page.text


async def test_sign_out_ends_the_session(client: httpx.AsyncClient) -> None:
    token = await _sign_in(client, "aud", "auditor-password")
    r = await client.post("/logout", data={"csrf": token})
    assert r.status_code == 303
    assert (await client.get("/runs")).status_code == 303


async def test_a_removed_account_loses_its_session_and_token(
    client: httpx.AsyncClient, world: World
) -> None:
    await _sign_in(client, "eng", "engineer-password")
    world.users.remove("eng")
    assert (await client.get("/runs")).status_code == 303
    assert (await client.get("/api/runs", headers=bearer(world, "engineer"))).status_code == 401


async def test_auditor_pages_have_no_replay_or_annotate_controls(
    client: httpx.AsyncClient, world: World
) -> None:
    """The auditor reads the run but is offered neither form; the analyst gets the annotate
    form, the engineer the replay form."""
    pages = {}
    for role in ROLES:
        r = await client.get(f"/runs/{world.run}", headers=bearer(world, role))
        assert r.status_code == 200
        pages[role] = r.text
    assert "/annotate" not in pages["auditor"]
    assert "/replay" not in pages["auditor"]
    assert "/annotate" in pages["analyst"]
    assert "/replay" not in pages["analyst"]
    assert "/replay" in pages["engineer"]
    assert "/annotate" not in pages["engineer"]
    assert "/replay" in pages["admin"]
    assert "/annotate" in pages["admin"]


# -- the access log ---------------------------------------------------------------------


async def test_each_payload_expansion_is_written_to_the_access_log(
    client: httpx.AsyncClient, world: World
) -> None:
    """Opening step 3 as a page fragment and as JSON appends one entry each, naming the
    user, role, channel, run, step and purpose."""
    before = len(world.store.access_entries(run_id=world.run))
    r = await client.get(
        f"/runs/{world.run}/events/3?purpose=INC-204",
        headers={**bearer(world, "analyst"), "x-fragment": "1"},
    )
    assert r.status_code == 200
    assert "jurisdiction" in r.text
    assert "GB-SCT" in r.text
    r = await client.get(f"/api/runs/{world.run}/events/3", headers=bearer(world, "auditor"))
    assert r.json()["response"]["text"] == "[]"
    entries = world.store.access_entries(run_id=world.run)[before:]
    assert [(e.user, e.role, e.channel, e.steps, e.purpose) for e in entries] == [
        ("ana", "analyst", "web", (3,), "INC-204"),
        ("aud", "auditor", "api", (3,), None),
    ]
    assert all(e.what == ("request", "response") for e in entries)


async def test_the_run_page_logs_the_steps_it_shows(
    client: httpx.AsyncClient, world: World
) -> None:
    """The timeline shows summaries of payloads: its steps, the annotations and flags read
    are logged before the page is returned."""
    before = len(world.store.access_entries(run_id=world.run))
    await client.get(f"/runs/{world.run}", headers=bearer(world, "engineer"))
    entries = world.store.access_entries(run_id=world.run)[before:]
    assert [e.what for e in entries] == [("request", "response"), ("annotations",), ("flags",)]
    assert entries[0].steps == (1, 2, 3, 4, 5)


async def test_the_access_log_page_shows_reads_and_logs_itself(
    client: httpx.AsyncClient, world: World
) -> None:
    await client.get(f"/api/runs/{world.run}/events/2", headers=bearer(world, "engineer"))
    r = await client.get(f"/api/access-log?run={world.run}", headers=bearer(world, "auditor"))
    rows = r.json()["entries"]
    assert rows[0]["what"] == ["access_log"]
    assert rows[0]["user"] == "aud"
    assert any(e["user"] == "eng" and e["steps"] == [2] for e in rows)


# -- tenants -------------------------------------------------------------------------------


async def test_a_tenant_user_sees_only_its_tenant(client: httpx.AsyncClient, world: World) -> None:
    """An acme auditor lists acme's runs only, and another tenant's run is not found, its
    payloads neither."""
    h = bearer(world, "acme_auditor")
    listed = {r["run_id"] for r in (await client.get("/api/runs", headers=h)).json()["runs"]}
    assert listed == {world.acme}
    for url in (
        f"/api/runs/{world.beta}",
        f"/api/runs/{world.beta}/events/1",
        f"/runs/{world.run}",
    ):
        assert (await client.get(url, headers=h)).status_code == 404, url
    diff = await client.get(f"/api/diff?a={world.acme}&b={world.beta}", headers=h)
    assert diff.status_code == 404
    assert (await client.get(f"/api/runs/{world.acme}", headers=h)).status_code == 200


async def test_admins_filter_by_tenant(client: httpx.AsyncClient, world: World) -> None:
    r = await client.get("/api/runs?tenant=beta", headers=bearer(world, "admin"))
    assert [x["run_id"] for x in r.json()["runs"]] == [world.beta]
    # Not an admin: the parameter is ignored, not obeyed.
    r = await client.get("/api/runs?tenant=beta", headers=bearer(world, "analyst"))
    assert len(r.json()["runs"]) == 4


# -- runs search ----------------------------------------------------------------------------


async def test_runs_search_by_impact_predicates_and_rule(
    client: httpx.AsyncClient, world: World
) -> None:
    """The impact query of the seed (compliance tool, empty response, jurisdiction GB…),
    the anomaly rule and the metadata filter, as shareable URLs."""
    h = bearer(world, "analyst")
    q = (
        "/api/runs?name=query_compliance_rules&where=response+empty"
        "&where=request.jurisdiction+%5E%3D+GB"
    )
    runs = (await client.get(q, headers=h)).json()["runs"]
    assert {r["run_id"] for r in runs} == {world.run, world.acme, world.beta}
    assert all(
        r["matching_steps"] == [{"seq": 3, "kind": "tool", "name": "query_compliance_rules"}]
        for r in runs
    )
    runs = (await client.get("/api/runs?rule=empty_data_decision", headers=h)).json()["runs"]
    assert [r["run_id"] for r in runs] == [world.run]
    runs = (await client.get("/api/runs?meta=contract_id%3DC-1", headers=h)).json()["runs"]
    assert [r["run_id"] for r in runs] == [world.run]
    page = await client.get("/runs?workflow=contract_review&per=1", headers=h)
    assert world.run[:13] in page.text
    assert '<a href="?workflow=contract_review&amp;per=1&amp;sort=status">status</a>' in page.text
    bad = await client.get("/api/runs?where=nonsense", headers=h)
    assert bad.status_code == 400
    assert "predicate" in bad.text


async def test_runs_are_paginated_and_sortable(client: httpx.AsyncClient, world: World) -> None:
    h = bearer(world, "admin")
    first = (await client.get("/api/runs?per=2", headers=h)).json()
    second = (await client.get("/api/runs?per=2&page=2", headers=h)).json()
    assert first["next_page"] == 2
    assert second["next_page"] is None
    ids = [r["run_id"] for r in first["runs"] + second["runs"]]
    assert len(set(ids)) == 4
    by_name = (await client.get("/api/runs?sort=workflow", headers=h)).json()["runs"]
    assert [r["workflow"] for r in by_name] == sorted(r["workflow"] for r in by_name)
    assert (await client.get("/api/runs?sort=evil", headers=h)).status_code == 400


# -- hostile content -------------------------------------------------------------------------


async def test_hostile_payloads_are_escaped_and_large_values_cut(
    client: httpx.AsyncClient, world: World
) -> None:
    """Script tags, HTML, markdown links and terminal escapes come back as text; a 2 MB
    value is cut with "show all", which returns it whole, still escaped."""
    h = bearer(world, "auditor")
    pages = [
        (await client.get(f"/runs/{world.hostile}", headers=h)).text,
        (await client.get(f"/runs/{world.hostile}/events/1", headers=h)).text,
        (await client.get(f"/runs/{world.hostile}/events/2", headers=h)).text,
        (await client.get("/runs", headers=h)).text,
    ]
    for html in pages:
        assert "<script>alert" not in html
        assert "<img src=x" not in html
        assert "\x1b" not in html
        assert 'href="javascript:' not in html
    assert "&lt;script&gt;alert(" in pages[1]
    assert "\\u001b[31mred" in pages[1]  # JSON text spells the escape out
    assert len(pages[1]) < 100_000
    assert "show all" in pages[1]
    assert "2000" in pages[1].replace(",", "")
    whole = await client.get(f"/runs/{world.hostile}/events/1?full=true", headers=h)
    assert BIG in whole.text
    assert "<script>alert" not in whole.text
    data = (await client.get(f"/api/runs/{world.hostile}/events/1", headers=h)).json()
    assert data["response"]["truncated"] is True
    assert data["response"]["length"] > 2_000_000


async def test_every_response_carries_a_strict_content_security_policy(
    client: httpx.AsyncClient, world: World
) -> None:
    r = await client.get(f"/runs/{world.run}", headers=bearer(world, "auditor"))
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "unsafe-eval" not in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in r.text  # only <script src=…>
    assert not re.search(r"<script(?![^>]*\bsrc=)", r.text)
    assert " on" + "click=" not in r.text


# -- pages of the audit ---------------------------------------------------------------------


async def test_the_anomaly_queue_links_flags_to_their_steps(
    client: httpx.AsyncClient, world: World
) -> None:
    h = bearer(world, "analyst")
    data = (await client.get("/api/anomalies", headers=h)).json()
    [group] = data["groups"]
    assert (group["rule"], group["flags"][0]["run_id"], group["flags"][0]["steps"]) == (
        "empty_data_decision",
        world.run,
        [3],
    )
    page = await client.get("/anomalies", headers=h)
    assert f"/runs/{world.run}?step=3#step-3" in page.text
    run_page = await client.get(f"/runs/{world.run}", headers=h)
    assert world.flag in run_page.text  # prefilled in the step's annotate form: closing it


async def test_annotating_through_the_api_closes_a_flag(
    client: httpx.AsyncClient, world: World
) -> None:
    h = bearer(world, "analyst")
    r = await client.post(
        f"/api/runs/{world.run}/annotations",
        headers=h,
        json={
            "step": 3,
            "verdict": "violation",
            "note": "no rules for GB-SCT",
            "closes": [world.flag[:13]],
        },
    )
    assert r.status_code == 201, r.text
    assert (await client.get("/api/anomalies", headers=h)).json()["groups"] == []
    closed = (await client.get("/api/anomalies?all=true", headers=h)).json()["groups"][0]["flags"][
        0
    ]
    assert closed["closed_by"] == r.json()["annotation_id"]
    notes = (await client.get(f"/api/runs/{world.run}/annotations", headers=h)).json()
    assert notes["current"] == [r.json()["annotation_id"]]
    bad = await client.post(
        f"/api/runs/{world.run}/annotations",
        headers=h,
        json={"step": 99, "verdict": "ok", "note": "n"},
    )
    assert bad.status_code == 400
    assert "no step 99" in bad.text


async def test_reports_download_in_three_formats(client: httpx.AsyncClient, world: World) -> None:
    h = bearer(world, "auditor")
    for fmt, marker in (("html", "<html"), ("md", "# "), ("json", '"report_version"')):
        r = await client.get(f"/runs/{world.run}/report?format={fmt}", headers=h)
        assert r.status_code == 200
        assert marker in r.text
        assert r.headers["content-disposition"].endswith(f'{world.run}.{fmt}"')
    r = await client.get(f"/runs/{world.hostile}/report?format=html", headers=h)
    assert "<script>alert" not in r.text
    z = await client.get(
        "/reports?name=query_compliance_rules&where=response+empty&download=true", headers=h
    )
    import io
    import zipfile

    names = zipfile.ZipFile(io.BytesIO(z.content)).namelist()
    assert f"{world.run}.html" in names
    assert f"{world.beta}.md" in names


async def test_diff_names_the_first_divergence(client: httpx.AsyncClient, world: World) -> None:
    """A fork whose compliance lookup found rules differs first at step 3; noise is hidden."""
    fork = make_run(
        world.store,
        review_calls(rules=[{"rule_id": "GB-DPA-03"}]),
        lineage={"forked_from": world.run, "fork_step": 3},
    )
    h = bearer(world, "engineer")
    data = (await client.get(f"/api/diff?a={world.run}&b={fork}", headers=h)).json()
    assert data["first_divergence"]["left_step"] == 3
    assert [p["first"] for p in data["pairs"]].count(True) == 1
    page = await client.get(f"/diff?a={world.run}&b={fork}", headers=h)
    assert 'id="first-divergence"' in page.text
    run_page = await client.get(f"/runs/{world.run}", headers=h)
    assert f"/diff?a={world.run}&amp;b={fork}" in run_page.text  # the fork is linked


async def test_a_long_run_is_paged_with_jump_to_step(
    client: httpx.AsyncClient, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = make_run(world.store, [tool("step", {"i": i}, i) for i in range(1, 1001)])
    h = bearer(world, "engineer")
    first = (await client.get(f"/api/runs/{long}", headers=h)).json()
    assert (first["pages"], len(first["events"]), first["events"][0]["seq"]) == (10, 100, 1)
    # A later page reads its own range by key, never the run up to it.
    read: list[tuple[int, int]] = []
    ranged = SQLiteStore.events_range

    def spy(self: SQLiteStore, run_id: str, first_seq: int, last_seq: int) -> list[Event]:
        read.append((first_seq, last_seq))
        return ranged(self, run_id, first_seq, last_seq)

    def whole(*args: object) -> None:
        raise AssertionError("the run page read the whole run")

    monkeypatch.setattr(SQLiteStore, "events_range", spy)
    monkeypatch.setattr(SQLiteStore, "events_until", whole)
    monkeypatch.setattr(SQLiteStore, "events", whole)
    jump = (await client.get(f"/api/runs/{long}?step=777", headers=h)).json()
    assert jump["page"] == 8
    assert jump["events"][0]["seq"] == 701
    assert any(e["seq"] == 777 for e in jump["events"])
    last = (await client.get(f"/api/runs/{long}?page=10", headers=h)).json()
    assert last["events"][-1]["seq"] == 1000
    assert last["events"][-1]["to_next"] is None
    assert read == [(701, 801), (901, 1001)]


# -- modes ----------------------------------------------------------------------------------


async def test_embedded_mode_works_at_once_for_the_local_user(world: World, tmp_path: Path) -> None:
    """No accounts: the local user is admin, the page says so, and only loopback names are
    answered (no DNS rebinding)."""
    app = create_app(
        WebConfig(store_url=world.url, users=UserDB(tmp_path / "none.json"), secret=b"s" * 32)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c,
    ):
        r = await c.get("/runs")
        assert r.status_code == 200
        assert 'id="local-mode"' in r.text
        assert "admin" in r.text
        evil = await c.get("/runs", headers={"host": "evil.example"})
        assert evil.status_code == 421


def test_a_public_address_needs_sign_in(world: World, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs sign-in"):
        create_app(
            WebConfig(store_url=world.url, users=UserDB(tmp_path / "none.json"), host="0.0.0.0")
        )
    with pytest.raises(ConfigurationError, match="trusted-proxy"):
        create_app(WebConfig(store_url=world.url, users=world.users, proxy_header="X-User"))
    create_app(WebConfig(store_url=world.url, users=world.users, host="0.0.0.0", secret=b"s" * 32))


async def test_proxy_header_is_believed_only_from_the_trusted_proxy(world: World) -> None:
    app = _app(world, proxy_header="X-Remote-User", trusted_proxies=("10.0.0.1",))
    async with app.router.lifespan_context(app):
        for client_ip, expected in (("10.0.0.1", 200), ("10.0.0.2", 401)):
            transport = httpx.ASGITransport(app=app, client=(client_ip, 4000))
            async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
                r = await c.get("/api/me", headers={"x-remote-user": "ana"})
                assert r.status_code == expected, client_ip
                if expected == 200:
                    assert r.json()["role"] == "analyst"
                    assert r.json()["via"] == "proxy"


def test_accounts_keep_only_hashes(world: World) -> None:
    text = world.users.path.read_text()
    assert "analyst-password" not in text
    assert "$argon2id$" in text
    assert world.tokens["analyst"] not in text
    assert oct(world.users.path.stat().st_mode & 0o777) == "0o600"
    assert world.users.check_password("ana", "analyst-password") is not None
    assert world.users.check_password("ana", "analyst-passwordx") is None
    assert world.users.check_password("nobody", "analyst-password") is None


async def test_an_llm_card_reads_as_a_conversation(client: httpx.AsyncClient, world: World) -> None:
    """The HTTP seam's description of a streamed call (model, parameters, messages, the
    assembled answer) is shown as turns, escaped, with the raw JSON beside it."""
    meta = {
        "provider": "openai",
        "model": "gpt-4o",
        "temperature": 0.2,
        "messages": [{"role": "user", "content": "rate <b>this</b>"}],
        "output": {"role": "assistant", "content": "risk: high", "finish_reason": "stop"},
        "stream": True,
    }
    rid = make_run(
        world.store,
        [
            Call(
                "llm",
                "openai.chat.completions",
                {"model": "gpt-4o"},
                {"status": 200},
                metadata=meta,
            )
        ],
    )
    r = await client.get(f"/runs/{rid}/events/1", headers=bearer(world, "analyst"))
    html = r.text
    assert 'class="conversation"' in html
    assert "gpt-4o" in html
    assert "temperature 0.2" in html
    assert "rate &lt;b&gt;this&lt;/b&gt;" in html
    assert "assistant (streamed)" in html
    assert "risk: high" in html
    assert "raw request and response" in html


async def test_a_partial_replay_job_shows_the_paused_step(
    client: httpx.AsyncClient, world: World
) -> None:
    """An engineer's partial replay runs in the background; its JSON reports the pause
    before step 2 with the agent's stack."""
    import asyncio

    import replayable
    from tests import agents_for_cli

    with replayable.recording(world.store) as rec:
        agents_for_cli.research("audit")
    h = bearer(world, "engineer")
    r = await client.post(
        f"/api/runs/{rec.run_ids[0]}/replay", headers=h, json={"mode": "partial", "step": 2}
    )
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    for _ in range(200):
        state = (await client.get(f"/api/jobs/{job}", headers=h)).json()
        if state["state"] in ("done", "failed"):
            break
        await asyncio.sleep(0.05)
    assert state["state"] == "done", state
    assert state["result"]["status"] == "paused"
    assert "research" in state["result"]["paused"]["text"]
    page = await client.get(f"/jobs/{job}", headers=h)
    assert "Paused" in page.text


async def test_a_replay_job_of_a_long_run_shows_its_progress_growing(
    client: httpx.AsyncClient, world: World
) -> None:
    """Polling a job of a 300-step run sees "step N of 300" grow while it runs, in the
    JSON and on the page, and the end at 300 of 300."""
    import asyncio

    import replayable
    from tests import agents_for_cli

    with replayable.recording(world.store) as rec:
        agents_for_cli.long_search(300, 0.002)
    h = bearer(world, "engineer")
    r = await client.post(f"/api/runs/{rec.run_ids[0]}/replay", headers=h, json={})
    assert r.status_code == 202, r.text
    assert r.json()["total_steps"] in (None, 300)  # none before the replay's first step
    job = r.json()["job_id"]
    seen: list[int] = []
    pages: list[str] = []
    for _ in range(1000):
        state = (await client.get(f"/api/jobs/{job}", headers=h)).json()
        if state["state"] == "running" and state["step"] is not None:
            assert state["total_steps"] == 300
            seen.append(state["step"])
            if len(pages) < 1:
                pages.append((await client.get(f"/jobs/{job}", headers=h)).text)
        if state["state"] in ("done", "failed"):
            break
        await asyncio.sleep(0.01)
    assert state["state"] == "done", state
    assert state["result"]["status"] == "identical"
    assert (state["step"], state["total_steps"]) == (300, 300)
    assert seen == sorted(seen)
    assert len(set(seen)) >= 3, seen
    assert re.search(r'id="job-progress">step \d+ of 300<', pages[0])
    done = await client.get(f"/jobs/{job}", headers=h)
    assert 'id="job-progress">step 300 of 300<' in done.text


async def test_a_replay_job_is_written_to_the_access_log(
    client: httpx.AsyncClient, world: World
) -> None:
    """A replay reads the whole recording: the job appends it to the access log as the
    engineer, through the API, before the replay runs."""
    import asyncio

    import replayable
    from tests import agents_for_cli

    with replayable.recording(world.store) as rec:
        agents_for_cli.long_search(5, 0.0)
    run = rec.run_ids[0]
    before = len(world.store.access_entries(run_id=run))
    h = {**bearer(world, "engineer"), "x-purpose": "INC-204"}
    r = await client.post(f"/api/runs/{run}/replay", headers=h, json={})
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    for _ in range(500):
        state = (await client.get(f"/api/jobs/{job}", headers=h)).json()
        if state["state"] in ("done", "failed"):
            break
        await asyncio.sleep(0.01)
    assert state["state"] == "done", state["error"]
    assert state["result"]["status"] == "identical"
    entries = [e for e in world.store.access_entries(run_id=run)[before:] if "replay" in e.what]
    assert [(e.user, e.role, e.channel, e.purpose) for e in entries] == [
        ("eng", "engineer", "api", "INC-204")
    ]
    assert entries[0].what == ("request", "response", "replay")


async def test_a_fork_override_of_the_wrong_shape_is_refused(
    client: httpx.AsyncClient, world: World
) -> None:
    """As `replay --override` does: step 3 recorded a list, a string does not start a job."""
    r = await client.post(
        f"/api/runs/{world.run}/replay",
        headers=bearer(world, "engineer"),
        json={"mode": "fork", "step": 3, "override": '"no rules"'},
    )
    assert r.status_code == 400
    assert "recorded a list" in r.text
    jobs = (await client.get("/api/jobs", headers=bearer(world, "engineer"))).json()["jobs"]
    assert jobs == []
    bad = await client.post(
        f"/api/runs/{world.run}/replay",
        headers=bearer(world, "engineer"),
        json={"mode": "fork", "step": 3, "override": "[not json"},
    )
    assert bad.status_code == 400
    assert "not JSON" in bad.text


async def test_an_admin_adds_changes_and_removes_accounts(
    client: httpx.AsyncClient, world: World
) -> None:
    """Through the accounts page, with its CSRF token: the new account can sign in, its
    role changes, and once removed it cannot."""
    token = await _sign_in(client, "adm", "admin-password")
    form = {"name": "kim", "role": "analyst", "tenant": "acme", "password": "kim-password"}
    assert (await client.post("/admin/users", data=form)).status_code == 403  # no token
    r = await client.post("/admin/users", data={**form, "csrf": token})
    assert r.status_code == 303
    assert world.users.check_password("kim", "kim-password") is not None
    r = await client.post("/admin/users/kim/role", data={"role": "auditor", "csrf": token})
    assert r.status_code == 303
    account = world.users.get("kim")
    assert account is not None
    assert (account.role, account.tenant) == ("auditor", "acme")
    dup = await client.post("/admin/users", data={**form, "csrf": token})
    assert dup.status_code == 400
    assert "exists" in dup.text
    assert (await client.post("/admin/users/adm/remove", data={"csrf": token})).status_code == 400
    assert (await client.post("/admin/users/kim/remove", data={"csrf": token})).status_code == 303
    assert world.users.get("kim") is None
    page = await client.get("/api/admin/users")
    assert page.json()["retention"]["hot_days"] == 30.0  # the default policy, read-only


async def test_a_filter_that_reads_only_the_newest_runs_says_so(
    client: httpx.AsyncClient, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter the store cannot apply (here the anomaly rule) looks at the newest runs
    only: with more runs than that, the page and its JSON say the search was partial,
    never a silently short list; within the limit they say nothing."""
    from replayable.web import reads

    h = bearer(world, "analyst")
    from replayable.store import RunFilter

    total = len(world.store.list_runs(RunFilter(limit=1000)))
    r = await client.get("/api/runs?rule=empty_data_decision", headers=h)
    assert r.json()["searched_all"] is True
    assert r.json()["searched_newest"] is None
    monkeypatch.setattr(reads, "SCAN_LIMIT", max(1, total - 1))
    r = await client.get("/api/runs?rule=empty_data_decision", headers=h)
    assert (r.json()["searched_all"], r.json()["searched_newest"]) == (False, total - 1)
    page = await client.get("/runs?rule=empty_data_decision", headers=h)
    assert f"Only the newest {total - 1} runs were searched" in page.text
    plain = await client.get("/api/runs", headers=h)  # the store pages this one itself
    assert plain.json()["searched_all"] is True


async def test_failed_sign_ins_slow_the_next_down_without_locking_the_person_out(
    client: httpx.AsyncClient, world: World
) -> None:
    """After five wrong passwords for one name from one address, the next attempt is
    refused (429, Retry-After) without checking the password, even a right one; other
    names from that address are still checked, and once the pause is over (doubling
    with each further failure) the right password signs in and clears the count."""
    from replayable.web import throttle as throttle_module

    state = client._transport.app.state.web  # type: ignore[attr-defined]
    now = [1000.0]
    state.throttle = throttle_module.LoginThrottle(clock=lambda: now[0])

    async def attempt(name: str, password: str) -> httpx.Response:
        page = await client.get("/login")
        return await client.post(
            "/login",
            data={"name": name, "password": password, "csrf": _csrf(page.text), "next": "/runs"},
        )

    for _ in range(5):
        assert (await attempt("ana", "guess")).status_code == 401
    refused = await attempt("ana", "analyst-password")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "30"
    assert "Too many failed sign-ins: try again in 30 s" in refused.text
    # Someone else on the same address is checked as usual.
    assert (await attempt("olu", "wrong")).status_code == 401
    now[0] += 31
    assert (await attempt("ana", "still wrong")).status_code == 401  # the sixth failure
    assert (await attempt("ana", "analyst-password")).status_code == 429
    assert (await attempt("ana", "x")).headers["Retry-After"] == "60"  # doubled
    now[0] += 61
    assert (await attempt("ana", "analyst-password")).status_code == 303
    assert state.throttle.wait_s("127.0.0.1", "ana") == 0


def test_the_sign_in_throttle_forgets_old_failures_as_it_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failures from many addresses do not grow the throttle without end: past its
    prune size, entries whose last failure is out of the window are dropped."""
    from replayable.web import throttle as throttle_module

    monkeypatch.setattr(throttle_module, "_PRUNE_AT", 200)
    now = [0.0]
    t = throttle_module.LoginThrottle(clock=lambda: now[0])
    for i in range(throttle_module._PRUNE_AT):
        t.failed(f"10.0.{i // 256}.{i % 256}", "ana")
    assert len(t._failures) >= throttle_module._PRUNE_AT
    now[0] += throttle_module.WINDOW_S + 1
    t.failed("192.0.2.1", "olu")
    assert len(t._failures) == 2  # the new address and its name
    assert t.wait_s("10.0.0.1", "ana") == 0
    for i in range(50):  # asking, as every sign-in does first, keeps nothing
        assert t.wait_s(f"198.51.100.{i}", f"name{i}") == 0
    assert len(t._failures) == 2
