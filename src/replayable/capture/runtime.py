"""Sessions and runs: what a boundary call is handed to.

A *session* is a recording (or, in ``replay/``, a replay); a *run context*
is one run inside it. Boundaries call ``run.call(...)``; a recording run
executes the real function and hands the event to the writer, a replay run
serves it from the tape. Both derive causal positions the same way.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from replayable.capture.config import settings
from replayable.capture.context import _STATE, Lineage, State, install_task_factory
from replayable.capture.environment import code_fingerprint, environment_snapshot
from replayable.capture.writer import OnStoreFailure, Writer, writer_for
from replayable.errors import ConfigurationError, SerializationError
from replayable.events.canonical import canonical
from replayable.events.codec import (
    UnencodableError,
    encode_error,
    encode_request,
    encode_value,
    to_tree,
)
from replayable.events.ids import uuid7
from replayable.events.model import RunStart
from replayable.store import EventStore, open_store

__all__ = [
    "RecordRun",
    "Recording",
    "RunContext",
    "Session",
    "WorkflowInfo",
    "encode_input",
    "encode_output",
    "new_run_id",
]

Durability = Literal["buffered", "durable"]


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """What ``@workflow`` knows about an entry function."""

    name: str
    entrypoint: str
    fn: Callable[..., Any]
    is_async: bool
    metadata: Mapping[str, Any] = field(default_factory=dict)


def new_run_id() -> str:
    """A fresh UUIDv7 run id."""
    return uuid7(time.time_ns() // 1_000_000, os.urandom(10))


def encode_input(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """A run's input as tagged canonical JSON (types survive the round trip)."""
    return canonical(to_tree({"args": list(args), "kwargs": dict(kwargs)})).decode()


def encode_output(value: Any) -> bytes:
    """A run's output as tagged canonical JSON."""
    return canonical(to_tree(value))


def _serialization_error(
    what: str, exc: UnencodableError, step: int | None, boundary: str | None = None
) -> SerializationError:
    where = f" at step {step}" if step is not None else ""
    return SerializationError(
        f"{what}{where} cannot be recorded: {exc}; teach replayable the type with "
        "replayable.register_codec()",
        boundary=boundary,
        step=step,
        type_name=exc.type_name,
        path=exc.path,
    )


class RunContext(ABC):
    """One run in progress: the target of every boundary call inside it."""

    run_id: str

    @abstractmethod
    def call(
        self,
        st: State,
        kind: str,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        request: Any,
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
    ) -> Any:
        """Cross a synchronous boundary (may return an awaitable for ``llm``)."""

    @abstractmethod
    async def acall(
        self,
        st: State,
        kind: str,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        request: Any,
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
    ) -> Any:
        """Cross an asynchronous boundary."""

    @abstractmethod
    def subrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """Run a child workflow."""

    @abstractmethod
    async def asubrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """Run an async child workflow."""

    def span(self, st: State, name: str, attrs: Mapping[str, Any]) -> int | None:
        """Open a span; returns the seq that nested events name as their parent."""
        return st.parent

    @abstractmethod
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
        """Start a boundary call whose outcome arrives later (streams, transports).

        Recording: the returned call is ``live``; do the real work, then
        ``finish(value)`` or ``fail(exc)``. Replay: it is not live and
        ``value()`` returns (or raises) what was recorded.
        """


class Session(ABC):
    """A recording or a replay: decides what a top-level workflow call does."""

    @abstractmethod
    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """A workflow called with no run active."""

    @abstractmethod
    async def arun_root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """An async workflow called with no run active."""


class OpenCall:
    """A boundary call in progress (see :meth:`RunContext.begin`)."""

    live: bool = True
    seq: int = 0
    metadata: dict[str, Any]

    def value(self) -> Any:
        """The recorded outcome (replay only)."""
        raise RuntimeError("a live call has no recorded value")

    def finish(self, value: Any, meta: Mapping[str, Any] | None = None) -> None:
        """Record the outcome of a live call."""

    def fail(self, exc: BaseException, meta: Mapping[str, Any] | None = None) -> None:
        """Record that a live call raised."""


