"""AG2 agents (the ``ag2`` package, 1.x) recorded and replayed through ag2's middleware.

Two ways in, both ordinary ag2 middleware:

- ``Agent(..., middleware=[replayable.integrations.ag2.middleware(side_effects={"send_email"})])``,
  or per call ``agent.ask(..., middleware=[middleware()])``;
- ``instrument(agent, side_effects={"send_email"})`` adds it to an existing
  agent (``agent.add_middleware``: the innermost position, closest to the model
  and the tools). Idempotent; it acts only inside a recorded or replayed run.

The middleware makes three hooks boundaries:

- ``on_llm_call``: one ``llm`` event per model call, named after the ag2
  client (``ag2.OpenAIClient``). The request holds the conversation as the
  model is given it (user requests, assistant turns with their tool calls,
  tool results), the system prompt, the client's model and sampling options,
  the tool schemas and the response schema. Only history items ag2's provider
  mappers send are kept: timestamps, usage, lifecycle and human-input events,
  and the tool-call announcements that restate an assistant turn, are left
  out, and tool-call ids are replaced by their order of appearance (``#1``, ``#2``), so
  ids a provider or ag2 makes up (``ToolCallEvent``'s ``uuid4`` default) never
  make a replayed request differ from the recorded one. The metadata holds
  provider, model, sampling parameters, messages, tool names, usage and the
  output.
- ``on_tool_execution``: one ``tool`` event named after the ag2 tool, whose
  request is the arguments the model gave (the call id is metadata). Tools
  named in ``side_effects`` are side-effecting: a fork serves them from the
  tape unless they are named in ``allow_live``.
- ``on_human_input``: a ``tool`` event named ``ag2.human_input`` whose request
  is the question, so a replay needs no human.

On replay each hook returns the recorded ``ModelResponse``,
``ToolResultEvent``/``ToolErrorEvent`` or ``HumanMessage`` without calling
``call_next``: the model, the tool and the human are not reached. A served
tool result is re-addressed to the current call's id. An ``overrides`` value
may be the ag2 event itself or plain content: a string (or ``ToolResult``)
becomes the tool's result, a string at an ``llm`` step the model's answer.
Exceptions a hook raised are raised again; a tool's own failure is a
``ToolErrorEvent`` value and comes back as one (its exception rebuilt from
type and message).

Importing this module registers a codec for ag2's events (they are neither
dataclasses nor pydantic models), so a ``ModelResponse`` round-trips with its
type, nested events, ``Usage`` and files.

Keys: ag2 drives each turn, and each tool call of a turn, in an asyncio task;
a boundary is keyed by the task's lineage, numbered in creation order, so
parallel tool calls replay whatever order they finish in (sync workflows that
call ``asyncio.run`` themselves included).

Limits: chunks of a streamed response (``ModelMessageChunk``) and the
``UsageEvent`` ag2 emits after a call are produced by the live call only, so
on replay stream observers see the final ``ModelResponse`` and usage comes
from the recorded response. Middleware registered inside this one (closer to
the model) and tool-level middleware (``approval_required``) are skipped on
replay along with the model or the tool. Events carry no call site: the
agent's code is not on the stack of the task ag2 runs a turn in. When a
replay stops (a divergence, ``stop_at``), ag2 1.2 leaves the turn's async
generators to the event loop's finalizer, which logs "an error occurred
during closing of asynchronous generator"; the replay result is unaffected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import hashlib
import sys
from collections.abc import Iterable, Sequence
from copy import copy
from typing import Any

import orjson
from ag2.compact import CompactionSummary
from ag2.events import (
    BaseEvent,
    BuiltinToolCallEvent,
    BuiltinToolResultEvent,
    ClientToolCallEvent,
    HumanInputRequest,
    HumanMessage,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ProviderReplay,
    TextInput,
    ToolCallEvent,
    ToolErrorEvent,
    ToolResultEvent,
    ToolResultsEvent,
)
from ag2.middleware import BaseMiddleware, Middleware

from replayable.capture.context import _STATE, State, active_state, install_task_factory
from replayable.capture.runtime import OpenCall
from replayable.events.codec import (
    decode_error,
    encode_error,
    qualified_name,
    register_codec,
    resolve_name,
)

__all__ = ["ReplayableMiddleware", "instrument", "middleware"]

_LIBRARY = ("ag2", "replayable", "anyio", "fast_depends", "functools")
_SAMPLING = (
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stop",
    "n",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
)
_ID_FIELDS = frozenset({"id", "parent_id", "tool_call_id"})
# Provider-native history items the model is given back besides requests, turns and results.
_NATIVE = (ProviderReplay, BuiltinToolCallEvent, BuiltinToolResultEvent, CompactionSummary)


# -- codec ------------------------------------------------------------------------------


def _encode_event(event: BaseEvent) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    for key, value in event.__dict__.items():
        if key.startswith("_"):
            continue  # caches (``_serialized_arguments``), as ag2's own to_dict
        if isinstance(value, BaseException):
            errors[key] = orjson.loads(encode_error(value))
        else:
            fields[key] = value
    out: dict[str, Any] = {"cls": qualified_name(type(event)), "fields": fields}
    if errors:
        out["errors"] = errors
    return out


def _decode_event(data: dict[str, Any]) -> BaseEvent:
    cls = resolve_name(data["cls"])  # through the allowlist: nothing else is imported
    if not (isinstance(cls, type) and issubclass(cls, BaseEvent)):
        from replayable.errors import UntrustedRecordError

        raise UntrustedRecordError(str(data["cls"]), "an AG2 event", "it is not an AG2 event")
    event: BaseEvent = cls.__new__(cls)
    event.__dict__.update(data["fields"])
    for key, record in (data.get("errors") or {}).items():
        event.__dict__[key] = decode_error(orjson.dumps(record))
    return event


register_codec(BaseEvent, _encode_event, _decode_event, name="ag2.event")


# -- attaching ---------------------------------------------------------------------------


class ReplayableMiddleware(BaseMiddleware):
    """ag2 middleware whose model calls, tool executions and human input are boundaries."""

    def __init__(self, event: BaseEvent, context: Any, *, side_effects: Iterable[str] = ()) -> None:
        super().__init__(event, context)
        self.side_effects = frozenset(side_effects)

    async def on_llm_call(self, call_next: Any, events: Sequence[BaseEvent], context: Any) -> Any:
        """One ``llm`` event; on replay the recorded ``ModelResponse``."""
        st = active_state()
        if st is None:
            return await call_next(events, context)
        name, request, meta = _llm_request(call_next, events, context)
        call = _begin(st, "llm", name, request, False, meta)
        if not call.live:
            return _as_response(call.value())
        result = await _live(call, call_next, events, context)
        call.finish(result, _response_meta(result))
        return result

    async def on_tool_execution(self, call_next: Any, event: ToolCallEvent, context: Any) -> Any:
        """One ``tool`` event named after the tool; on replay the recorded result."""
        st = active_state()
        if st is None:
            return await call_next(event, context)
        meta: dict[str, Any] = {"framework": "ag2", "tool_call_id": event.id}
        if event.source:
            meta["source"] = event.source
        side_effect = event.name in self.side_effects
        call = _begin(st, "tool", event.name, _tool_request(event), side_effect, meta)
        if not call.live:
            return _as_tool_result(call.value(), event)
        result = await _live(call, call_next, event, context)
        call.finish(result, {"error": True} if isinstance(result, ToolErrorEvent) else None)
        return result

    async def on_human_input(self, call_next: Any, event: HumanInputRequest, context: Any) -> Any:
        """A ``tool`` event named ``ag2.human_input``; on replay the recorded answer."""
        st = active_state()
        if st is None:
            return await call_next(event, context)
        request = {"content": event.content}
        call = _begin(st, "tool", "ag2.human_input", request, False, {"framework": "ag2"})
        if not call.live:
            return _as_human_message(call.value(), event)
        result = await _live(call, call_next, event, context)
        call.finish(result)
        return result


def middleware(*, side_effects: Iterable[str] = ()) -> Middleware:
    """An ag2 middleware factory for ``Agent(middleware=[...])`` or ``agent.ask(middleware=[...])``.
    ``side_effects`` names the agent's tools that change the world."""
    return Middleware(ReplayableMiddleware, side_effects=frozenset(side_effects))


