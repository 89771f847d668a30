"""Audit reports: every section, what a role may not read, hostile payloads escaped in HTML."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replayable.audit import Actor, AuditReader, Scanner
from replayable.audit.annotations import annotate_run
from replayable.audit.render import to_html, to_markdown
from replayable.audit.report import build_report
from replayable.cli import app
from replayable.store import MemoryStore
from replayable.store.sqlite import SQLiteStore
from tests.audit_runs import llm, record, tool

ANALYST = Actor("dana", "analyst", "dana")
AUDITOR = Actor("olu", "auditor", "olu")
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>``` | **bold**'


def _story(store: MemoryStore | SQLiteStore) -> str:
    rid = record(
        store,
        [
            tool("read_contract", {"id": "C-1"}, {"text": HOSTILE}),
            tool("rules", {"jurisdiction": "GB-SCT"}, []),
            llm('{"risk": "low"}'),
            tool("file_report", {"risk": "low"}, {"ok": True}, side_effect=True),
        ],
        metadata={"contract_id": "C-1"},
    )
    Scanner(store).scan()
    annotate_run(store, ANALYST, rid, step=1, verdict="concern", note=f"saw {HOSTILE}")
    first = annotate_run(store, ANALYST, rid, step=2, verdict="concern", note="empty")
    annotate_run(
        store, ANALYST, rid, verdict="violation", note="rated low", amends=first.annotation_id
    )
    return rid


def test_report_carries_every_section() -> None:
    """Header, lineage, chain and seal, timeline with payloads of flagged and annotated
    steps only, flags, annotations with history and the access-log summary."""
    store = MemoryStore()
    rid = _story(store)
    AuditReader(store, ANALYST, channel="cli", purpose="INC-1").events(rid)
    reader = AuditReader(store, AUDITOR, purpose="quarterly audit")
    r = build_report(reader, rid)
    assert r["run"]["run_id"] == rid
    assert r["run"]["metadata"] == {"contract_id": "C-1"}
    assert r["lineage"]["root_run_id"] == rid
    assert r["chain"]["ok"] is True
    assert r["chain"]["seal"] == "sealed"
    assert "annotations intact (3)" in r["chain"]["annotations"]["message"]
    assert r["payload_steps"] == [1, 2, 3]  # annotated 1 and 2, flagged 2 and 3; not 4
    step2 = r["timeline"][1]
    assert step2["request"] == {"jurisdiction": "GB-SCT"}
    assert step2["response"] == []
    assert set(step2["marks"]) == {"empty_data_decision", "annotated"}
    assert "request" not in r["timeline"][3]
    assert [f["rule"] for f in r["flags"]] == ["empty_data_decision"]
    history = r["annotations"]["history"]
    assert [(a["verdict"], a["current"]) for a in history] == [
        ("concern", True),
        ("concern", False),
        ("violation", True),
    ]
    log = r["access_log"]
    assert log["readers"] == {"dana (analyst)": 1, "olu (auditor)": 4}
    assert [e["what"] for e in log["recent"][-4:]] == [
        ["flags"],
        ["annotations"],
        ["request", "response"],
        ["access_log"],
    ]
    assert log["recent"][-2]["steps"] == [1, 2, 3]
    assert log["recent"][-1]["purpose"] == "quarterly audit"
    assert {e.channel for e in store.access_entries(who="olu")} == {"report"}


def test_a_role_without_the_access_log_gets_the_rest() -> None:
    """An analyst's report says the access log is not available to them; the rest is there."""
    store = MemoryStore()
    rid = _story(store)
    r = build_report(AuditReader(store, ANALYST), rid)
    assert r["access_log"]["available"] is False
    assert "may not read the access log" in r["access_log"]["reason"]
    assert len(r["annotations"]["history"]) == 3
    assert "(not available: dana (role analyst) may not read the access log" in to_markdown(r)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [k for k, _ in attrs]


def test_html_escapes_hostile_payloads_and_stands_alone() -> None:
    """Payload and note text with <script>, tags and handlers comes out as text: the HTML
    has no script or img element, no event handler, and loads nothing from outside."""
    store = MemoryStore()
    rid = _story(store)
    page = to_html(build_report(AuditReader(store, AUDITOR), rid))
    parsed = _Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags
    assert "img" not in parsed.tags
    assert not [a for a in parsed.attrs if a.startswith("on")]
    assert "saw &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img" in page  # the note
    assert "&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt;" in page  # the payload (JSON)
    assert not re.search(r"(src|href)=\"?https?:", page)
    assert "default-src 'none'" in page
    assert "@media print" in page


def test_markdown_fence_survives_backticks_in_payloads() -> None:
    """A payload holding ``` is fenced with a longer fence, so it cannot end the block."""
    store = MemoryStore()
    rid = _story(store)
    text = to_markdown(build_report(AuditReader(store, AUDITOR), rid))
    assert "````json" in text
    assert "## Annotations" in text
    assert "**violation** on run" not in text  # the violation corrects step 2's note
    assert "**violation** on step 2 by dana (analyst)" in text


