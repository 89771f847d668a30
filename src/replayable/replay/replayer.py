"""Full replay: re-execute the recorded entrypoint with every boundary served from the tape."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from replayable.capture.boundaries import workflow_info
from replayable.capture.config import settings
from replayable.capture.context import _STATE, Lineage, State, install_task_factory
from replayable.capture.runtime import (
    OpenCall,
    RunContext,
    Session,
    WorkflowInfo,
    encode_output,
)
from replayable.errors import EntrypointNotFoundError, ReplayDivergenceError, ReplayError
from replayable.events.canonical import fingerprint
from replayable.events.codec import (
    decode_error,
    decode_tree,
    decode_value,
    encode_request,
    resolve_name,
)
from replayable.events.model import Event, Run
from replayable.replay.divergence import ActualCall, Divergence, DivergenceReason, field_diff
from replayable.replay.tape import Tape
from replayable.store import EventStore, open_store

__all__ = ["ReplayResult", "replay"]

ReplayStatus = Literal["identical", "diverged", "failed", "incomplete"]


class _Stop(BaseException):
    """Unwinds the agent's stack when replay must stop. A BaseException, so the
    agent's own ``except Exception`` handlers do not swallow it."""

    def __init__(self, divergence: Divergence | None) -> None:
        super().__init__(divergence.message if divergence else "end of an incomplete recording")
        self.divergence = divergence


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of a replay.

    ``status`` is ``identical`` (every call matched the tape and the outcome is
    the recorded one), ``diverged`` (see ``divergence``), ``failed`` (the agent
    raised where the recording did not) or ``incomplete`` (the recording was
    cut short and was replayed to its last event).
    """

    status: ReplayStatus
    run_id: str
    output: Any = None
    error: BaseException | None = None
    divergence: Divergence | None = None
    events_served: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "identical"


class _ServedCall(OpenCall):
    """A call answered from the tape."""

    live = False

    def __init__(self, event: Event) -> None:
        self.event = event
        self.seq = event.seq
        self.metadata = event.metadata

    def value(self) -> Any:
        return ReplayRun._result(self.event)


class ReplayRun(RunContext):
    """A run being replayed: boundaries are answered from its tape."""

    def __init__(self, session: ReplaySession, run: Run, events: list[Event]) -> None:
        self.session = session
        self.run = run
        self.run_id = run.run_id
        self.tape = Tape(events)
        self.complete = run.end is not None

    def _serve(self, st: State, kind: str, name: str, request: Any, site: str | None) -> Event:
        session = self.session
        if session.stopped is not None:
            raise session.stopped
        key = st.lineage.next_key()
        req = settings.redactor.redact_bytes(encode_request(request))
        fp = fingerprint(kind, name, req)
        ev = self.tape.at(key)
        if ev is not None and ev.fingerprint == fp and ev.kind == kind and ev.name == name \
                and self.tape.take(ev):
            session.events_served += 1
            return ev
        if ev is None and not self.complete and self.tape.remaining() == 0:
            raise session.stop(None)
        actual = ActualCall(kind=kind, name=name, key=key, request=orjson.loads(req),
                            fingerprint=fp, call_site=site)
        if ev is None:
            reason: DivergenceReason = (
                "tape_exhausted" if self.tape.remaining() == 0 else "unexpected_call"
            )
            div = Divergence(reason=reason, run_id=self.run_id,
                             step=self._next_step(), actual=actual,
                             nearest=self.tape.nearest(kind, name), call_site=site)
        elif ev.kind != kind or ev.name != name:
            div = Divergence(reason="unexpected_call", run_id=self.run_id, step=ev.seq,
                             expected=ev, actual=actual, call_site=site)
        else:
            div = Divergence(reason="request_changed", run_id=self.run_id, step=ev.seq,
                             expected=ev, actual=actual,
                             diff=field_diff(ev.request_value(), actual.request), call_site=site)
        raise session.stop(div)

    def _next_step(self) -> int:
        unasked = self.tape.unasked()
        if unasked:
            return unasked[0].seq
        return (self.tape.events[-1].seq + 1) if self.tape.events else 1

    @staticmethod
    def _result(ev: Event) -> Any:
        if ev.error is not None:
            raise decode_error(ev.error)
        return decode_value(ev.response, ev.encoding)

    async def _aresult(self, ev: Event) -> Any:
        return self._result(ev)

    def begin(self, st: State, kind: str, name: str, request: Any, side_effect: bool = False,
              meta: dict[str, Any] | None = None, site: str | None = None) -> OpenCall:
        return _ServedCall(self._serve(st, kind, name, request, site))

    def call(self, st: State, kind: str, name: str, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: Mapping[str, Any], request: Any,
             side_effect: bool, meta: dict[str, Any] | None, site: str | None) -> Any:
        ev = self._serve(st, kind, name, request, site)
        if ev.metadata.get("awaitable"):
            return self._aresult(ev)
        return self._result(ev)

    async def acall(self, st: State, kind: str, name: str, fn: Callable[..., Awaitable[Any]],
                    args: tuple[Any, ...], kwargs: Mapping[str, Any], request: Any,
                    side_effect: bool, meta: dict[str, Any] | None, site: str | None) -> Any:
        return self._result(self._serve(st, kind, name, request, site))

    def _child(self, st: State, wf: WorkflowInfo, args: tuple[Any, ...],
               kwargs: Mapping[str, Any]) -> tuple[Event, ReplayRun]:
        ev = self._serve(st, "subrun", wf.name, {"args": list(args), "kwargs": dict(kwargs)}, None)
        child_id = ev.metadata.get("child_run_id")
        if not child_id:
            raise ReplayError(f"step {ev.seq} of run {self.run_id} names no child run")
        return ev, self.session.load(child_id)

    def subrun(self, st: State, wf: WorkflowInfo, args: tuple[Any, ...],
               kwargs: Mapping[str, Any]) -> Any:
        _, child = self._child(st, wf, args, kwargs)
        return self.session.execute(child, wf, args, kwargs)

    async def asubrun(self, st: State, wf: WorkflowInfo, args: tuple[Any, ...],
                      kwargs: Mapping[str, Any]) -> Any:
        _, child = self._child(st, wf, args, kwargs)
        return await self.session.aexecute(child, wf, args, kwargs)

    def finish(self) -> None:
        """After the run's code returned: every recorded call must have been asked."""
        unasked = self.tape.unasked()
        if unasked and self.session.stopped is None:
            first = unasked[0]
            raise self.session.stop(Divergence(
                reason="calls_not_asked", run_id=self.run_id, step=first.seq, expected=first,
                unasked=[e.seq for e in unasked]))


