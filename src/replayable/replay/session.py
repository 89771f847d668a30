"""Replay sessions: a run's calls answered from its tape, with divergence detection."""

from __future__ import annotations

import asyncio
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import orjson

from replayable.capture.config import settings
from replayable.capture.context import _STATE, Lineage, State, install_task_factory
from replayable.capture.network import Connection, unguarded
from replayable.capture.runtime import (
    Call,
    OpenCall,
    RunContext,
    Session,
    WorkflowInfo,
)
from replayable.errors import ReplayError, UntrustedRecordError
from replayable.events.canonical import fingerprint
from replayable.events.codec import (
    UnencodableError,
    decode_error,
    decode_value,
    encode_request,
    unencodable_request,
)
from replayable.events.model import Event, Run
from replayable.replay.divergence import ActualCall, Divergence, DivergenceReason, field_diff
from replayable.replay.frames import user_site
from replayable.replay.tape import Tape
from replayable.store import EventStore

__all__ = [
    "ReplayResult",
    "ReplayRun",
    "ReplaySession",
    "Stop",
    "aexecute_replay",
    "execute_replay",
    "explain",
    "request_fingerprint",
    "unrecorded_io",
]

ReplayStatus = Literal["identical", "diverged", "failed", "incomplete", "paused", "completed"]


