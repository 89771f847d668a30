"""What the HTTP seam knows about LLM wire formats (OpenAI, Anthropic, OpenAI-compatible).

Pure functions over parsed JSON: which boundary an HTTP request is (``llm``
with a name like ``openai.chat.completions``, or plain ``http``), the model
and sampling parameters of a request, normalized messages, usage and output
of a response, and the assembly of a server-sent event stream into the
response it amounts to. Nothing here imports an SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

__all__ = [
    "assemble_sse",
    "classify",
    "describe_request",
    "describe_response",
    "parse_sse",
    "stream_finished",
]

JSON = Any

_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stop",
    "stop_sequences",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "tool_choice",
    "response_format",
    "reasoning_effort",
    "reasoning",
    "thinking",
    "output_config",
    "stream",
)

#: (path suffix, boundary name) for OpenAI's wire format, longest suffix first.
_OPENAI_PATHS = (
    ("/chat/completions", "openai.chat.completions"),
    ("/responses", "openai.responses"),
    ("/completions", "openai.completions"),
    ("/embeddings", "openai.embeddings"),
)


def classify(method: str, path: str, headers: Mapping[str, str]) -> tuple[str, str, str | None]:
    """``(kind, name, provider)`` of a request: an ``llm`` call or a plain ``http`` one."""
    if method == "POST":
        if path.endswith("/messages") and (
            "anthropic-version" in headers or "anthropic" in headers.get("user-agent", "").lower()
        ):
            return "llm", "anthropic.messages", "anthropic"
        for suffix, name in _OPENAI_PATHS:
            if path.endswith(suffix):
                return "llm", name, "openai"
    return "http", f"{method} {path}", None


# -- requests -------------------------------------------------------------------


def _text(content: JSON) -> JSON:
    """Content parts that are all text become one string; anything else stays as sent."""
    if (
        isinstance(content, list)
        and content
        and all(
            isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
            for p in content
        )
    ):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _openai_messages(body: Mapping[str, Any]) -> list[JSON]:
    out: list[JSON] = []
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        item: dict[str, Any] = {"role": m.get("role"), "content": _text(m.get("content"))}
        calls = m.get("tool_calls")
        if calls:
            item["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments"),
                }
                for c in calls
                if isinstance(c, dict)
            ]
        if m.get("tool_call_id"):
            item["tool_call_id"] = m["tool_call_id"]
        out.append(item)
    return out


def _responses_messages(body: Mapping[str, Any]) -> list[JSON]:
    out: list[JSON] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
        return out
    for item in given or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            out.append(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": item.get("call_id"),
                            "name": item.get("name"),
                            "arguments": item.get("arguments"),
                        }
                    ],
                }
            )
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")}
            )
        else:
            out.append({"role": kind, "content": item})
    return out


def _anthropic_messages(body: Mapping[str, Any]) -> list[JSON]:
    out: list[JSON] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _text(system)})
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m.get("role"), "content": content})
            continue
        item: dict[str, Any] = {"role": m.get("role")}
        texts = []
        for block in content or ():
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                item.setdefault("tool_calls", []).append(
                    {
                        "id": block.get("id"),
                        "name": block.get("name"),
                        "arguments": block.get("input"),
                    }
                )
            elif kind == "tool_result":
                item.setdefault("tool_results", []).append(
                    {
                        "tool_call_id": block.get("tool_use_id"),
                        "content": _text(block.get("content")),
                    }
                )
            else:
                item.setdefault("blocks", []).append(block)
        item["content"] = "".join(texts)
        out.append(item)
    return out


def describe_request(name: str, provider: str | None, body: JSON) -> dict[str, Any]:
    """Metadata of an LLM request: provider, model, sampling parameters, messages, tool names."""
    meta: dict[str, Any] = {"provider": provider}
    if not isinstance(body, dict):
        return meta
    if "model" in body:
        meta["model"] = body["model"]
    for key in _SAMPLING:
        if key in body:
            meta[key] = body[key]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None:
        meta["response_format"] = fmt
    if name == "anthropic.messages":
        meta["messages"] = _anthropic_messages(body)
    elif name == "openai.responses":
        meta["messages"] = _responses_messages(body)
    elif name == "openai.chat.completions":
        meta["messages"] = _openai_messages(body)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        meta["tools"] = [_tool_name(t) for t in tools]
    return meta


def _tool_name(tool: JSON) -> JSON:
    if not isinstance(tool, dict):
        return tool
    fn = tool.get("function")
    if isinstance(fn, dict):
        return fn.get("name")
    return tool.get("name", tool.get("type"))


# -- responses ------------------------------------------------------------------


def _usage(usage: JSON) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    inp = usage.get("input_tokens", usage.get("prompt_tokens"))
    out = usage.get("output_tokens", usage.get("completion_tokens"))
    norm: dict[str, Any] = {"input_tokens": inp, "output_tokens": out}
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens", "total_tokens"):
        if usage.get(key) is not None:
            norm[key] = usage[key]
    return norm


def _chat_output(body: Mapping[str, Any]) -> dict[str, Any] | None:
    choices = body.get("choices") or ()
    if not choices or not isinstance(choices[0], dict):
        return None
    first = choices[0]
    msg = _openai_messages({"messages": [first.get("message") or {}]})
    out: dict[str, Any] = msg[0] if msg else {}
    out["finish_reason"] = first.get("finish_reason")
    return out


def _responses_output(body: Mapping[str, Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[JSON] = []
    for item in body.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            texts.append(str(_text(item.get("content")) or ""))
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "name": item.get("name"),
                    "arguments": item.get("arguments"),
                }
            )
    out: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts),
        "finish_reason": body.get("status"),
    }
    if calls:
        out["tool_calls"] = calls
    return out


def _anthropic_output(body: Mapping[str, Any]) -> dict[str, Any]:
    norm = _anthropic_messages(
        {
            "messages": [
                {"role": body.get("role", "assistant"), "content": body.get("content") or []}
            ]
        }
    )
    out: dict[str, Any] = norm[0]
    out["finish_reason"] = body.get("stop_reason")
    return out


def describe_response(name: str, body: JSON) -> dict[str, Any]:
    """Metadata of an LLM response: usage, the model that answered and the normalized output."""
    if not isinstance(body, dict):
        return {}
    meta: dict[str, Any] = {}
    usage = _usage(body.get("usage"))
    if usage is not None:
        meta["usage"] = usage
    if body.get("model"):
        meta["response_model"] = body["model"]
    output: dict[str, Any] | None = None
    if name == "openai.chat.completions":
        output = _chat_output(body)
    elif name == "openai.responses":
        output = _responses_output(body)
    elif name == "anthropic.messages":
        output = _anthropic_output(body)
    if output is not None:
        meta["output"] = output
    return meta


# -- server-sent events ------------------------------------------------------------


def parse_sse(data: bytes) -> list[tuple[str | None, JSON]]:
    """``(event, data)`` pairs of a server-sent event stream; data parsed as JSON when it is."""
    events: list[tuple[str | None, JSON]] = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        event: str | None = None
        lines: list[bytes] = []
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                lines.append(line[5:].lstrip(b" "))
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode()
        if not lines:
            continue
        raw = b"\n".join(lines)
        try:
            value: JSON = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw.decode(errors="replace")
        events.append((event, value))
    return events


def _assemble_chat(events: list[tuple[str | None, JSON]]) -> JSON:
    out: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for _, chunk in events:
        if not isinstance(chunk, dict):
            continue
        for key in ("id", "model", "created", "system_fingerprint"):
            if chunk.get(key) is not None:
                out[key] = chunk[key]
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for c in chunk.get("choices") or ():
            choice = choices.setdefault(
                c.get("index", 0),
                {
                    "index": c.get("index", 0),
                    "finish_reason": None,
                    "message": {"role": "assistant", "content": None},
                },
            )
            delta = c.get("delta") or {}
            msg = choice["message"]
            if delta.get("content"):
                msg["content"] = (msg["content"] or "") + delta["content"]
            for tc in delta.get("tool_calls") or ():
                calls = msg.setdefault("tool_calls", [])
                i = tc.get("index", 0)
                while len(calls) <= i:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                slot = calls[i]
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                choice["finish_reason"] = c["finish_reason"]
    out["object"] = "chat.completion"
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def _assemble_responses(events: list[tuple[str | None, JSON]]) -> JSON:
    text: list[str] = []
    latest: JSON = None
    for _, ev in events:
        if not isinstance(ev, dict):
            continue
        if isinstance(ev.get("response"), dict):
            latest = ev["response"]
        if ev.get("type") == "response.output_text.delta":
            text.append(str(ev.get("delta", "")))
    if isinstance(latest, dict) and latest.get("output"):
        return latest
    partial = dict(latest) if isinstance(latest, dict) else {}
    partial["output"] = [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "".join(text)}],
        }
    ]
    return partial


def _assemble_anthropic(events: list[tuple[str | None, JSON]]) -> JSON:
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, str] = {}
    for _, ev in events:
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if kind == "message_start":
            message = dict(ev.get("message") or {})
        elif kind == "content_block_start":
            blocks[ev.get("index", 0)] = dict(ev.get("content_block") or {})
        elif kind == "content_block_delta":
            i = ev.get("index", 0)
            block = blocks.setdefault(i, {"type": "text", "text": ""})
            delta = ev.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                partial_json[i] = partial_json.get(i, "") + delta.get("partial_json", "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "message_delta":
            message.update(ev.get("delta") or {})
            if ev.get("usage"):
                message["usage"] = {**(message.get("usage") or {}), **ev["usage"]}
    for i, raw in partial_json.items():
        try:
            blocks[i]["input"] = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            blocks[i]["input"] = raw
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


_ASSEMBLERS: dict[str, Callable[[list[tuple[str | None, JSON]]], JSON]] = {
    "openai.chat.completions": _assemble_chat,
    "openai.completions": _assemble_chat,
    "openai.responses": _assemble_responses,
    "anthropic.messages": _assemble_anthropic,
}


def assemble_sse(name: str, events: list[tuple[str | None, JSON]]) -> JSON:
    """The response a parsed stream amounts to (``None`` for a stream of unknown format)."""
    assemble = _ASSEMBLERS.get(name)
    if assemble is None:
        return None
    return assemble(events)


_TERMINAL = frozenset(
    {
        "[DONE]",
        "message_stop",
        "response.completed",
        "response.failed",
        "response.incomplete",
        "error",
    }
)


def stream_finished(events: list[tuple[str | None, JSON]]) -> bool:
    """Whether a stream reached its provider's final event (``[DONE]``, ``message_stop`` …)."""
    if not events:
        return False
    name, data = events[-1]
    kind = data.get("type") if isinstance(data, dict) else data
    return name in _TERMINAL or kind in _TERMINAL