def test_cli_report_for_one_run_in_three_formats(tmp_path: Path) -> None:
    """``report --run R`` writes JSON, Markdown and HTML for that run, as the acting user."""
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    rid = _story(store)
    store.close()
    out = tmp_path / "reports"
    env = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}
    args = ["--store", f"sqlite:///{path}", "report", "--run", rid[:13], "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--as", "olu", "--role", "auditor"], env=env)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [f"{rid}.{x}" for x in ("html", "json", "md")]
    data = json.loads((out / f"{rid}.json").read_text())
    assert data["generated_by"]["user"] == "olu"
    assert data["flags"][0]["rule"] == "empty_data_decision"
    bad = CliRunner().invoke(app, [*args, "--format", "docx"], env=env)
    assert bad.exit_code == 2
    assert "--format 'docx' is not one of json, md, html, pdf" in bad.stderr


def _poppler(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        message = f"{tool} (Debian's poppler-utils) is not installed"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: .ci/run installs it)")
        pytest.skip(message)
    return found


def _dark_fraction(pgm: bytes) -> float:
    """The share of pixels darker than mid-grey in a binary PGM (P5) image."""
    fields = pgm.split(maxsplit=4)
    assert fields[0] == b"P5", fields[:4]
    width, height, pixels = int(fields[1]), int(fields[2]), fields[4]
    assert len(pixels) >= width * height
    return sum(1 for b in pixels[: width * height] if b < 128) / (width * height)


def test_cli_report_as_pdf_renders_its_first_page(tmp_path: Path) -> None:
    """``report --format pdf`` writes a PDF whose first page pdftoppm renders with ink on
    it, and whose text (pdftotext) is the report's: title, run id, the flag, the escaped
    hostile payload as text."""
    pdftoppm, pdftotext = _poppler("pdftoppm"), _poppler("pdftotext")
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    rid = _story(store)
    store.close()
    out = tmp_path / "reports"
    env = {"COLUMNS": "200", "REPLAYABLE_USER": "", "REPLAYABLE_ROLE": ""}
    args = ["--store", f"sqlite:///{path}", "report", "--run", rid, "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--format", "pdf", "--as", "olu"], env=env)
    assert result.exit_code == 0, result.output
    pdf = out / f"{rid}.pdf"
    assert sorted(p.name for p in out.iterdir()) == [pdf.name]
    assert pdf.read_bytes().startswith(b"%PDF-")
    assert pdf.stat().st_mode & 0o777 == 0o600
    page = subprocess.run(
        [pdftoppm, "-gray", "-r", "40", "-f", "1", "-l", "1", str(pdf)],
        capture_output=True,
        check=True,
    ).stdout
    assert 0.005 < _dark_fraction(page) < 0.5  # text on a white page: neither blank nor black
    text = subprocess.run(
        [pdftotext, "-layout", str(pdf), "-"], capture_output=True, check=True, text=True
    ).stdout
    assert f"Audit report: run {rid}" in " ".join(text.split())
    assert "empty_data_decision" in text
    assert "<script>alert(" in text  # printed as text, never run


MD_HOSTILE = "a` ![t](https://evil.example/x.png) [click](https://evil.example) <b>x</b> **b** `"


def test_markdown_shows_recorded_text_as_text() -> None:
    """Recorded names, metadata, notes and purposes in the Markdown report render as the
    text they are: no link, image, HTML or emphasis comes from them in a Markdown viewer.
    A backtick in a workflow's name ended its code span, so a stored run could put a
    tracking image or a link into the report an auditor opens."""
    from markdown_it import MarkdownIt

    store = MemoryStore()
    rid = record(
        store,
        [tool(MD_HOSTILE, {"q": MD_HOSTILE}, {"a": 1})],
        workflow=MD_HOSTILE,
        metadata={"k": MD_HOSTILE},
    )
    annotate_run(store, ANALYST, rid, step=1, verdict="concern", note=MD_HOSTILE)
    text = to_markdown(build_report(AuditReader(store, AUDITOR, purpose=MD_HOSTILE), rid))
    kinds: set[str] = set()

    def walk(tokens: list) -> None:  # type: ignore[type-arg]
        for t in tokens:
            kinds.add(t.type)
            if t.children:
                walk(t.children)

    walk(MarkdownIt("commonmark").parse(text))
    assert not kinds & {"image", "link_open", "html_inline", "html_block"}, kinds
    # The report's own emphasis is there; none from the recorded text.
    rendered = MarkdownIt("commonmark").render(text)
    assert "<strong>b</strong>" not in rendered
    assert "evil.example" in rendered  # shown, as text


def test_html_shows_reader_names_as_they_are() -> None:
    """The HTML report escapes for HTML only: a reader named with a Markdown character
    (``_``) reads as it is, with no backslash from the Markdown report's escaping."""
    store = MemoryStore()
    rid = _story(store)
    AuditReader(store, Actor("dana_x", "analyst", "dana_x"), purpose="INC-1").events(rid)
    page = to_html(build_report(AuditReader(store, AUDITOR), rid))
    assert "dana_x (analyst) ×1" in page
    assert "dana\\_x" not in page
    text = to_markdown(build_report(AuditReader(store, AUDITOR), rid))
    assert "dana\\_x (analyst) ×1" in text
