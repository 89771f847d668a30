"""Runs as OpenTelemetry spans, named by the ``gen_ai`` semantic conventions.

One trace per run tree. The root run is the root span (``invoke_agent
<workflow>``); a child run is a span under the event that started it. Each
event is a span under its causal parent (the enclosing ``span`` event, else
its run):

- ``llm`` events are ``chat <model>`` spans (``text_completion`` for a
  completions endpoint) with ``gen_ai.operation.name``, ``gen_ai.provider.name``,
  ``gen_ai.request.model`` and the sampling parameters, ``gen_ai.response.model``,
  ``gen_ai.response.id``, ``gen_ai.response.finish_reasons`` and
  ``gen_ai.usage.input_tokens`` / ``output_tokens``; the messages are span
  events (``gen_ai.system.message``, ``gen_ai.user.message``,
  ``gen_ai.assistant.message``, ``gen_ai.tool.message``, ``gen_ai.choice``).
- ``tool`` events are ``execute_tool <name>`` spans with ``gen_ai.tool.name``.
- every other kind is a span named ``<kind> <name>``.

Times are the recorded times; ids are derived from run ids and steps, so the
same run exported twice gives the same trace. What the store holds is already
redacted, and nothing else is read. ``replayable.*`` attributes carry the run
id, step, kind and fingerprint.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from replayable.events.model import Event, Run
from replayable.integrations import _wire

__all__ = [
    "event_spans",
    "parent_context",
    "run_span",
    "run_spans",
    "span_id",
    "trace_id",
]

_SCOPE: Final = InstrumentationScope("replayable", "0.1.0")
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
#: Sampling parameters named as the conventions name them.
_REQUEST_ATTRS: Final = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
#: Text longer than this is cut in message events (a span event is not a payload store).
MAX_TEXT: Final = 8192


def trace_id(root_run_id: str) -> int:
    """The trace id of a run tree: the root run's UUID, as 128 bits."""
    try:
        value = uuid.UUID(root_run_id).int
    except ValueError:
        value = int.from_bytes(hashlib.sha256(root_run_id.encode()).digest()[:16], "big")
    return value or 1


def span_id(run_id: str, seq: int | None = None) -> int:
    """A span id for a run (``seq`` ``None``) or one of its events, never 0."""
    text = run_id if seq is None else f"{run_id}#{seq}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") or 1


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _untag(tree: Any) -> Any:
    while isinstance(tree, dict) and isinstance(tree.get("$t"), str):
        if "v" in tree:
            tree = tree["v"]
        elif "t" in tree:
            tree = tree["t"]
        else:
            return None
    return tree


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return _untag(orjson.loads(text))
    except orjson.JSONDecodeError:
        return None


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def _body(request: Any) -> dict[str, Any]:
    """The request as the LLM saw it: a tool call's arguments, or an HTTP event's body."""
    if not isinstance(request, dict):
        return {}
    for key in ("body", "json", "kwargs"):
        inner = _untag(request.get(key))
        if isinstance(inner, dict) and ("messages" in inner or "model" in inner):
            return inner
    return request


def _llm(e: Event, ctx: SpanContext) -> tuple[str, dict[str, Any], list[SpanEvent]]:
    meta = e.metadata or {}
    request = _body(_json(e.request))
    response = _json(e.response)
    response = response if isinstance(response, dict) else {}
    response = _body(response) if "body" in response else response
    model = meta.get("model") or request.get("model")
    op = (
        "text_completion"
        if e.name.endswith(("completions", "completion")) and ("chat" not in e.name)
        else "chat"
    )
    attrs: dict[str, Any] = {"gen_ai.operation.name": op}
    provider = meta.get("provider") or e.name.split(".", 1)[0]
    if provider:
        attrs["gen_ai.provider.name"] = str(provider)
        attrs["gen_ai.system"] = str(provider)
    if model:
        attrs["gen_ai.request.model"] = str(model)
    for key, name in _REQUEST_ATTRS.items():
        value = meta.get(key, request.get(key))
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[name] = value
    answered = meta.get("response_model") or response.get("model")
    if answered:
        attrs["gen_ai.response.model"] = str(answered)
    if isinstance(response.get("id"), str):
        attrs["gen_ai.response.id"] = response["id"]
    usage = meta.get("usage") or response.get("usage") or {}
    if isinstance(usage, dict):
        inp = usage.get("input_tokens", usage.get("prompt_tokens"))
        out = usage.get("output_tokens", usage.get("completion_tokens"))
        if isinstance(inp, int):
            attrs["gen_ai.usage.input_tokens"] = inp
        if isinstance(out, int):
            attrs["gen_ai.usage.output_tokens"] = out
    events: list[SpanEvent] = []
    start = _ns(e.started_at)
    raw = _json(e.request)
    messages = (
        meta.get("messages")
        or _wire.recorded_messages(e.name, raw)
        or (_wire.langchain_messages(raw) if meta.get("framework") == "langchain" else None)
        or request.get("messages")
        or []
    )
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role") or "user")
        kind = role if role in ("system", "user", "assistant", "tool") else "user"
        events.append(
            SpanEvent(
                f"gen_ai.{kind}.message",
                {"gen_ai.provider.name": str(provider), "content": _text(m.get("content", ""))},
                start,
            )
        )
    choices = response.get("choices")
    finish: list[str] = []
    outputs: list[Any] = []
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict):
                outputs.append(c.get("message") or c.get("text"))
                if c.get("finish_reason"):
                    finish.append(str(c["finish_reason"]))
    else:
        # Older events describe the answer in metadata; later ones are read from the
        # recorded response (a stream's assembled one), as the HTTP seam saw it.
        answer = meta.get("output")
        if not isinstance(answer, dict):
            answer = _wire.recorded_output(e.name, _json(e.response))
        if not isinstance(answer, dict) and meta.get("framework") == "langchain":
            answer = _wire.langchain_output(_json(e.response))
        if not isinstance(answer, dict) and meta.get("framework") == "ag2":
            answer = _wire.ag2_output(_json(e.response))
        if isinstance(answer, dict):
            outputs.append(answer)
            if answer.get("finish_reason"):
                finish.append(str(answer["finish_reason"]))
    end = start + max(e.duration_ns, 0)
    for i, out in enumerate(outputs):
        content = out.get("content") if isinstance(out, dict) else out
        events.append(
            SpanEvent("gen_ai.choice", {"index": i, "message": _text(content or "")}, end)
        )
    if finish:
        attrs["gen_ai.response.finish_reasons"] = tuple(finish)
    name = f"{op} {model}" if model else op
    return name, attrs, events


