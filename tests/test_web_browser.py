"""The web interface in a real Chromium: the seed's incident from the recording to the fork.

Record the demo; as an analyst open the run, expand step 3 (the empty compliance
result) and annotate it as a violation; as an auditor see the annotation, find no
replay or annotate controls and get 403 from the API; as an engineer fork at step 3
with the fixed tool's answer and open the diff, whose first divergence is step 3.
Hostile payloads are opened too: nothing runs, big values are cut with "show all".
Screenshots go to ``test-artifacts/web/`` (``$REPLAYABLE_TEST_ARTIFACTS``).

Chromium is Debian's ``chromium`` at ``/usr/bin/chromium``; without it the test is
skipped, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from argon2 import PasswordHasher
from rich.console import Console

from replayable.store import open_store
from replayable.web import UserDB, WebConfig, create_app
from tests.web_runs import make_run, tool

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ARTIFACTS = (
    Path(
        os.environ.get("REPLAYABLE_TEST_ARTIFACTS")
        or Path(__file__).resolve().parents[1] / "test-artifacts"
    )
    / "web"
)
HOSTILE = "<script>window.__pwned = 1; alert('x')</script><img src=x onerror=\"alert(2)\">"
PASSWORDS = {"dana": "analyst-pass", "olu": "auditor-pass", "eli": "engineer-pass"}


def _chromium() -> None:
    if not Path(CHROMIUM).exists():
        message = f"Chromium is not installed at {CHROMIUM} (Debian package chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """The app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = _free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the web server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture
