"""Sessions and runs: the contracts a boundary call is handed to.

A *session* is a recording (or, in ``replay/``, a replay); a *run context*
is one run inside it. Boundaries call ``run.call(...)``; a recording run
executes the real function and hands the event to the writer, a replay run
serves it from the tape. Both derive causal positions the same way.
"""

from __future__ import annotations

import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from replayable.capture.context import State
from replayable.errors import SerializationError
from replayable.events.codec import (
    UnencodableError,
    dump_tree,
    to_tree,
)
from replayable.events.ids import uuid7

if TYPE_CHECKING:
    from replayable.capture.network import Connection

__all__ = [
    "Call",
    "DeferredRequest",
    "OpenCall",
    "RunContext",
    "Session",
    "WorkflowInfo",
    "call_site",
    "encode_input",
    "encode_output",
    "intercept_http",
    "new_run_id",
    "serialization_error",
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
    """A run's input as tagged JSON (types and dict order survive the round trip)."""
    return dump_tree(to_tree({"args": list(args), "kwargs": dict(kwargs)})).decode()


def encode_output(value: Any) -> bytes:
    """A run's output as tagged JSON, in the value's own key order."""
    return dump_tree(to_tree(value))


def serialization_error(
    what: str, exc: UnencodableError, step: int | None, boundary: str | None = None
) -> SerializationError:
    where = f" at step {step}" if step is not None else ""
    hint = (
        "pass a value without the cycle, or a flatter one"
        if exc.reason
        else "teach replayable the type with replayable.register_codec()"
    )
    return SerializationError(
        f"{what}{where} cannot be recorded: {exc}; {hint}",
        boundary=boundary,
        step=step,
        type_name=exc.type_name,
        path=exc.path,
    )


class Call(msgspec.Struct, frozen=True):
    """One boundary crossing as a boundary hands it to its run.

    ``fn(*args, **kwargs)`` is the real call; ``request`` is what the event
    records and replay matches; ``side_effect`` marks a call replay must not
    repeat; ``meta`` is the event's metadata; ``site`` is the caller's
    ``file:line in function``.
    """

    kind: str
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    request: Any
    side_effect: bool = False
    meta: dict[str, Any] | None = None
    site: str | None = None


class RunContext(ABC):
    """One run in progress: the target of every boundary call inside it."""

    run_id: str

    @abstractmethod
    def call(self, st: State, call: Call) -> Any:
        """Cross a synchronous boundary (may return an awaitable for ``llm``)."""

    @abstractmethod
    async def acall(self, st: State, call: Call) -> Any:
        """Cross an asynchronous boundary (``call.fn`` returns an awaitable)."""

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

    def outbound(self, st: State, conn: Connection) -> None:
        """A network connection opened inside this run but outside every boundary.

        Called by the network guard before the connection is made: a recording
        notes it as a gap, a pure replay refuses it (by raising its stop). The
        base lets it through.
        """
        return None

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

    def begin_deferred(self, st: State, request: DeferredRequest, site: str | None) -> OpenCall:
        """:meth:`begin` for a request handed over raw. A recording run leaves building
        the event to its writer (the call is ``deferred``); every other run builds the
        request here, as it must match it at once."""
        return self.begin(
            st, request.kind, request.name, request.request, False, request.meta, site
        )


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
    #: Begun with :meth:`RunContext.begin_deferred` by a run whose writer builds the
    #: event: end it with :meth:`finish_deferred` and the raw outcome.
    deferred: bool = False
    seq: int = 0
    #: The call's causal position (calls nested under it are keyed below it).
    key: str | None = None
    metadata: dict[str, Any]

    def value(self) -> Any:
        """The recorded outcome (replay only)."""
        raise RuntimeError("a live call has no recorded value")

    def finish(self, value: Any, meta: Mapping[str, Any] | None = None) -> None:
        """Record the outcome of a live call."""

    def fail(self, exc: BaseException, meta: Mapping[str, Any] | None = None) -> None:
        """Record that a live call raised."""

    def finish_deferred(self, raw: Any, meta: Mapping[str, Any] | None = None) -> None:
        """Record the raw outcome of a deferred call; the writer's builder makes the value."""
        raise RuntimeError("only a deferred call takes a raw outcome")


class DeferredRequest(Protocol):
    """A request whose recorded form is built later (see :meth:`RunContext.begin_deferred`).

    ``raw`` holds plain values (bytes, strings, numbers, lists, dicts) that can
    cross to the writer process; ``builder`` names the function in
    :mod:`replayable.capture.writer.deferred` that builds the event from them.
    ``request`` and ``meta`` build the same values here, for the runs that
    must match the request at once.
    """

    kind: str
    name: str
    raw: Any
    builder: str

    @property
    def request(self) -> Any: ...

    @property
    def meta(self) -> dict[str, Any]: ...


def intercept_http() -> None:
    """Route HTTP clients through the recording seam and watch for unseen connections.

    The HTTP libraries and SDKs already imported are patched now, and those
    imported later (inside a workflow, in a thread, at any time) the moment
    their module is loaded; the patches act only while a run is active. The
    network guard (:mod:`replayable.capture.network`) goes on ``socket``.
    Idempotent and cheap: recordings and replays call it when they start.
    """
    from replayable.capture import network
    from replayable.integrations.http import install

    install()
    network.install()


def call_site(depth: int) -> str | None:
    """``file:line in function`` of the frame ``depth`` levels above the caller."""
    try:
        f = sys._getframe(depth + 1)
    except ValueError:
        return None
    co = f.f_code
    return f"{co.co_filename}:{f.f_lineno} in {co.co_name}"
