"""What every command shares: the store chosen by ``--store`` and the one error edge."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any, Final

import typer
from rich.console import Console
from rich.segment import Segment
from typer.core import TyperGroup

from replayable.errors import ReplayableError
from replayable.store import EventStore, open_store

__all__ = [
    "EXIT_ERROR",
    "STORE_HELP",
    "CliState",
    "ReplayableGroup",
    "fail",
    "hoist_store",
    "piped",
    "state",
    "stdout",
    "visible",
    "whole_stdout",
]

#: Exit code for a request that could not be carried out (bad input, unreadable store).
#: Exit code 1 is kept for "done, and the answer is bad": a divergent replay, a broken chain.
EXIT_ERROR = 2


class CliState:
    """Options of the top-level command, and the store opened on first use."""

    def __init__(self, store_url: str | None) -> None:
        self.store_url = store_url
        self._store: EventStore | None = None

    def store(self) -> EventStore:
        """The store named by ``--store`` / ``$REPLAYABLE_STORE`` (or the default).

        Commands read runs that must already be there: a store that does not
        exist (a mistyped path) is an error, never a new empty database.
        """
        if self._store is None:
            self._store = open_store(self.store_url, create=False)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def state(ctx: typer.Context) -> CliState:
    """The :class:`CliState` stored on the root context."""
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):
        obj = ctx.find_root().obj = CliState(None)
    return obj


#: Control characters but tab and newline: C0, DEL and C1 (an 8-bit CSI among them).
_CONTROL: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escaped(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def visible(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``): recorded text (a
    workflow's name, a tool's result, metadata, a stored row) is shown, never sent to
    the terminal as an escape sequence, a bell or a carriage return."""
    return _CONTROL.sub(_escaped, text) if _CONTROL.search(text) else text


class SafeConsole(Console):
    """A console that shows text as text: no Rich markup is read in it (this CLI styles
    with ``Style`` and ``Text``, never markup, so a ``[green]`` in a recorded value is
    printed as it is) and control characters are written out (see :func:`visible`)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        super().__init__(**kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(visible(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # The last guard, for text that reached a renderable some other way (a ``Text``
        # built from a value): before the styles' own escape sequences are added.
        return super()._render_buffer(
            seg
            if seg.control or not _CONTROL.search(seg.text)
            else seg._replace(text=visible(seg.text))
            for seg in buffer
        )


def stdout() -> Console:
    """A console on the current stdout (looked up per call so test runners can capture it)."""
    return SafeConsole(file=sys.stdout, highlight=False, soft_wrap=False)


#: Width of the console for output that is not a terminal: wide enough that no
#: value is ever cut to fit (a pipe or a file has no columns to fit).
_PIPE_WIDTH: Final = 100_000


def piped() -> bool:
    """Whether stdout is not a terminal (a pipe, a file, a test runner)."""
    return not stdout().is_terminal


def whole_stdout() -> Console:
    """Like :func:`stdout`, but when piped as wide as needed, so nothing is cut."""
    if piped():
        return SafeConsole(file=sys.stdout, highlight=False, soft_wrap=False, width=_PIPE_WIDTH)
    return stdout()


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` as one line on stderr and return the exit to raise."""
    typer.echo(f"error: {visible(' '.join(message.split()))}", err=True)
    return typer.Exit(EXIT_ERROR)


STORE_HELP = (
    "Event store URL: sqlite:///path/to/runs.db, postgresql://… or memory://. "
    "Accepted before or after the command's name."
)


def hoist_store(args: list[str]) -> list[str]:
    """``--store URL`` given after a command's name, moved before it (where it is parsed).

    ``replayable runs --store X`` then means ``replayable --store X runs``.
    Nothing after a ``--`` is touched; a later ``--store`` wins over an earlier one.
    """
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg == "--store" and i + 1 < len(args):
            moved += args[i : i + 2]
            i += 2
            continue
        if arg.startswith("--store="):
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    return moved + rest


class ReplayableGroup(TyperGroup):
    """The root command: turns library and OS errors into one line on stderr.

    User mistakes (an unknown run, an ambiguous prefix, a bad store URL, an
    unreadable database, an entrypoint that cannot be imported) end here
    instead of in a traceback. Every command also takes ``--store`` after
    its name (``replayable runs --store URL``), as people type it.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return list(super().parse_args(ctx, hoist_store(list(args))))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayableError as exc:
            raise fail(str(exc)) from None
        except OSError as exc:
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            raise fail(f"{exc.strerror or exc}{where}") from None