def instrument(agent: Any, *, side_effects: Iterable[str] = ()) -> Any:
    """Add the recording middleware to ``agent`` (innermost, once) and return the agent.
    Called again, it adds ``side_effects`` to those already declared."""
    effects = frozenset(side_effects)
    for i, factory in enumerate(agent._middleware):
        if isinstance(factory, Middleware) and factory.cls is ReplayableMiddleware:
            known = factory.options.get("side_effects", frozenset())
            agent._middleware[i] = middleware(side_effects=known | effects)
            return agent
    agent.add_middleware(middleware(side_effects=effects))
    return agent


# -- boundary plumbing -------------------------------------------------------------------


def _site() -> str | None:
    # The agent's own frame, if the hook runs in its task: ag2 drives a turn in a task
    # of its own, so the walk stops at the event loop rather than name the loop's caller.
    f: Any = sys._getframe(2)
    while f is not None:
        module = f.f_globals.get("__name__") or ""
        if module.startswith("asyncio"):
            return None
        if not module.startswith(_LIBRARY):
            return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return None


def _begin(
    st: State, kind: str, name: str, request: Any, side_effect: bool, meta: dict[str, Any]
) -> OpenCall:
    run = st.run
    assert run is not None  # active_state() returns states inside a run only
    # A sync workflow may start the loop itself (asyncio.run): give the tasks ag2
    # creates from here on (parallel tool calls) lineages numbered by creation.
    install_task_factory(asyncio.get_running_loop())
    return run.begin(st, kind, name, request, side_effect, meta, _site())


