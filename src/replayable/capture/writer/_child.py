"""The writer process behind :class:`~replayable.capture.writer.process.ProcessWriter`.

Reads length-prefixed msgpack frames from stdin. A frame is an array: the
number of the store it is for, then that store's records in order. The first
record of a store (``o``) names its URL and settings and starts an ordinary
in-process ``Writer`` for it; events, starts, ends and blobs go to that
writer; ``m`` asks for an acknowledgement, ``c`` closes the store, ``k`` and
``r`` change outage and redaction settings. After each frame holding
acknowledgement requests it flushes the store's writer and writes one line
per request to stdout: the ticket, then an error message if the flush failed
(``q`` and ``d`` are answered the same way: spooled or not, drained or not).
A line with ticket ``0`` is news the agent did not ask for: ``0 ready`` once
this process is up, ``0 <store> down <why>`` when a store's writer cannot
store, ``0 <store> up`` when it can again. On end of input (the agent's
process closed the pipe or died) it flushes what it has and exits.

The store is opened on its first use, not when the ``o`` record arrives: a
database that cannot be reached yet is an outage like any other, and the
writer spools until it answers.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from replayable.capture.writer.core import Writer
from replayable.capture.writer.handoff import apply
from replayable.errors import StoreError
from replayable.events.redaction import Redactor
from replayable.store.integrity import Integrity
from replayable.store.lazy import LazyStore


def _read_exactly(stream: Any, n: int) -> bytes | None:
    data: bytes = stream.read(n)
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _redactor(keys: list[str], patterns: list[str]) -> Redactor:
    return Redactor(keys=keys, value_patterns=patterns)


if TYPE_CHECKING:
    from replayable.store.base import EventStore

_out_lock = threading.Lock()


def _say(text: str) -> None:
    """Write answer lines to the agent's process (writer threads tell it news too)."""
    with _out_lock:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (OSError, ValueError):
            pass  # the agent's process is gone: commit what it sent, then end at EOF


def _open(sid: int, config: dict[str, Any]) -> tuple[Writer, LazyStore]:
    data_env: dict[str, str] | None = config.get("data_env")

    def opener(url: str) -> EventStore:
        from replayable.store import open_store
        from replayable.store.crypto import enable_encryption

        store = open_store(url)
        if data_env is not None:
            # The data keys of the process that opened the store, not this one's.
            enable_encryption(store, environ=data_env)
        return store

    store = LazyStore(config.get("open") or config["url"], opener, shown=config["url"])
    store.data_env = data_env
    writer = Writer(
        store,  # type: ignore[arg-type]
        redactor=_redactor(config["redact_keys"], config["redact_patterns"]),
        max_block_s=config["max_block_s"],
        on_store_failure=config["on_store_failure"],
        spool_dir=config["spool_dir"],
        integrity=Integrity.from_env(config.get("integrity_env") or {}),
    )

    def tell(state: str, message: str) -> None:
        # Ticket 0 is news, not an answer: the store's writer went down or came back.
        _say(f"0 {sid} {state} {message}".replace("\n", " ") + "\n")

    writer.on_status = tell
    return writer, store


#: How long a thread of the writer process holds the interpreter lock while another
#: waits for it (the interpreter's default is 5 ms).
SWITCH_INTERVAL_S = 0.0005

#: A record waits at most this long before the writer process stops yielding the CPU.
DEADLINE_S = 0.2


def _lower_priority(argv: list[str]) -> int:
    """Apply ``--nice N``: the agent's work comes before the records' on a busy machine."""
    if "--nice" not in argv or not hasattr(os, "nice"):
        return 0
    try:
        nice = int(argv[argv.index("--nice") + 1])
        if nice > 0:
            os.nice(nice)
        return max(nice, 0)
    except (IndexError, ValueError, OSError):
        return 0  # an unknown value, or not permitted: run at the agent's priority


