"""A paused agent's state: its call stack from the workflow entry down to the boundary."""

from __future__ import annotations

import reprlib
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayable.capture.config import settings
from replayable.events.model import Event
from replayable.events.redaction import REDACTED

__all__ = ["FrameInfo", "PausePoint", "capture_stack", "safe_repr", "user_site"]

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_STDLIB = sysconfig.get_paths()["stdlib"]
_LIBRARIES = tuple(
    {_PACKAGE_DIR, _STDLIB, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
_INSTALLED = ("/site-packages/", "/dist-packages/")
_LOOP_HANDLE = str(Path("asyncio") / "events.py")

_repr = reprlib.Repr()
_repr.maxstring = 200
_repr.maxother = 200
_repr.maxlist = 10
_repr.maxdict = 10
_repr.maxlevel = 3


def safe_repr(value: Any, name: str | None = None) -> str:
    """A short repr that never raises, with secrets redacted: long values are cut, broken
    ones named; a value whose ``name`` is secret-looking, and the secrets in any other,
    are replaced as they would be in a recording (shown locals are never stored, but
    they are printed and sent to a browser)."""
    redactor = settings.redactor
    if name is not None and redactor.secret_key(name):
        return REDACTED
    try:
        return redactor.redact_text(_repr.repr(redactor.redact_object(value)))
    except Exception as exc:  # a user __repr__ may raise anything
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


@dataclass(frozen=True)
class FrameInfo:
    """One frame of the agent's stack; ``frame`` is live while the replay is paused."""

    function: str
    file: str
    line: int
    locals: dict[str, str]
    frame: types.FrameType | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "locals": self.locals,
        }


@dataclass(frozen=True)
class PausePoint:
    """Where a replay paused: the event about to be served and the stack that asked for it."""

    event: Event
    frames: list[FrameInfo]

    def to_dict(self) -> dict[str, Any]:
        ev = self.event
        return {
            "step": ev.seq,
            "kind": ev.kind,
            "name": ev.name,
            "request": ev.request_value(),
            "response": ev.response_tree(),
            "error": ev.error_value(),
            "stack": [f.to_dict() for f in self.frames],
        }

    def render(self) -> str:
        """Text for people: the event, then the stack innermost last."""
        ev = self.event
        lines = [f"paused before step {ev.seq}: {ev.kind} {ev.name}", "stack (entry first):"]
        for f in self.frames:
            lines.append(f"  {f.function} at {f.file}:{f.line}")
            for k, v in f.locals.items():
                lines.append(f"      {k} = {v}")
        return "\n".join(lines)


def _library(file: str) -> bool:
    return file.startswith(_LIBRARIES) or any(p in file for p in _INSTALLED) or file[:1] == "<"


def user_site(
    start: types.FrameType | None = None, origin: types.FrameType | None = None
) -> str | None:
    """``file:line in function`` of the innermost frame of the agent's own code above the
    caller: not replayable, the standard library or an installed package (an SDK, a
    framework). Where the walk reaches the event loop that runs this task, the frame
    that started the task (``origin``) comes first; what ran the loop comes last."""
    rest = _user_frame(start or sys._getframe(1))
    if isinstance(rest, str):
        return rest
    if origin is not None:
        found = _user_frame(origin)
        if isinstance(found, str):
            return found
    while rest is not None:
        found = _user_frame(rest)
        if isinstance(found, str):
            return found
        rest = found
    return None


def _user_frame(frame: types.FrameType | None) -> str | types.FrameType | None:
    """The first frame of the agent's code from ``frame`` outwards, as text; or, where
    the walk reaches an event loop running a task first, the frame that runs the loop."""
    while frame is not None:
        code = frame.f_code
        if not _library(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        if code.co_name == "_run" and code.co_filename.endswith(_LOOP_HANDLE):
            return frame.f_back
        frame = frame.f_back
    return None


def capture_stack(
    keep_frames: bool = False,
    start: types.FrameType | None = None,
    origin: types.FrameType | None = None,
) -> list[FrameInfo]:
    """Frames of the agent's code, from the workflow entry down to the boundary call.

    The walk skips replayable's own frames and the standard library's (the event
    loop, thread pools), collects the agent's frames, and stops at the next
    replayable frame (the workflow wrapper), so the list starts at the entry
    function. A call made in a gathered task or a pool thread has no agent frame
    of its own above it; then the walk continues from ``origin``, the frame that
    started the task.
    """
    collected = _walk(start or sys._getframe(1), keep_frames, spawned=False)
    if origin is not None:
        collected.extend(_walk(origin, keep_frames, spawned=True))
    collected.reverse()
    return collected


def _walk(frame: types.FrameType | None, keep_frames: bool, spawned: bool) -> list[FrameInfo]:
    collected: list[FrameInfo] = []
    while frame is not None:
        code = frame.f_code
        file = code.co_filename
        ours = file.startswith(_PACKAGE_DIR)
        if ours and collected:
            break
        stdlib = file.startswith(_STDLIB)
        if stdlib and not collected and not spawned:
            break  # the event loop or a pool worker: where this task or thread began
        if not ours and not stdlib:
            collected.append(
                FrameInfo(
                    function=getattr(code, "co_qualname", code.co_name),
                    file=file,
                    line=frame.f_lineno,
                    locals={
                        k: safe_repr(v, k)
                        for k, v in frame.f_locals.items()
                        if not k.startswith("__")
                    },
                    frame=frame if keep_frames else None,
                )
            )
        frame = frame.f_back
    return collected
