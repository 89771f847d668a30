"""LangChain chat models and tools recorded, and substituted on replay.

``instrument(side_effects={"send_email"})`` (idempotent, process-wide; it acts
only inside a recorded or replayed run) wraps two methods every LangChain
model and tool goes through:

- ``BaseChatModel._generate_with_cache`` / ``_agenerate_with_cache``: one
  ``llm`` event per model call (``invoke``, ``ainvoke``, ``batch``, and the
  streamed path LangGraph takes when it streams tokens). The request holds the
  messages (without their random ids), the stop words and the call's
  parameters (bound tools, tool choice, response format); the metadata holds
  provider, model, temperature, max tokens, the messages, the output and the
  usage. A replay returns the recorded ``ChatResult`` without calling the
  model, so the HTTP request beneath it is neither made nor recorded.
- ``BaseTool.run`` / ``arun``: one ``tool`` event named after the tool, whose
  request is the arguments the model gave (injected arguments such as
  ``ToolRuntime`` or ``InjectedState`` left out) and the tool call id. The
  boundaries the tool's own code crosses (a ``@replayable.tool``, an HTTP
  call) are events nested under it (their ``parent`` is the tool's step). On
  replay a tool that made such calls runs again and they are served and
  matched one by one, so a changed argument inside a tool is a divergence; a
  tool that made none is served whole (the recorded output, a ``ToolMessage``
  when called with a tool call). Tools named in ``side_effects``, or with
  ``metadata={"side_effect": True}``, are side-effecting: always served whole,
  and a fork serves them from the tape unless they are named in ``allow_live``.

A model that streams (``stream_mode="messages"``, ``astream_events``, a
callback handler that asks for tokens) hands its chunks to the callbacks
while it generates; they are recorded with the result, and a replay hands the
same chunks to the callbacks again, so a token stream replays token for
token. ``on_llm_start``/``on_llm_end`` fire around a served model call; a tool
served whole fires no tool callbacks (one that runs again fires them).
``model.stream()`` called directly is not intercepted here; the HTTP seam still
records the provider request under it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable
from typing import Any

from replayable.capture.context import _STATE, Lineage, State, active_state
from replayable.integrations._wire import tool_schemas

__all__ = ["instrument", "instrumented", "side_effect_tools", "uninstrument"]

_STDLIB = sysconfig.get_paths()["stdlib"]
_lock = threading.Lock()
_installed = False
_side_effects: set[str] = set()
_originals: list[tuple[type, str, Any]] = []
_PARAMS = (
    "tool_choice",
    "response_format",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "reasoning_effort",
)


def side_effect_tools() -> frozenset[str]:
    """The LangChain tools marked side-effecting so far."""
    return frozenset(_side_effects)


def instrumented() -> bool:
    """Whether the wrappers are in place."""
    return _installed


def instrument(*, side_effects: Iterable[str] = ()) -> None:
    """Wrap LangChain's model and tool entry points (once) and mark ``side_effects``."""
    global _installed
    _side_effects.update(side_effects)
    with _lock:
        if _installed:
            return
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.tools import BaseTool

        for cls, attr, wrap in (
            (BaseChatModel, "_generate_with_cache", _wrap_generate),
            (BaseChatModel, "_agenerate_with_cache", _wrap_agenerate),
            (BaseTool, "run", _wrap_run),
            (BaseTool, "arun", _wrap_arun),
        ):
            original = getattr(cls, attr)
            _originals.append((cls, attr, original))
            setattr(cls, attr, wrap(original))
        _installed = True


def uninstrument() -> None:
    """Put LangChain's own methods back (the HTTP seam alone records again)."""
    global _installed
    with _lock:
        while _originals:
            cls, attr, original = _originals.pop()
            setattr(cls, attr, original)
        _installed = False


def _site() -> str | None:
    # The first frame outside langchain, langgraph, this package and the standard
    # library (a thread pool running a node): the agent's node or tool.
    f = sys._getframe(2)
    while f is not None:
        module = f.f_globals.get("__name__") or ""
        if not module.startswith(("langchain", "langgraph", "replayable.integrations")) and (
            not f.f_code.co_filename.startswith(_STDLIB)
        ):
            return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back  # type: ignore[assignment]
    return None