class RecordingCall(OpenCall):
    __slots__ = (
        "_done",
        "key",
        "kind",
        "metadata",
        "name",
        "parent",
        "req",
        "run",
        "seq",
        "side_effect",
        "site",
        "started",
        "t0",
    )

    def __init__(
        self,
        run: RecordRun,
        st: State,
        kind: str,
        name: str,
        req: bytes,
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
        position: tuple[int, str] | None = None,
    ) -> None:
        self.run, self.kind, self.name, self.req = run, kind, name, req
        self.seq, self.key = position or (run.next_seq(), st.lineage.next_key())
        self.parent = st.parent
        self.side_effect, self.site = side_effect, site
        self.metadata = dict(meta or {})
        self.started = time.time()
        self.t0 = time.perf_counter_ns()
        self._done = False

    def finish(self, value: Any, meta: Mapping[str, Any] | None = None) -> None:
        if self._done:
            return
        self._done = True
        if meta:
            self.metadata.update(meta)
        try:
            resp, tagged = encode_value(value)
        except UnencodableError as exc:
            err = _serialization_error(
                f"the value returned by {self.kind} {self.name!r}", exc, self.seq, self.name
            )
            self._emit(None, False, encode_error(err))
            raise err from None
        self._emit(resp, tagged, None)

    def fail(self, exc: BaseException, meta: Mapping[str, Any] | None = None) -> None:
        if self._done:
            return
        self._done = True
        if meta:
            self.metadata.update(meta)
        self._emit(None, False, encode_error(exc))

    def _emit(self, resp: bytes | None, tagged: bool, err: bytes | None) -> None:
        self.run.emit(
            self.seq,
            self.kind,
            self.name,
            self.key,
            self.parent,
            self.site,
            self.req,
            resp,
            tagged,
            err,
            self.side_effect,
            self.started,
            time.perf_counter_ns() - self.t0,
            self.metadata or None,
        )


