"""The public boundary markers: ``workflow``, ``tool``, ``llm``, the clock and randomness.

Each checks one context variable; outside a recording or replay it calls
straight through.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import random as _random
import time
import uuid as _uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, overload

from replayable.capture._metadata import json_metadata
from replayable.capture.context import _STATE, State, install_task_factory
from replayable.capture.runtime import Call, WorkflowInfo, call_site, intercept_http

__all__ = [
    "asleep",
    "llm",
    "now",
    "randint",
    "random",
    "sleep",
    "span",
    "tool",
    "utcnow",
    "uuid4",
    "workflow",
]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

_get_state = _STATE.get


# -- workflow -----------------------------------------------------------------


@overload
def workflow(name: F, /) -> F: ...
@overload
def workflow(
    name: str | None = None, /, *, metadata: Mapping[str, Any] | None = None
) -> Callable[[F], F]: ...
def workflow(
    name: str | Callable[..., Any] | None = None,
    /,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Any:
    """Mark an agent's entry function. Inside ``recording()`` each call is a run;
    called from inside another run it becomes a child run; elsewhere it just runs."""
    if callable(name):
        return workflow(None)(name)
    checked = json_metadata(metadata, "@workflow metadata")

    def decorate(fn: F) -> F:
        # From here on, HTTP clients and SDKs are intercepted whenever they are imported.
        intercept_http()
        wf = WorkflowInfo(
            name=name or fn.__qualname__,
            entrypoint=f"{fn.__module__}:{fn.__qualname__}",
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn),
            metadata=dict(checked),
        )
        if wf.is_async:

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                st = _get_state()
                if st is None:
                    return await fn(*args, **kwargs)
                # Imported here, not at the top: a synchronous agent need not load it.
                import asyncio

                install_task_factory(asyncio.get_running_loop())
                if st.run is None:
                    return await st.session.arun_root(wf, args, kwargs)
                return await st.run.asubrun(st, wf, args, kwargs)

            wrapper: Any = run_async
        else:

            @functools.wraps(fn)
            def run_sync(*args: Any, **kwargs: Any) -> Any:
                st = _get_state()
                if st is None:
                    return fn(*args, **kwargs)
                if st.run is None:
                    return st.session.run_root(wf, args, kwargs)
                return st.run.subrun(st, wf, args, kwargs)

            wrapper = run_sync
        wrapper.__replayable_workflow__ = wf
        return wrapper  # type: ignore[no-any-return]

    return decorate


def workflow_info(fn: Callable[..., Any]) -> WorkflowInfo | None:
    """The :class:`WorkflowInfo` of a ``@workflow`` function, else ``None``."""
    return getattr(fn, "__replayable_workflow__", None)


# -- tools ----------------------------------------------------------------------

_TOOLS: dict[str, dict[str, Any]] = {}


def registered_tools() -> dict[str, dict[str, Any]]:
    """Every tool decorated in this process: name → kind, side_effect, function."""
    return dict(_TOOLS)


def _request_builder(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """Name positional arguments by parameter, so f(1) and f(x=1) record the same request."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].name in ("self", "cls"):
        skip = 1
        params = params[1:]
    else:
        skip = 0
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    n = len(positional)

    def build(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if skip:
            args = args[1:]
        if not args:
            return kwargs
        if len(args) <= n:
            req = dict(zip(positional, args, strict=False))
        else:
            req = dict(zip(positional, args[:n], strict=True))
            req["*args"] = list(args[n:])
        if kwargs:
            req.update(kwargs)
        return req

    return build


@overload
def tool(fn: F, /) -> F: ...
@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    side_effect: bool = False,
    kind: str = "tool",
    validate: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
    normalize: Callable[[Any], Any] | None = None,
) -> Callable[[F], F]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    side_effect: bool = False,
    kind: str = "tool",
    validate: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
    normalize: Callable[[Any], Any] | None = None,
) -> Any:
    """Mark a tool: its arguments and its result or exception are recorded, and replay
    serves them from the tape without calling it. ``side_effect=True`` marks a tool
    that changes the world (replay never runs it). ``kind`` may name another boundary
    kind (``retrieval``, ``http``, ``state_read``, ``state_write``); a ``retrieval``
    tool's event names the query and each document's id, score and version.

    ``validate(arguments) -> arguments`` checks or coerces the named arguments before
    the call: the request is the validated arguments, and the ones given are kept
    beside them. ``normalize(raw) -> value`` is an adapter over the raw provider
    response: the raw response is recorded (and served on replay), the normalized
    value the caller gets is kept beside it, and ``normalize`` runs again on replay."""
    if fn is not None:
        return tool(
            name=name, side_effect=side_effect, kind=kind, validate=validate, normalize=normalize
        )(fn)

    def decorate(f: F) -> F:
        tool_name = name or f.__name__
        build = _request_builder(f)
        if kind == "retrieval" or validate is not None or normalize is not None:
            from replayable.capture.decisions import described_tool

            wrapper: Any = functools.wraps(f)(
                described_tool(f, tool_name, kind, side_effect, build, normalize, validate)
            )
        elif inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                st = _get_state()
                if st is None or st.run is None:
                    return await f(*args, **kwargs)
                return await st.run.acall(
                    st,
                    Call(
                        kind, tool_name, f, args, kwargs, build(args, kwargs), side_effect, None,
                        call_site(1),
                    ),
                )  # fmt: skip

            wrapper = call_async
        else:

            @functools.wraps(f)
            def call_sync(*args: Any, **kwargs: Any) -> Any:
                st = _get_state()
                if st is None or st.run is None:
                    return f(*args, **kwargs)
                return st.run.call(
                    st,
                    Call(
                        kind, tool_name, f, args, kwargs, build(args, kwargs), side_effect, None,
                        call_site(1),
                    ),
                )  # fmt: skip

            wrapper = call_sync
        info = {
            "name": tool_name,
            "side_effect": side_effect,
            "kind": kind,
            "function": f"{f.__module__}:{f.__qualname__}",
        }
        wrapper.__replayable_tool__ = info
        _TOOLS[tool_name] = info
        return wrapper  # type: ignore[no-any-return]

    return decorate


