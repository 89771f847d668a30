"""What the HTTP seam knows about LLM wire formats (OpenAI, Anthropic, OpenAI-compatible).

Pure functions over parsed JSON: which boundary an HTTP request is (``llm``
with a name like ``openai.chat.completions``, or plain ``http``), the model
and sampling parameters of a request, normalized messages, usage and output
of a response. Streams are in :mod:`~replayable.integrations._sse`. Nothing
here imports an SDK.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from replayable.events.canonical import canonical

__all__ = [
    "ag2_output",
    "classify",
    "describe_request",
    "describe_response",
    "langchain_messages",
    "langchain_output",
    "recorded_messages",
    "recorded_output",
    "request_messages",
    "response_output",
    "tool_schemas",
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


def classify(method: str, path: str, anthropic: bool) -> tuple[str, str, str | None]:
    """``(kind, name, provider)`` of a request: an ``llm`` call or a plain ``http`` one.

    ``anthropic``: the request names Anthropic (an ``anthropic-version``
    header or an Anthropic user agent), which tells its ``/messages`` apart.
    """
    if method == "POST":
        if anthropic and path.endswith("/messages"):
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


def request_messages(name: str, body: JSON) -> list[JSON] | None:
    """The normalized messages of an LLM request body (``None``: not a chat wire format)."""
    if not isinstance(body, dict):
        return None
    if name == "anthropic.messages":
        return _anthropic_messages(body)
    if name == "openai.responses":
        return _responses_messages(body)
    if name == "openai.chat.completions":
        return _openai_messages(body)
    return None


def describe_request(name: str, provider: str | None, body: JSON) -> dict[str, Any]:
    """Metadata of an LLM request: provider, model, sampling parameters, tool names.

    No message text: metadata is stored in clear beside payloads that may be
    encrypted and shredded, so the conversation is read from the recorded
    request (:func:`recorded_messages`), never copied here.
    """
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
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        meta["tools"] = [_tool_name(t) for t in tools]
        meta["tool_schemas"] = tool_schemas(tools)
    return meta


def tool_schemas(tools: list[JSON]) -> dict[str, str]:
    """Each tool offered to the model, by name, with a hash of its whole definition
    (description and parameter schema), so a changed schema is seen as such."""
    out: dict[str, str] = {}
    for i, tool in enumerate(tools):
        name = _tool_name(tool)
        key = name if isinstance(name, str) and name not in out else f"{name}#{i}"
        out[key] = "sha256:" + hashlib.sha256(canonical(tool)).hexdigest()[:16]
    return out


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


def response_output(name: str, body: JSON) -> dict[str, Any] | None:
    """The normalized answer (role, text, tool calls, finish reason) of an LLM response
    body, a stream's assembled one included (``None``: not a chat wire format)."""
    if not isinstance(body, dict):
        return None
    if name == "openai.chat.completions":
        return _chat_output(body)
    if name == "openai.responses":
        return _responses_output(body)
    if name == "anthropic.messages":
        return _anthropic_output(body)
    return None


def describe_response(name: str, body: JSON) -> dict[str, Any]:
    """Metadata of an LLM response: usage and the model that answered.

    No answer text (see :func:`describe_request`); :func:`recorded_output`
    reads it from the recorded response.
    """
    if not isinstance(body, dict):
        return {}
    meta: dict[str, Any] = {}
    usage = _usage(body.get("usage"))
    if usage is not None:
        meta["usage"] = usage
    if body.get("model"):
        meta["response_model"] = body["model"]
    return meta


# -- reading recorded values ----------------------------------------------------


def recorded_messages(name: str, request: JSON) -> list[JSON] | None:
    """The normalized messages of a recorded HTTP-seam request value (its ``body``)."""
    if not isinstance(request, dict):
        return None
    return request_messages(name, request.get("body"))


def recorded_output(name: str, response: JSON) -> dict[str, Any] | None:
    """The normalized answer of a recorded HTTP-seam response value: its ``body``, or
    for a stream the response assembled from its chunks at capture (``assembled``)."""
    if not isinstance(response, dict):
        return None
    body = response.get("assembled") if "stream" in response else response.get("body")
    return response_output(name, body)


# -- LangChain's recorded values ----------------------------------------------------------


def _langchain_message(m: JSON) -> dict[str, Any] | None:
    """One message as LangChain's ``message_to_dict`` records it (``{"type", "data"}``),
    normalized like the wire formats' (role, content, tool calls)."""
    if not isinstance(m, dict) or not isinstance(m.get("data"), dict):
        return None
    data = m["data"]
    out: dict[str, Any] = {"role": m.get("type", "?"), "content": data.get("content")}
    calls = data.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {"name": c.get("name"), "args": c.get("args")} for c in calls if isinstance(c, dict)
        ]
    if data.get("tool_call_id"):
        out["tool_call_id"] = data["tool_call_id"]
    return out


def langchain_messages(request: JSON) -> list[JSON] | None:
    """The normalized messages of a recorded LangChain model request."""
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return None
    found = [_langchain_message(m) for m in request["messages"]]
    return [m for m in found if m is not None]


def langchain_output(response: JSON) -> dict[str, Any] | None:
    """The normalized answer of a recorded LangChain model result (its first generation)."""
    if not isinstance(response, dict):
        return None
    generations = response.get("generations")
    if not isinstance(generations, list) or not generations:
        return None
    first = generations[0]
    return _langchain_message(first.get("message")) if isinstance(first, dict) else None


# -- AG2's recorded values -----------------------------------------------------------------


def _untag(node: JSON) -> JSON:
    """A recorded object's fields: the codec's type tags (``$t``, ``v``, ``fields``) peeled."""
    while isinstance(node, dict):
        if "$t" in node and "v" in node:
            node = node["v"]
        elif set(node) == {"cls", "fields"} and isinstance(node["fields"], dict):
            node = node["fields"]
        else:
            break
    return node


def ag2_output(response: JSON) -> dict[str, Any] | None:
    """The normalized answer of a recorded AG2 ``ModelResponse`` (its tagged JSON tree)."""
    fields = _untag(response)
    if not isinstance(fields, dict) or "finish_reason" not in fields:
        return None
    message = _untag(fields.get("message"))
    if isinstance(message, dict):
        content = _untag(message.get("content", message.get("text")))
    else:
        content = message
    out: dict[str, Any] = {"role": "assistant", "content": content}
    calls = _untag(fields.get("tool_calls"))
    listed = _untag(calls.get("calls")) if isinstance(calls, dict) else None
    if isinstance(listed, list) and listed:
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
            for c in map(_untag, listed)
            if isinstance(c, dict)
        ]
    out["finish_reason"] = fields.get("finish_reason")
    return out
