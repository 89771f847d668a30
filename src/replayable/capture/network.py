"""The network guard: outbound connections made outside every boundary.

A boundary (an ``@tool``, the HTTP seam's transport) runs its real work with
no run active, so whatever it connects to belongs to it. A TCP connection
opened while a run *is* active comes from code the recording does not see:
an HTTP client that is not intercepted, a database driver called from an
undecorated function, a raw socket. :func:`install` patches
``socket.socket.connect`` (which ``socket.create_connection``, ``http.client``,
``urllib3``, ``aiohttp`` and asyncio's loop connections all go through) and
hands each such connection to the run, which decides:

- recording: the run notes a ``gap`` event (host, port, call site) and the
  first connection from each call site is warned about
  (:class:`CaptureGapWarning`);
- a pure replay: nothing may reach the network, so the connection is refused
  and the replay ends ``diverged`` with reason ``unrecorded_io``, unless the
  replay was given ``allow_network=True``;
- a fork or counterfactual replay: allowed where the replay runs live (and
  noted as a gap in the new run), refused in the parts served from the tape.

The check costs one context-variable read per connection attempt and nothing
per request on a kept-alive connection. Connections made with no run active
(the store's own PostgreSQL and NATS connections, the writer's threads and
process, any code outside a workflow) are never looked at.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import sysconfig
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from replayable.capture.context import _STATE

__all__ = [
    "CaptureGapWarning",
    "Connection",
    "install",
    "installed",
    "pure_replays_active",
    "replaying_purely",
    "unguarded",
    "warn_gap",
]

_INET = (socket.AF_INET, socket.AF_INET6)


class CaptureGapWarning(UserWarning):
    """A recorded run made a network connection no boundary captured."""


class Connection:
    """An outbound connection attempt: where to, from which code, through which library."""

    __slots__ = ("host", "port", "site", "via")

    def __init__(self, host: str, port: int, site: str | None, via: str | None) -> None:
        self.host, self.port, self.site, self.via = host, port, site, via

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def request(self) -> dict[str, Any]:
        """The recorded form (a ``gap`` event's request)."""
        out: dict[str, Any] = {"host": self.host, "port": self.port}
        if self.via:
            out["via"] = self.via
        return out


# -- where the connection came from -----------------------------------------------

_LIBRARY_DIRS = tuple(
    {
        p
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)
#: Files that are not the agent's own code: the standard library, installed packages,
#: frozen modules.
_NOT_AGENT = (*_LIBRARY_DIRS, "<frozen")
_OWN_PREFIX = __name__.rsplit(".", 2)[0] + "."


def _origin(depth: int) -> tuple[str | None, str | None]:
    """``(call site, via)``: the nearest frame in the agent's own code (not the standard
    library, an installed package or this package), and the library module the agent
    called into (the outermost library frame beneath that call site)."""
    try:
        f: Any = sys._getframe(depth + 1)
    except ValueError:
        return None, None
    via: str | None = None
    fallback: tuple[str, str | None] | None = None
    while f is not None:
        module = f.f_globals.get("__name__", "")
        if not module.startswith(_OWN_PREFIX) and module not in ("socket", "ssl"):
            co = f.f_code
            where = f"{co.co_filename}:{f.f_lineno} in {co.co_name}"
            if not co.co_filename.startswith(_NOT_AGENT):
                return where, via
            via = module
            fallback = fallback or (where, None)
        f = f.f_back
    return fallback if fallback is not None else (None, None)


# -- the patch ----------------------------------------------------------------------

_lock = threading.Lock()
_real: dict[str, Any] = {}
_pure = 0


def _guard(sock: socket.socket, address: Any) -> None:
    st = _STATE.get()
    if st is None or st.run is None or sock.family not in _INET:
        return
    if sock.type != socket.SOCK_STREAM:
        return
    if not isinstance(address, tuple) or len(address) < 2:
        return
    site, via = _origin(2)
    conn = Connection(str(address[0]), int(address[1]), site, via)
    outbound = getattr(st.run, "outbound", None)
    if outbound is None:
        return
    try:
        outbound(st, conn)
    except BaseException:
        # Refused: the socket never connects, and callers clean up only after an OSError.
        sock.close()
        raise


def _connect(self: socket.socket, address: Any) -> None:
    _guard(self, address)
    _real["connect"](self, address)


def _connect_ex(self: socket.socket, address: Any) -> int:
    _guard(self, address)
    result: int = _real["connect_ex"](self, address)
    return result


def install() -> None:
    """Put the guard on ``socket.socket`` (idempotent; it acts only inside a run)."""
    with _lock:
        if _real:
            return
        _real["connect"] = socket.socket.connect
        _real["connect_ex"] = socket.socket.connect_ex
        socket.socket.connect = _connect  # type: ignore[method-assign,assignment]
        socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign,assignment]


def installed() -> bool:
    """Whether the guard is in place."""
    return bool(_real)


@contextlib.contextmanager
def unguarded() -> Iterator[None]:
    """Run the enclosed code as no run's: the replay engine reading its own store
    (a partial tape, a child's tape) from inside the agent's call."""
    token = _STATE.set(None)
    try:
        yield
    finally:
        _STATE.reset(token)


# -- gap warnings -------------------------------------------------------------------

_warned: set[str] = set()


def warn_gap(conn: Connection) -> None:
    """Warn about a gap once per call site (and once per address when the site is unknown)."""
    key = conn.site or conn.address
    if key in _warned:
        return
    _warned.add(key)
    via = f" through {conn.via}" if conn.via else ""
    warnings.warn(
        f"replayable: a connection to {conn.address}{via} at {conn.site or 'an unknown site'} "
        "was made outside any boundary and is not captured; its result cannot be replayed. "
        "Mark the function with @replayable.tool, or use an intercepted client",
        CaptureGapWarning,
        stacklevel=4,
    )


# -- pure replays in progress (for tests that count what reaches a server) ----------


class replaying_purely:
    """Counts pure replays in progress, process-wide (see :func:`pure_replays_active`)."""

    def __enter__(self) -> None:
        global _pure
        with _lock:
            _pure += 1

    def __exit__(self, *exc: object) -> None:
        global _pure
        with _lock:
            _pure -= 1


def pure_replays_active() -> int:
    """How many pure replays are running in this process now.

    A test server can read it on each request it receives: during a pure
    replay nothing should reach it.
    """
    return _pure
