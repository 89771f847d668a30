"""Where a boundary call finds its run: one context variable and causal positions.

``_STATE`` holds the active session, run, task lineage and enclosing span.
A lineage is a node in the tree of tasks and threads a run spawns; each new
asyncio task (through the task factory) or carried thread gets a child
lineage numbered in the order the parent *created* it, never in the order it
happens to run. A call's causal position is ``lineage:ordinal``, so parallel
calls match on replay however their completion order falls.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import sys
import types
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    import asyncio

    from replayable.capture.runtime import RunContext, Session

__all__ = [
    "Lineage",
    "State",
    "active_state",
    "carry",
    "current_state",
    "install_task_factory",
]

P = ParamSpec("P")
R = TypeVar("R")


class Lineage:
    """A task or thread inside a run: its path and its counters."""

    __slots__ = ("_children", "_ordinal", "path")

    def __init__(self, path: str = "r") -> None:
        self.path = path
        self._ordinal = itertools.count()
        self._children = itertools.count()

    def next_key(self) -> str:
        """The causal position of this lineage's next boundary call."""
        return f"{self.path}:{next(self._ordinal)}"

    def child(self) -> Lineage:
        """A new lineage for a task or thread this one is starting now."""
        return Lineage(f"{self.path}.{next(self._children)}")


class State:
    """What the context variable holds: immutable, replaced rather than changed."""

    __slots__ = ("lineage", "origin", "parent", "run", "session")

    def __init__(
        self,
        session: Session,
        run: RunContext | None,
        lineage: Lineage,
        parent: int | None = None,
        origin: types.FrameType | None = None,
    ) -> None:
        self.session = session
        self.run = run
        self.lineage = lineage
        self.parent = parent
        #: The frame that started this task or thread, so a paused replay can show
        #: the agent code that spawned it (a gathered task's own stack has none).
        self.origin = origin

    def child(self, origin: types.FrameType | None = None) -> State:
        return State(self.session, self.run, self.lineage.child(), self.parent, origin)


_STATE: contextvars.ContextVar[State | None] = contextvars.ContextVar(
    "replayable_state", default=None
)
current_state = _STATE.get


def active_state() -> State | None:
    """The state of the run this code is inside, or ``None`` outside any run."""
    st = _STATE.get()
    return st if st is not None and st.run is not None else None


def carry(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``fn`` to run in this context, as a new lineage, in another thread.

    Threads do not inherit context variables, so a tool called from a plain
    thread would not be recorded. ``executor.submit(replayable.carry(fn), x)``
    fixes that; the child lineage is numbered now, in submission order, which
    keeps replay deterministic whatever order the threads run in. Each
    wrapper is for one call.
    """
    ctx = contextvars.copy_context()
    st = ctx.get(_STATE)
    if st is not None and st.run is not None:
        ctx.run(_STATE.set, st.child(sys._getframe(1)))

    @functools.wraps(fn)
    def run_carried(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.run(fn, *args, **kwargs)

    return run_carried


def _in_finalizer(frame: types.FrameType | None, depth: int = 4) -> bool:
    """Whether one of the ``depth`` innermost frames is a ``__del__`` method."""
    while frame is not None and depth:
        if frame.f_code.co_name == "__del__":
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _task_factory(
    previous: Any,
) -> Callable[..., asyncio.Future[Any]]:
    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        context = kwargs.get("context")
        context = contextvars.copy_context() if context is None else context.copy()
        st = context.get(_STATE)
        if st is not None and st.run is not None:
            origin = sys._getframe(1)
            # A finalizer runs wherever garbage collection strikes (an SDK client left
            # open schedules its own close from ``__del__``): its task is no one's, and
            # must not take an ordinal from whichever agent task happened to be running.
            context.run(_STATE.set, None if _in_finalizer(origin) else st.child(origin))
        kwargs["context"] = context
        if previous is not None:
            return previous(loop, coro, **kwargs)  # type: ignore[no-any-return]
        # Imported here, not at the top: a synchronous agent need not load it.
        import asyncio

        return asyncio.Task(coro, loop=loop, **kwargs)

    factory.replayable = True  # type: ignore[attr-defined]
    return factory


def install_task_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Give tasks created on ``loop`` their own lineage (chains any existing factory)."""
    current = loop.get_task_factory()
    if not getattr(current, "replayable", False):
        loop.set_task_factory(_task_factory(current))
