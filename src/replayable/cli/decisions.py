"""``replayable show``'s decision-context section: what each step decided under.

A run's ``recording(context=...)``, then per step: a retrieval's query and
documents (id, version, score), the tools a model was offered (name and schema
hash), a prompt template's name and version, a snapshot of external state, the
arguments a tool was given beside the validated ones, and an adapter's raw
response beside what it handed the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from replayable.cli.render import plain, short_value
from replayable.events.model import Event, Run

__all__ = ["decision_lines", "decisions_view"]


def _documents(docs: Any) -> str:
    parts = []
    for d in docs[:8] if isinstance(docs, list) else []:
        if not isinstance(d, dict):
            continue
        text = f"doc {d.get('id', '?')}"
        if d.get("version") is not None:
            text += f" {d['version']}"
        if d.get("score") is not None:
            text += f" ({d['score']})"
        parts.append(text)
    more = len(docs) - 8 if isinstance(docs, list) and len(docs) > 8 else 0
    return ", ".join(parts) + (f", … {more} more" if more else "") if parts else "no documents"


def _event_lines(event: Event) -> list[str]:
    meta = event.metadata
    out: list[str] = []
    if event.kind == "retrieval" and "documents" in meta:
        out.append(f"query {short_value(meta.get('query'), 40)} → {_documents(meta['documents'])}")
    schemas = meta.get("tool_schemas")
    if isinstance(schemas, dict) and schemas:
        out.append("tools offered: " + ", ".join(f"{n} {str(h)[7:15]}" for n, h in schemas.items()))
    if event.kind == "prompt":
        out.append(f"template {meta.get('template', event.name)} version {meta.get('version')}")
    if meta.get("snapshot"):
        out.append(f"snapshot {short_value(plain(event.response_tree()), 60)}")
    if "arguments_given" in meta:
        out.append(
            f"arguments given {short_value(plain(meta['arguments_given']), 40)} → validated "
            f"{short_value(event.request_value(), 40)}"
        )
    if "normalized" in meta:
        out.append(
            f"raw response {short_value(plain(event.response_tree()), 40)} → normalized "
            f"{short_value(plain(meta['normalized']), 40)}"
        )
    return out


def decision_lines(run: Run, events: Sequence[Event]) -> list[str]:
    """The section's lines as plain text (``context: …``, ``step N kind name: …``)."""
    lines: list[str] = []
    context = run.metadata.get("context")
    if isinstance(context, dict) and context:
        lines.append(
            "context: " + ", ".join(f"{k}={short_value(v, 40)}" for k, v in context.items())
        )
    for event in events:
        for line in _event_lines(event):
            lines.append(f"step {event.seq} {event.kind} {event.name}: {line}")
    return lines


def decisions_view(run: Run, events: Sequence[Event]) -> RenderableType | None:
    """The section for the terminal, or ``None`` when the run recorded no decision context."""
    lines = decision_lines(run, events)
    if not lines:
        return None
    return Group(Text("decision context", style="bold"), *(Text("  " + ln) for ln in lines))