class ReplaySession(Session):
    """Serves one recorded run (and its child runs) to the agent's code."""

    def __init__(self, store: EventStore, root: Run, events: list[Event]) -> None:
        self.store = store
        self.root = ReplayRun(self, root, events)
        self.events_served = 0
        self.stopped: _Stop | None = None
        self._lock = threading.Lock()
        self._root_started = False

    def stop(self, divergence: Divergence | None) -> _Stop:
        with self._lock:
            if self.stopped is None:
                self.stopped = _Stop(divergence)
            return self.stopped

    def load(self, run_id: str) -> ReplayRun:
        return ReplayRun(self, self.store.get_run(run_id), self.store.events(run_id))

    def _claim_root(self, wf: WorkflowInfo) -> ReplayRun:
        if self._root_started:
            raise ReplayError("the replayed entrypoint started a second top-level run")
        self._root_started = True
        recorded = self.root.run.workflow
        if wf.name != recorded:
            raise ReplayError(f"run {self.root.run_id} recorded workflow {recorded!r}, "
                              f"but the entrypoint is workflow {wf.name!r}")
        return self.root

    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return self.execute(self._claim_root(wf), wf, args, kwargs)

    async def arun_root(self, wf: WorkflowInfo, args: tuple[Any, ...],
                        kwargs: Mapping[str, Any]) -> Any:
        return await self.aexecute(self._claim_root(wf), wf, args, kwargs)

    def execute(self, run: ReplayRun, wf: WorkflowInfo, args: tuple[Any, ...],
                kwargs: Mapping[str, Any]) -> Any:
        token = _STATE.set(State(self, run, Lineage()))
        try:
            result = wf.fn(*args, **kwargs)
        finally:
            _STATE.reset(token)
        run.finish()
        return result

    async def aexecute(self, run: ReplayRun, wf: WorkflowInfo, args: tuple[Any, ...],
                       kwargs: Mapping[str, Any]) -> Any:
        install_task_factory(asyncio.get_running_loop())
        token = _STATE.set(State(self, run, Lineage()))
        try:
            result = await wf.fn(*args, **kwargs)
        finally:
            _STATE.reset(token)
        run.finish()
        return result