class RecordRun(RunContext):
    """A run being recorded: boundaries run for real and are handed to the writer."""

    __slots__ = ("_seq", "durable", "recording", "root_run_id", "run_id", "writer")

    def __init__(self, recording: Recording, run_id: str, root_run_id: str) -> None:
        self.recording = recording
        self.run_id = run_id
        self.root_run_id = root_run_id
        self.writer: Writer = recording.writer
        self.durable = recording.durable
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seq)

    # -- boundaries ---------------------------------------------------------

    def call(
        self,
        st: State,
        kind: str,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        request: Any,
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
    ) -> Any:
        seq = next(self._seq)
        key = st.lineage.next_key()
        return self.live_call(
            st,
            seq,
            key,
            self._request(request, name, seq),
            kind,
            name,
            fn,
            args,
            kwargs,
            side_effect,
            meta,
            site,
        )

    def live_call(
        self,
        st: State,
        seq: int,
        key: str,
        req: bytes,
        kind: str,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
    ) -> Any:
        """Run the real call for step ``seq`` and record it."""
        started = time.time()
        t0 = time.perf_counter_ns()
        # Calls made inside a boundary belong to it: replay serves the boundary
        # without running it, so nested boundaries must not be recorded.
        token = _STATE.set(None)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self.emit(
                seq,
                kind,
                name,
                key,
                st.parent,
                site,
                req,
                None,
                False,
                encode_error(exc),
                side_effect,
                started,
                time.perf_counter_ns() - t0,
                meta,
            )
            raise
        finally:
            _STATE.reset(token)
        if meta is not None and meta.get("awaitable") is None and inspect.isawaitable(result):
            return self._finish_awaitable(
                result, st, seq, kind, name, key, site, req, side_effect, started, t0, meta
            )
        self._respond(
            result,
            st,
            seq,
            kind,
            name,
            key,
            site,
            req,
            side_effect,
            started,
            time.perf_counter_ns() - t0,
            meta,
        )
        return result

    async def _finish_awaitable(
        self,
        awaitable: Awaitable[Any],
        st: State,
        seq: int,
        kind: str,
        name: str,
        key: str,
        site: str | None,
        req: bytes,
        side_effect: bool,
        started: float,
        t0: int,
        meta: dict[str, Any],
    ) -> Any:
        meta = {**meta, "awaitable": True}
        token = _STATE.set(None)
        try:
            result = await awaitable
        except BaseException as exc:
            self.emit(
                seq,
                kind,
                name,
                key,
                st.parent,
                site,
                req,
                None,
                False,
                encode_error(exc),
                side_effect,
                started,
                time.perf_counter_ns() - t0,
                meta,
            )
            raise
        finally:
            _STATE.reset(token)
        self._respond(
            result,
            st,
            seq,
            kind,
            name,
            key,
            site,
            req,
            side_effect,
            started,
            time.perf_counter_ns() - t0,
            meta,
        )
        return result

    async def acall(
        self,
        st: State,
        kind: str,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        request: Any,
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
    ) -> Any:
        seq = next(self._seq)
        key = st.lineage.next_key()
        return await self.alive_call(
            st,
            seq,
            key,
            self._request(request, name, seq),
            kind,
            name,
            fn,
            args,
            kwargs,
            side_effect,
            meta,
            site,
        )

    async def alive_call(
        self,
        st: State,
        seq: int,
        key: str,
        req: bytes,
        kind: str,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
    ) -> Any:
        """Await the real call for step ``seq`` and record it."""
        started = time.time()
        t0 = time.perf_counter_ns()
        token = _STATE.set(None)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self.emit(
                seq,
                kind,
                name,
                key,
                st.parent,
                site,
                req,
                None,
                False,
                encode_error(exc),
                side_effect,
                started,
                time.perf_counter_ns() - t0,
                meta,
            )
            raise
        finally:
            _STATE.reset(token)
        self._respond(
            result,
            st,
            seq,
            kind,
            name,
            key,
            site,
            req,
            side_effect,
            started,
            time.perf_counter_ns() - t0,
            meta,
        )
        return result

    def _request(self, request: Any, name: str, seq: int) -> bytes:
        try:
            return encode_request(request)
        except UnencodableError as exc:
            raise _serialization_error(f"the request of {name!r}", exc, seq, name) from None

    def _respond(
        self,
        result: Any,
        st: State,
        seq: int,
        kind: str,
        name: str,
        key: str,
        site: str | None,
        req: bytes,
        side_effect: bool,
        started: float,
        dur: int,
        meta: dict[str, Any] | None,
    ) -> None:
        try:
            resp, tagged = encode_value(result)
        except UnencodableError as exc:
            err = _serialization_error(f"the value returned by {kind} {name!r}", exc, seq, name)
            self.emit(
                seq,
                kind,
                name,
                key,
                st.parent,
                site,
                req,
                None,
                False,
                encode_error(err),
                side_effect,
                started,
                dur,
                meta,
            )
            raise err from None
        self.emit(
            seq,
            kind,
            name,
            key,
            st.parent,
            site,
            req,
            resp,
            tagged,
            None,
            side_effect,
            started,
            dur,
            meta,
        )

    def emit(
        self,
        seq: int,
        kind: str,
        name: str,
        key: str | None,
        parent: int | None,
        site: str | None,
        req: bytes,
        resp: bytes | None,
        tagged: bool,
        err: bytes | None,
        side_effect: bool,
        started: float,
        dur: int,
        meta: dict[str, Any] | None,
    ) -> None:
        """Hand one finished event to the writer."""
        self.writer.event(
            (
                self.run_id,
                seq,
                kind,
                name,
                key,
                parent,
                site,
                req,
                resp,
                tagged,
                err,
                side_effect,
                started,
                dur,
                meta,
            ),
            self.durable,
        )

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
        try:
            req = encode_request(request)
        except UnencodableError as exc:
            raise _serialization_error(f"the request of {name!r}", exc, None, name) from None
        return RecordingCall(self, st, kind, name, req, side_effect, meta, site)

    def span(self, st: State, name: str, attrs: Mapping[str, Any]) -> int | None:
        seq = next(self._seq)
        self.emit(
            seq,
            "span",
            name,
            None,
            st.parent,
            None,
            encode_request(dict(attrs)),
            None,
            False,
            None,
            False,
            time.time(),
            0,
            None,
        )
        return seq

    # -- child runs -----------------------------------------------------------

    def subrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        seq = next(self._seq)
        key = st.lineage.next_key()
        req = self._request({"args": list(args), "kwargs": dict(kwargs)}, wf.name, seq)
        child = self.recording.start_run(wf, args, kwargs, parent=(self, seq))
        return self.live_subrun(st, seq, key, req, wf, args, kwargs, child)

    def live_subrun(
        self,
        st: State,
        seq: int,
        key: str,
        req: bytes,
        wf: WorkflowInfo,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        child: RecordRun,
    ) -> Any:
        """Run the child workflow as run ``child`` and record step ``seq`` pointing at it."""
        started, t0 = time.time(), time.perf_counter_ns()
        meta = {"child_run_id": child.run_id}
        try:
            result = self.recording.execute(child, wf, args, kwargs)
        except BaseException as exc:
            self.emit(
                seq,
                "subrun",
                wf.name,
                key,
                st.parent,
                None,
                req,
                None,
                False,
                encode_error(exc),
                False,
                started,
                time.perf_counter_ns() - t0,
                meta,
            )
            raise
        self._respond(
            result,
            st,
            seq,
            "subrun",
            wf.name,
            key,
            None,
            req,
            False,
            started,
            time.perf_counter_ns() - t0,
            meta,
        )
        return result

    async def asubrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        seq = next(self._seq)
        key = st.lineage.next_key()
        req = self._request({"args": list(args), "kwargs": dict(kwargs)}, wf.name, seq)
        child = self.recording.start_run(wf, args, kwargs, parent=(self, seq))
        return await self.alive_subrun(st, seq, key, req, wf, args, kwargs, child)

    async def alive_subrun(
        self,
        st: State,
        seq: int,
        key: str,
        req: bytes,
        wf: WorkflowInfo,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        child: RecordRun,
    ) -> Any:
        """Await the child workflow as run ``child`` and record step ``seq`` pointing at it."""
        started, t0 = time.time(), time.perf_counter_ns()
        meta = {"child_run_id": child.run_id}
        try:
            result = await self.recording.aexecute(child, wf, args, kwargs)
        except BaseException as exc:
            self.emit(
                seq,
                "subrun",
                wf.name,
                key,
                st.parent,
                None,
                req,
                None,
                False,
                encode_error(exc),
                False,
                started,
                time.perf_counter_ns() - t0,
                meta,
            )
            raise
        self._respond(
            result,
            st,
            seq,
            "subrun",
            wf.name,
            key,
            None,
            req,
            False,
            started,
            time.perf_counter_ns() - t0,
            meta,
        )
        return result