def _jsonable(value: Any) -> Any:
    """A plain-data rendering of a request part (schemas, classes and callables by name)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, type):
        schema = getattr(value, "model_json_schema", None)
        if callable(schema):
            return {"schema": value.__name__, "json_schema": _jsonable(schema())}
        return f"{value.__module__}.{value.__qualname__}"
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _jsonable(dump(mode="json"))
    if callable(value):
        return getattr(value, "__qualname__", type(value).__name__)
    return repr(value)


# -- models -----------------------------------------------------------------------


def _message(msg: Any) -> dict[str, Any]:
    from langchain_core.messages import message_to_dict

    d = message_to_dict(msg)
    data = dict(d["data"])
    data.pop("id", None)
    return {"type": d["type"], "data": _jsonable(data)}


def _model_request(
    model: Any, messages: list[Any], stop: list[str] | None, kwargs: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    params = {k: v for k, v in kwargs.items() if not k.startswith("ls_") and k != "run_manager"}
    request: dict[str, Any] = {
        "model": _jsonable(_identity(model)),
        "messages": [_message(m) for m in messages],
    }
    if stop:
        request["stop"] = list(stop)
    if params:
        request["params"] = _jsonable(params)
    try:
        ls = model._get_ls_params(stop=stop, **kwargs)
    except Exception:
        ls = {}
    provider = ls.get("ls_provider") or getattr(model, "_llm_type", "langchain")
    meta: dict[str, Any] = {
        "provider": provider,
        "model": ls.get("ls_model_name"),
        "framework": "langchain",
    }
    if ls.get("ls_temperature") is not None:
        meta["temperature"] = ls["ls_temperature"]
    if ls.get("ls_max_tokens") is not None:
        meta["max_tokens"] = ls["ls_max_tokens"]
    for k in _PARAMS:
        if k in params and k not in meta:
            meta[k] = _jsonable(params[k])
    tools = request.get("params", {}).get("tools")
    if isinstance(tools, list) and tools:
        meta["tool_schemas"] = tool_schemas(tools)
        meta["tools"] = [name.partition("#")[0] for name in meta["tool_schemas"]]
    return f"langchain.{type(model).__name__}", request, meta


def _identity(model: Any) -> Any:
    try:
        params = dict(model._identifying_params)
    except Exception:
        params = {}
    return {k: v for k, v in params.items() if "key" not in k.lower()}


def _encode_result(result: Any, streamed: list[tuple[str, Any, Any]] | None) -> dict[str, Any]:
    from langchain_core.messages import message_to_dict

    out: dict[str, Any] = {
        "generations": [
            {
                "message": message_to_dict(g.message),
                "generation_info": g.generation_info,
            }
            for g in result.generations
        ],
        "llm_output": result.llm_output,
    }
    if streamed:
        out["streamed"] = [
            [what, token, _encode_chunk(chunk) if what == "token" else chunk]
            for what, token, chunk in streamed
        ]
    return out


def _encode_chunk(chunk: Any) -> Any:
    from langchain_core.messages import message_to_dict

    if chunk is None:
        return None
    return {"message": message_to_dict(chunk.message), "generation_info": chunk.generation_info}


def _decode_chunk(value: Any) -> Any:
    from langchain_core.messages import messages_from_dict
    from langchain_core.outputs import ChatGenerationChunk

    if value is None:
        return None
    return ChatGenerationChunk(
        message=messages_from_dict([value["message"]])[0],  # type: ignore[arg-type]
        generation_info=value.get("generation_info"),
    )


def _decode_result(value: Any) -> Any:
    from langchain_core.messages import messages_from_dict
    from langchain_core.outputs import ChatGeneration, ChatResult

    gens = [
        ChatGeneration(
            message=messages_from_dict([g["message"]])[0],
            generation_info=g.get("generation_info"),
        )
        for g in value["generations"]
    ]
    return ChatResult(generations=gens, llm_output=value.get("llm_output"))


# Streaming callbacks. A model that streams (``stream_mode="messages"``,
# ``astream_events``, a callback handler asking for tokens) hands each chunk to
# the run manager while it generates. A served result has no generation, so the
# chunks are recorded with the result and handed to the run manager again on
# replay, in order: whoever listens sees what it saw live.
_STREAM_HOOKS = ("on_llm_new_token", "on_stream_event")


def _tap(run_manager: Any) -> list[tuple[str, Any, Any]] | None:
    """Record what the model streams to ``run_manager`` while it passes it on."""
    if run_manager is None:
        return None
    taken: list[tuple[str, Any, Any]] = []
    for hook in _STREAM_HOOKS:
        original = getattr(run_manager, hook, None)
        if original is not None:
            setattr(run_manager, hook, _tapped(hook, original, taken))
    return taken


def _tapped(hook: str, original: Callable[..., Any], taken: list[tuple[str, Any, Any]]) -> Any:
    if hook == "on_llm_new_token":

        def note(first: Any, *args: Any, **kwargs: Any) -> None:
            taken.append(("token", first, kwargs.get("chunk")))

    else:

        def note(first: Any, *args: Any, **kwargs: Any) -> None:
            taken.append(("event", None, first))

    if inspect.iscoroutinefunction(original):

        async def tapped_async(*args: Any, **kwargs: Any) -> Any:
            note(*args, **kwargs)
            return await original(*args, **kwargs)

        return tapped_async

    def tapped(*args: Any, **kwargs: Any) -> Any:
        note(*args, **kwargs)
        return original(*args, **kwargs)

    return tapped


def _untap(run_manager: Any) -> None:
    for hook in _STREAM_HOOKS:
        run_manager.__dict__.pop(hook, None)


def _replayed_stream(run_manager: Any, value: Any) -> list[tuple[Any, str, Any, Any]]:
    """The recorded stream of ``value`` as (hook, kind, token, payload), for ``run_manager``."""
    if run_manager is None or not isinstance(value, dict):
        return []
    out = []
    for what, token, payload in value.get("streamed") or ():
        if what == "token":
            out.append((run_manager.on_llm_new_token, what, token, _decode_chunk(payload)))
        elif hasattr(run_manager, "on_stream_event"):
            out.append((run_manager.on_stream_event, what, token, payload))
    return out


def _refire(run_manager: Any, value: Any) -> None:
    for hook, what, token, payload in _replayed_stream(run_manager, value):
        if what == "token":
            hook(token, chunk=payload)
        else:
            hook(payload)


async def _arefire(run_manager: Any, value: Any) -> None:
    for hook, what, token, payload in _replayed_stream(run_manager, value):
        if what == "token":
            await hook(token, chunk=payload)
        else:
            await hook(payload)


def _result_meta(result: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if result.generations:
        msg = result.generations[0].message
        usage = getattr(msg, "usage_metadata", None)
        if usage:
            meta["usage"] = {
                "input_tokens": usage.get("input_tokens"),
                "output_tokens": usage.get("output_tokens"),
            }
    return meta


def _begin_model(
    st: State, model: Any, messages: list[Any], stop: list[str] | None, kwargs: dict[str, Any]
) -> Any:
    name, request, meta = _model_request(model, messages, stop, kwargs)
    return st.run.begin(st, "llm", name, request, False, meta, _site())  # type: ignore[union-attr]


def _wrap_generate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _generate_with_cache(
        self: Any,
        messages: list[Any],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> Any:
        st = active_state()
        if st is None:
            return original(self, messages, stop, run_manager, **kwargs)
        call = _begin_model(st, self, messages, stop, kwargs)
        if not call.live:
            value = call.value()
            _refire(run_manager, value)
            return _decode_result(value)
        token = _STATE.set(None)
        streamed = _tap(run_manager)
        try:
            result = original(self, messages, stop, run_manager, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            _STATE.reset(token)
            if run_manager is not None:
                _untap(run_manager)
        call.finish(_encode_result(result, streamed), _result_meta(result))
        return result

    return _generate_with_cache


def _wrap_agenerate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _agenerate_with_cache(
        self: Any,
        messages: list[Any],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> Any:
        st = active_state()
        if st is None:
            return await original(self, messages, stop, run_manager, **kwargs)
        call = _begin_model(st, self, messages, stop, kwargs)
        if not call.live:
            value = call.value()
            await _arefire(run_manager, value)
            return _decode_result(value)
        token = _STATE.set(None)
        streamed = _tap(run_manager)
        try:
            result = await original(self, messages, stop, run_manager, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            _STATE.reset(token)
            if run_manager is not None:
                _untap(run_manager)
        call.finish(_encode_result(result, streamed), _result_meta(result))
        return result

    return _agenerate_with_cache


# -- tools ------------------------------------------------------------------------


def _tool_request(tool: Any, tool_input: Any, tool_call_id: str | None) -> dict[str, Any]:
    if isinstance(tool_input, dict):
        try:
            shown: Any = tool._filter_injected_args(tool_input)
        except Exception:
            shown = tool_input
    else:
        shown = tool_input
    request: dict[str, Any] = {"input": _jsonable(shown)}
    if tool_call_id is not None:
        request["tool_call_id"] = tool_call_id
    return request


def _tool_side_effect(tool: Any) -> bool:
    return tool.name in _side_effects or bool((tool.metadata or {}).get("side_effect"))


class _ToolLineage(Lineage):
    """The lineage of the calls a tool's own code makes; counts them."""

    __slots__ = ("calls",)

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.calls = 0

    def next_key(self) -> str:
        self.calls += 1
        return super().next_key()

    def child(self) -> Lineage:
        self.calls += 1
        return super().child()


