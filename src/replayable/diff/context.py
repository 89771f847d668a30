"""The decision context of two aligned steps, compared: what the request and response
alone do not name.

- a retrieval's documents, matched by id: "document 17 changed from v2 to v3";
- the tools offered to a model, by name and schema hash: "the schema of tool
  get_weather changed";
- a prompt template's version;
- what an adapter (``@tool(normalize=...)``) made of the same raw response;
- a run's ``recording(context={...})``: flags, tenant configuration, permissions.
"""

from __future__ import annotations

from typing import Any

from replayable.diff.compare import Comparer, FieldChange
from replayable.events.model import Event, Run

__all__ = ["describe_change", "run_context_changes", "step_context_changes"]

_MISSING = "<missing>"


def _documents(event: Event) -> dict[str, dict[str, Any]]:
    docs = event.metadata.get("documents")
    if not isinstance(docs, list):
        return {}
    return {str(d["id"]): d for d in docs if isinstance(d, dict) and d.get("id") is not None}


def _document_changes(a: Event, b: Event) -> list[FieldChange]:
    old, new = _documents(a), _documents(b)
    out: list[FieldChange] = []
    for doc_id in [*old, *(k for k in new if k not in old)]:
        if doc_id not in new:
            out.append(FieldChange("document", doc_id, "retrieved", "not retrieved", "structural"))
        elif doc_id not in old:
            out.append(FieldChange("document", doc_id, "not retrieved", "retrieved", "structural"))
        else:
            before, after = old[doc_id].get("version"), new[doc_id].get("version")
            if before != after:
                out.append(
                    FieldChange("document", f"{doc_id}.version", before, after, "structural")
                )
            if old[doc_id].get("score") != new[doc_id].get("score"):
                out.append(
                    FieldChange(
                        "document",
                        f"{doc_id}.score",
                        old[doc_id].get("score"),
                        new[doc_id].get("score"),
                        "text",
                    )
                )
    return out


def _schema_changes(a: Event, b: Event) -> list[FieldChange]:
    old, new = a.metadata.get("tool_schemas"), b.metadata.get("tool_schemas")
    if not isinstance(old, dict) or not isinstance(new, dict) or old == new:
        if isinstance(old, dict) != isinstance(new, dict):
            return [FieldChange("tool_schema", "", old, new, "structural")]
        return []
    out: list[FieldChange] = []
    for name in [*old, *(k for k in new if k not in old)]:
        if old.get(name) != new.get(name):
            out.append(
                FieldChange(
                    "tool_schema",
                    name,
                    old.get(name, _MISSING),
                    new.get(name, _MISSING),
                    "structural",
                )
            )
    return out


def step_context_changes(comparer: Comparer, a: Event, b: Event) -> list[FieldChange]:
    """What differs in the decision context recorded with two aligned steps."""
    out = _document_changes(a, b) if a.kind == "retrieval" or b.kind == "retrieval" else []
    out += _schema_changes(a, b)
    if a.kind == "prompt" and a.metadata.get("version") != b.metadata.get("version"):
        out.append(
            FieldChange(
                "prompt",
                "version",
                a.metadata.get("version"),
                b.metadata.get("version"),
                "structural",
            )
        )
    if "normalized" in a.metadata or "normalized" in b.metadata:
        out += comparer.compare(
            "normalized", a.metadata.get("normalized"), b.metadata.get("normalized")
        )
    return out


def run_context_changes(comparer: Comparer, left: Run, right: Run) -> list[FieldChange]:
    """What differs in the ``recording(context=...)`` of two runs."""
    old, new = left.metadata.get("context"), right.metadata.get("context")
    if old == new:
        return []
    return comparer.compare("context", old, new)


def describe_change(change: FieldChange) -> str | None:
    """A sentence for a decision-context change, or ``None`` for an ordinary field."""
    if change.side == "document":
        doc_id, _, what = change.path.partition(".")
        if what == "version":
            return f"document {doc_id} changed from {change.old} to {change.new}"
        if what == "score":
            return f"document {doc_id} scored {change.new} instead of {change.old}"
        return f"document {doc_id} {change.new} (was {change.old})"
    if change.side == "tool_schema":
        if not change.path:
            return "the tools offered to the model changed"
        if change.old == _MISSING:
            return f"tool {change.path} offered to the model"
        if change.new == _MISSING:
            return f"tool {change.path} no longer offered to the model"
        return f"the schema of tool {change.path} changed"
    if change.side == "prompt":
        return f"prompt template version changed from {change.old} to {change.new}"
    if change.side == "normalized":
        where = f" {change.path}" if change.path else ""
        return (
            f"the adapter's normalized result{where} changed from {change.old!r} to {change.new!r}"
        )
    if change.side == "context":
        return f"run context {change.path} changed from {change.old!r} to {change.new!r}"
    return None