class Stop(BaseException):
    """Unwinds the agent's stack when replay must stop. A BaseException, so the
    agent's own ``except Exception`` handlers do not swallow it."""

    def __init__(self, divergence: Divergence | None, paused: Any = None) -> None:
        super().__init__(divergence.message if divergence else "replay stopped")
        self.divergence = divergence
        self.paused = paused


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of a replay.

    ``status`` is ``identical`` (every call matched the tape and the outcome is
    the recorded one), ``diverged`` (see ``divergence``), ``failed`` (the agent
    raised where the recording did not), ``incomplete`` (the recording was
    cut short and was replayed to its last event), ``paused`` (``stop_at``:
    see ``paused``) or ``completed`` (a fork or counterfactual replay ran to
    its end as the new run ``new_run_id``).
    """

    status: ReplayStatus
    run_id: str
    output: Any = None
    error: BaseException | None = None
    divergence: Divergence | None = None
    events_served: int = 0
    duration_s: float = 0.0
    paused: Any = None
    new_run_id: str | None = None
    blocked: tuple[int, ...] = ()
    #: The verdicts of ``replay(..., policies=…)`` on the run the replay made (a fork's
    #: or counterfactual's new run; the recorded run for a pure replay that matched it).
    policies: tuple[Any, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "identical"


def request_fingerprint(
    kind: str, name: str, request: Any, recorded: Event | None = None
) -> tuple[bytes, str]:
    """The canonical, redacted request and its fingerprint, as the recording computed them.

    When the unredacted request already hashes to the recorded fingerprint, the
    stored request is byte-identical to it (it held nothing to redact), so the
    redaction scan is skipped: the common case on replay costs one hash.
    """
    try:
        raw = encode_request(request)
    except UnencodableError as exc:
        # Recorded as an unencodable step with this same placeholder request.
        raw = unencodable_request(exc)
    if recorded is not None:
        fp = fingerprint(kind, name, raw)
        if fp == recorded.fingerprint:
            return raw, fp
    req = settings.redactor.redact_bytes(raw)
    return req, fingerprint(kind, name, req)


class _ServedCall(OpenCall):
    """A call answered from the tape."""

    live = False

    def __init__(self, event: Event) -> None:
        self.event = event
        self.seq = event.seq
        self.key = event.key
        self.metadata = event.metadata

    def value(self) -> Any:
        return served_value(self.event)


def served_value(ev: Event) -> Any:
    """The recorded outcome of ``ev``: its value, or its exception raised."""
    if ev.error is not None:
        raise decode_error(ev.error)
    try:
        return decode_value(ev.response, ev.encoding)
    except UntrustedRecordError as exc:
        raise exc.located(ev.run_id, ev.seq) from None


async def _served_async(ev: Event) -> Any:
    return served_value(ev)


#: The step a run reports its progress at when nobody asked for it: never reached.
NEVER = sys.maxsize


class Progress:
    """A replay's progress through the replayed run, reported to ``hook(step, total)``
    at a bounded rate: each time the run passes another hundredth of its ``total``
    recorded steps (at most about 100 calls whatever its length), and once at the end.

    The run checks one integer per step (``seq >= report_at``); nothing else is done
    on the hot path. A hook that raises is warned about and not called again: progress
    is for watching the replay, never a reason for it to fail.
    """

    __slots__ = ("every", "hook", "last", "total")

    def __init__(self, hook: Callable[[int, int], None], total: int) -> None:
        self.hook = hook
        self.total = total
        self.every = max(1, total // 100)
        self.last = -1

    def first(self) -> int:
        """The step the run first reports at."""
        return min(self.every, max(self.total, 1))

    def report(self, step: int) -> int:
        """Report reaching ``step``; returns the next step to report at."""
        self._call(step)
        return step + self.every if self.last >= 0 else NEVER

    def final(self, step: int) -> None:
        """The replay ended having reached ``step`` (reported unless it already was)."""
        if step != self.last:
            self._call(step)

    def _call(self, step: int) -> None:
        if self.last == -2:
            return
        try:
            self.hook(step, self.total)
            self.last = step
        except Exception as exc:
            self.last = -2
            warnings.warn(
                f"the replay's progress callback raised {type(exc).__name__}: {exc}; "
                "it is not called again",
                RuntimeWarning,
                stacklevel=2,
            )


class Served:
    """What a run needs from its session while replaying (shared by every replay mode)."""

    store: EventStore
    events_served: int
    stopped: Stop | None
    pause_hook: Callable[[Event], None] | None
    until_seq: int | None
    #: Let connections made outside every boundary through (``replay(allow_network=True)``).
    allow_network: bool

    def _init_served(self, store: EventStore) -> None:
        self.store = store
        self.progress: Progress | None = None
        self.allow_network = False
        self.events_served = 0
        self.stopped = None
        self.pause_hook = None
        self.until_seq = None
        self._stop_lock = threading.Lock()

    def stop(self, divergence: Divergence | None, paused: Any = None) -> Stop:
        """The one Stop of this session (the first reason wins)."""
        with self._stop_lock:
            if self.stopped is None:
                self.stopped = Stop(divergence, paused)
            return self.stopped

    def check(self) -> None:
        if self.stopped is not None:
            raise self.stopped

    def load(self, run_id: str) -> ReplayRun:
        """A pure replay of a child run from its own tape."""
        with unguarded():
            return ReplayRun(self, self.store.get_run(run_id), self.store.events(run_id))


def _seq(event: Event) -> int:
    return event.seq


class ReplayRun(RunContext):
    """A run being replayed: boundaries are answered from its tape."""

    #: The step at which this run next reports progress (the root run, when watched).
    report_at = NEVER

    def __init__(
        self, session: Served, run: Run, events: list[Event], partial: bool = False
    ) -> None:
        self.session = session
        self.run = run
        self.run_id = run.run_id
        self.tape = Tape(events)
        self.complete = run.end is not None
        self.partial = partial
        # A stored row that could not be read: replay stops there, saying so.
        self.unreadable = min((e for e in events if e.problems), key=_seq, default=None)

    def _serve(self, st: State, kind: str, name: str, request: Any, site: str | None) -> Event:
        self.session.check()
        key = st.lineage.next_key()
        tape = self.tape
        ev = tape.at(key)
        if ev is None and self.partial:
            with unguarded():
                tape.extend(self.session.store.events(self.run_id))
            self.partial = False
            ev = tape.at(key)
        bad = self.unreadable
        if bad is not None and (ev is None or ev.problems or ev.seq >= bad.seq):
            raise self.session.stop(
                Divergence(
                    reason="unreadable_record", run_id=self.run_id, step=bad.seq, expected=bad
                )
            )
        req, fp = request_fingerprint(kind, name, request, ev)
        if (
            ev is not None
            and ev.fingerprint == fp
            and ev.kind == kind
            and ev.name == name
            and not tape.served(ev)
        ):
            hook = self.session.pause_hook
            if hook is not None:
                hook(ev)
            tape.take(ev)
            self.session.events_served += 1
            if ev.seq >= self.report_at:
                self.report_at = self.session.progress.report(ev.seq)  # type: ignore[union-attr]
            return ev
        if ev is None and not self.complete and tape.remaining() == 0:
            raise self.session.stop(None)
        actual = ActualCall(
            kind=kind,
            name=name,
            key=key,
            request=req,
            fingerprint=fp,
            call_site=site,
            user_site=user_site(origin=st.origin),
        )
        raise self.session.stop(self.divergence(ev, actual))

    def outbound(self, st: State, conn: Connection) -> None:
        """A pure replay reaches no network: the connection stops the replay."""
        if self.session.allow_network:
            return
        raise self.session.stop(unrecorded_io(self.run_id, self.tape, conn))

    def divergence(self, ev: Event | None, actual: ActualCall) -> Divergence:
        """Explain why ``actual`` does not match ``ev`` (the event at its position, if any)."""
        return explain(self.tape, self.run_id, ev, actual)

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
        return _ServedCall(self._serve(st, kind, name, request, site))

    def call(self, st: State, call: Call) -> Any:
        ev = self._serve(st, call.kind, call.name, call.request, call.site)
        if ev.metadata.get("awaitable"):
            return _served_async(ev)
        return served_value(ev)

    async def acall(self, st: State, call: Call) -> Any:
        return served_value(self._serve(st, call.kind, call.name, call.request, call.site))

    def _child(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> ReplayRun:
        ev = self._serve(st, "subrun", wf.name, {"args": list(args), "kwargs": dict(kwargs)}, None)
        child_id = ev.metadata.get("child_run_id")
        if not child_id:
            raise ReplayError(f"step {ev.seq} of run {self.run_id} names no child run")
        return self.session.load(child_id)

    def subrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        return execute_replay(self._child(st, wf, args, kwargs), wf, args, kwargs)

    async def asubrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        return await aexecute_replay(self._child(st, wf, args, kwargs), wf, args, kwargs)

    def finish(self) -> None:
        """After the run's code returned: every recorded call must have been asked."""
        if self.partial:
            with unguarded():
                self.tape.extend(self.session.store.events(self.run_id))
            self.partial = False
        unasked = self.tape.unasked()
        if unasked and self.session.stopped is None:
            first = unasked[0]
            raise self.session.stop(
                Divergence(
                    reason="calls_not_asked",
                    run_id=self.run_id,
                    step=first.seq,
                    expected=first,
                    unasked=[e.seq for e in unasked],
                )
            )


