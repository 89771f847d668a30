"""Server-sent event streams: parsing, and the response a stream amounts to.

A recorded LLM stream is stored as the bytes received; alongside it the seam
stores the response those events assemble into (what the SDK's non-streaming
call would have returned) and whether the stream reached its provider's
final event. :func:`read_sse` computes both in one pass: each event is
parsed and folded into the assembly, then dropped, so a long stream never
holds all of its parsed events at once (which would also make the cyclic
garbage collector scan them over and over).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

__all__ = ["iter_sse", "read_sse"]

JSON = Any
Events = Iterable[tuple[str | None, JSON]]


def iter_sse(data: bytes) -> Iterator[tuple[str | None, JSON]]:
    """``(event, data)`` pairs of a server-sent event stream; data parsed as JSON when it is."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    blocks = data.split(b"\n\n")
    # When the separators hold every newline, each event is one line (OpenAI's
    # ``data: {...}``) and needs no splitting into lines.
    one_line = data.count(b"\n") == 2 * (len(blocks) - 1)
    loads = orjson.loads
    for block in blocks:
        event: str | None = None
        if one_line:
            if not block.startswith(b"data:"):
                continue
            raw = block[5:].lstrip(b" ")
        else:
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
            value: JSON = loads(raw)
        except orjson.JSONDecodeError:
            value = raw.decode(errors="replace")
        yield event, value


def read_sse(name: str, data: bytes) -> tuple[JSON, bool]:
    """What the stream ``data`` of boundary ``name`` amounts to, and whether it is finished.

    The first is the assembled response (``None`` when the stream holds no
    event or ``name`` has no known stream format); the second whether the
    last event is its provider's final one (``[DONE]``, ``message_stop`` …).
    """
    last: tuple[str | None, JSON] | None = None

    def events() -> Iterator[tuple[str | None, JSON]]:
        nonlocal last
        for item in iter_sse(data):
            last = item
            yield item

    assemble = _ASSEMBLERS.get(name)
    if assemble is None:
        tail = deque(iter_sse(data), maxlen=1)
        return None, bool(tail) and _final(tail[0])
    assembled = assemble(events())
    if last is None:
        return None, False
    return assembled, _final(last)


# -- assembly ---------------------------------------------------------------------

_CHAT_FIELDS = ("id", "model", "created", "system_fingerprint")


def _assemble_chat(events: Events) -> JSON:
    out: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    texts: dict[int, list[str]] = {}  # content pieces of each choice, joined once at the end
    for _, chunk in events:
        if not isinstance(chunk, dict):
            continue
        for key in _CHAT_FIELDS:
            value = chunk.get(key)
            if value is not None:
                out[key] = value
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for c in chunk.get("choices") or ():
            index = c.get("index", 0)
            choice = choices.get(index)
            if choice is None:
                choice = choices[index] = {
                    "index": index,
                    "finish_reason": None,
                    "message": {"role": "assistant", "content": None},
                }
                texts[index] = []
            delta = c.get("delta") or {}
            content = delta.get("content")
            if content:
                texts[index].append(content)
            calls = delta.get("tool_calls")
            if calls:
                _add_tool_calls(choice["message"], calls)
            if c.get("finish_reason"):
                choice["finish_reason"] = c["finish_reason"]
    for index, pieces in texts.items():
        if pieces:
            choices[index]["message"]["content"] = "".join(pieces)
    out["object"] = "chat.completion"
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def _add_tool_calls(msg: dict[str, Any], deltas: list[Any]) -> None:
    calls = msg.setdefault("tool_calls", [])
    for tc in deltas:
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


def _assemble_responses(events: Events) -> JSON:
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


def _assemble_anthropic(events: Events) -> JSON:
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


_ASSEMBLERS: dict[str, Callable[[Events], JSON]] = {
    "openai.chat.completions": _assemble_chat,
    "openai.completions": _assemble_chat,
    "openai.responses": _assemble_responses,
    "anthropic.messages": _assemble_anthropic,
}


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


def _final(event: tuple[str | None, JSON]) -> bool:
    name, data = event
    kind = data.get("type") if isinstance(data, dict) else data
    return name in _TERMINAL or kind in _TERMINAL
