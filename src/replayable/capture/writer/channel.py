"""The pipe to this process's writer process, and the two threads that serve it.

One :class:`Channel` per agent process (started by the first
:class:`~replayable.capture.writer.process.ProcessWriter`, replaced if it dies,
forgotten in a forked child): a forwarding thread sends each store's records
in frames, an answer-reading thread settles the :class:`Reply` of each flush,
durable record and question. If the child ends, or either thread fails, every
store falls back to an in-process writer with what was not sent.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec

from replayable.capture.writer.batches import Outcome
from replayable.capture.writer.refusals import warn
from replayable.errors import StoreError

if TYPE_CHECKING:
    from replayable.capture.writer.process import ProcessWriter

__all__ = ["INTERVAL", "WAKE_AT", "Channel", "Reply", "current_channel"]

log = logging.getLogger("replayable.writer")

_ENCODER = msgspec.msgpack.Encoder()
#: How often the forwarder sends what has accumulated. It is also woken by flushes,
#: durable records and ends of runs, and by a store with ``WAKE_AT`` records waiting.
#: Every round wakes the writer process too; at 10 ms, a recorded LLM call cost the
#: agent 30-40 µs more (on two cores, the rounds land beside the agent and the provider).
INTERVAL = 0.05
#: Records one store may gather before the forwarder is woken early: a tight loop's
#: records then reach the writer process (and are committed there) while the loop
#: still runs, so a short recording's exit does not wait for all of them at once.
WAKE_AT = 512


class Reply(Outcome[str]):
    """One request to the child; ``outcome`` is its answer (for a flush, an error message)."""

    __slots__ = ()


class Channel:
    """This process's writer process, and the two threads that talk to it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.writers: dict[int, ProcessWriter] = {}
        self.waiters: dict[int, Reply] = {}
        self._tickets = itertools.count(1)
        self._sids = itertools.count(1)
        self.wake = threading.Event()
        #: Set once the writer process says it is up (its interpreter started, its
        #: modules imported): until then a run's start is stored by the agent's process.
        self.ready = threading.Event()
        self.dead: BaseException | None = None
        self.closing = False
        #: Runs handed to the writer process by every store (see ``count_run``).
        self.runs = 0
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        from replayable.capture.writer.options import options

        nice = str(options.nice)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "replayable.capture.writer._child", "--nice", nice],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        _widen_pipe(self.proc.stdin)
        self._forwarder = threading.Thread(
            target=self._forward, name="replayable-forwarder", daemon=True
        )
        self._acks = threading.Thread(target=self._read_acks, name="replayable-acks", daemon=True)
        self._forwarder.start()
        self._acks.start()

    def add(self, writer: ProcessWriter) -> int | None:
        """Register a store's writer; ``None`` if the channel has died already."""
        with self.lock:
            if self.dead is not None:
                return None
            sid = next(self._sids)
            self.writers[sid] = writer
        return sid

    def count_run(self, writer: ProcessWriter, n: int) -> None:
        """A run handed to the writer process (``1``), or taken back before any of its
        records was sent (``-1``)."""
        with self.lock:
            writer._child_runs += n
            self.runs += n

    def ticket(self) -> tuple[int, Reply]:
        waiter = Reply()
        with self.lock:
            ticket = next(self._tickets)
            if self.dead is None:
                self.waiters[ticket] = waiter
            else:
                waiter.resolve(f"the writer process ended before confirming: {self.dead}")
        return ticket, waiter

    # -- threads ----------------------------------------------------------------------

    def _forward(self) -> None:
        # Whatever goes wrong here, the records must not be stranded: the stores fall
        # back to in-process writers, which take what was not sent.
        try:
            self._forward_loop()
        except Exception as exc:
            log.exception("replayable: the forwarder to the writer process failed")
            self._died(exc)

    def _forward_loop(self) -> None:
        pipe = self.proc.stdin
        assert pipe is not None
        while True:
            self.wake.wait(INTERVAL)
            self.wake.clear()
            frames: list[bytes] = []
            finished: list[int] = []
            for sid, writer in list(self.writers.items()):
                buf = writer._buf
                n = 0
                if buf and writer.may_send():
                    # Slice, then delete: hot paths append concurrently, and both
                    # operations are atomic, so no record can fall between them. Under
                    # the lock a run ending before the child is up is taken back under,
                    # and the in-process writer takes over under (then they are its).
                    with writer._drain_lock:
                        if writer._fallback is None:
                            n = len(buf)
                            records = buf[:n]
                            del buf[:n]
                            # Held until the writer process says they are kept (see
                            # ``ProcessWriter.kept``): if it dies first, they go to the
                            # in-process writer.
                            size = sum(map(len, records))
                            writer._sent += n
                            writer._sent_bytes += size
                            writer._unkept.append((writer._sent, records, size))
                if n:
                    # A msgpack array is its header followed by its items, already
                    # encoded: the store's number, then its records.
                    payload = (
                        b"\xdd"
                        + (n + 1).to_bytes(4, "big")
                        + _ENCODER.encode(sid)
                        + b"".join(records)
                    )
                    frames.append(len(payload).to_bytes(4, "little") + payload)
                if writer._closing and not buf:
                    finished.append(sid)
            if frames:
                try:
                    pipe.write(b"".join(frames))
                    pipe.flush()
                except (OSError, ValueError) as exc:
                    self._died(exc)
                    return
            if finished:
                with self.lock:
                    for sid in finished:
                        self.writers.pop(sid, None)
            if self.closing and not any(w._buf for w in self.writers.values()):
                try:
                    pipe.close()
                except OSError:
                    pass
                return

    def _read_acks(self) -> None:
        try:
            self._read_acks_loop()
        except Exception as exc:
            log.exception("replayable: reading the writer process's answers failed")
            self._died(exc)
        finally:
            if self.dead is not None:
                self._reap()

    def _reap(self) -> None:
        """Collect a child that has ended (or been told to), so it leaves no zombie."""
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def _read_acks_loop(self) -> None:
        out = self.proc.stdout
        assert out is not None
        for line in out:
            ticket_text, _, reply = line.decode().rstrip("\n").partition(" ")
            if ticket_text == "0":
                if reply == "ready":
                    self.ready.set()
                else:
                    self._news(reply)
                continue
            with self.lock:
                waiter = self.waiters.pop(int(ticket_text), None)
            if waiter is not None:
                waiter.resolve(reply or None)
        if not self.closing:
            self._died(EOFError("the writer process ended"))

    def _news(self, text: str) -> None:
        """A store's writer in the child went down or came back: say so here, at once."""
        sid_text, _, rest = text.partition(" ")
        state, _, message = rest.partition(" ")
        writer = self.writers.get(int(sid_text)) if sid_text.isdigit() else None
        if writer is None:
            return
        if state == "kept":
            writer.kept(int(message))
        elif state == "down":
            writer.last_error = StoreError(message)
            warn(message)
        else:
            writer.last_error = None

    def _died(self, exc: BaseException) -> None:
        with self.lock:
            if self.dead is not None:
                return
            self.dead = exc
            waiters, self.waiters = self.waiters, {}
            writers = list(self.writers.values())
            self.writers = {}
        log.warning("replayable: the writer process ended (%s); writing in-process", exc)
        try:
            # If it still runs, it commits what it was sent and exits; the in-process
            # writers continue each run's chain from what it committed, so wait for it.
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        # Fall back first: a waiter that wakes up confirms with the in-process writer.
        for writer in writers:
            writer._fall_back(exc)
        for waiter in waiters.values():
            waiter.resolve(f"the writer process ended before confirming: {exc}")

    def shutdown(self, timeout: float = 30.0) -> None:
        """Send what is left, let the child commit it and exit."""
        self.closing = True
        self.wake.set()
        self._forwarder.join(timeout=timeout)
        with self.lock:
            idle = self.runs == 0 and not self.ready.is_set()
        if idle:
            # Still starting, and given no run to store (each was stored here, see
            # ``ProcessWriter.end``): it holds nothing to commit, so it need not be
            # waited for (a short script would wait for its interpreter to start).
            self.proc.kill()
        # Its answers end as it exits (its end of the pipe closes): waiting for them
        # wakes at once, where waiting for the process polls (from 0.5 ms, doubling up to
        # 50 ms) and overshot an exit of 15 ms by as much again.
        deadline = time.monotonic() + timeout
        self._acks.join(timeout=timeout)
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._acks.join(timeout=timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _widen_pipe(pipe: Any) -> None:
    """Let the pipe hold a second of records (where Linux allows): a 64 KB pipe made
    the forwarder and the child take turns every 64 KB, a context switch each."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError, ValueError):
        pass  # not Linux, or a lower limit: the default size works, only slower


_channel: Channel | None = None
_channel_lock = threading.Lock()


def current_channel() -> Channel:
    global _channel
    with _channel_lock:
        if _channel is None or _channel.dead is not None or _channel.pid != os.getpid():
            _channel = Channel()
        return _channel


@atexit.register
def _shutdown_channel() -> None:
    # Registered before the writers' own exit hook, so it runs after their final flush.
    channel = _channel
    if channel is not None and channel.pid == os.getpid() and channel.dead is None:
        channel.shutdown()


def _forget_channel() -> None:
    global _channel
    _channel = None  # a forked child starts its own writer process when it needs one


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_channel)
