"""``replayable.replay()``: every replay mode behind one call."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

import orjson

from replayable.capture.boundaries import workflow_info
from replayable.capture.config import settings
from replayable.capture.context import _STATE, Lineage, State
from replayable.capture.network import replaying_purely
from replayable.capture.runtime import WorkflowInfo, encode_output, intercept_http
from replayable.errors import (
    ConfigurationError,
    ReplayDivergenceError,
    UntrustedRecordError,
)
from replayable.events.codec import decode_tree
from replayable.events.model import BOUNDARY_KINDS, Event, Run
from replayable.replay.divergence import Divergence, FieldDiff, field_diff
from replayable.replay.frames import PausePoint, capture_stack
from replayable.replay.keys import placeholder_keys
from replayable.replay.live import LiveSession, Policy
from replayable.replay.loading import check_not_erased, check_records, load_entrypoint
from replayable.replay.session import (
    Progress,
    ReplayResult,
    ReplaySession,
    ReplayStatus,
    Served,
    Stop,
)
from replayable.store import EventStore, open_store

__all__ = ["PolicyCheck", "execute_session", "load_entrypoint", "prepare", "replay"]


class PolicyCheck(Protocol):
    """What ``replay(..., policies=…)`` takes: a :class:`replayable.audit.policies.Policy`."""

    def evaluate(self, store: EventStore, run_id: str) -> Any: ...


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


def _steps(events: list[Event]) -> dict[int, Event]:
    return {e.seq: e for e in events if e.key is not None}


def _check_step(store: EventStore, run: Run, events: list[Event], step: int, what: str) -> Event:
    # The tape of a partial replay ends at its step: found without indexing the tape.
    if events and events[-1].seq == step and events[-1].key is not None:
        return events[-1]
    steps = _steps(events)
    if step in steps:
        return steps[step]
    last = max(steps) if steps else 0
    for child in store.children(run.run_id):
        if any(e.seq == step for e in store.events(child.run_id)):
            raise ConfigurationError(
                f"{what}={step}: run {run.run_id} has steps 1–{last}; step {step} is inside "
                f"child run {child.run_id} ({child.workflow}) — replay that run to {what} in it"
            )
    if step < 1 or step > last:
        raise ConfigurationError(
            f"{what}={step} is beyond run {run.run_id}, which has {len(steps)} steps (1–{last})"
        )
    raise ConfigurationError(
        f"{what}={step}: step {step} of run {run.run_id} is a "
        f"{next((e.kind for e in events if e.seq == step), 'span')}, not a call"
    )


def _known_names(store: EventStore, run: Run, events: list[Event]) -> set[str]:
    from replayable.capture.boundaries import registered_tools

    names = {e.name for e in events} | {e.kind for e in events} | set(registered_tools())
    for child in store.children(run.run_id):
        names |= {e.name for e in store.events(child.run_id)}
    return names


def replay(
    run_id: str,
    *,
    store: EventStore | str | None = None,
    fn: Callable[..., Any] | None = None,
    strict: bool = False,
    stop_at: int | None = None,
    fork_at: int | None = None,
    overrides: Mapping[int, Any] | None = None,
    live: Iterable[str] = (),
    allow_live: Iterable[str] = (),
    children: Literal["tape", "live"] = "tape",
    on_side_effect: Literal["stop", "recorded"] = "stop",
    metadata: Mapping[str, Any] | None = None,
    allow_network: bool = False,
    policies: Iterable[PolicyCheck] = (),
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Re-execute a recorded run against its tape.

    - Full (default): every boundary served from the tape, nothing real runs.
    - Partial, ``stop_at=N``: pause before step N is served; ``result.paused``
      holds the event and the agent's stack with its locals.
    - Fork, ``fork_at=N``: steps before N from the tape; at N the value in
      ``overrides[N]``, or the live call; after N live, except side-effect
      tools, which get the recorded response for a recorded request and stop
      the replay otherwise (unless named in ``allow_live``; with
      ``on_side_effect="recorded"`` they get the recorded response instead).
    - Counterfactual, ``live={"llm", "search_web"}``: those kinds or names run
      live, everything else is frozen and matched by request.
    - ``children="live"`` runs child workflows live instead of from their tapes.

    Fork and counterfactual replays are recorded as a new run
    (``result.new_run_id``) whose lineage names the original. With ``strict``
    a divergence raises :class:`~replayable.ReplayDivergenceError`.

    Nothing reaches the network from the parts of a replay served from the
    tape: a connection opened outside every boundary there stops the replay
    with the divergence ``unrecorded_io`` (host, port, call site), where the
    parts that run live let it through. ``allow_network=True`` lets it
    through everywhere, for the rare agent that needs it.

    ``policies`` (see :func:`replayable.policy`) judge the run the replay made: a
    fork's or counterfactual's new run, or, for a pure replay that is identical
    (or incomplete or paused), the recorded run it reproduced. A pure replay that
    diverged made no run to judge: ``result.policies`` is empty and the
    divergence says why.

    ``progress(step, total)`` is called from the replaying thread as the replay
    passes the replayed run's steps (a fork's or counterfactual's: its new run's):
    ``step`` is the step reached, ``total`` the recorded run's step count. It is
    called about every hundredth of ``total`` steps (at most some 100 times), and
    once when the replay ends; a callback that raises is warned about and dropped.
    """
    if progress is not None and not callable(progress):
        raise ConfigurationError(f"progress must be a callable(step, total), not {progress!r}")
    st = open_store(store)
    run = st.run(run_id)
    check_not_erased(run)
    live_set, allow = frozenset(live), frozenset(allow_live)
    overrides = dict(overrides or {})
    if overrides and fork_at is None:
        if len(overrides) > 1:
            raise ConfigurationError("overrides name several steps; pass fork_at= to choose one")
        fork_at = next(iter(overrides))
    if stop_at is not None and (fork_at is not None or live_set):
        raise ConfigurationError(
            "stop_at pauses a pure replay; it cannot be combined with fork_at or live"
        )
    if fork_at is not None and live_set:
        raise ConfigurationError(
            "choose fork_at (live after a step) or live (named boundaries live), not both"
        )
    if children not in ("tape", "live"):
        raise ConfigurationError(f"children must be 'tape' or 'live', not {children!r}")
    if on_side_effect not in ("stop", "recorded"):
        raise ConfigurationError(
            f"on_side_effect must be 'stop' or 'recorded', not {on_side_effect!r}"
        )
    if any(k != fork_at for k in overrides):
        raise ConfigurationError(
            f"overrides must name the fork step {fork_at}, got {sorted(overrides)}"
        )

    partial = stop_at is not None
    events = st.events_until(run.run_id, stop_at) if stop_at is not None else []
    # Events come in seq order: the step, when recorded, is the last one read.
    if stop_at is None or not (
        (events and events[-1].seq == stop_at) or any(e.seq == stop_at for e in events)
    ):
        partial = False
        events = st.events(run.run_id)
    if stop_at is not None:
        _check_step(st, run, events, stop_at, "stop_at")
    if fork_at is not None:
        at = _check_step(st, run, events, fork_at, "fork_at")
        guarded = settings.side_effects
        if (
            (at.side_effect or at.name in guarded)
            and fork_at not in overrides
            and at.name not in allow
        ):
            raise ConfigurationError(
                f"fork_at={fork_at} is the side-effect tool {at.name!r}; give an override for "
                f"step {fork_at} or name it in allow_live to run it for real"
            )
    if allow or live_set:
        known = _known_names(st, run, events)
        for label, names in (("allow_live", allow), ("live", live_set)):
            unknown = sorted(n for n in names if n not in known and n not in _KINDS)
            if unknown:
                raise ConfigurationError(
                    f"unknown tool {unknown[0]!r} in {label}; this run knows "
                    + ", ".join(sorted(n for n in known if n not in _KINDS)[:20])
                )

    # A stored record is data: refuse a tape naming classes decoding would not build
    # before the agent's code (or any import) runs.
    check_records(run, events)
    for child in st.children(run.run_id):
        check_records(child, st.events(child.run_id))
    is_live = fork_at is not None or bool(live_set) or children == "live"
    with contextlib.ExitStack() as pure:
        if not is_live:
            # Nothing leaves a pure replay: an SDK client built at import needs no real key.
            pure.enter_context(replaying_purely())
            pure.enter_context(placeholder_keys())
        wf, args, kwargs = prepare(run, fn)
        session: ReplaySession | LiveSession
        if is_live:
            lineage: dict[str, Any] = {"replay_of": run.run_id}
            if fork_at is not None:
                lineage.update(
                    forked_from=run.run_id,
                    fork_step=fork_at,
                    mode="fork",
                    overridden=fork_at in overrides,
                )
            else:
                lineage.update(mode="counterfactual", live=sorted(live_set), children=children)
            session = LiveSession(
                st,
                run,
                events,
                Policy(
                    fork_at=fork_at,
                    overrides=overrides,
                    live=live_set,
                    allow_live=allow,
                    guarded=frozenset(settings.side_effects),
                    children=children,
                    on_side_effect=on_side_effect,
                ),
                lineage,
                metadata,
            )
        else:
            session = ReplaySession(st, run, events, partial=partial)
            if stop_at is not None:
                session.pause_hook = _pause_at(session, stop_at)
        session.allow_network = allow_network
        watched = None
        if progress is not None:
            last = max((e.seq for e in events), default=0)
            watched = Progress(progress, run.end.event_count if run.end is not None else last)
            session.watch(watched)
        result = execute_session(session, run, wf, args, kwargs)
        if watched is not None:
            watched.final(session.reached())
    checks = tuple(policies)
    if checks:
        judged = result.new_run_id or (run.run_id if result.status != "diverged" else None)
        if judged is not None:
            verdicts = tuple(p.evaluate(st, judged) for p in checks)
            result = dataclasses.replace(result, policies=verdicts)
    if strict and result.divergence is not None:
        raise ReplayDivergenceError(result.divergence)
    return result


