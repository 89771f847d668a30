"""Runs, events and annotations as plain dicts: what a page renders and its JSON twin returns.

Nothing here decides what a role may see; it shapes records the routes have
already read (through :class:`~replayable.audit.AuditReader`). Summaries are
the CLI's (``replayable show``), so a card reads like a timeline row.
Untrusted text stays text: templates escape it, and values longer than the
page's limit are cut here with the full length named, for "show all".
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec
import orjson

from replayable.audit.annotations import AnnotationSet
from replayable.cli.jsonview import run_to_dict
from replayable.cli.render import (
    event_mark,
    event_summary,
    format_duration,
    plain,
    run_duration,
)
from replayable.events.audit import Annotation, AnomalyFlag
from replayable.events.model import Event, Run
from replayable.integrations import _wire

__all__ = [
    "annotation_dict",
    "card",
    "clip",
    "flag_dict",
    "iso",
    "payload_view",
    "pretty",
    "run_summary",
    "tree",
    "visible",
]

#: ANSI escape sequences (colours, cursor moves): shown as visible text, never interpreted.
_ANSI: Final = re.compile(r"\x1b")


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def visible(text: str) -> str:
    """Control characters made visible (``ESC`` as ``\\x1b``) so a terminal escape
    in a payload reads as what it is."""
    text = _ANSI.sub(r"\\x1b", text)
    return "".join(
        c if c in "\n\t" or c.isprintable() or ord(c) > 0x9F else f"\\x{ord(c):02x}" for c in text
    )


def clip(text: str, limit: int) -> dict[str, Any]:
    """``text`` cut at ``limit`` characters: ``{"text", "truncated", "length"}``."""
    text = visible(text)
    if limit <= 0 or len(text) <= limit:
        return {"text": text, "truncated": False, "length": len(text)}
    return {"text": text[:limit], "truncated": True, "length": len(text)}


def pretty(value: Any) -> str:
    """A plain value as indented JSON text (strings as they are)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(
        value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str
    ).decode()


def run_summary(run: Run, event_count: int | None = None) -> dict[str, Any]:
    """A run's header for listings (the CLI's ``--json`` shape)."""
    out = run_to_dict(run, event_count=event_count)
    out["duration"] = format_duration(run_duration(run))
    out["problems"] = list(run.problems)
    return out


def annotation_dict(a: Annotation, found: AnnotationSet | None = None) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.structs.asdict(a)
    out["closes"] = list(a.closes)
    out["created"] = iso(a.created_at)
    if found is not None:
        out["current"] = a in found.current
    return out


def flag_dict(f: AnomalyFlag, closed_by: str | None = None) -> dict[str, Any]:
    return {
        "flag_id": f.flag_id,
        "rule": f.rule,
        "run_id": f.run_id,
        "workflow": f.workflow,
        "steps": list(f.steps),
        "score": f.score,
        "evidence": f.evidence,
        "created": iso(f.created_at),
        "tenant": f.tenant,
        "open": closed_by is None,
        "closed_by": closed_by,
    }


def card(
    event: Event,
    following: Event | None,
    origin: float,
    *,
    notes: Sequence[Annotation] = (),
    flags: Sequence[AnomalyFlag] = (),
) -> dict[str, Any]:
    """One timeline card: kind, name, summary, times, and the notes and flags on it."""
    if event.problems:
        summary, failed = "unreadable row: " + "; ".join(event.problems), True
    else:
        summary, failed = event_summary(event, width=160)
    gap = None
    if following is not None:
        gap = following.started_at - (event.started_at + event.duration_ns / 1e9)
    mark = event_mark(event)
    return {
        "seq": event.seq,
        "kind": event.kind,
        "name": event.name,
        "summary": visible(summary),
        "failed": failed,
        "side_effect": event.side_effect,
        "via": None if mark is None else mark.plain,
        "parent": event.parent,
        "started": iso(event.started_at),
        "at": "+" + format_duration(max(0.0, event.started_at - origin)),
        "took": format_duration(event.duration_ns / 1e9),
        "to_next": format_duration(gap) if gap is not None and gap >= 0 else None,
        "annotations": [annotation_dict(a) for a in notes],
        "flags": [{"flag_id": f.flag_id, "rule": f.rule, "score": f.score} for f in flags],
    }


def tree(text: str | None) -> Any:
    """A stored JSON text as a plain value (type tags removed); text that is not JSON as is."""
    if text is None:
        return None
    try:
        return plain(orjson.loads(text))
    except orjson.JSONDecodeError:
        return text