# A tool is recorded as one event, and the boundaries its own code crosses
# (a ``@replayable.tool``, an HTTP call) as events nested under it, keyed by the
# tool's causal position. On replay a tool whose recording holds nested calls
# runs again, so those calls are matched one by one (a changed argument inside
# the tool is a divergence, as it is without ``instrument()``); a tool that made
# none, and every side-effecting tool, is served whole.


def _begin_tool(st: State, tool: Any, tool_input: Any, kwargs: dict[str, Any]) -> tuple[Any, bool]:
    request = _tool_request(tool, tool_input, kwargs.get("tool_call_id"))
    side_effect = _tool_side_effect(tool)
    run = st.run
    assert run is not None  # active_state() returned a state with a run
    call = run.begin(
        st, "tool", tool.name, request, side_effect, {"framework": "langchain"}, _site()
    )
    return call, side_effect


def _inside(st: State, call: Any, side_effect: bool) -> tuple[State | None, _ToolLineage | None]:
    """The state the tool's code runs in: nested under ``call``, or outside any run for a
    side-effecting tool (replay never runs it, so nothing inside it may be on the tape)."""
    key = getattr(call, "key", None)
    if side_effect or key is None:
        return None, None
    lineage = _ToolLineage(f"{key}/")
    return State(st.session, st.run, lineage, call.seq), lineage


