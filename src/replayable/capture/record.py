"""A run being recorded: boundaries run for real and their events go to the writer."""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from replayable.capture.context import _STATE, State
from replayable.capture.network import Connection, warn_gap
from replayable.capture.runtime import (
    Call,
    DeferredRequest,
    OpenCall,
    RunContext,
    WorkflowInfo,
    serialization_error,
)
from replayable.capture.writer.core import Writer
from replayable.capture.writer.process import ProcessWriter
from replayable.events.codec import (
    UnencodableError,
    encode_error,
    encode_request,
    encode_value,
    unencodable_note,
    unencodable_request,
)

if TYPE_CHECKING:
    from replayable.capture.recording import Recording

__all__ = ["RecordRun", "RecordingCall"]

_clock = time.perf_counter_ns


class RecordingCall(OpenCall):
    __slots__ = (
        "_done",
        "builder",
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
        req: Any,
        side_effect: bool,
        meta: dict[str, Any] | None,
        site: str | None,
        position: tuple[int, str] | None = None,
        builder: str | None = None,
    ) -> None:
        # ``req`` is the encoded request, or with a ``builder`` its raw parts.
        self.run, self.kind, self.name, self.req = run, kind, name, req
        self.builder = builder
        self.seq, self.key = position or (run.next_seq(), st.lineage.next_key())
        self.parent = st.parent
        self.side_effect, self.site = side_effect, site
        self.metadata = dict(meta) if meta else {}
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
            err = serialization_error(
                f"the value returned by {self.kind} {self.name!r}", exc, self.seq, self.name
            )
            # The step stays on the tape, marked, so replay meets the same error here.
            self.metadata["unencodable"] = unencodable_note(exc, "response")
            self._emit(None, False, encode_error(err))
            raise err from None
        self._emit(resp, tagged, None)

    def fail(self, exc: BaseException, meta: Mapping[str, Any] | None = None) -> None:
        if self._done:
            return
        self._done = True
        if meta:
            self.metadata.update(meta)
        self._emit(None, self.builder or False, encode_error(exc))

    @property
    def deferred(self) -> bool:  # type: ignore[override]
        return self.builder is not None

    def finish_deferred(self, raw: Any, meta: Mapping[str, Any] | None = None) -> None:
        if self._done:
            return
        if self.builder is None:
            raise RuntimeError(f"{self.kind} {self.name!r} was not begun deferred")
        self._done = True
        if meta:
            self.metadata.update(meta)
        self._emit(raw, self.builder, None)

    def _emit(self, resp: Any, tagged: bool | str, err: bytes | None) -> None:
        # What ``RecordRun.emit`` does, without a call of fifteen arguments.
        run = self.run
        run.writer.event(
            (
                run.run_id,
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
            ),
            run.durable,
        )


