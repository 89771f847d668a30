"""A local fake LLM provider on 127.0.0.1: OpenAI and Anthropic wire formats, JSON and SSE.

The "model" is a script: when the request offers tools and holds no tool
result yet, it calls the first tool with ``{"city": <last word of the last
user message>}``; otherwise it answers ``"Answer: <last user or tool
text>"``. Streaming responses send one server-sent event per HTTP chunk
(chunked transfer encoding, keep-alive), so clients see real chunk
boundaries: chat-completion chunks with split tool-call arguments, the
Responses API's item, content-part, text and function-call-argument events
(``added``, ``delta``, ``done``) and ``response.completed``, and Anthropic's
message and content-block events with ``input_json_delta`` for tool use.
``fail_next`` makes the next requests fail with those statuses (for retry
tests); ``chunks`` (or a model named ``chunks-<n>``) fixes how many text chunks
an answer has. ``replay_hits`` lists the requests that arrived
while a pure replay was running in this process: there must be none.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

__all__ = ["FakeProvider"]


def _last_text(messages: list[Any]) -> tuple[str, bool]:
    """The text the script answers to, and whether it is a tool result."""
    for m in reversed(messages):
        role = m.get("role") or m.get("type")
        content = m.get("content", m.get("output"))
        if role in ("tool", "function_call_output"):
            return str(content), True
        if isinstance(content, list):
            for block in content:
                if block.get("type") == "tool_result":
                    inner = block.get("content")
                    text = (
                        inner
                        if isinstance(inner, str)
                        else " ".join(b.get("text", "") for b in inner or [])
                    )
                    return text, True
            texts = [b.get("text", "") for b in content if "text" in b]
            if role == "user" and texts:
                return " ".join(texts), False
        elif role == "user":
            return str(content), False
    return "", False


class _Script:
    def __init__(
        self, provider: FakeProvider, messages: list[Any], tools: list[Any], model: str = ""
    ) -> None:
        text, after_tool = _last_text(messages)
        self.tool: str | None = None
        self.args: dict[str, Any] = {}
        if tools and not after_tool:
            first = tools[0]
            self.tool = (first.get("function") or {}).get("name") or first.get("name")
            self.args = {"city": text.split()[-1] if text.split() else ""}
        chunks = int(model[7:]) if model.startswith("chunks-") else provider.chunks
        if chunks is not None:
            self.pieces = [f"w{i} " for i in range(chunks)]
        else:
            words = f"Answer: {text}".split(" ")
            self.pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
        self.text = "".join(self.pieces)
        self.usage_in = sum(len(str(m)) for m in messages) // 4
        self.usage_out = len(self.pieces)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, delayed ACKs
        # add tens of milliseconds to every response.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        provider = self.server.provider
        provider.note_hit(self.path)
        body = orjson.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        provider.requests.append(
            {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        if provider.fail_next:
            status = provider.fail_next.pop(0)
            self._json(status, {"error": {"type": "server_error", "message": f"fail {status}"}})
            return
        if self.path.endswith("/chat/completions"):
            self._chat(body, provider)
        elif self.path.endswith("/responses"):
            self._responses(body, provider)
        elif self.path.endswith("/messages"):
            self._anthropic(body, provider)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_GET(self) -> None:
        self.server.provider.note_hit(self.path)
        if self.path.split("?")[0].endswith("/models"):
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": "fake-1", "object": "model", "created": 0, "owned_by": "me"}],
                },
            )
        else:
            self._json(404, {"error": {"message": "not found"}})

    # -- plumbing ---------------------------------------------------------------------

    def _json(self, status: int, payload: Any) -> None:
        data = orjson.dumps(payload)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("x-request-id", f"req-{time.monotonic_ns()}")
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[tuple[str | None, Any]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for name, data in events:
                payload = data if isinstance(data, bytes) else orjson.dumps(data)
                event = (f"event: {name}\n".encode() if name else b"") + b"data: " + payload
                event += b"\n\n"
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- OpenAI chat completions ------------------------------------------------------

    def _chat(self, body: dict[str, Any], provider: FakeProvider) -> None:
        s = _Script(provider, body.get("messages", []), body.get("tools") or [], body["model"])
        base = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body["model"],
        }
        usage = {
            "prompt_tokens": s.usage_in,
            "completion_tokens": s.usage_out,
            "total_tokens": s.usage_in + s.usage_out,
        }
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": s.tool, "arguments": orjson.dumps(s.args).decode()},
        }
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": None if s.tool else s.text}
            if s.tool:
                message["tool_calls"] = [call]
            self._json(
                200,
                {
                    **base,
                    "usage": usage,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if s.tool else "stop",
                        }
                    ],
                },
            )
            return
        chunk = {**base, "object": "chat.completion.chunk"}

        def delta(d: dict[str, Any], finish: str | None = None) -> Any:
            return {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

        events: list[tuple[str | None, Any]] = [(None, delta({"role": "assistant"}))]
        if s.tool:
            args = call["function"]["arguments"]
            events.append(
                (
                    None,
                    delta(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": s.tool, "arguments": ""},
                                }
                            ]
                        }
                    ),
                )
            )
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                events.append(
                    (None, delta({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
                )
            events.append((None, delta({}, "tool_calls")))
        else:
            events.extend((None, delta({"content": p})) for p in s.pieces)
            events.append((None, delta({}, "stop")))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, {**chunk, "choices": [], "usage": usage}))
        events.append((None, b"[DONE]"))
        self._sse(events)

    # -- OpenAI responses ---------------------------------------------------------------

    def _responses(self, body: dict[str, Any], provider: FakeProvider) -> None:
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
        s = _Script(provider, items, body.get("tools") or [], body["model"])
        if s.tool:
            output: list[Any] = [
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": s.tool,
                    "arguments": orjson.dumps(s.args).decode(),
                    "status": "completed",
                }
            ]
        else:
            output = [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": s.text, "annotations": []}],
                }
            ]
        response = {
            "id": "resp_1",
            "object": "response",
            "created_at": 1700000000,
            "model": body["model"],
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": s.usage_in,
                "output_tokens": s.usage_out,
                "total_tokens": s.usage_in + s.usage_out,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        if not body.get("stream"):
            self._json(200, response)
            return
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[tuple[str | None, Any]] = [
            (
                "response.created",
                {"type": "response.created", "sequence_number": 0, "response": started},
            )
        ]
        n = 1

        def add(event: str, **fields: Any) -> None:
            nonlocal n
            events.append((event, {"type": event, "sequence_number": n, **fields}))
            n += 1

        item = output[0]
        if s.tool:
            add(
                "response.output_item.added",
                output_index=0,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            args = item["arguments"]
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                add(
                    "response.function_call_arguments.delta",
                    item_id="fc_1",
                    output_index=0,
                    delta=part,
                )
            add(
                "response.function_call_arguments.done",
                item_id="fc_1",
                output_index=0,
                name=s.tool,
                arguments=args,
            )
        else:
            part = {"type": "output_text", "text": "", "annotations": []}
            add(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "content": []},
            )
            add(
                "response.content_part.added",
                item_id="msg_1",
                output_index=0,
                content_index=0,
                part=part,
            )
            for p in s.pieces:
                add(
                    "response.output_text.delta",
                    item_id="msg_1",
                    output_index=0,
                    content_index=0,
                    delta=p,
                    logprobs=[],
                )
            add(
                "response.output_text.done",
                item_id="msg_1",
                output_index=0,
                content_index=0,
                text=s.text,
                logprobs=[],
            )
            add(
                "response.content_part.done",
                item_id="msg_1",
                output_index=0,
                content_index=0,
                part={**part, "text": s.text},
            )
        add("response.output_item.done", output_index=0, item=item)
        events.append(
            (
                "response.completed",
                {"type": "response.completed", "sequence_number": n, "response": response},
            )
        )
        self._sse(events)

    # -- Anthropic messages --------------------------------------------------------------

    def _anthropic(self, body: dict[str, Any], provider: FakeProvider) -> None:
        s = _Script(provider, body.get("messages", []), body.get("tools") or [], body["model"])
        usage = {"input_tokens": s.usage_in, "output_tokens": s.usage_out}
        tool_block = {"type": "tool_use", "id": "toolu_1", "name": s.tool, "input": s.args}
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "stop_reason": "tool_use" if s.tool else "end_turn",
            "stop_sequence": None,
            "usage": usage,
            "content": [tool_block] if s.tool else [{"type": "text", "text": s.text}],
        }
        if not body.get("stream"):
            self._json(200, message)
            return
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": s.usage_in, "output_tokens": 0},
        }
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        if s.tool:
            args = orjson.dumps(s.args).decode()
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {**tool_block, "input": {}},
                    },
                )
            )
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": part},
                        },
                    )
                )
        else:
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            for p in s.pieces:
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": p},
                        },
                    )
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": s.usage_out},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        self._sse(events)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    provider: FakeProvider

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that drops its keep-alive connection is normal, not a server error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeProvider:
    """A running fake provider; ``with FakeProvider() as p:`` starts and stops it."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        #: Paths requested while a pure replay was running in this process (should be none).
        self.replay_hits: list[str] = []
        self.fail_next: list[int] = []
        self.chunks: int | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def note_hit(self, path: str) -> None:
        from replayable.capture.network import pure_replays_active

        if pure_replays_active():
            self.replay_hits.append(path)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``; the OpenAI base URL is ``url + "/v1"``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeProvider:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.provider = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (the port refuses connections)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """``python tests/integrations/servers.py [chunks]``: serve until stdin closes.

    Prints the port on the first line of stdout.
    """
    with FakeProvider() as provider:
        if len(sys.argv) > 1:
            provider.chunks = int(sys.argv[1])
        print(provider.port, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