def _rerun(call: Any, side_effect: bool) -> bool:
    return not side_effect and bool(call.metadata.get("nested"))


def _wrap_run(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        st = active_state()
        if st is None:
            return original(self, tool_input, *args, **kwargs)
        call, side_effect = _begin_tool(st, self, tool_input, kwargs)
        if not call.live and not _rerun(call, side_effect):
            return call.value()
        inner, lineage = _inside(st, call, side_effect)
        token = _STATE.set(inner)
        try:
            result = original(self, tool_input, *args, **kwargs)
        except BaseException as exc:
            if call.live:
                call.fail(exc, _nested(lineage))
            raise
        finally:
            _STATE.reset(token)
        if call.live:
            call.finish(result, _nested(lineage))
        return result

    return run


def _wrap_arun(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def arun(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        st = active_state()
        if st is None:
            return await original(self, tool_input, *args, **kwargs)
        call, side_effect = _begin_tool(st, self, tool_input, kwargs)
        if not call.live and not _rerun(call, side_effect):
            return call.value()
        inner, lineage = _inside(st, call, side_effect)
        token = _STATE.set(inner)
        try:
            result = await original(self, tool_input, *args, **kwargs)
        except BaseException as exc:
            if call.live:
                call.fail(exc, _nested(lineage))
            raise
        finally:
            _STATE.reset(token)
        if call.live:
            call.finish(result, _nested(lineage))
        return result

    return arun


def _nested(lineage: _ToolLineage | None) -> dict[str, Any] | None:
    return {"nested": lineage.calls} if lineage is not None and lineage.calls else None
