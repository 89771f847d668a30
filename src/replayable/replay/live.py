"""Replays that run something live: fork, counterfactual, live children.

A live replay is also a recording: it writes a new run whose lineage names
the original (``replay_of``, ``forked_from`` and ``fork_step``). Each call is
decided once: served from the tape (and copied into the new run), replaced
by an override, run live, or stopped. Side-effect tools stay guarded: a call
whose request the recording holds gets the recorded response; any other
stops the replay unless the tool is named in ``allow_live``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from replayable.capture.config import settings
from replayable.capture.context import State
from replayable.capture.network import Connection, unguarded
from replayable.capture.record import RecordingCall, RecordRun
from replayable.capture.recording import Recording
from replayable.capture.runtime import Call, OpenCall, RunContext, WorkflowInfo
from replayable.events.canonical import fingerprint
from replayable.events.codec import encode_value
from replayable.events.model import Event, Run
from replayable.replay.divergence import ActualCall, Divergence, field_diff
from replayable.replay.frames import user_site
from replayable.replay.session import (
    NEVER,
    Progress,
    Served,
    aexecute_replay,
    execute_replay,
    explain,
    served_value,
    unrecorded_io,
)
from replayable.replay.tape import Tape
from replayable.store import EventStore

__all__ = ["LiveSession", "Policy"]

RunMode = Literal["fork_target", "frozen", "live"]


@dataclass(frozen=True)
class Policy:
    """What a live replay may run for real."""

    fork_at: int | None = None
    overrides: Mapping[int, Any] = field(default_factory=dict)
    live: frozenset[str] = frozenset()
    allow_live: frozenset[str] = frozenset()
    guarded: frozenset[str] = frozenset()
    children: Literal["tape", "live"] = "tape"
    on_side_effect: Literal["stop", "recorded"] = "stop"


def _fingerprint_of(kind: str, name: str, req: bytes, ev: Event | None) -> str:
    """The redacted request's fingerprint; the scan is skipped when the raw request
    already matches what was recorded (see ``request_fingerprint``)."""
    if ev is not None:
        fp = fingerprint(kind, name, req)
        if fp == ev.fingerprint:
            return fp
    return fingerprint(kind, name, settings.redactor.redact_bytes(req))


@dataclass(slots=True)
class _Decision:
    action: Literal["serve", "override", "live", "blocked"]
    seq: int
    key: str
    req: bytes
    event: Event | None = None


class LiveReplayRun(RecordRun):
    """A run of a live replay: decides per call, records everything into the new run."""

    #: The step at which this run next reports progress (the root run, when watched).
    report_at = NEVER
    #: The furthest step this run has reached.
    reached = 0

    def __init__(
        self,
        session: LiveSession,
        run_id: str,
        root_run_id: str,
        tape: Tape,
        mode: RunMode,
        original_run_id: str | None,
    ) -> None:
        super().__init__(session, run_id, root_run_id)
        self.session = session
        self.tape = tape
        self.mode = mode
        self.original_run_id = original_run_id

    # -- deciding ---------------------------------------------------------------

    def _decide(
        self, st: State, kind: str, name: str, request: Any, side_effect: bool, site: str | None
    ) -> _Decision:
        session = self.session
        session.check()
        pol = session.policy
        seq = self.next_seq()
        self.reached = seq
        if seq >= self.report_at:
            self.report_at = session.progress.report(seq)  # type: ignore[union-attr]
        key = st.lineage.next_key()
        req = self._request(request, name, seq)
        tape = self.tape
        ev = tape.at(key)
        fp = _fingerprint_of(kind, name, req, ev)
        same_call = ev is not None and ev.kind == kind and ev.name == name and not tape.served(ev)
        exact = same_call and ev is not None and ev.fingerprint == fp
        guarded = side_effect or name in pol.guarded

        def stop(reason_ev: Event | None, blocked: bool = False) -> Divergence:
            actual = ActualCall(
                kind=kind,
                name=name,
                key=key,
                request=req,
                fingerprint=fp,
                call_site=site,
                user_site=user_site(origin=st.origin),
            )
            div = explain(tape, self.original_run_id or session.original.run_id, reason_ev, actual)
            if blocked:
                nearest = reason_ev or tape.find_name(kind, name)
                diff = (
                    field_diff(nearest.request_value(), div.actual.request)
                    if nearest is not None and div.actual is not None
                    else []
                )
                div = msgspec.structs.replace(
                    div,
                    reason="side_effect_blocked",
                    step=seq,
                    expected=None,
                    nearest=nearest,
                    diff=diff,
                )
            return div

        if self.mode == "fork_target" and not session.fork_reached:
            n = pol.fork_at
            if ev is not None and ev.seq == n and same_call:
                tape.take(ev)
                session.fork_reached = True
                session.fork_seq = seq
                if n in pol.overrides:
                    return _Decision("override", seq, key, req, ev)
                return _Decision("live", seq, key, req, ev)
            if exact and ev is not None:
                tape.take(ev)
                return _Decision("serve", seq, key, req, ev)
            raise session.stop(stop(ev))

        if self.mode == "frozen" and not (kind in pol.live or name in pol.live):
            match = ev if exact else tape.find(kind, name, fp)
            if match is not None:
                tape.take(match)
                return _Decision("serve", seq, key, req, match)
            raise session.stop(stop(ev if same_call else None, blocked=guarded))

        # Live: after the fork point, a live child, or a boundary named in ``live``.
        explicitly_live = kind in pol.live or name in pol.live or name in pol.allow_live
        if guarded and not explicitly_live:
            match = ev if exact else tape.find(kind, name, fp)
            if match is not None:
                tape.take(match)
                return _Decision("serve", seq, key, req, match)
            if pol.on_side_effect == "recorded":
                nearest = ev if same_call else tape.find_name(kind, name)
                if nearest is not None:
                    tape.take(nearest)
                    return _Decision("blocked", seq, key, req, nearest)
            raise session.stop(stop(ev if same_call else None, blocked=True))
        if same_call and ev is not None:
            tape.take(ev)  # the live call stands where the recorded one stood
        return _Decision("live", seq, key, req, ev)

    def outbound(self, st: State, conn: Connection) -> None:
        """Allowed (and noted as a gap) where this replay runs live, refused elsewhere."""
        session = self.session
        live = self.mode == "live" or (self.mode == "fork_target" and session.fork_reached)
        if not live and not session.allow_network:
            raise session.stop(
                unrecorded_io(self.original_run_id or session.original.run_id, self.tape, conn)
            )
        super().outbound(st, conn)

    # -- answering ----------------------------------------------------------------

    def _copy(
        self,
        st: State,
        d: _Decision,
        kind: str,
        name: str,
        side_effect: bool,
        site: str | None,
        extra: dict[str, Any],
    ) -> None:
        ev = d.event
        assert ev is not None
        self.emit(
            d.seq,
            kind,
            name,
            d.key,
            st.parent,
            site,
            d.req,
            None if ev.response is None else ev.response.encode(),
            ev.encoding == "tagged",
            None if ev.error is None else ev.error.encode(),
            side_effect,
            time.time(),
            0,
            {**ev.metadata, **extra},
        )

    def _answer(
        self, st: State, d: _Decision, kind: str, name: str, side_effect: bool, site: str | None
    ) -> Any:
        ev = d.event
        assert ev is not None
        if d.action == "override":
            value = self.session.policy.overrides[ev.seq]
            resp, tagged = encode_value(value)
            self.emit(
                d.seq,
                kind,
                name,
                d.key,
                st.parent,
                site,
                d.req,
                resp,
                tagged,
                None,
                side_effect,
                time.time(),
                0,
                {"override": True, "original_step": ev.seq},
            )
            self.session.events_served += 1
            return value
        extra: dict[str, Any] = {"replayed_from": ev.seq}
        if d.action == "blocked":
            extra.update(side_effect_blocked=True, request_differed=True)
            self.session.blocked.append(d.seq)
        self._copy(st, d, kind, name, side_effect, site, extra)
        self.session.events_served += 1
        return served_value(ev)

    def call(self, st: State, call: Call) -> Any:
        kind, name, side_effect, site = call.kind, call.name, call.side_effect, call.site
        d = self._decide(st, kind, name, call.request, side_effect, site)
        if d.action == "live":
            return self.live_call(st, d.seq, d.key, d.req, _live(call))
        if d.event is not None and d.event.metadata.get("awaitable") and d.action != "override":
            try:
                value = self._answer(st, d, kind, name, side_effect, site)
            except Exception as exc:
                return _raise_async(exc)
            return _value_async(value)
        return self._answer(st, d, kind, name, side_effect, site)

    async def acall(self, st: State, call: Call) -> Any:
        kind, name, side_effect, site = call.kind, call.name, call.side_effect, call.site
        d = self._decide(st, kind, name, call.request, side_effect, site)
        if d.action == "live":
            return await self.alive_call(st, d.seq, d.key, d.req, _live(call))
        return self._answer(st, d, kind, name, side_effect, site)

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
        d = self._decide(st, kind, name, request, side_effect, site)
        if d.action == "live":
            return RecordingCall(
                self,
                st,
                kind,
                name,
                d.req,
                side_effect,
                {**(meta or {}), "live": True},
                site,
                (d.seq, d.key),
            )
        answered = _Answered(self._answer_outcome(st, d, kind, name, side_effect, site), d.seq)
        answered.key = d.key
        if d.action == "serve" and d.event is not None:
            answered.metadata = d.event.metadata  # what the recorded call was, e.g. nested
        return answered

    # Each call of a fork is decided (served, overridden or live) on its request,
    # so a deferred request is built here rather than by the writer.
    begin_deferred = RunContext.begin_deferred

    def _answer_outcome(
        self, st: State, d: _Decision, kind: str, name: str, side_effect: bool, site: str | None
    ) -> tuple[Any, BaseException | None]:
        try:
            return self._answer(st, d, kind, name, side_effect, site), None
        except Exception as exc:
            return None, exc

    # -- child runs -------------------------------------------------------------

    def _child(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[_Decision, Any]:
        d = self._decide(
            st, "subrun", wf.name, {"args": list(args), "kwargs": dict(kwargs)}, False, None
        )
        session = self.session
        recorded_child = d.event.metadata.get("child_run_id") if d.event is not None else None
        if (
            d.action == "serve"
            and self.mode == "fork_target"
            and session.policy.children == "tape"
            and recorded_child
        ):
            return d, ("replay", session.load(recorded_child))
        if d.action in ("override", "blocked"):
            return d, ("answer", None)
        with unguarded():
            tape = Tape(session.store.events(recorded_child) if recorded_child else ())
        mode: RunMode = (
            "frozen"
            if (
                self.mode == "frozen"
                and not session.policy.fork_at
                and session.policy.children == "tape"
            )
            else "live"
        )

        def factory(run_id: str, root: str) -> RecordRun:
            return LiveReplayRun(session, run_id, root, tape, mode, recorded_child)

        child = session.start_run(wf, args, kwargs, parent=(self, d.seq), factory=factory)
        return d, ("live", child)

    def subrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        d, (how, child) = self._child(st, wf, args, kwargs)
        if how == "answer":
            return self._answer(st, d, "subrun", wf.name, False, None)
        if how == "replay":
            result = execute_replay(child, wf, args, kwargs)
            self._copy(st, d, "subrun", wf.name, False, None, {"replayed_from": d.event.seq})  # type: ignore[union-attr]
            return result
        return self.live_subrun(st, d.seq, d.key, d.req, wf, args, kwargs, child)

    async def asubrun(
        self, st: State, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        d, (how, child) = self._child(st, wf, args, kwargs)
        if how == "answer":
            return self._answer(st, d, "subrun", wf.name, False, None)
        if how == "replay":
            result = await aexecute_replay(child, wf, args, kwargs)
            self._copy(st, d, "subrun", wf.name, False, None, {"replayed_from": d.event.seq})  # type: ignore[union-attr]
            return result
        return await self.alive_subrun(st, d.seq, d.key, d.req, wf, args, kwargs, child)


class _Answered(OpenCall):
    live = False

    def __init__(self, outcome: tuple[Any, BaseException | None], seq: int) -> None:
        self._value, self._error = outcome
        self.seq = seq
        self.metadata = {}

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


async def _value_async(value: Any) -> Any:
    return value


async def _raise_async(exc: BaseException) -> Any:
    raise exc


class LiveSession(Served, Recording):
    """A replay that records a new run: the fork or counterfactual of ``original``."""

    def __init__(
        self,
        store: EventStore,
        original: Run,
        events: list[Event],
        policy: Policy,
        lineage: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        Recording.__init__(
            self,
            store,
            metadata={**original.metadata, **(metadata or {})},
            tenant=original.start.tenant,
            lineage=lineage,
        )
        self._init_served(self.store)
        self.original = original
        self.policy = policy
        self.root_events = events
        self.fork_reached = False
        self.fork_seq: int | None = None
        self.new_run_id: str | None = None
        self.blocked: list[int] = []
        self.root_run: LiveReplayRun | None = None
        self._root_started = False

    def _root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> RecordRun:
        from replayable.errors import ReplayError

        if self._root_started:
            raise ReplayError("the replayed entrypoint started a second top-level run")
        self._root_started = True
        if wf.name != self.original.workflow:
            raise ReplayError(
                f"run {self.original.run_id} recorded workflow "
                f"{self.original.workflow!r}, but the entrypoint is {wf.name!r}"
            )
        mode: RunMode = "fork_target" if self.policy.fork_at is not None else "frozen"
        tape = Tape(self.root_events)

        def factory(run_id: str, root: str) -> RecordRun:
            made = LiveReplayRun(self, run_id, root, tape, mode, self.original.run_id)
            if self.progress is not None:
                made.report_at = self.progress.first()
            self.root_run = made
            return made

        run = self.start_run(wf, args, kwargs, factory=factory)
        self.new_run_id = run.run_id
        return run

    def watch(self, progress: Progress) -> None:
        """Report the new run's progress to ``progress`` (set before the run starts)."""
        self.progress = progress

    def reached(self) -> int:
        """The furthest step of the new run so far."""
        root = self.root_run
        return 0 if root is None else root.reached

    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return self.execute(self._root(wf, args, kwargs), wf, args, kwargs)

    async def arun_root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        return await self.aexecute(self._root(wf, args, kwargs), wf, args, kwargs)


def _live(call: Call) -> Call:
    """The call with its event marked as run live in a replay."""
    return msgspec.structs.replace(call, meta={**(call.meta or {}), "live": True})
