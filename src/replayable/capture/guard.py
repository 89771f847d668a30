"""The import guard: while replay imports an entry module, nothing may run live.

A script recorded with ``python tour.py`` often records at its top level
(``with replayable.recording(): agent(...)``, no ``__main__`` guard). Importing
it to find the workflow would run that code again: a new live run, real model
calls, real side effects. Under :func:`guarded` every boundary, every
``recording()`` and every workflow call is refused with :class:`GuardStop`
(a ``BaseException``, so the script's ``except Exception`` cannot swallow it),
and the refusals are kept so the caller can say what happened.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from replayable.capture.context import _STATE, Lineage, State
from replayable.capture.runtime import (
    Call,
    DeferredRequest,
    OpenCall,
    RunContext,
    Session,
    WorkflowInfo,
)

__all__ = ["Guard", "GuardStop", "guarded", "refuse_live"]


class GuardStop(BaseException):
    """Raised inside an entry module's top level when it tries to run something live."""


class Guard:
    """One guarded import: the file being imported and what its top level tried."""

    def __init__(self, label: str, file: str | None) -> None:
        self.label = label
        self.file = file
        self.refused: list[str] = []

    def refuse(self, what: str) -> GuardStop:
        where = self._site()
        self.refused.append(f"{what}{where}")
        return GuardStop(f"{what}{where}")

    def _site(self) -> str:
        # The first frame in the imported file: the line of the script that asked.
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if self.file is not None and code.co_filename == self.file:
                return f" at {code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back  # type: ignore[assignment]
        return ""


_lock = threading.Lock()
_active: list[Guard] = []


def refuse_live(what: str) -> None:
    """Raise :class:`GuardStop` if an entry module is being imported for replay."""
    if _active:
        raise _active[-1].refuse(what)


class _GuardRun(RunContext):
    """The run every boundary finds while an entry module is imported: refuses all."""

    run_id = "(importing an entry module)"

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def call(self, st: State, call: Call) -> Any:
        raise self.guard.refuse(_what(call.kind, call.name, call.side_effect))

    async def acall(self, st: State, call: Call) -> Any:
        raise self.guard.refuse(_what(call.kind, call.name, call.side_effect))

    def subrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        raise self.guard.refuse(f"a call of workflow {wf.name!r}")

    async def asubrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        raise self.guard.refuse(f"a call of workflow {wf.name!r}")

    def span(self, st: State, name: str, attrs: Mapping[str, Any]) -> int | None:
        raise self.guard.refuse(f"span {name!r}")

    def begin(
        self,
        st: State,
        kind: str,
        name: str,
        request: Any,
        side_effect: bool = False,
        meta: dict[str, Any] | None = None,
        site: str | None = None,
    ) -> OpenCall:
        raise self.guard.refuse(_what(kind, name, side_effect))

    def begin_deferred(self, st: State, request: DeferredRequest, site: str | None) -> OpenCall:
        raise self.guard.refuse(_what(request.kind, request.name, False))


class _GuardSession(Session):
    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        raise self.guard.refuse(f"a call of workflow {wf.name!r}")

    async def arun_root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        raise self.guard.refuse(f"a call of workflow {wf.name!r}")


def _what(kind: str, name: str, side_effect: bool) -> str:
    if kind == "tool" and side_effect:
        return f"the side-effect tool {name!r}"
    return f"the {kind} call {name!r}"


@contextmanager
def guarded(label: str, file: str | None) -> Iterator[Guard]:
    """Refuse everything live while the body (an import) runs; yields the :class:`Guard`."""
    guard = Guard(label, file)
    with _lock:
        _active.append(guard)
    token = _STATE.set(State(_GuardSession(guard), _GuardRun(guard), Lineage()))
    try:
        yield guard
    finally:
        _STATE.reset(token)
        with _lock:
            _active.remove(guard)
