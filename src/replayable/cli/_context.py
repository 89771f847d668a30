"""What every command shares: the store chosen by ``--store`` and the one error edge."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from replayable.errors import ReplayableError
from replayable.store import EventStore, open_store

__all__ = ["EXIT_ERROR", "CliState", "ReplayableGroup", "fail", "state", "stdout"]

#: Exit code for a request that could not be carried out (bad input, unreadable store).
#: Exit code 1 is kept for "done, and the answer is bad": a divergent replay, a broken chain.
EXIT_ERROR = 2


class CliState:
    """Options of the top-level command, and the store opened on first use."""

    def __init__(self, store_url: str | None) -> None:
        self.store_url = store_url
        self._store: EventStore | None = None

    def store(self) -> EventStore:
        """The store named by ``--store`` / ``$REPLAYABLE_STORE`` (or the default)."""
        if self._store is None:
            self._store = open_store(self.store_url)
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


def stdout() -> Console:
    """A console on the current stdout (looked up per call so test runners can capture it)."""
    return Console(file=sys.stdout, highlight=False, soft_wrap=False)


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` as one line on stderr and return the exit to raise."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    return typer.Exit(EXIT_ERROR)


class ReplayableGroup(TyperGroup):
    """The root command: turns library and OS errors into one line on stderr.

    User mistakes (an unknown run, an ambiguous prefix, a bad store URL, an
    unreadable database, an entrypoint that cannot be imported) end here
    instead of in a traceback.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayableError as exc:
            raise fail(str(exc)) from None
        except OSError as exc:
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            raise fail(f"{exc.strerror or exc}{where}") from None