async def _live(call: OpenCall, call_next: Any, *args: Any) -> Any:
    # Calls made under a boundary belong to it (the HTTP request beneath a model call).
    token = _STATE.set(None)
    try:
        return await call_next(*args)
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        _STATE.reset(token)


def _as_response(value: Any) -> Any:
    if isinstance(value, str):
        return ModelResponse(ModelMessage(value))
    return value


def _as_tool_result(value: Any, event: ToolCallEvent) -> Any:
    if isinstance(value, ToolResultEvent):
        served = copy(value)
        served.parent_id = event.id
        return served
    if isinstance(value, ClientToolCallEvent):
        served_call = copy(value)
        served_call.id = event.id
        return served_call
    return ToolResultEvent.from_call(event, value)


def _as_human_message(value: Any, event: HumanInputRequest) -> Any:
    if isinstance(value, HumanMessage):
        served = copy(value)
        served.parent_id = event.id
        return served
    return HumanMessage.ensure_message(str(value), event.id)


# -- requests ----------------------------------------------------------------------------


class _Ids:
    """Tool-call ids by order of appearance: ``#1``, ``#2`` …"""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        alias = self._seen.get(value)
        if alias is None:
            alias = self._seen[value] = f"#{len(self._seen) + 1}"
        return alias


def _plain(value: Any, ids: _Ids | None = None) -> Any:
    """A stable plain-data rendering (no timestamps, ids normalized, bytes by digest)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value, ids)
    if isinstance(value, dict):
        return {str(k): _plain(v, ids) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, ids) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v, ids) for v in value), key=repr)
    if isinstance(value, bytes | bytearray):
        return {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()}
    if isinstance(value, BaseEvent):
        out: dict[str, Any] = {"event": type(value).__name__}
        for key, item in value.__dict__.items():
            if key.startswith("_") or key == "created_at":
                continue
            out[key] = ids(item) if ids is not None and key in _ID_FIELDS else _plain(item, ids)
        return out
    if isinstance(value, BaseException):
        return {"error": type(value).__name__, "message": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), ids) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return _plain(dump(mode="json"), ids)
    if isinstance(value, type):
        schema = getattr(value, "model_json_schema", None)
        if callable(schema):
            return {"schema": value.__name__, "json_schema": _plain(schema())}
        return f"{value.__module__}.{value.__qualname__}"
    # Anything else by type only: a repr may carry a memory address.
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _arguments(call: ToolCallEvent) -> Any:
    try:
        return _plain(call.serialized_arguments)
    except (TypeError, ValueError):
        return call.arguments


def _tool_request(event: ToolCallEvent) -> dict[str, Any]:
    return {"arguments": _arguments(event)}


def _content(parts: Sequence[Any], ids: _Ids) -> Any:
    if len(parts) == 1 and type(parts[0]) is TextInput and not parts[0].metadata:
        return parts[0].content
    out: list[Any] = []
    for part in parts:
        if type(part) is TextInput:
            item: dict[str, Any] = {"text": part.content}
            if part.metadata:
                item["metadata"] = _plain(part.metadata)
            out.append(item)
        else:
            out.append(_plain(part, ids))
    return out


def _assistant(response: ModelResponse, ids: _Ids) -> dict[str, Any]:
    item: dict[str, Any] = {"role": "assistant", "content": response.content}
    if response.tool_calls and response.tool_calls.calls:
        item["tool_calls"] = [
            {"id": ids(c.id), "name": c.name, "arguments": _arguments(c)}
            for c in response.tool_calls.calls
        ]
    if response.metadata:
        item["metadata"] = _plain(response.metadata)
    if response.files:
        item["files"] = _plain(response.files)
    return item


def _tool_message(result: ToolResultEvent, ids: _Ids) -> dict[str, Any]:
    item: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": ids(result.parent_id),
        "name": result.name,
        "content": _content(result.result.parts, ids) if result.result is not None else None,
    }
    if isinstance(result, ToolErrorEvent):
        item["error"] = True
    return item


def _messages(events: Sequence[BaseEvent], ids: _Ids) -> list[Any]:
    """The history as the model is given it. Only what ag2's provider mappers send is
    kept: requests, assistant turns, tool results, compaction summaries and
    provider-native items. Call announcements and single results restate a turn or a
    ``ToolResultsEvent``; human input exchanged inside a tool, usage and lifecycle
    events never reach the model (and a replayed tool does not produce them again)."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, ModelRequest):
            out.append({"role": "user", "content": _content(event.parts, ids)})
        elif isinstance(event, ModelResponse):
            out.append(_assistant(event, ids))
        elif isinstance(event, ToolResultsEvent):
            out.extend(_tool_message(r, ids) for r in event.results)
        elif isinstance(event, _NATIVE):
            out.append(_plain(event, ids))
    return out