def contract_review(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("REPLAYABLE_STORE", raising=False)
    import contract_review.agent
    import contract_review.demo

    monkeypatch.setattr(contract_review.agent, "MATCH_MODE", "exact")
    return contract_review


@pytest.fixture
def site(
    contract_review: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    _chromium()
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = contract_review.demo.run_demo(
        url,
        Console(file=io.StringIO(), width=120),
        seed=7,
        reruns=1,
        reports_path=tmp_path / "reports.jsonl",
        audit_days=0,
    )
    assert result.ok
    store = open_store(url)
    from replayable.audit import Scanner

    Scanner(store).scan()  # flags the run's decision on the empty lookup (rule 5)
    hostile = make_run(
        store,
        [
            tool(
                "fetch_page",
                {"url": "https://example.test"},
                {"body": HOSTILE, "big": "B" * 300_000},
            )
        ],
        workflow="hostile",
        metadata={"note": HOSTILE},
    )
    store.close()
    users = UserDB(
        tmp_path / "users.json", hasher=PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
    )
    users.add("dana", "analyst", password=PASSWORDS["dana"])
    users.add("olu", "auditor", password=PASSWORDS["olu"])
    users.add("eli", "engineer", password=PASSWORDS["eli"])
    app = create_app(WebConfig(store_url=url, users=users, secret=b"k" * 32))
    from contract_review.model_server import serve

    with serve(seed=7) as model, Server(app) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "demo-key")
        monkeypatch.setenv("CONTRACT_REVIEW_REPORTS", str(tmp_path / "reports.jsonl"))
        yield {
            "url": server.url,
            "run": result.run_id,
            "hostile": hostile,
            "agent": contract_review.agent,
        }


@pytest.fixture
def browser() -> Iterator[Any]:
    _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _shot(page: Any, name: str, part: str | None = None) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    docs = os.environ.get("REPLAYABLE_WEB_DOCS")  # the README's pictures: one screenful each
    if docs:
        Path(docs).mkdir(parents=True, exist_ok=True)
        if part is not None:
            page.locator(part).screenshot(path=str(Path(docs) / f"{name}.png"))
        else:
            page.screenshot(path=str(Path(docs) / f"{name}.png"))


def _sign_in(browser: Any, site: dict[str, Any], name: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.errors = errors
    page.goto(site["url"] + "/runs")
    assert "/login" in page.url
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORDS[name])
    page.click("button[type=submit]")
    page.wait_for_url("**/runs")
    return page


def test_the_incident_in_the_browser(browser: Any, site: dict[str, Any]) -> None:
    """Analyst, auditor and engineer each do their part of the seed's story."""
    run = site["run"]

    # -- the analyst opens the run, expands step 3, annotates it -----------------------
    page = _sign_in(browser, site, "dana")
    _shot(page, "runs")
    page.click(f"a[href='/runs/{run}']")
    page.wait_for_selector("#verify-badge.badge-intact")
    card = page.locator("#step-3")
    assert "query_compliance_rules" in card.locator(".card-head").inner_text()
    card.locator("details.payload > summary").click()
    response = card.locator(".payload-body .response pre")
    response.wait_for()
    assert response.inner_text().strip() == "[]"
    _shot(page, "run")
    card.locator("details.annotate > summary").click()
    assert card.locator("input[name=closes]").input_value()  # the flag on this step
    card.locator("select[name=verdict]").select_option("violation")
    card.locator("input[name=policy]").fill("CR-7")
    card.locator("textarea[name=note]").fill("No rules for GB-SCT; rated low without them.")
    card.locator("button[type=submit]").click()
    page.wait_for_selector("#step-3 .annotation.verdict-violation")
    assert "No rules for GB-SCT" in page.locator("#step-3 .annotation").inner_text()
    _shot(page, "annotated")
    assert page.errors == []

    # -- the auditor sees it, has no controls, and the API refuses ---------------------
    page = _sign_in(browser, site, "olu")
    page.goto(f"{site['url']}/runs/{run}?step=3")
    assert "No rules for GB-SCT" in page.locator("#step-3 .annotation").inner_text()
    assert page.locator("#replay-controls").count() == 0
    assert page.locator(".annotate-form").count() == 0
    status = page.evaluate(
        """async (run) => {
            const csrf = document.querySelector('meta[name=csrf]').content;
            const res = await fetch(`/api/runs/${run}/annotations`, {method: 'POST',
                headers: {'content-type': 'application/json', 'x-csrf-token': csrf},
                body: JSON.stringify({verdict: 'ok', note: 'looks fine'})});
            const replay = await fetch(`/api/runs/${run}/replay`, {method: 'POST',
                headers: {'content-type': 'application/json', 'x-csrf-token': csrf},
                body: JSON.stringify({mode: 'full'})});
            return [res.status, replay.status];
        }""",
        run,
    )
    assert status == [403, 403]
    page.goto(site["url"] + "/access-log")
    log = page.locator("#access-table").inner_text()
    assert "dana" in log
    assert "olu" in log
    _shot(page, "access_log")
    page.goto(site["url"] + "/anomalies?all=true")
    assert "empty_data_decision" in page.locator("main").inner_text()
    assert "closed by" in page.locator("main").inner_text()  # the analyst's note closed it
    _shot(page, "anomalies")
    page.goto(site["url"] + "/reports?name=query_compliance_rules&where=response+empty")
    assert run[:13] in page.locator("main").inner_text()
    _shot(page, "reports")

    # -- the engineer forks at step 3 with the fixed tool and opens the diff -----------
    page = _sign_in(browser, site, "eli")
    page.goto(f"{site['url']}/runs/{run}")
    fixed = site["agent"].find_rules("GB-SCT", "prefix")
    assert fixed, "the fixed lookup finds the GB rules"
    page.click("#step-3 button.fork-here")  # fills in the mode, the step, the recorded value
    deadline = time.monotonic() + 10
    while page.input_value("#replay-override").strip() != "[]" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert page.input_value("#replay-override").strip() == "[]"
    assert page.input_value("#replay-mode") == "fork"
    assert page.input_value("#replay-step") == "3"
    page.fill("#replay-override", json.dumps(fixed, indent=2))  # the fixed tool's answer
    page.select_option("select[name=on_side_effect]", "recorded")
    _shot(page, "fork_form", "#replay-controls")
    page.click(".replay-form button[type=submit]")
    page.wait_for_url("**/jobs/*")
    page.wait_for_selector("#job-links", timeout=60_000)
    assert page.locator("#replay-status").inner_text() == "completed"
    _shot(page, "job")
    page.click("#job-diff")
    page.wait_for_selector("#first-divergence")
    first = page.locator("#first-divergence")
    assert first.get_attribute("data-left") == "3"
    assert first.get_attribute("data-right") == "3"
    assert "step 3" in page.locator("#first-divergence-text").inner_text()
    _shot(page, "diff")
    assert page.errors == []


def test_hostile_payloads_do_not_run_in_the_browser(browser: Any, site: dict[str, Any]) -> None:
    """A payload with a script tag and an onerror handler is shown as text; no dialog
    opens, no script sets its marker; a 300 KB value is cut and "show all" shows it."""
    page = _sign_in(browser, site, "olu")
    page.goto(f"{site['url']}/runs/{site['hostile']}")
    page.locator("#step-1 details.payload > summary").click()
    body = page.locator("#step-1 .payload-body")
    body.locator(".truncated").wait_for()
    assert "<script>window.__pwned" in body.inner_text()
    assert page.evaluate("window.__pwned") is None
    short = len(body.inner_text())
    assert short < 100_000
    body.locator("a.show-all").first.click()
    # Polled from here: the page's policy forbids the eval a wait_for_function needs.
    deadline = time.monotonic() + 10
    while len(body.inner_text()) < 300_000 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(body.inner_text()) > 300_000
    assert page.evaluate("window.__pwned") is None
    _shot(page, "hostile")
    assert [e for e in page.errors if "dialog" in e] == []