def _set_nice(nice: int) -> bool:
    """Every thread of this process at ``nice`` (Linux keeps one per thread); ``False``
    where that is not permitted (lowering it needs root or CAP_SYS_NICE)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    try:
        for tid in tids:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except PermissionError:
        return False
    except OSError:
        pass  # a thread that ended meanwhile
    return True


class Priority:
    """This process's scheduling priority, raised to the agent's while any reason holds:
    a record late for its deadline, or an agent waiting for an answer (a flush, a
    recording's exit), which has nothing else to run meanwhile."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self._lock = threading.Lock()
        self._reasons: set[str] = set()
        self._high = False
        self._permitted = nice > 0

    def want(self, reason: str, high: bool) -> None:
        with self._lock:
            if high:
                self._reasons.add(reason)
            else:
                self._reasons.discard(reason)
            wanted = bool(self._reasons)
            if wanted == self._high or not self._permitted:
                return
            if wanted:
                # Not permitted (lowering needs root or CAP_SYS_NICE): never ask again.
                self._high = self._permitted = _set_nice(0)
            else:
                _set_nice(self.nice)
                self._high = False


def keep_deadline(
    writers: Callable[[], list[Writer]], nice: int, deadline: float = DEADLINE_S,
    tick: float = 0.05, rounds: int | None = None, priority: Priority | None = None,
) -> None:  # fmt: skip
    """While a record has waited longer than ``deadline``, run at the agent's priority
    (a niced writer on a busy machine committed nothing for seconds); then yield again."""
    priority = priority or Priority(nice)
    while rounds is None or rounds > 0:
        if rounds is not None:
            rounds -= 1
        time.sleep(tick)
        now = time.monotonic()
        late = any(
            w.waiting_since is not None and now - w.waiting_since > deadline for w in writers()
        )
        priority.want("late", late)


#: How often the writer process tells the agent's process how far each store's records
#: are kept (committed, spooled or refused).
KEPT_EVERY_S = 0.05


def report_kept(writers: dict[int, tuple[Writer, LazyStore]]) -> None:
    """Tell the agent's process, as news (ticket 0), how many of each store's records
    are kept: it holds on to the records it sent until then, and if this process dies
    it hands them to its in-process writer (which skips what this one stored), so that
    a writer process killed while behind loses nothing the agent's process still has."""
    told: dict[int, int] = {}
    while True:
        time.sleep(KEPT_EVERY_S)
        for sid, (writer, _) in list(writers.items()):
            noted = writer.noted
            if noted > told.get(sid, 0):
                told[sid] = noted
                _say(f"0 {sid} kept {noted}\n")


def main() -> int:
    nice = _lower_priority(sys.argv)
    # Everything imported so far lives as long as the process: keep it out of the
    # collector's way, and collect less often, since records in flight are many
    # short-lived containers that are never part of a cycle.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    # The committer gives the interpreter lock away for each statement the database
    # runs and must take it back from the thread building the next batch, which keeps
    # it for a whole switch interval: at the default 5 ms, a batch's few statements
    # waited longer than the database took to run them.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    decoder = msgspec.msgpack.Decoder()
    stdin = sys.stdin.buffer
    _say("0 ready\n")  # up: the agent's process stops storing run starts itself
    writers: dict[int, tuple[Writer, LazyStore]] = {}
    #: Records received for each store, of every kind (the agent's process counts them
    #: the same way).
    received: dict[int, int] = {}
    threading.Thread(
        target=report_kept, args=(writers,), name="replayable-kept", daemon=True
    ).start()
    priority = Priority(nice)
    if nice:
        threading.Thread(
            target=keep_deadline,
            args=(lambda: [w for w, _ in list(writers.values())], nice),
            kwargs={"priority": priority},
            name="replayable-deadline",
            daemon=True,
        ).start()
    try:
        while True:
            head = _read_exactly(stdin, 4)
            if head is None:
                break
            payload = _read_exactly(stdin, int.from_bytes(head, "little"))
            if payload is None:
                break
            records = decoder.decode(payload)
            sid = records[0]
            opened = writers.get(sid)
            writer = opened[0] if opened is not None else None
            tickets: list[tuple[int, float]] = []
            queries: list[tuple[str, Any]] = []
            close = False
            events: list[Any] = []
            for i in range(1, len(records)):
                kind, item = records[i]
                if kind == "e":
                    events.append(item)
                    continue
                if events and writer is not None:
                    writer.events(events)
                events = []
                if kind == "m":
                    tickets.append(item)
                elif kind == "q" or kind == "d":
                    queries.append((kind, item))
                elif kind == "o":
                    opened = writers[sid] = _open(sid, item)
                    writer = opened[0]
                elif writer is None:
                    continue  # a store that was closed, or never opened
                elif kind == "c":
                    close = True
                elif kind == "k":
                    writer.configure(**item)
                elif kind == "r":
                    writer.redactor = _redactor(*item)
                else:
                    apply(writer, kind, item)
            if events and writer is not None:
                writer.events(events)
            received[sid] = received.get(sid, 0) + len(records) - 1
            if writer is not None and not close:
                # Once everything before it is kept, the agent's process may let go of
                # this store's records up to here (see ``report_kept``).
                writer.note(received[sid])
            if not (tickets or close or queries):
                continue
            error = ""
            if writer is not None and (tickets or close):
                # The agent waits for this answer: it is the agent's work now.
                priority.want("asked", True)
                try:
                    # Inside the agent's own bound, so that a fail-open flush is
                    # answered (spooled) before the agent stops waiting.
                    writer.flush(timeout=0.8 * max(t for _, t in tickets or [(0, 5.0)]))
                except StoreError as exc:
                    error = " " + str(exc).replace("\n", " ")
            if close and writer is not None and opened is not None:
                del writers[sid]
                try:
                    writer.close()
                except StoreError as exc:
                    error = error or " " + str(exc).replace("\n", " ")
                opened[1].close()
            lines = [f"{t}{error}\n" for t, _ in tickets]
            for kind, (ticket, arg) in queries:
                if kind == "q":
                    spooled = writer is not None and writer.spooled
                    lines.append(f"{ticket}{' spooled' if spooled else ''}\n")
                else:
                    drained = writer is None or writer.drain(timeout=arg)
                    lines.append(f"{ticket}{'' if drained else ' not drained'}\n")
            priority.want("asked", False)  # before answering: the agent runs on at once
            _say("".join(lines))
    finally:
        for writer, store in writers.values():
            try:
                writer.close()
            finally:
                store.close()
    return 0


def _exit(code: int) -> None:
    """End the process as the interpreter would, without taking its modules apart: every
    store is closed and every record committed or spooled by now, and the agent waits
    for this exit (its interpreter's clean-up took 10-25 ms)."""
    # The interpreter's own first step at exit: the hooks that tell thread pools to stop
    # (a KMS plugin's executor, say), then every non-daemon thread joined. Joining
    # without those hooks would wait forever for a pool's idle workers.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