def execute_session(
    session: ReplaySession | LiveSession,
    run: Run,
    wf: WorkflowInfo,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> ReplayResult:
    """Run the entrypoint under ``session`` and judge the outcome."""
    started = time.perf_counter()
    output: Any = None
    error: BaseException | None = None
    token = _STATE.set(State(session, None, Lineage()))
    try:
        if wf.is_async:
            output = _run_coroutine(lambda: session.arun_root(wf, args, kwargs))
        else:
            output = session.run_root(wf, args, kwargs)
    except Stop:
        pass
    except Exception as exc:
        error = exc
    except BaseException as exc:
        # A stop raised beneath a task group (a refused connection in a happy-eyeballs
        # task) comes back wrapped; the session holds the reason either way.
        if not _stopped_by(session, exc):
            raise
    finally:
        _STATE.reset(token)
        if isinstance(session, LiveSession):
            session.writer.flush()
    duration = time.perf_counter() - started
    if isinstance(session, LiveSession):
        return _judge_live(session, run, output, error, duration)
    return _judge(session, run, output, error, duration)


def _stopped_by(session: Served, exc: BaseException) -> bool:
    """Whether ``exc`` is (or wraps nothing but) the session's own stop."""
    if session.stopped is None:
        return False
    if isinstance(exc, BaseExceptionGroup):
        rest = exc.split(Stop)[1]
        return rest is None
    return exc is session.stopped


def prepare(
    run: Run, fn: Callable[..., Any] | None
) -> tuple[WorkflowInfo, tuple[Any, ...], dict[str, Any]]:
    """The entrypoint to call and the recorded input to call it with."""
    # Before the entry module is imported: the SDKs it imports are patched as they load.
    intercept_http()
    target = fn or load_entrypoint(run)
    try:
        inputs = decode_tree(orjson.loads(run.start.input))
    except UntrustedRecordError as exc:
        raise exc.located(run.run_id, None) from None
    wf = workflow_info(target) or WorkflowInfo(
        name=run.workflow,
        entrypoint=run.start.entrypoint,
        fn=target,
        is_async=inspect.iscoroutinefunction(target),
    )
    return wf, tuple(inputs["args"]), dict(inputs["kwargs"])


_KINDS = frozenset(BOUNDARY_KINDS) - {"span", "gap"}


def _pause_at(session: Served, step: int) -> Callable[[Event], None]:
    def hook(ev: Event) -> None:
        if ev.seq >= step:
            st = _STATE.get()
            stack = capture_stack(start=sys._getframe(1), origin=st.origin if st else None)
            raise session.stop(None, paused=PausePoint(ev, stack))

    return hook


def _judge_live(
    session: LiveSession, run: Run, output: Any, error: BaseException | None, duration: float
) -> ReplayResult:
    base: dict[str, Any] = {
        "run_id": run.run_id,
        "events_served": session.events_served,
        "duration_s": duration,
        "new_run_id": session.new_run_id,
        "blocked": tuple(session.blocked),
    }
    if session.stopped is not None:
        return ReplayResult(status="diverged", divergence=session.stopped.divergence, **base)
    if error is not None:
        return ReplayResult(status="failed", error=error, **base)
    return ReplayResult(status="completed", output=output, **base)


def _judge(
    session: ReplaySession, run: Run, output: Any, error: BaseException | None, duration: float
) -> ReplayResult:
    base: dict[str, Any] = {
        "run_id": run.run_id,
        "events_served": session.events_served,
        "duration_s": duration,
    }
    if session.stopped is not None:
        stop = session.stopped
        if stop.paused is not None:
            return ReplayResult(status="paused", paused=stop.paused, **base)
        if stop.divergence is None:
            return ReplayResult(status="incomplete", **base)
        return ReplayResult(status="diverged", divergence=stop.divergence, **base)
    end = run.end
    if end is None:
        return ReplayResult(status="incomplete", output=output, error=error, **base)
    if error is not None:
        recorded = orjson.loads(end.error) if end.error else None
        same = recorded is not None and _same_error(recorded, error)
        status: ReplayStatus = "identical" if same else "failed"
        return ReplayResult(status=status, error=error, **base)
    if end.status == "failed":
        div = Divergence(
            reason="output_changed",
            run_id=run.run_id,
            step=None,
            diff=[FieldDiff("error", orjson.loads(end.error or "null"), None)],
        )
        return ReplayResult(status="diverged", output=output, divergence=div, **base)
    now = settings.redactor.redact_bytes(encode_output(output))
    if end.output is not None and not _same_output(end.output, now, output):
        div = Divergence(
            reason="output_changed",
            run_id=run.run_id,
            step=None,
            diff=field_diff(orjson.loads(end.output), orjson.loads(now), "output"),
        )
        return ReplayResult(status="diverged", output=output, divergence=div, **base)
    return ReplayResult(status="identical", output=output, **base)


def _same_error(recorded: dict[str, Any], error: BaseException) -> bool:
    """Whether ``error`` is the recorded exception again (type and message)."""
    from replayable.errors import RecordedError
    from replayable.events.codec import printable, qualified_name

    rtype, rmessage = str(recorded["type"]), str(recorded["message"])
    if isinstance(error, RecordedError):
        return error.type_name == rtype and error.message == rmessage
    return qualified_name(type(error)) == rtype and printable(str(error)) == rmessage


def _same_output(recorded: str, now: bytes, output: Any) -> bool:
    """Equal outputs, by bytes or else by value (a nested ``StrEnum`` served back as its
    plain value by the fast codec path is the same output)."""
    if now == recorded.encode():
        return True
    from replayable.events.codec import encode_request

    try:
        before = encode_request(decode_tree(orjson.loads(recorded)))
    except Exception:
        return False
    redact = settings.redactor.redact_bytes
    return redact(before) == redact(encode_request(output))