def unrecorded_io(run_id: str, tape: Tape, conn: Connection) -> Divergence:
    """The divergence of a connection the recording does not hold (host, port, call site)."""
    unasked = tape.unasked()
    step = unasked[0].seq if unasked else (tape.events[-1].seq + 1 if tape.events else 1)
    actual = ActualCall(
        kind="connect",
        name=conn.address,
        key=None,
        request=conn.request(),
        fingerprint="",
        call_site=conn.site,
    )
    return Divergence(
        reason="unrecorded_io", run_id=run_id, step=step, actual=actual, call_site=conn.site
    )


def explain(tape: Tape, run_id: str, ev: Event | None, actual: ActualCall) -> Divergence:
    """Why the call ``actual`` does not match ``ev``, the recorded event at its causal
    position (``None`` if the tape has nothing there)."""
    actual = msgspec.structs.replace(actual, request=orjson.loads(actual.request))
    if ev is None and actual.key is not None:
        moved = tape.find(actual.kind, actual.name, actual.fingerprint)
        if moved is not None and _task(moved.key) != _task(actual.key):
            # Nothing was recorded at this position, and exactly this request is on
            # the tape, unasked, in another task: the same call reached along another
            # task path (an extra call in the same task is not that).
            return Divergence(
                reason="unexpected_call",
                run_id=run_id,
                step=moved.seq,
                actual=actual,
                nearest=moved,
                call_site=actual.call_site,
                same_request=True,
            )
    if ev is None:
        reason: DivergenceReason = "tape_exhausted" if tape.remaining() == 0 else "unexpected_call"
        unasked = tape.unasked()
        step = unasked[0].seq if unasked else (tape.events[-1].seq + 1 if tape.events else 1)
        return Divergence(
            reason=reason,
            run_id=run_id,
            step=step,
            actual=actual,
            nearest=tape.nearest(actual.kind, actual.name),
            call_site=actual.call_site,
        )
    if ev.kind != actual.kind or ev.name != actual.name:
        return Divergence(
            reason="unexpected_call",
            run_id=run_id,
            step=ev.seq,
            expected=ev,
            actual=actual,
            call_site=actual.call_site,
        )
    return Divergence(
        reason="request_changed",
        run_id=run_id,
        step=ev.seq,
        expected=ev,
        actual=actual,
        diff=field_diff(ev.request_value(), actual.request),
        call_site=actual.call_site,
    )