def _event_span(e: Event, trace: int, parent: SpanContext, resource: Resource) -> ReadableSpan:
    ctx = SpanContext(trace, span_id(e.run_id, e.seq), False, _SAMPLED)
    attrs: dict[str, Any] = {
        "replayable.run_id": e.run_id,
        "replayable.seq": e.seq,
        "replayable.kind": e.kind,
        "replayable.fingerprint": e.fingerprint,
    }
    events: list[SpanEvent] = []
    kind = SpanKind.INTERNAL
    if e.kind == "llm":
        name, extra, events = _llm(e, ctx)
        attrs.update(extra)
        kind = SpanKind.CLIENT
    elif e.kind == "tool":
        name = f"execute_tool {e.name}"
        attrs.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": e.name,
                "gen_ai.tool.type": "function",
                "replayable.side_effect": e.side_effect,
            }
        )
    else:
        name = f"{e.kind} {e.name}"
        if e.kind == "http":
            kind = SpanKind.CLIENT
    if e.call_site:
        attrs["code.location"] = e.call_site
    status = Status(StatusCode.UNSET)
    err = e.error_value() if e.error is not None else None
    if err is not None:
        status = Status(StatusCode.ERROR, f"{err.get('type')}: {err.get('message')}"[:500])
        attrs["error.type"] = str(err.get("type"))
    start = _ns(e.started_at)
    return ReadableSpan(
        name=name,
        context=ctx,
        parent=parent,
        resource=resource,
        attributes=attrs,
        events=events,
        kind=kind,
        status=status,
        start_time=start,
        end_time=start + max(e.duration_ns, 0),
        instrumentation_scope=_SCOPE,
    )


def parent_context(run: Run, have_event: Callable[[str, int], bool]) -> SpanContext | None:
    """The span a run hangs under: the event that started it, else its parent run."""
    s = run.start
    if s.parent_run_id is None:
        return None
    trace = trace_id(s.root_run_id)
    if s.parent_seq is not None and have_event(s.parent_run_id, s.parent_seq):
        return SpanContext(trace, span_id(s.parent_run_id, s.parent_seq), False, _SAMPLED)
    return SpanContext(trace, span_id(s.parent_run_id), False, _SAMPLED)


def run_span(
    run: Run, events: Sequence[Event], parent: SpanContext | None, resource: Resource
) -> ReadableSpan:
    """The span of one run: its workflow, outcome and recorded start and end."""
    s = run.start
    trace = trace_id(s.root_run_id)
    last = max((e.started_at + e.duration_ns / 1e9 for e in events), default=s.started_at)
    ended = run.end.ended_at if run.end is not None else last
    status = Status(StatusCode.UNSET)
    if run.status == "failed":
        err = _json(run.end.error) if run.end is not None else None
        message = f"{err.get('type')}: {err.get('message')}" if isinstance(err, dict) else ""
        status = Status(StatusCode.ERROR, message[:500])
    return ReadableSpan(
        name=f"invoke_agent {s.workflow}",
        context=SpanContext(trace, span_id(run.run_id), False, _SAMPLED),
        parent=parent,
        resource=resource,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": s.workflow,
            "gen_ai.agent.id": run.run_id,
            "replayable.run_id": run.run_id,
            "replayable.workflow": s.workflow,
            "replayable.status": run.status,
            "replayable.entrypoint": s.entrypoint,
        },
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=_ns(s.started_at),
        end_time=_ns(max(ended, s.started_at)),
        instrumentation_scope=_SCOPE,
    )


def event_spans(run: Run, events: Sequence[Event], resource: Resource) -> list[ReadableSpan]:
    """The spans of ``run``'s events, each under its causal parent."""
    trace = trace_id(run.start.root_run_id)
    seqs = {e.seq for e in events}
    out: list[ReadableSpan] = []
    for e in events:
        if e.problems:
            continue
        p = e.parent if e.parent in seqs else None
        pid = span_id(e.run_id, p) if p is not None else span_id(e.run_id)
        out.append(_event_span(e, trace, SpanContext(trace, pid, False, _SAMPLED), resource))
    return out


def run_spans(
    runs: Iterable[Run], events: Mapping[str, list[Event]], resource: Resource
) -> list[ReadableSpan]:
    """The spans of one run tree (root run first in ``runs``), parents before children."""
    ordered = list(runs)
    present = {r.run_id for r in ordered}
    have = {(e.run_id, e.seq) for evs in events.values() for e in evs}
    spans: list[ReadableSpan] = []
    for run in ordered:
        evs = events.get(run.run_id, [])
        parent = (
            parent_context(run, lambda r, q: (r, q) in have)
            if run.parent_run_id in present
            else None
        )
        spans.append(run_span(run, evs, parent, resource))
        spans.extend(event_spans(run, evs, resource))
    return spans
