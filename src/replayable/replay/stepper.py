"""Step through a replay like a debugger: one boundary at a time, with the agent's frames.

The replay runs in a worker thread. Before each event is served the worker
asks whether to pause; when it does, it publishes the event and the live
stack and waits. :class:`Stepper` is the Python API; :class:`StepperShell`
reads commands from any text stream, so the same session works in a
terminal and through a pipe.
"""

from __future__ import annotations

import shlex
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import orjson

from replayable.capture.context import _STATE
from replayable.events.model import Event
from replayable.replay.api import execute_session, prepare
from replayable.replay.frames import FrameInfo, PausePoint, capture_stack, safe_repr
from replayable.replay.loading import check_records
from replayable.replay.session import ReplayResult, ReplaySession
from replayable.store import EventStore, open_store

__all__ = ["Breakpoint", "Stepper", "StepperShell"]


@dataclass(frozen=True)
class Breakpoint:
    """Pause before events matching every given field."""

    kind: str | None = None
    name: str | None = None
    step: int | None = None

    def matches(self, ev: Event) -> bool:
        return (
            (self.kind is None or ev.kind == self.kind)
            and (self.name is None or ev.name == self.name)
            and (self.step is None or ev.seq == self.step)
        )

    def __str__(self) -> str:
        parts = [
            f"{k}={v}"
            for k, v in (("kind", self.kind), ("name", self.name), ("step", self.step))
            if v is not None
        ]
        return " ".join(parts) or "every event"


class Stepper:
    """Drive a pure replay one boundary at a time.

    ``start()`` runs to the first event (or first breakpoint with
    ``stop_at_start=False``); ``next()`` serves the current event and pauses
    before the following one; ``cont()`` runs to the next breakpoint. Each
    returns the new :class:`PausePoint`, or ``None`` once the replay ended
    (then ``result`` holds the :class:`ReplayResult`).
    """

    def __init__(
        self,
        run_id: str,
        *,
        store: EventStore | str | None = None,
        fn: Callable[..., Any] | None = None,
    ) -> None:
        self.store = open_store(store)
        self.run = self.store.run(run_id)
        events = self.store.events(self.run.run_id)
        check_records(self.run, events)  # a stored record is data: refused before it runs
        self._wf, self._args, self._kwargs = prepare(self.run, fn)
        self.session = ReplaySession(self.store, self.run, events)
        self.session.pause_hook = self._hook
        self.breakpoints: list[Breakpoint] = []
        self.current: PausePoint | None = None
        self.result: ReplayResult | None = None
        self._mode = "step"
        self._quit = False
        self._cv = threading.Condition()
        self._turn = "worker"
        self._thread: threading.Thread | None = None

    # -- worker side ------------------------------------------------------------

    def _hook(self, ev: Event) -> None:
        if self._mode != "step" and not any(b.matches(ev) for b in self.breakpoints):
            return
        st = _STATE.get()
        frames = capture_stack(
            keep_frames=True, start=sys._getframe(1), origin=st.origin if st else None
        )
        point = PausePoint(ev, frames)
        with self._cv:
            self.current = point
            self._turn = "controller"
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == "worker")
            self.current = None
        if self._quit:
            raise self.session.stop(None, paused=point)

    def _work(self) -> None:
        try:
            self.result = execute_session(
                self.session, self.run, self._wf, self._args, self._kwargs
            )
        finally:
            with self._cv:
                self.current = None
                self._turn = "controller"
                self._cv.notify_all()

    # -- controller side --------------------------------------------------------

    def _resume(self, mode: str) -> PausePoint | None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="replayable-step", daemon=True
                )
                self._mode = mode
                self._turn = "worker"
                self._thread.start()
            elif self.finished:
                return None
            else:
                self._mode = mode
                self._turn = "worker"
                self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == "controller")
            return self.current

    @property
    def finished(self) -> bool:
        return self.result is not None or (self._thread is not None and not self._thread.is_alive())

    def start(self, stop_at_start: bool = True) -> PausePoint | None:
        """Begin: pause before the first event (or run to the first breakpoint)."""
        return self._resume("step" if stop_at_start else "continue")

    def next(self) -> PausePoint | None:
        """Serve the current event; pause before the next one."""
        return self._resume("step")

    def cont(self) -> PausePoint | None:
        """Run until a breakpoint or the end."""
        return self._resume("continue")

    def break_on(
        self, *, kind: str | None = None, name: str | None = None, step: int | None = None
    ) -> Breakpoint:
        bp = Breakpoint(kind, name, step)
        self.breakpoints.append(bp)
        return bp

    def where(self) -> list[FrameInfo]:
        """The paused stack, entry first."""
        return self.current.frames if self.current else []

    def _frame(self, index: int) -> FrameInfo:
        frames = self.where()
        if not frames:
            raise RuntimeError("the replay is not paused")
        return frames[index]

    def locals(self, frame: int = -1) -> dict[str, str]:
        """Safe reprs of a paused frame's locals (innermost frame by default)."""
        return self._frame(frame).locals

    def eval(self, expression: str, frame: int = -1) -> str:
        """Evaluate ``expression`` in a paused frame and return a safe repr of the value."""
        info = self._frame(frame)
        if info.frame is None:
            raise RuntimeError("the frame is gone")
        value = eval(expression, info.frame.f_globals, dict(info.frame.f_locals))
        return safe_repr(value)

    def quit(self) -> ReplayResult | None:
        """Stop the replay where it is."""
        if self._thread is not None and not self.finished:
            self._quit = True
            with self._cv:
                self._turn = "worker"
                self._cv.notify_all()
            self._thread.join(timeout=10)
        return self.result