def _client_and_options(call_next: Any) -> tuple[Any, dict[str, Any]]:
    """The ag2 LLM client under the middleware chain and the keywords ag2 bound to it."""
    fn = call_next
    for _ in range(64):
        if not isinstance(fn, functools.partial):
            break
        if "tools" in fn.keywords or not fn.args:
            return fn.func, dict(fn.keywords)
        fn = fn.args[0]  # partial(mw.on_llm_call, inner)
    return None, {}


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _client_options(client: Any) -> dict[str, Any]:
    options = getattr(client, "_create_options", None)
    if not isinstance(options, dict):
        return {}
    return {
        k: v
        for k, v in options.items()
        if _is_plain(v) and "api_key" not in k and "secret" not in k
    }


def _provider(client: Any) -> str | None:
    if client is None:
        return None
    parts = type(client).__module__.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["ag2", "config"] else parts[0]


def _tool_names(tools: Iterable[Any]) -> list[Any]:
    names: list[Any] = []
    for schema in tools:
        fn = getattr(schema, "function", None)
        names.append(
            getattr(fn, "name", None) or getattr(schema, "name", None) or type(schema).__name__
        )
    return names


def _llm_request(
    call_next: Any, events: Sequence[BaseEvent], context: Any
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    client, bound = _client_and_options(call_next)
    ids = _Ids()
    messages = _messages(events, ids)
    request: dict[str, Any] = {}
    prompt = list(getattr(context, "prompt", None) or ())
    if prompt:
        request["system"] = prompt
    request["messages"] = messages
    options = _client_options(client)
    if options:
        request["options"] = options
    tools = list(bound.get("tools") or ())
    if tools:
        request["tools"] = _plain(tools)
    schema = bound.get("response_schema")
    if schema is not None:
        request["response_schema"] = {
            "name": getattr(schema, "name", type(schema).__name__),
            "json_schema": _plain(getattr(schema, "json_schema", None)),
        }
    meta: dict[str, Any] = {"framework": "ag2", "provider": _provider(client)}
    if "model" in options:
        meta["model"] = options["model"]
    for key in _SAMPLING:
        if key in options:
            meta[key] = options[key]
    # No messages: they are in the request, encrypted and erasable with it, while
    # metadata is stored in clear.
    if tools:
        meta["tools"] = _tool_names(tools)
    name = f"ag2.{type(client).__name__}" if client is not None else "ag2.llm"
    return name, request, meta


def _response_meta(response: Any) -> dict[str, Any]:
    if not isinstance(response, ModelResponse):
        return {}
    # No answer text or tool-call arguments: they are in the recorded response (read
    # back by replayable.integrations._wire.ag2_output), encrypted and erasable with it.
    meta: dict[str, Any] = {"finish_reason": response.finish_reason}
    if response.provider:
        meta["provider"] = response.provider
    if response.model:
        meta["response_model"] = response.model
    usage = response.usage
    if usage:
        meta["usage"] = {
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
        }
    return meta