def load_entrypoint(run: Run) -> Callable[..., Any]:
    """Import the run's recorded ``module:qualname`` (the current directory is importable;
    a script recorded as ``__main__`` is loaded from its file)."""
    entry = run.start.entrypoint
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    module_name, _, qualname = entry.partition(":")
    try:
        target: Any
        if module_name == "__main__":
            target = sys.modules["__main__"]
            for part in qualname.split("."):
                target = getattr(target, part)
        else:
            target = resolve_name(entry)
    except (ImportError, AttributeError, KeyError) as exc:
        file = run.start.code.get("file")
        target = _from_file(file, qualname) if file else None
        if target is None:
            raise EntrypointNotFoundError(
                f"cannot import the entrypoint {entry!r} of run {run.run_id}: {exc}; "
                "run from the project's directory or pass fn= to replay()"
            ) from None
    if not callable(target):
        raise EntrypointNotFoundError(f"entrypoint {entry!r} is not callable")
    return target  # type: ignore[no-any-return]


def _from_file(file: str, qualname: str) -> Callable[..., Any] | None:
    import importlib.util

    path = Path(file)
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"_replayable_entry_{path.stem}", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if callable(obj) else None


def _run_coroutine(make: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Called from inside an event loop: replay on a loop of its own.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="replayable-replay")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def replay(
    run_id: str,
    *,
    store: EventStore | str | None = None,
    fn: Callable[..., Any] | None = None,
    strict: bool = False,
) -> ReplayResult:
    """Re-execute a recorded run with every boundary served from its tape.

    The entrypoint is imported by its recorded name unless ``fn`` is given.
    Nothing real is called: no model, no tool, no clock. With ``strict`` a
    divergence raises :class:`~replayable.ReplayDivergenceError`.
    """
    st = open_store(store)
    run = st.run(run_id)
    target = fn or load_entrypoint(run)
    inputs = decode_tree(orjson.loads(run.start.input))
    args, kwargs = tuple(inputs["args"]), dict(inputs["kwargs"])
    session = ReplaySession(st, run, st.events(run.run_id))
    wf = workflow_info(target) or WorkflowInfo(
        name=run.workflow, entrypoint=run.start.entrypoint, fn=target,
        is_async=inspect.iscoroutinefunction(target))
    started = time.perf_counter()
    output: Any = None
    error: BaseException | None = None
    token = _STATE.set(State(session, None, Lineage()))
    try:
        if wf.is_async:
            output = _run_coroutine(lambda: session.arun_root(wf, args, kwargs))
        else:
            output = session.run_root(wf, args, kwargs)
    except _Stop:
        pass
    except Exception as exc:
        error = exc
    finally:
        _STATE.reset(token)
    result = _judge(session, run, output, error, time.perf_counter() - started)
    if strict and result.divergence is not None:
        raise ReplayDivergenceError(result.divergence)
    return result


def _judge(session: ReplaySession, run: Run, output: Any, error: BaseException | None,
           duration: float) -> ReplayResult:
    served = session.events_served
    base = {"run_id": run.run_id, "events_served": served, "duration_s": duration}
    if session.stopped is not None:
        div = session.stopped.divergence
        if div is None:
            return ReplayResult(status="incomplete", **base)  # type: ignore[arg-type]
        return ReplayResult(status="diverged", divergence=div, **base)  # type: ignore[arg-type]
    end = run.end
    if end is None:
        status: ReplayStatus = "incomplete"
        return ReplayResult(status=status, output=output, error=error, **base)  # type: ignore[arg-type]
    if error is not None:
        recorded = orjson.loads(end.error) if end.error else None
        same = (recorded is not None and recorded["type"].rsplit(":", 1)[-1]
                == type(error).__qualname__ and recorded["message"] == str(error))
        status = "identical" if same else "failed"
        return ReplayResult(status=status, error=error, **base)  # type: ignore[arg-type]
    if end.status == "failed":
        div = Divergence(reason="output_changed", run_id=run.run_id, step=None,
                         diff=[_fd("error", orjson.loads(end.error or "null"), None)])
        return ReplayResult(status="diverged", output=output, divergence=div, **base)  # type: ignore[arg-type]
    now = settings.redactor.redact_bytes(encode_output(output))
    if end.output is not None and now != end.output.encode():
        div = Divergence(reason="output_changed", run_id=run.run_id, step=None,
                         diff=field_diff(orjson.loads(end.output), orjson.loads(now), "output"))
        return ReplayResult(status="diverged", output=output, divergence=div, **base)  # type: ignore[arg-type]
    return ReplayResult(status="identical", output=output, **base)  # type: ignore[arg-type]


def _fd(path: str, expected: Any, actual: Any) -> Any:
    from replayable.replay.divergence import FieldDiff

    return FieldDiff(path, expected, actual)
