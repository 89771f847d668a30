"""An audit report (the dict of :func:`~replayable.audit.report.build_report`) as Markdown,
as one self-contained HTML file that prints well, or as that HTML printed to PDF.

Payloads are untrusted text (a prompt may carry ``<script>``): the HTML
escapes every value it prints, has no script, and loads nothing from outside
(a Content-Security-Policy says so to the browser too).
"""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import orjson

__all__ = ["to_html", "to_markdown", "to_pdf"]


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "—"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def _unavailable(section: Any) -> str | None:
    if isinstance(section, dict) and section.get("available") is False:
        return str(section.get("reason", "not available"))
    return None


def _fence(text: str) -> str:
    # A payload holding ``` must not close the fence early.
    ticks = "`" * max(3, _max_backticks(text) + 1)
    return f"{ticks}json\n{text}\n{ticks}"


def _max_backticks(text: str) -> int:
    best = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        best = max(best, run)
    return best


#: What CommonMark reads as markup inside a line (these values never start one): each
#: is written with a backslash.
_MD_SPECIAL = frozenset("\\`*_[]<>!|~&")


def _md_text(text: Any) -> str:
    """Recorded text (a name, a note, a purpose) as Markdown that shows it as it is: no
    emphasis, link, image, HTML or heading can come from it, and it stays on one line."""
    out = []
    for ch in " ".join(str(text).split()):
        if ch in _MD_SPECIAL:
            out.append("\\" + ch)
        elif ch < " " or "\x7f" <= ch <= "\x9f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _md_code(text: Any) -> str:
    """Recorded text in a code span, delimited by more backticks than it holds (one line)."""
    value = " ".join(str(text).split())
    ticks = "`" * (_max_backticks(value) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or not value.strip() else ""
    return f"{ticks}{pad}{value}{pad}{ticks}"


def to_markdown(r: dict[str, Any]) -> str:
    """The report as Markdown."""
    run, chain, lin = r["run"], r["chain"], r["lineage"]
    out = [
        f"# Audit report: run {_md_text(run['run_id'])}",
        "",
        f"- Workflow: {_md_code(run['workflow'])} ({_md_text(run['entrypoint'])}), "
        f"status **{_md_text(run['status'])}**",
        f"- Started: {_when(run['started_at'])}; ended: {_when(run['ended_at'])}",
        f"- Metadata: {_md_code(orjson.dumps(run['metadata']).decode())}",
        f"- Hash chain: {chain['message']}; {chain['seal']}",
    ]
    notes_chain = chain.get("annotations", {})
    if "message" in notes_chain:
        out.append(f"- Annotation chain: {notes_chain['message']}")
    if r.get("query"):
        out.append(f"- Query: {_md_code(r['query'])}")
    by = r["generated_by"]
    out.append(
        f"- Generated {_when(r['generated_at'])} by {_md_text(by['user'])} ({by['role']})"
        + (f" for: {_md_text(by['purpose'])}" if by.get("purpose") else "")
    )
    out += [
        "",
        "## Lineage",
        "",
        f"- Parent: {_md_text(lin['parent_run_id'] or '—')}"
        + (f" (step {lin['parent_seq']})" if lin["parent_seq"] else ""),
        f"- Root: {_md_text(lin['root_run_id'])}",
        f"- Children: {_md_text(', '.join(lin['children']) or '—')}",
        f"- Lineage: {_md_code(orjson.dumps(lin['lineage']).decode())}",
        "",
        "## Timeline",
        "",
        "| seq | kind | name | at (UTC) | ms | marks |",
        "|---:|---|---|---|---:|---|",
    ]
    for e in r["timeline"]:
        marks = ", ".join(f"**{m}**" for m in e["marks"]) or ("error" if e["failed"] else "")
        out.append(
            f"| {e['seq']} | {e['kind']} | {_md_text(e['name'])} | {_when(e['started_at'])} | "
            f"{e['duration_ms']:.1f} | {marks} |"
        )
    out += ["", "## Steps shown in full", ""]
    shown = [e for e in r["timeline"] if "request" in e]
    if not shown:
        out.append("(none: no step matched, was flagged or was annotated)")
    for e in shown:
        out += [f"### Step {e['seq']}: {e['kind']} {_md_code(e['name'])}", "", "Request:", ""]
        out += [_fence(_json(e["request"])), ""]
        label, value = (
            ("Error", e["error"]) if e["error"] is not None else ("Response", e["response"])
        )
        out += [f"{label}:", "", _fence(_json(value)), ""]
    out += ["## Anomaly flags", ""]
    reason = _unavailable(r["flags"])
    if reason:
        out.append(f"(not available: {reason})")
    elif not r["flags"]:
        out.append("(none)")
    for f in r["flags"] if not reason else []:
        state = "open" if f["open"] else f"closed by {f['closed_by']}"
        out.append(
            f"- **{_md_text(f['rule'])}** at steps {', '.join(map(str, f['steps'])) or '—'}, "
            f"score {f['score']:g}, {_md_text(state)}: "
            f"{_md_code(orjson.dumps(f['evidence']).decode())}"
        )
    out += ["", "## Annotations", ""]
    reason = _unavailable(r["annotations"])
    if reason:
        out.append(f"(not available: {reason})")
    elif not r["annotations"]["history"]:
        out.append("(none)")
    for a in [] if reason else r["annotations"]["history"]:
        where = "run" if a["seq"] is None else f"step {a['seq']}"
        verdict = "retracted" if a["retract"] else a["verdict"]
        state = "current" if a["current"] else "superseded"
        extra = f", amends {a['amends']}" if a["amends"] else ""
        policy = f", policy {a['policy']}" if a["policy"] else ""
        out.append(
            f"- **{_md_text(verdict)}** on {where} by {_md_text(a['author'])} ({a['role']}), "
            f"{_when(a['created_at'])}{_md_text(policy + extra)} \\[{state}\\]: "
            f"{_md_text(a['note'])}"
        )
    out += ["", "## Access log", ""]
    log = r["access_log"]
    reason = _unavailable(log)
    if reason:
        out.append(f"(not available: {reason})")
    else:
        readers = ", ".join(f"{_md_text(k)} ×{v}" for k, v in log["readers"].items()) or "—"
        out.append(f"- {log['reads']} read(s) of this run by {readers}")
        out.append(f"- First {_when(log['first_at'])}, last {_when(log['last_at'])}")
        for e in log["recent"]:
            purpose = f" for {_md_text(e['purpose'])}" if e["purpose"] else ""
            out.append(
                f"  - {_when(e['at'])} {_md_text(e['user'])} ({e['role']}) via "
                f"{_md_text(e['channel'])}{purpose}: {_md_text(', '.join(e['what']))}"
            )
    return "\n".join(out) + "\n"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:60em;
color:#111;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ccc;padding:.2em .4em;
text-align:left;vertical-align:top}th{background:#f3f3f3}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.5em;white-space:pre-wrap;
word-break:break-all;font-size:12px}
.mark{font-weight:600}.bad{color:#a00}.ok{color:#070}.dim{color:#666}
.violation{color:#a00;font-weight:600}.concern{color:#a60}.needs-review{color:#06a}
section.step{page-break-inside:avoid}
@media print{body{margin:0;max-width:none;font-size:11px}a{color:inherit}
h2{page-break-after:avoid}tr{page-break-inside:avoid}}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _pre(value: Any) -> str:
    return f"<pre>{_e(_json(value))}</pre>"


def to_html(r: dict[str, Any]) -> str:
    """The report as one HTML document: no script, no outside resource, every value escaped."""
    run, chain, lin = r["run"], r["chain"], r["lineage"]
    ok = "ok" if chain["ok"] else "bad"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>Audit report: run {_e(run['run_id'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Audit report: run {_e(run['run_id'])}</h1>",
        "<table>",
    ]
    rows = [
        ("Workflow", f"{run['workflow']} ({run['entrypoint']})"),
        ("Status", run["status"]),
        ("Started", _when(run["started_at"])),
        ("Ended", _when(run["ended_at"])),
        ("Metadata", orjson.dumps(run["metadata"]).decode()),
        ("Tenant", run["tenant"] or "—"),
        ("Query", r.get("query") or "—"),
        (
            "Generated",
            f"{_when(r['generated_at'])} by {r['generated_by']['user']} "
            f"({r['generated_by']['role']})"
            + (f" for: {r['generated_by']['purpose']}" if r["generated_by"].get("purpose") else ""),
        ),
    ]
    parts += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows]
    annotation_chain = chain.get("annotations", {}).get("message", "not available")
    parts += [
        f'<tr><th>Hash chain</th><td class="{ok}">{_e(chain["message"])}; '
        f"{_e(chain['seal'])}<br>{_e(annotation_chain)}</td></tr>",
        "</table>",
        "<h2>Lineage</h2><table>",
        f"<tr><th>Parent</th><td>{_e(lin['parent_run_id'] or '—')}"
        + (f" (step {_e(lin['parent_seq'])})" if lin["parent_seq"] else "")
        + "</td></tr>",
        f"<tr><th>Root</th><td>{_e(lin['root_run_id'])}</td></tr>",
        f"<tr><th>Children</th><td>{_e(', '.join(lin['children']) or '—')}</td></tr>",
        f"<tr><th>Lineage</th><td>{_e(orjson.dumps(lin['lineage']).decode())}</td></tr>",
        "</table>",
        "<h2>Timeline</h2><table><tr><th>seq</th><th>kind</th><th>name</th>"
        "<th>at (UTC)</th><th>ms</th><th>marks</th></tr>",
    ]
    for e in r["timeline"]:
        marks = ", ".join(e["marks"]) or ("error" if e["failed"] else "")
        parts.append(
            f"<tr><td>{e['seq']}</td><td>{_e(e['kind'])}</td><td>{_e(e['name'])}</td>"
            f"<td>{_e(_when(e['started_at']))}</td><td>{e['duration_ms']:.1f}</td>"
            f'<td class="mark">{_e(marks)}</td></tr>'
        )
    parts.append("</table><h2>Steps shown in full</h2>")
    shown = [e for e in r["timeline"] if "request" in e]
    if not shown:
        parts.append('<p class="dim">None: no step matched, was flagged or was annotated.</p>')
    for e in shown:
        parts.append(
            f'<section class="step"><h3>Step {e["seq"]}: {_e(e["kind"])} {_e(e["name"])}</h3>'
            f"<p>Request</p>{_pre(e['request'])}"
        )
        if e["error"] is not None:
            parts.append(f'<p class="bad">Error</p>{_pre(e["error"])}</section>')
        else:
            parts.append(f"<p>Response</p>{_pre(e['response'])}</section>")
    parts.append("<h2>Anomaly flags</h2>")
    reason = _unavailable(r["flags"])
    if reason:
        parts.append(f'<p class="dim">Not available: {_e(reason)}</p>')
    elif not r["flags"]:
        parts.append('<p class="dim">None.</p>')
    else:
        parts.append(
            "<table><tr><th>rule</th><th>steps</th><th>score</th><th>state</th>"
            "<th>evidence</th></tr>"
        )
        for f in r["flags"]:
            state = "open" if f["open"] else f"closed by {f['closed_by']}"
            parts.append(
                f"<tr><td>{_e(f['rule'])}</td><td>{_e(', '.join(map(str, f['steps'])))}</td>"
                f"<td>{f['score']:g}</td><td>{_e(state)}</td><td>{_pre(f['evidence'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Annotations</h2>")
    reason = _unavailable(r["annotations"])
    history = [] if reason else r["annotations"]["history"]
    if reason:
        parts.append(f'<p class="dim">Not available: {_e(reason)}</p>')
    elif not history:
        parts.append('<p class="dim">None.</p>')
    else:
        parts.append(
            "<table><tr><th>verdict</th><th>on</th><th>by</th><th>when</th><th>policy</th>"
            "<th>note</th><th>state</th></tr>"
        )
        for a in history:
            verdict = "retracted" if a["retract"] else a["verdict"]
            state = "current" if a["current"] else "superseded"
            if a["amends"]:
                state += f" (amends {a['amends']})"
            where = "run" if a["seq"] is None else f"step {a['seq']}"
            parts.append(
                f'<tr><td class="{_e(verdict)}">{_e(verdict)}</td><td>{_e(where)}</td>'
                f"<td>{_e(a['author'])} ({_e(a['role'])})</td>"
                f"<td>{_e(_when(a['created_at']))}</td><td>{_e(a['policy'] or '—')}</td>"
                f"<td>{_e(a['note'])}</td><td>{_e(state)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Access log</h2>")
    log = r["access_log"]
    reason = _unavailable(log)
    if reason:
        parts.append(f'<p class="dim">Not available: {_e(reason)}</p>')
    else:
        readers = ", ".join(f"{k} ×{v}" for k, v in log["readers"].items()) or "—"
        parts.append(f"<p>{log['reads']} read(s) of this run by {_e(readers)}.</p>")
        parts.append(
            "<table><tr><th>when</th><th>who</th><th>via</th><th>what</th><th>purpose</th></tr>"
        )
        for e in log["recent"]:
            parts.append(
                f"<tr><td>{_e(_when(e['at']))}</td><td>{_e(e['user'])} ({_e(e['role'])})</td>"
                f"<td>{_e(e['channel'])}</td><td>{_e(', '.join(e['what']))}</td>"
                f"<td>{_e(e['purpose'] or '')}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def to_pdf(r: dict[str, Any]) -> bytes:
    """The HTML report printed to PDF by WeasyPrint (the ``pdf`` extra), with its print
    styles; nothing is fetched from outside while rendering."""
    try:
        import weasyprint
    except ImportError:  # pragma: no cover - the pdf extra is part of dev
        from replayable.errors import ConfigurationError

        raise ConfigurationError(
            "PDF reports need WeasyPrint: pip install 'replayable[pdf]'"
        ) from None
    fetcher = weasyprint.URLFetcher(allowed_protocols=())
    pdf = weasyprint.HTML(string=to_html(r), url_fetcher=fetcher).write_pdf()
    assert isinstance(pdf, bytes)
    return pdf