# -- llm ------------------------------------------------------------------------

_SAMPLING = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "tool_choice",
    "response_format",
    "reasoning_effort",
    "stream",
)


def _llm_name(fn: Callable[..., Any]) -> str:
    """A readable event name: ``openai.chat.completions.create`` for an SDK resource
    method (its module path after ``resources``), else ``package.Qual.name``."""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", "") or ""
    top = module.split(".", 1)[0]
    if ".resources." in module:
        parts: list[str] = []
        for part in module.split(".resources.", 1)[1].split("."):
            if not parts or parts[-1] != part:
                parts.append(part)
        return ".".join([top, *parts, str(qual).rsplit(".", 1)[-1]])
    return f"{top}.{qual}" if top and top not in ("__main__", "builtins") else str(qual)


def llm(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Call a model through ``fn`` and record it: the request, the model and sampling
    parameters as given, and the returned object (an SDK's response type comes back
    as that type on replay). Works for sync and async clients: ``await`` the result
    of an async one."""
    st = _get_state()
    if st is None or st.run is None:
        return fn(*args, **kwargs)
    meta: dict[str, Any] = {k: kwargs[k] for k in _SAMPLING if k in kwargs}
    request: Any = kwargs if not args else {"args": list(args), "kwargs": kwargs}
    name = _llm_name(fn)
    if inspect.iscoroutinefunction(fn):
        meta["awaitable"] = True
        return st.run.acall(  # type: ignore[return-value]
            st, Call("llm", name, fn, args, kwargs, request, False, meta, call_site(1))
        )
    return st.run.call(  # type: ignore[no-any-return]
        st, Call("llm", name, fn, args, kwargs, request, False, meta, call_site(1))
    )


# -- clock, randomness, sleep ---------------------------------------------------


def _simple(kind: str, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    st = _get_state()
    if st is None or st.run is None:
        return fn(*args)
    request = {"args": list(args)} if args else {}
    return st.run.call(st, Call(kind, name, fn, args, {}, request, False, None, call_site(2)))


def now() -> float:
    """``time.time()``, recorded; replay returns the recorded instant."""
    return _simple("clock", "time", time.time)  # type: ignore[no-any-return]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def utcnow() -> dt.datetime:
    """The current UTC time as an aware datetime, recorded."""
    return _simple("clock", "utcnow", _utcnow)  # type: ignore[no-any-return]


def random() -> float:
    """``random.random()``, recorded."""
    return _simple("random", "random", _random.random)  # type: ignore[no-any-return]


def randint(a: int, b: int) -> int:
    """``random.randint(a, b)``, recorded (the bounds are part of the request)."""
    return _simple("random", "randint", _random.randint, a, b)  # type: ignore[no-any-return]


def uuid4() -> _uuid.UUID:
    """``uuid.uuid4()``, recorded."""
    return _simple("uuid", "uuid4", _uuid.uuid4)  # type: ignore[no-any-return]


def sleep(seconds: float) -> None:
    """``time.sleep(seconds)``, recorded; a replay does not sleep."""
    _simple("sleep", "sleep", time.sleep, seconds)


async def asleep(seconds: float) -> None:
    """``await asyncio.sleep(seconds)``, recorded; a replay does not sleep."""
    import asyncio

    st = _get_state()
    if st is None or st.run is None:
        await asyncio.sleep(seconds)
        return
    await st.run.acall(
        st,
        Call("sleep", "sleep", asyncio.sleep, (seconds,), {}, {"args": [seconds]}, False, None,
             call_site(1)),
    )  # fmt: skip


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """Group the events inside under one causal parent (shown nested in the timeline)."""
    st = _get_state()
    if st is None or st.run is None:
        yield
        return
    seq = st.run.span(st, name, attributes)
    token = _STATE.set(State(st.session, st.run, st.lineage, seq))
    try:
        yield
    finally:
        _STATE.reset(token)
