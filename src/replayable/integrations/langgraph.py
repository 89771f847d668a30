"""LangGraph graphs recorded and replayed node by node, parallel branches included.

``replayable.integrations.langgraph.instrument(side_effects={"send_email"})``
(idempotent; it acts only inside a recorded or replayed run) does two things:

- It installs the LangChain model and tool wrappers
  (:mod:`replayable.integrations.langchain`), so each chat-model call is one
  ``llm`` event and each tool call (``ToolNode``, ``create_agent``, a tool
  invoked by hand) one ``tool`` event, *substituted* on replay: the node gets
  the recorded ``AIMessage``/``ToolMessage`` and the model is never called.
- It gives every LangGraph task its own causal lineage. LangGraph runs the
  tasks of a step in threads (sync) or asyncio tasks (async) and they finish
  in any order; a boundary inside a node is keyed by the graph invocation
  (the caller's own causal position), the task's step and its task path
  (``__pregel_pull|node`` for a node, ``__pregel_push|<i>`` for the i-th
  ``Send``), and its ordinal inside that task, never by completion order. A
  node re-run after an ``interrupt()`` is resumed belongs to the resuming
  invocation, so it is keyed apart from its first, interrupted run. Any
  boundary inside a node gets this key: ``@replayable.tool`` functions,
  ``replayable.now()``, HTTP calls through the seam.

Checkpointers (``InMemorySaver`` and the others) work unchanged: their
checkpoint ids, timestamps and the ids ``add_messages`` gives new messages
are LangGraph's own and are not recorded, so keep them out of a workflow's
return value if the replay must be ``identical`` (return message contents,
not message objects with ids). Threads a node starts itself (``batch`` inside
a node) share the node's lineage; wrap them with ``replayable.carry``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from replayable.capture.context import _STATE, Lineage, State, active_state
from replayable.integrations import langchain

__all__ = ["instrument", "instrumented", "task_key", "uninstrument"]

_KEY = "__replayable_graph"
_lock = threading.Lock()
_installed = False
_originals: list[tuple[Any, str, Any]] = []


def instrumented() -> bool:
    """Whether the LangGraph wrappers are in place."""
    return _installed


def instrument(*, side_effects: Iterable[str] = ()) -> None:
    """Wrap LangGraph's task runner and LangChain's model and tool calls (once)."""
    global _installed
    langchain.instrument(side_effects=side_effects)
    with _lock:
        if _installed:
            return
        from langgraph.pregel import Pregel, _runner

        for owner, attr, wrap in (
            (_runner, "run_with_retry", _wrap_run_task),
            (_runner, "arun_with_retry", _wrap_arun_task),
            (Pregel, "stream", _wrap_stream),
            (Pregel, "astream", _wrap_stream),
        ):
            original = getattr(owner, attr)
            _originals.append((owner, attr, original))
            setattr(owner, attr, wrap(original))
        _installed = True


def uninstrument() -> None:
    """Undo :func:`instrument`: LangGraph's and LangChain's own methods are back, and only
    the HTTP seam records (the zero-change path)."""
    global _installed
    with _lock:
        while _originals:
            owner, attr, original = _originals.pop()
            setattr(owner, attr, original)
        _installed = False
    langchain.uninstrument()


def _path(part: Any) -> str:
    if isinstance(part, tuple | list):
        return "(" + "|".join(_path(p) for p in part) + ")"
    if isinstance(part, str | int | bool):
        return str(part)
    return type(part).__name__


def task_key(task: Any) -> str | None:
    """The causal path of a LangGraph task: graph invocation, step and task path."""
    config = task.config or {}
    base = (config.get("configurable") or {}).get(_KEY)
    if base is None:
        return None
    step = (config.get("metadata") or {}).get("langgraph_step", "?")
    return f"{base}/{step}/" + "|".join(_path(p) for p in task.path)


def _task_state(task: Any) -> State | None:
    st = active_state()
    if st is None:
        return None
    key = task_key(task)
    if key is None:
        return None
    return State(st.session, st.run, Lineage(key), st.parent)


def _wrap_run_task(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run_with_retry(task: Any, *args: Any, **kwargs: Any) -> Any:
        state = _task_state(task)
        if state is None:
            return original(task, *args, **kwargs)
        token = _STATE.set(state)
        try:
            return original(task, *args, **kwargs)
        finally:
            _STATE.reset(token)

    return run_with_retry


def _wrap_arun_task(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def arun_with_retry(task: Any, *args: Any, **kwargs: Any) -> Any:
        state = _task_state(task)
        if state is None:
            return await original(task, *args, **kwargs)
        token = _STATE.set(state)
        try:
            return await original(task, *args, **kwargs)
        finally:
            _STATE.reset(token)

    return arun_with_retry


def _wrap_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def stream(self: Any, input: Any, config: Any = None, *args: Any, **kwargs: Any) -> Any:
        st = active_state()
        if st is not None:
            # The invocation's causal position names every task inside it.
            base = st.lineage.next_key()
            config = dict(config or {})
            config["configurable"] = {**(config.get("configurable") or {}), _KEY: base}
        return original(self, input, config, *args, **kwargs)

    return stream
