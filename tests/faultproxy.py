"""A fault-injecting TCP proxy for outage tests: 127.0.0.1:<ephemeral> → a real server.

``drop`` refuses new connections (accept, then reset), ``stall`` accepts and
holds connections without forwarding a byte (new and existing ones), and
``reset()`` resets every open connection. The proxy never touches the server
beyond forwarding, and it stops by itself after ``lifetime`` seconds.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from types import TracebackType

__all__ = ["FaultProxy"]

_TICK = 0.05


def _hard_close(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped network path looks."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket | None) -> None:
        self.client = client
        self.server = server
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _hard_close(self.client)
            if self.server is not None:
                _hard_close(self.server)


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``target``, with faults switched on and off at will."""

    def __init__(self, target: tuple[str, int], *, lifetime: float = 120.0) -> None:
        self.target = target
        self.drop = False
        self.stall = False
        self.accepted = 0
        self._deadline = time.monotonic() + lifetime
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_TICK)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        self._thread.start()

    # -- controls -------------------------------------------------------------

    def cut(self) -> None:
        """The server vanishes: reset open connections and refuse new ones."""
        self.drop = True
        self.reset()

    def restore(self) -> None:
        """Forward normally again (open connections that were stalled resume)."""
        self.drop = False
        self.stall = False

    def reset(self) -> None:
        """Reset every open connection."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def open_links(self) -> int:
        with self._lock:
            return sum(1 for link in self._links if not link.closed)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.reset()
        self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- threads --------------------------------------------------------------

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def _accept(self) -> None:
        while self._running():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.drop:
                _hard_close(client)
                continue
            link = _Link(client, None)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._serve, args=(link,), daemon=True).start()
        self.reset()

    def _serve(self, link: _Link) -> None:
        # A stalled connection is held, unconnected, until the stall ends or it is reset.
        while self.stall and not link.closed and self._running():
            time.sleep(_TICK)
        if link.closed or not self._running():
            link.close()
            return
        try:
            link.server = socket.create_connection(self.target, timeout=2)
        except OSError:
            link.close()
            return
        if link.closed:
            # Reset while it connected: ``close`` may have run before the server's
            # socket was there to close (left open, a ResourceWarning fails the test).
            _hard_close(link.server)
            return
        pair = {link.client: link.server, link.server: link.client}
        try:
            while not link.closed and self._running():
                if self.stall:
                    time.sleep(_TICK)
                    continue
                readable, _, _ = select.select(list(pair), [], [], _TICK)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("peer closed")
                    pair[sock].sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            link.close()