def _task(key: str | None) -> str | None:
    """The lineage part of a causal key (``r.0.2`` of ``r.0.2:1``)."""
    return None if key is None else key.rpartition(":")[0]


def execute_replay(
    run: ReplayRun, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """Run ``wf`` with ``run`` answering its boundaries."""
    token = _STATE.set(State(run.session, run, Lineage()))  # type: ignore[arg-type]
    try:
        result = wf.fn(*args, **kwargs)
    finally:
        _STATE.reset(token)
    run.finish()
    return result


async def aexecute_replay(
    run: ReplayRun, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """Await ``wf`` with ``run`` answering its boundaries."""
    install_task_factory(asyncio.get_running_loop())
    token = _STATE.set(State(run.session, run, Lineage()))  # type: ignore[arg-type]
    try:
        result = await wf.fn(*args, **kwargs)
    finally:
        _STATE.reset(token)
    run.finish()
    return result


class ReplaySession(Served, Session):
    """Serves one recorded run (and its child runs) to the agent's code, running nothing."""

    def __init__(
        self, store: EventStore, root: Run, events: list[Event], partial: bool = False
    ) -> None:
        self._init_served(store)
        self.root = ReplayRun(self, root, events, partial)
        self._root_started = False

    def claim_root(self, wf: WorkflowInfo) -> None:
        """Check that the entrypoint is the recorded workflow, once."""
        if self._root_started:
            raise ReplayError("the replayed entrypoint started a second top-level run")
        self._root_started = True
        recorded = self.root.run.workflow
        if wf.name != recorded:
            raise ReplayError(
                f"run {self.root.run_id} recorded workflow {recorded!r}, "
                f"but the entrypoint is workflow {wf.name!r}"
            )

    def watch(self, progress: Progress) -> None:
        """Report the root run's progress to ``progress``."""
        self.progress = progress
        self.root.report_at = progress.first()

    def reached(self) -> int:
        """The furthest step of the root run served so far."""
        tape = self.root.tape
        return max((e.seq for e in tape.events if e.key is not None and tape.served(e)), default=0)

    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        self.claim_root(wf)
        return execute_replay(self.root, wf, args, kwargs)

    async def arun_root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        self.claim_root(wf)
        return await aexecute_replay(self.root, wf, args, kwargs)