class RecordRun(RunContext):
    """A run being recorded: boundaries run for real and are handed to the writer."""

    __slots__ = ("_seq", "durable", "recording", "root_run_id", "run_id", "writer")

    def __init__(self, recording: Recording, run_id: str, root_run_id: str) -> None:
        self.recording = recording
        self.run_id = run_id
        self.root_run_id = root_run_id
        self.writer: Writer | ProcessWriter = recording.writer
        self.durable = recording.durable
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seq)

    # -- boundaries ---------------------------------------------------------

    def call(self, st: State, call: Call) -> Any:
        seq = next(self._seq)
        key = st.lineage.next_key()
        try:
            req = encode_request(call.request)
        except UnencodableError as exc:
            raise self._unencodable(
                st, seq, key, call.kind, call.name, exc, call.side_effect, call.site
            ) from None
        return self.live_call(st, seq, key, req, call)

    def live_call(self, st: State, seq: int, key: str, req: bytes, call: Call) -> Any:
        """Run the real call for step ``seq`` and record it."""
        kind, name, side_effect, meta, site = (
            call.kind, call.name, call.side_effect, call.meta, call.site
        )  # fmt: skip
        started = time.time()
        t0 = _clock()
        # Calls made inside a boundary belong to it: replay serves the boundary
        # without running it, so nested boundaries must not be recorded.
        token = _STATE.set(None)
        try:
            result = call.fn(*call.args, **call.kwargs)
        except BaseException as exc:
            self._opened(st, seq, key, req, call, started, t0).fail(exc)
            raise
        finally:
            _STATE.reset(token)
        if meta is None:
            # The common case (every @tool call) without a call object.
            try:
                resp, tagged = encode_value(result)
            except UnencodableError:
                pass  # the call object records the error and raises SerializationError
            else:
                self.emit(
                    seq, kind, name, key, st.parent, site, req, resp, tagged, None,
                    side_effect, started, _clock() - t0, None,
                )  # fmt: skip
                return result
        opened = self._opened(st, seq, key, req, call, started, t0)
        if meta is not None and meta.get("awaitable") is None and inspect.isawaitable(result):
            # A plain function that handed back an awaitable (SDK wrappers do):
            # the call ends when the caller awaits it.
            opened.metadata["awaitable"] = True
            return self._finish_awaitable(result, opened)
        opened.finish(result)
        return result

    def _opened(
        self, st: State, seq: int, key: str, req: bytes, call: Call, started: float, t0: int
    ) -> RecordingCall:
        """The call object of step ``seq``, whose real call began at ``started``."""
        opened = RecordingCall(
            self, st, call.kind, call.name, req, call.side_effect, call.meta, call.site, (seq, key)
        )
        opened.started, opened.t0 = started, t0
        return opened

    async def _finish_awaitable(self, awaitable: Awaitable[Any], call: RecordingCall) -> Any:
        token = _STATE.set(None)
        try:
            result = await awaitable
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            _STATE.reset(token)
        call.finish(result)
        return result

    async def acall(self, st: State, call: Call) -> Any:
        seq = next(self._seq)
        key = st.lineage.next_key()
        try:
            req = encode_request(call.request)
        except UnencodableError as exc:
            raise self._unencodable(
                st, seq, key, call.kind, call.name, exc, call.side_effect, call.site
            ) from None
        return await self.alive_call(st, seq, key, req, call)

    async def alive_call(self, st: State, seq: int, key: str, req: bytes, call: Call) -> Any:
        """Await the real call for step ``seq`` and record it."""
        opened = RecordingCall(
            self, st, call.kind, call.name, req, call.side_effect, call.meta, call.site, (seq, key)
        )
        token = _STATE.set(None)
        try:
            result = await call.fn(*call.args, **call.kwargs)
        except BaseException as exc:
            opened.fail(exc)
            raise
        finally:
            _STATE.reset(token)
        opened.finish(result)
        return result

    def _request(self, request: Any, name: str, seq: int) -> bytes:
        try:
            return encode_request(request)
        except UnencodableError as exc:
            raise serialization_error(f"the request of {name!r}", exc, seq, name) from None

    def _unencodable(
        self,
        st: State,
        seq: int,
        key: str,
        kind: str,
        name: str,
        exc: UnencodableError,
        side_effect: bool,
        site: str | None,
    ) -> BaseException:
        """Record step ``seq``, whose request cannot be encoded, as an unencodable error
        event (the tape keeps no hole) and return the SerializationError to raise."""
        err = serialization_error(f"the request of {name!r}", exc, seq, name)
        self.emit(
            seq, kind, name, key, st.parent, site, unencodable_request(exc), None, False,
            encode_error(err), side_effect, time.time(), 0,
            {"unencodable": unencodable_note(exc, "request")},
        )  # fmt: skip
        return err

    def emit(
        self,
        seq: int,
        kind: str,
        name: str,
        key: str | None,
        parent: int | None,
        site: str | None,
        req: Any,
        resp: Any,
        tagged: bool | str,
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
            raise serialization_error(f"the request of {name!r}", exc, None, name) from None
        return RecordingCall(self, st, kind, name, req, side_effect, meta, site)

    def begin_deferred(self, st: State, request: DeferredRequest, site: str | None) -> OpenCall:
        return RecordingCall(
            self, st, request.kind, request.name, request.raw, False, None, site,
            builder=request.builder,
        )  # fmt: skip

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

    def outbound(self, st: State, conn: Connection) -> None:
        """Note a connection no boundary captured as a ``gap`` event, and warn once per site.

        A gap takes a seq but no causal position (like a span): replay matching
        never looks for it, and the hash chain covers it like any event.
        """
        self.gap(st, conn)
        warn_gap(conn)

    def gap(self, st: State, conn: Connection) -> None:
        """Hand the ``gap`` event of ``conn`` to the writer."""
        self.emit(
            next(self._seq),
            "gap",
            conn.address,
            None,
            st.parent,
            conn.site,
            encode_request(conn.request()),
            None,
            False,
            None,
            False,
            time.time(),
            0,
            None,
        )

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
        call = self._subrun_call(st, seq, key, req, wf, child)
        try:
            result = self.recording.execute(child, wf, args, kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.finish(result)
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
        call = self._subrun_call(st, seq, key, req, wf, child)
        try:
            result = await self.recording.aexecute(child, wf, args, kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.finish(result)
        return result

    def _subrun_call(
        self, st: State, seq: int, key: str, req: bytes, wf: WorkflowInfo, child: RecordRun
    ) -> RecordingCall:
        meta = {"child_run_id": child.run_id}
        return RecordingCall(self, st, "subrun", wf.name, req, False, meta, None, (seq, key))
