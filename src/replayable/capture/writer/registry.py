"""One writer per store, started on first use, flushed at exit, forgotten in a fork."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import weakref
from typing import TYPE_CHECKING

from replayable.capture.writer.core import Writer, default_spool_dir
from replayable.capture.writer.options import OnStoreFailure, options
from replayable.capture.writer.process import ProcessWriter

if TYPE_CHECKING:
    from replayable.events.redaction import Redactor
    from replayable.store.base import EventStore

__all__ = ["can_spawn_writer", "close_writer", "set_redactor", "writer_for"]

_writers: weakref.WeakKeyDictionary[EventStore, Writer | ProcessWriter] = (
    weakref.WeakKeyDictionary()
)
_writers_lock = threading.Lock()


def _forget_writers() -> None:
    # A forked child has none of its parent's writer threads (nor its pipe to the
    # writer process): it starts writers of its own when it records.
    global _writers_lock
    _writers_lock = threading.Lock()
    _writers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_writers)


def can_spawn_writer() -> bool:
    """Whether this interpreter can start the writer process: a plain Python, not a
    frozen application or a server that embeds one (their executable is not Python)."""
    exe = sys.executable
    if not exe or getattr(sys, "frozen", False):
        return False
    return os.path.basename(exe).lower().startswith(("python", "pypy"))


def set_redactor(redactor: Redactor) -> None:
    """Redact with ``redactor`` in every running writer, from their next record on."""
    for running in list(_writers.values()):
        running.redactor = redactor


def _forget(store: EventStore, writer: Writer | ProcessWriter) -> None:
    with _writers_lock:
        if _writers.get(store) is writer:
            del _writers[store]


def writer_for(
    store: EventStore,
    *,
    max_block_s: float | None = None,
    on_store_failure: OnStoreFailure | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
) -> Writer | ProcessWriter:
    """The store's writer, started on first use; given options reconfigure it.

    A store that a second process can open gets a :class:`ProcessWriter` unless
    ``configure(writer="thread")`` (or ``$REPLAYABLE_WRITER=thread``) says otherwise;
    a fail-closed recording (``on_store_failure="raise"``) always gets the
    in-process writer, which sees an outage the moment it starts.
    """
    if on_store_failure == "raise":
        with _writers_lock:
            running = _writers.get(store)
        if isinstance(running, ProcessWriter) and not running._closed:
            running.close()  # what it holds is committed (or spooled) before the switch
    with _writers_lock:
        writer = _writers.get(store)
        if writer is None or writer._closed:
            block = 5.0 if max_block_s is None else max_block_s
            if (
                options.mode == "process"
                and on_store_failure != "raise"
                and not store.url.startswith("memory:")
                and can_spawn_writer()
            ):
                writer = ProcessWriter(
                    store,
                    redactor=options.redactor,
                    max_block_s=block,
                    on_store_failure="spool",
                    spool_dir=spool_dir if spool_dir is not None else default_spool_dir(),
                )
            else:
                writer = Writer(
                    store,
                    redactor=options.redactor,
                    max_block_s=block,
                    on_store_failure=on_store_failure or "spool",
                    spool_dir=spool_dir,
                )
            started = writer
            writer.on_close = lambda: _forget(store, started)
            _writers[store] = writer
            store.add_close_hook(writer.close)
            return writer
    writer.configure(
        max_block_s=max_block_s, on_store_failure=on_store_failure, spool_dir=spool_dir
    )
    return writer


def close_writer(store: EventStore) -> None:
    """Flush and stop ``store``'s writer if it has one."""
    with _writers_lock:
        writer = _writers.pop(store, None)
    if writer is not None:
        writer.close()


@atexit.register
def _flush_all() -> None:
    for writer in list(_writers.values()):
        try:
            writer.flush(timeout=10.0)
        except Exception as exc:  # the process is ending: say so, do not raise
            warnings.warn(f"replayable: could not flush events at exit: {exc}", stacklevel=1)