_HELP = """commands:
  n, next              serve this event, pause before the next
  c, continue          run to the next breakpoint or the end
  b, break [kind=K] [name=N] [step=S]   pause before matching events (no args: list)
  w, where             the agent's stack, entry first
  l, locals [FRAME]    locals of a frame (default: innermost)
  p, print EXPR        evaluate EXPR in the innermost paused frame
  s, show              the current event's request and recorded response
  q, quit              stop the replay
  h, help              this text"""


class StepperShell:
    """A line-oriented debugger over :class:`Stepper`, for terminals and pipes."""

    def __init__(
        self, stepper: Stepper, stdin: TextIO, stdout: TextIO, prompt: str = "(replayable) "
    ) -> None:
        self.stepper = stepper
        self.stdin = stdin
        self.out = stdout
        self.prompt = prompt

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _announce(self, point: PausePoint | None) -> None:
        if point is None:
            result = self.stepper.result
            status = result.status if result else "stopped"
            self._say(
                f"replay finished: {status}"
                + (f" ({result.events_served} events served)" if result else "")
            )
            if result and result.divergence:
                self._say(result.divergence.message)
            return
        ev = point.event
        where = point.frames[-1] if point.frames else None
        at = f"  at {where.file}:{where.line} in {where.function}" if where else ""
        run = "" if ev.run_id == self.stepper.run.run_id else f"child run {ev.run_id[:13]} "
        self._say(f"{run}step {ev.seq}: {ev.kind} {ev.name}{at}")

    def run(self) -> ReplayResult | None:
        """Read commands until quit or end of input; returns the replay's result."""
        run = self.stepper.run
        self._say(f"stepping run {run.run_id} ({run.workflow}); 'help' lists commands")
        self._announce(self.stepper.start())
        while not self.stepper.finished:
            self.out.write(self.prompt)
            self.out.flush()
            line = self.stdin.readline()
            if not line:
                break
            if not self.handle(line.strip()):
                break
        return self.stepper.quit() or self.stepper.result

    def handle(self, line: str) -> bool:
        """Run one command; ``False`` ends the session."""
        if not line:
            return True
        cmd, _, rest = line.partition(" ")
        rest = rest.strip()
        try:
            if cmd in ("n", "next"):
                self._announce(self.stepper.next())
            elif cmd in ("c", "continue", "cont"):
                self._announce(self.stepper.cont())
            elif cmd in ("b", "break"):
                self._break(rest)
            elif cmd in ("w", "where", "bt"):
                for i, f in enumerate(self.stepper.where()):
                    self._say(f"  #{i} {f.function} at {f.file}:{f.line}")
            elif cmd in ("l", "locals"):
                for k, v in self.stepper.locals(int(rest) if rest else -1).items():
                    self._say(f"  {k} = {v}")
            elif cmd in ("p", "print"):
                self._say(self.stepper.eval(rest))
            elif cmd in ("s", "show"):
                self._show()
            elif cmd in ("q", "quit", "exit"):
                self.stepper.quit()
                self._say("replay stopped")
                return False
            elif cmd in ("h", "help", "?"):
                self._say(_HELP)
            else:
                self._say(f"unknown command {cmd!r}; 'help' lists commands")
        except Exception as exc:  # a bad expression must not end the session
            self._say(f"error: {type(exc).__name__}: {exc}")
        return True

    def _break(self, rest: str) -> None:
        if not rest:
            for bp in self.stepper.breakpoints:
                self._say(f"  break {bp}")
            if not self.stepper.breakpoints:
                self._say("  no breakpoints")
            return
        fields: dict[str, Any] = {}
        for part in shlex.split(rest):
            key, sep, value = part.partition("=")
            if not sep or key not in ("kind", "name", "step"):
                raise ValueError(f"expected kind=K, name=N or step=S, got {part!r}")
            fields[key] = int(value) if key == "step" else value
        self._say(f"breakpoint: {self.stepper.break_on(**fields)}")

    def _show(self) -> None:
        point = self.stepper.current
        if point is None:
            self._say("not paused")
            return
        ev = point.event
        self._say(f"step {ev.seq} {ev.kind} {ev.name}")
        self._say(
            "request:  " + orjson.dumps(ev.request_value(), option=orjson.OPT_INDENT_2).decode()
        )
        if ev.error is not None:
            self._say("error:    " + str(ev.error_value()))
        else:
            self._say(
                "response: " + orjson.dumps(ev.response_tree(), option=orjson.OPT_INDENT_2).decode()
            )
