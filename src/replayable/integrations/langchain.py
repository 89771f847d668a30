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
  ``ToolRuntime`` or ``InjectedState`` left out) and the tool call id. A
  replay returns the recorded output (a ``ToolMessage`` when called with a
  tool call). Tools named in ``side_effects``, or with
  ``metadata={"side_effect": True}``, are side-effecting: a fork serves them
  from the tape unless they are named in ``allow_live``.

Callbacks see live calls only: on replay, ``on_llm_start``/``on_tool_start``
and token callbacks are not fired for served calls. ``model.stream()`` called
directly is not intercepted here; the HTTP seam still records the provider
request under it.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from replayable.capture.context import _STATE, State, active_state

__all__ = ["instrument", "instrumented", "side_effect_tools"]

_lock = threading.Lock()
_installed = False
_side_effects: set[str] = set()
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

        BaseChatModel._generate_with_cache = _wrap_generate(BaseChatModel._generate_with_cache)  # type: ignore[method-assign]
        BaseChatModel._agenerate_with_cache = _wrap_agenerate(  # type: ignore[method-assign]
            BaseChatModel._agenerate_with_cache
        )
        BaseTool.run = _wrap_run(BaseTool.run)  # type: ignore[method-assign]
        BaseTool.arun = _wrap_arun(BaseTool.arun)  # type: ignore[method-assign]
        _installed = True


def _site() -> str | None:
    # The first frame outside langchain, langgraph and this module: the agent's node.
    f = sys._getframe(2)
    while f is not None:
        module = f.f_globals.get("__name__") or ""
        if not module.startswith(("langchain", "langgraph", "replayable.integrations")):
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


def _short(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": getattr(msg, "type", "?"), "content": _jsonable(msg.content)}
    calls = getattr(msg, "tool_calls", None)
    if calls:
        out["tool_calls"] = [{"name": c["name"], "args": _jsonable(c["args"])} for c in calls]
    call_id = getattr(msg, "tool_call_id", None)
    if call_id:
        out["tool_call_id"] = call_id
    return out


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
        "messages": [_short(m) for m in messages],
    }
    if ls.get("ls_temperature") is not None:
        meta["temperature"] = ls["ls_temperature"]
    if ls.get("ls_max_tokens") is not None:
        meta["max_tokens"] = ls["ls_max_tokens"]
    for k in _PARAMS:
        if k in params and k not in meta:
            meta[k] = _jsonable(params[k])
    return f"langchain.{type(model).__name__}", request, meta


def _identity(model: Any) -> Any:
    try:
        params = dict(model._identifying_params)
    except Exception:
        params = {}
    return {k: v for k, v in params.items() if "key" not in k.lower()}


def _encode_result(result: Any) -> dict[str, Any]:
    from langchain_core.messages import message_to_dict

    return {
        "generations": [
            {
                "message": message_to_dict(g.message),
                "generation_info": g.generation_info,
            }
            for g in result.generations
        ],
        "llm_output": result.llm_output,
    }


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


def _result_meta(result: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if result.generations:
        msg = result.generations[0].message
        meta["output"] = _short(msg)
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
            return _decode_result(call.value())
        token = _STATE.set(None)
        try:
            result = original(self, messages, stop, run_manager, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            _STATE.reset(token)
        call.finish(_encode_result(result), _result_meta(result))
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
            return _decode_result(call.value())
        token = _STATE.set(None)
        try:
            result = await original(self, messages, stop, run_manager, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            _STATE.reset(token)
        call.finish(_encode_result(result), _result_meta(result))
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


def _wrap_run(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        st = active_state()
        if st is None:
            return original(self, tool_input, *args, **kwargs)
        request = _tool_request(self, tool_input, kwargs.get("tool_call_id"))
        return st.run.call(  # type: ignore[union-attr]
            st,
            "tool",
            self.name,
            original,
            (self, tool_input, *args),
            kwargs,
            request,
            _tool_side_effect(self),
            {"framework": "langchain"},
            _site(),
        )

    return run


def _wrap_arun(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def arun(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        st = active_state()
        if st is None:
            return await original(self, tool_input, *args, **kwargs)
        request = _tool_request(self, tool_input, kwargs.get("tool_call_id"))
        return await st.run.acall(  # type: ignore[union-attr]
            st,
            "tool",
            self.name,
            original,
            (self, tool_input, *args),
            kwargs,
            request,
            _tool_side_effect(self),
            {"framework": "langchain"},
            _site(),
        )

    return arun