def _messages(name: str, request: Any, metadata: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    # Events recorded before the HTTP seam stopped copying messages into metadata
    # hold them there; later ones are read from the recorded request body.
    if "messages" in metadata:
        derived = None
    elif metadata.get("framework") == "langchain":
        derived = _wire.langchain_messages(request)
    else:
        derived = _wire.recorded_messages(name, request)
    derived_source = {"messages": derived} if derived is not None else None
    kwargs = request.get("kwargs") if isinstance(request, dict) else None
    for source in (metadata, derived_source, request, kwargs):
        if isinstance(source, dict) and isinstance(source.get("messages"), list):
            return [m for m in source["messages"] if isinstance(m, dict)]
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content]
        return "\n".join(parts)
    return "" if content is None else pretty(content)


def _answer(name: str, response: Any, metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model's answer: text and tool calls, from a chat completion, a streamed
    answer's assembled text, or an Anthropic message."""
    # Older HTTP-seam events describe the answer in metadata; later ones are read from
    # the recorded response (a stream's assembled at capture), the same normaliser.
    described = metadata.get("output")
    if described is None and metadata.get("framework") == "ag2":
        described = _wire.ag2_output(response)
    elif described is None and metadata.get("framework") == "langchain":
        described = _wire.langchain_output(response)
    elif described is None:
        described = _wire.recorded_output(name, response)
    if isinstance(described, dict):
        role = str(described.get("role") or "assistant")
        return {
            "role": role + (" (streamed)" if metadata.get("stream") else ""),
            "content": _content_text(described.get("content")),
            "tool_calls": described.get("tool_calls") or [],
        }
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        if isinstance(message, dict):
            return {
                "role": str(message.get("role") or "assistant"),
                "content": _content_text(message.get("content")),
                "tool_calls": message.get("tool_calls") or [],
            }
    if isinstance(response.get("content"), list):
        blocks = response["content"]
        text = "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))
        calls = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        return {"role": "assistant", "content": text, "tool_calls": calls}
    return None


def _conversation(event: Event, request: Any, response: Any, limit: int) -> dict[str, Any] | None:
    messages = _messages(event.name, request, event.metadata)
    if messages is None:
        return None
    params_from = request.get("kwargs", request) if isinstance(request, dict) else {}
    params = {
        k: v
        for k, v in {
            **(params_from if isinstance(params_from, dict) else {}),
            **event.metadata,
        }.items()
        if k not in ("messages", "tools", "output", "status", "chunks", "complete")
        and not isinstance(v, dict | list)
    }
    turns = [
        {
            "role": str(m.get("role", "?")),
            "content": clip(_content_text(m.get("content")), limit),
            "tool_calls": clip(pretty(m["tool_calls"]), limit) if m.get("tool_calls") else None,
        }
        for m in messages
    ]
    answer = _answer(event.name, response, event.metadata)
    if answer is not None:
        turns.append(
            {
                "role": answer["role"] + " (response)",
                "content": clip(answer["content"], limit),
                "tool_calls": clip(pretty(answer["tool_calls"]), limit)
                if answer["tool_calls"]
                else None,
            }
        )
    return {"model": params.pop("model", None), "params": params, "turns": turns}


def payload_view(event: Event, limit: int) -> dict[str, Any]:
    """An event's payloads for the expanded card: request, response, error and metadata
    as text cut at ``limit`` characters (``0``: whole), and an LLM call as a conversation."""
    request = tree(event.request)
    response = tree(event.response)
    error = tree(event.error)
    out: dict[str, Any] = {
        "seq": event.seq,
        "kind": event.kind,
        "name": event.name,
        "request": clip(pretty(request), limit),
        "response": None if event.response is None else clip(pretty(response), limit),
        "error": None if event.error is None else clip(pretty(error), limit),
        "metadata": clip(pretty(event.metadata), limit) if event.metadata else None,
        "call_site": event.call_site,
        "fingerprint": event.fingerprint,
        "hash": event.hash,
        "conversation": None,
    }
    if event.kind == "llm":
        out["conversation"] = _conversation(event, request, response, limit)
    return out


def group_notes(found: AnnotationSet | None) -> dict[int | None, list[Annotation]]:
    by: dict[int | None, list[Annotation]] = {}
    for a in [] if found is None else found.current:
        by.setdefault(a.seq, []).append(a)
    return by


def group_flags(flags: Iterable[AnomalyFlag]) -> dict[int, list[AnomalyFlag]]:
    by: dict[int, list[AnomalyFlag]] = {}
    for f in flags:
        for s in f.steps:
            by.setdefault(s, []).append(f)
    return by