class Recording(Session):
    """``with replayable.recording(store):`` — workflow calls inside are recorded.

    ``run_ids`` lists the top-level runs recorded, ``all_run_ids`` child runs
    too. Leaving the block waits until everything is committed.
    """

    def __init__(
        self,
        store: EventStore | str | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        durability: Durability = "buffered",
        env_vars: tuple[str, ...] = (),
        lineage: Mapping[str, Any] | None = None,
        on_store_failure: OnStoreFailure | None = None,
        max_block_s: float | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if durability not in ("buffered", "durable"):
            raise ConfigurationError(
                f"durability must be 'buffered' or 'durable', not {durability!r}"
            )
        self.store = open_store(store)
        self.metadata = dict(metadata or {})
        self.tenant = tenant
        self.durability = durability
        self.durable = durability == "durable"
        self.env_vars = (*settings.env_vars, *env_vars)
        self.lineage = dict(lineage or {})
        self.run_ids: list[str] = []
        self.all_run_ids: list[str] = []
        self._env_hash: str | None = None
        self._tokens: list[Any] = []
        self.writer = writer_for(
            self.store,
            on_store_failure=on_store_failure,
            max_block_s=max_block_s,
            spool_dir=spool_dir,
        )

    # -- context manager ------------------------------------------------------

    def __enter__(self) -> Recording:
        intercept_http()
        self._tokens.append(_STATE.set(State(self, None, Lineage())))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _STATE.reset(self._tokens.pop())
        self.writer.flush()

    async def __aenter__(self) -> Recording:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import asyncio

        _STATE.reset(self._tokens.pop())
        await asyncio.to_thread(self.writer.flush)

    # -- runs -----------------------------------------------------------------

    def _environment(self) -> str:
        if self._env_hash is None:
            digest, data = environment_snapshot(self.env_vars, settings.redactor)
            self.writer.blob(digest, data)
            self._env_hash = digest
        return self._env_hash

    def start_run(
        self,
        wf: WorkflowInfo,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        parent: tuple[RecordRun, int] | None = None,
        run_id: str | None = None,
        factory: Callable[[str, str], RecordRun] | None = None,
    ) -> RecordRun:
        """Write a run's start record and return its context (built by ``factory``)."""
        run_id = run_id or new_run_id()
        try:
            input_json = encode_input(args, kwargs)
        except UnencodableError as exc:
            raise _serialization_error(
                f"the input of workflow {wf.name!r}", exc, None, wf.name
            ) from None
        parent_run, parent_seq = parent if parent is not None else (None, None)
        root = parent_run.root_run_id if parent_run is not None else run_id
        start = RunStart(
            run_id=run_id,
            workflow=wf.name,
            entrypoint=wf.entrypoint,
            parent_run_id=parent_run.run_id if parent_run is not None else None,
            parent_seq=parent_seq,
            root_run_id=root,
            tenant=self.tenant,
            input=input_json,
            metadata={**wf.metadata, **self.metadata},
            code=code_fingerprint(wf.fn),
            env_hash=self._environment(),
            lineage=self.lineage if parent is None else {},
            started_at=time.time(),
        )
        self.writer.start(start, self.durable)
        if parent is None:
            self.run_ids.append(run_id)
        self.all_run_ids.append(run_id)
        return factory(run_id, root) if factory is not None else RecordRun(self, run_id, root)

    def _finish(self, run: RecordRun, result: Any) -> None:
        try:
            output = encode_output(result)
        except UnencodableError as exc:
            err = _serialization_error(f"the output of run {run.run_id}", exc, None)
            self.writer.end(
                (run.run_id, "failed", None, encode_error(err), time.time()), self.durable
            )
            raise err from None
        self.writer.end((run.run_id, "completed", output, None, time.time()), self.durable)

    def _fail(self, run: RecordRun, exc: BaseException) -> None:
        self.writer.end((run.run_id, "failed", None, encode_error(exc), time.time()), self.durable)

    def execute(
        self, run: RecordRun, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        token = _STATE.set(State(self, run, Lineage()))
        try:
            result = wf.fn(*args, **kwargs)
        except BaseException as exc:
            self._fail(run, exc)
            raise
        finally:
            _STATE.reset(token)
        self._finish(run, result)
        return result

    async def aexecute(
        self, run: RecordRun, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        import asyncio

        install_task_factory(asyncio.get_running_loop())
        token = _STATE.set(State(self, run, Lineage()))
        try:
            result = await wf.fn(*args, **kwargs)
        except BaseException as exc:
            self._fail(run, exc)
            raise
        finally:
            _STATE.reset(token)
        self._finish(run, result)
        return result

    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return self.execute(self.start_run(wf, args, kwargs), wf, args, kwargs)

    async def arun_root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        return await self.aexecute(self.start_run(wf, args, kwargs), wf, args, kwargs)


def intercept_http() -> None:
    """Route the HTTP clients already imported (httpx, httpx2 and the SDKs on them)
    through the recording seam; it acts only while a run is active."""
    if "httpx2" in sys.modules or "httpx" in sys.modules:
        from replayable.integrations.http import install

        install()


def call_site(depth: int) -> str | None:
    """``file:line in function`` of the frame ``depth`` levels above the caller."""
    try:
        f = sys._getframe(depth + 1)
    except ValueError:
        return None
    co = f.f_code
    return f"{co.co_filename}:{f.f_lineno} in {co.co_name}"
