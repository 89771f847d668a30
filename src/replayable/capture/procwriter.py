"""A writer in its own process: the agent's process only encodes and forwards.

With the in-process :class:`~replayable.capture.writer.Writer`, the writer
thread's per-event work (redaction, hashing, building rows, the store's
driver) shares the interpreter lock with the agent, so an agent that makes
calls in a tight loop pays for it. :class:`ProcessWriter` keeps the same
interface, but the hot path only encodes the hand-off with msgpack (C) and
appends it to a list; a forwarding thread writes the encoded records to a
pipe in batches, and a child process (``python -m replayable.capture._child``)
runs an ordinary ``Writer`` against its own connection to the same store:
redaction, chains, group commit, the outage spool, all of it.

Durable records wait for the child's acknowledgement, which it sends once the
batch holding them is committed (or spooled, fail-open). If the agent's
process is killed, the child still commits what it had received. If the child
dies, the writer falls back to an in-process ``Writer`` for what follows and
fails the durable waiters it could not confirm.

Opt in with ``REPLAYABLE_WRITER=process`` or ``configure(writer="process")``;
stores that live in memory always use the in-process writer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import msgspec

from replayable.errors import StoreError
from replayable.events.canonical import Redactor
from replayable.events.codec import encode_request

if TYPE_CHECKING:
    from replayable.capture.linker import PendingEvent
    from replayable.capture.writer import Writer
    from replayable.events.model import RunStart
    from replayable.store.base import EventStore

__all__ = ["ProcessWriter"]

log = logging.getLogger("replayable.writer")

_ENCODER = msgspec.msgpack.Encoder()


class _Waiter:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: str | None = None


class ProcessWriter:
    """Forwards records to a writer process; same calls as ``Writer``."""

    def __init__(
        self,
        store: EventStore,
        *,
        redactor: Redactor,
        max_block_s: float = 5.0,
        on_store_failure: str = "spool",
        spool_dir: str | os.PathLike[str] | None = None,
        interval: float = 0.01,
        durable_timeout: float = 30.0,
    ) -> None:
        self.store = store
        self.interval = interval
        self.durable_timeout = durable_timeout
        self.max_block_s = max_block_s
        self.last_error: BaseException | None = None
        self._redactor = redactor
        self._buf: list[bytes] = []
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._tickets = 0
        self._waiters: dict[int, _Waiter] = {}
        self._closed = False
        self._fallback: Writer | None = None
        config = {
            "url": store.url,
            "redact_keys": sorted(redactor.keys),
            "max_block_s": max_block_s,
            "on_store_failure": on_store_failure,
            "spool_dir": None if spool_dir is None else os.fspath(spool_dir),
        }
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "replayable.capture._child", msgspec.json.encode(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._forwarder = threading.Thread(
            target=self._forward, name="replayable-forwarder", daemon=True
        )
        self._acks = threading.Thread(target=self._read_acks, name="replayable-acks", daemon=True)
        self._forwarder.start()
        self._acks.start()

    # -- hot path -------------------------------------------------------------------

    def event(self, pending: PendingEvent, durable: bool = False) -> None:
        """Hand off one event; with ``durable`` return once the child committed it."""
        if durable:
            self._send_and_wait("e", pending)
            return
        try:
            self._buf.append(_ENCODER.encode(("e", pending)))
        except TypeError:
            self._buf.append(_ENCODER.encode(("e", _plain(pending))))

    def start(self, start: RunStart, durable: bool = False) -> None:
        self._put("s", start, durable)

    def end(self, end: tuple[str, str, bytes | None, bytes | None, float], durable: bool) -> None:
        self._put("x", end, durable)
        self._wake.set()

    def blob(self, digest: str, data: bytes) -> None:
        self._put("b", (digest, data), False)

    def _put(self, kind: str, item: Any, durable: bool) -> None:
        if durable:
            self._send_and_wait(kind, item)
        else:
            self._buf.append(_ENCODER.encode((kind, item)))

    def _send_and_wait(self, kind: str, item: Any, timeout: float | None = None) -> None:
        waiter = _Waiter()
        with self._lock:
            self._tickets += 1
            ticket = self._tickets
            self._waiters[ticket] = waiter
        if kind != "m":
            self._buf.append(_ENCODER.encode((kind, item if kind != "e" else _safe(item))))
        self._buf.append(_ENCODER.encode(("m", ticket)))
        self._wake.set()
        bound = self.max_block_s if timeout is None else timeout
        if not waiter.done.wait(bound):
            raise StoreError(
                f"the writer process for {self.store.url} did not confirm within {bound:g}s"
            )
        if waiter.error is not None:
            raise StoreError(f"writing to {self.store.url} failed: {waiter.error}")

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything handed off so far is committed by the child."""
        if self._closed:
            return
        self._send_and_wait("m", None, self.durable_timeout if timeout is None else timeout)

    # -- threads ----------------------------------------------------------------------

    def _forward(self) -> None:
        pipe = self._proc.stdin
        assert pipe is not None
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            buf, self._buf = self._buf, []
            if buf:
                # A msgpack array is its header followed by its items, already encoded.
                payload = b"\xdd" + len(buf).to_bytes(4, "big") + b"".join(buf)
                try:
                    pipe.write(len(payload).to_bytes(4, "little") + payload)
                    pipe.flush()
                except (OSError, ValueError) as exc:
                    self._child_died(exc, buf)
                    return
            if self._closed and not self._buf:
                try:
                    pipe.close()
                except OSError:
                    pass
                return

    def _read_acks(self) -> None:
        out = self._proc.stdout
        assert out is not None
        for line in out:
            ticket_text, _, error = line.decode().rstrip("\n").partition(" ")
            with self._lock:
                waiter = self._waiters.pop(int(ticket_text), None)
            if waiter is not None:
                waiter.error = error or None
                waiter.done.set()
        if not self._closed:
            self._child_died(EOFError("the writer process ended"), [])

    def _child_died(self, exc: BaseException, unsent: list[bytes]) -> None:
        from replayable.capture.writer import Writer

        self.last_error = exc
        log.warning(
            "replayable: the writer process for %s ended (%s); writing in-process",
            self.store.url,
            exc,
        )
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = f"the writer process ended before confirming: {exc}"
            waiter.done.set()
        fallback = Writer(self.store, redactor=self._redactor, max_block_s=self.max_block_s)
        decoder = msgspec.msgpack.Decoder()
        for data in [*unsent, *self._buf]:
            kind, item = decoder.decode(data)
            _apply(fallback, kind, item)
        self._buf = []
        self._fallback = fallback
        # Later hand-offs go straight to the in-process writer.
        self.__dict__.update(
            event=fallback.event,
            start=fallback.start,
            end=fallback.end,
            blob=fallback.blob,
            flush=fallback.flush,
        )

    # -- the rest of the Writer interface ----------------------------------------------

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        self._redactor = redactor  # the child keeps the settings it started with

    def configure(self, **options: Any) -> None:
        """Outage settings are fixed when the writer process starts."""

    @property
    def spooled(self) -> bool:
        return False

    def drain(self, timeout: float = 30.0) -> bool:
        self.flush(timeout)
        return True

    def close(self) -> None:
        """Flush, then let the child finish and exit."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._wake.set()
            self._forwarder.join(timeout=self.durable_timeout)
            try:
                self._proc.wait(timeout=self.durable_timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._acks.join(timeout=self.durable_timeout)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            if self._fallback is not None:
                self._fallback.close()


def _safe(pending: Any) -> Any:
    try:
        _ENCODER.encode(pending)
    except TypeError:
        return _plain(pending)
    return pending


def _plain(pending: PendingEvent) -> tuple[Any, ...]:
    """The hand-off with its metadata reduced to JSON values (an SDK may pass a class
    as ``response_format``), so that it can cross the pipe."""
    items = list(pending)
    meta = items[14]
    if meta:
        import orjson

        items[14] = orjson.loads(encode_request(meta))
    return tuple(items)


def _apply(writer: Writer, kind: str, item: Any) -> None:
    """Hand one decoded record to an in-process writer."""
    from replayable.events.model import RunStart

    if kind == "e":
        writer.event(tuple(item))
    elif kind == "s":
        writer.start(msgspec.convert(item, RunStart))
    elif kind == "x":
        writer.end(tuple(item), False)
    elif kind == "b":
        writer.blob(item[0], item[1])
