"""The background writer: the hot path hands records off, this thread persists them.

One writer per store. Boundaries append a raw record to a deque (no lock, no
hashing, no I/O); the writer thread drains it in batches, redacts and
fingerprints requests, links each run's hash chain, and writes the batch in
one transaction (group commit). A durable caller waits on its own record's
waiter, so many threads share one commit.
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from replayable.capture.config import settings
from replayable.errors import StoreError
from replayable.events.canonical import (
    Redactor,
    canonical,
    chain_hash,
    fingerprint,
    genesis_hash,
    run_seal,
)
from replayable.events.model import SCHEMA_VERSION, Event, RunEnd, RunStart

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["PendingEvent", "Writer", "writer_for"]

#: What a boundary hands off: (run_id, seq, kind, name, key, parent, call_site,
#: request bytes, response bytes | None, tagged, error bytes | None,
#: side_effect, started_at, duration_ns, metadata | None)
PendingEvent = tuple[
    str,
    int,
    str,
    str,
    "str | None",
    "int | None",
    "str | None",
    bytes,
    "bytes | None",
    bool,
    "bytes | None",
    bool,
    float,
    int,
    "dict[str, Any] | None",
]

_EVENT, _START, _END, _BLOB, _MARK = range(5)


class _Waiter:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class _Chain:
    __slots__ = ("count", "head")

    def __init__(self, run_id: str) -> None:
        self.count = 0
        self.head = genesis_hash(run_id)


class Writer:
    """Batches records into the store from a daemon thread."""

    def __init__(
        self,
        store: EventStore,
        *,
        redactor: Redactor | None = None,
        batch_size: int = 2048,
        interval: float = 0.02,
        durable_timeout: float = 30.0,
    ) -> None:
        self.store = store
        self.redactor = redactor or Redactor()
        self.batch_size = batch_size
        self.interval = interval
        self.durable_timeout = durable_timeout
        self._queue: collections.deque[tuple[int, Any, _Waiter | None]] = collections.deque()
        self._wake = threading.Event()
        self._chains: dict[str, _Chain] = {}
        self._starts: dict[str, RunStart] = {}
        self._closed = False
        self.last_error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="replayable-writer", daemon=True)
        self._thread.start()

    # -- hot path -----------------------------------------------------------

    def event(self, pending: PendingEvent, durable: bool = False) -> None:
        """Hand off one event; with ``durable`` return only once it is committed."""
        if not durable:
            self._queue.append((_EVENT, pending, None))
            if len(self._queue) >= self.batch_size:
                self._wake.set()
            return
        self._submit_and_wait(_EVENT, pending)

    def start(self, start: RunStart, durable: bool = False) -> None:
        if durable:
            self._submit_and_wait(_START, start)
        else:
            self._queue.append((_START, start, None))

    def end(self, end: tuple[str, str, bytes | None, bytes | None, float], durable: bool) -> None:
        """Hand off a run's outcome; the writer adds the chain head and count."""
        if durable:
            self._submit_and_wait(_END, end)
        else:
            self._queue.append((_END, end, None))
            self._wake.set()

    def blob(self, digest: str, data: bytes) -> None:
        self._queue.append((_BLOB, (digest, data), None))

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything handed off so far is committed."""
        if threading.current_thread() is self._thread or self._closed:
            return
        self._submit_and_wait(_MARK, None, timeout)

    def _submit_and_wait(self, kind: int, item: Any, timeout: float | None = None) -> None:
        waiter = _Waiter()
        self._queue.append((kind, item, waiter))
        self._wake.set()
        if not waiter.done.wait(self.durable_timeout if timeout is None else timeout):
            raise StoreError(
                f"the store {self.store.url} did not commit within "
                f"{self.durable_timeout if timeout is None else timeout:.0f}s"
                + (f": {self.last_error}" if self.last_error else "")
            )
        if waiter.error is not None:
            raise StoreError(f"writing to {self.store.url} failed: {waiter.error}") from (
                waiter.error
            )

    # -- writer thread ------------------------------------------------------

    def _loop(self) -> None:
        backoff = 0.05
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            while self._queue:
                batch: list[tuple[int, Any, _Waiter | None]] = []
                while self._queue and len(batch) < self.batch_size:
                    batch.append(self._queue.popleft())
                try:
                    self._write(batch)
                except Exception as exc:
                    self.last_error = exc
                    # Put the batch back, in order, and retry after a pause:
                    # nothing handed off is dropped while the process lives.
                    self._queue.extendleft(reversed(batch))
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                backoff = 0.05
                self.last_error = None
                for _, _, waiter in batch:
                    if waiter is not None:
                        waiter.done.set()
            if self._closed:
                return

    def _write(self, batch: list[tuple[int, Any, _Waiter | None]]) -> None:
        starts: list[RunStart] = []
        events: list[Event] = []
        ends: list[RunEnd] = []
        durable = False
        # Chains advance only once the batch is committed, so a failed batch
        # is rebuilt identically on retry.
        chains: dict[str, _Chain] = {}
        for kind, item, waiter in batch:
            durable = durable or waiter is not None
            if kind == _EVENT:
                events.append(self._build_event(item, chains))
            elif kind == _START:
                start = self._redact_start(item)
                self._starts[start.run_id] = start
                starts.append(start)
            elif kind == _END:
                ends.append(self._build_end(item, chains))
            elif kind == _BLOB:
                self.store.put_blob(*item)
        if starts or events or ends:
            self.store.append(starts, events, ends, durable=durable)
        self._chains.update(chains)
        for end in ends:
            self._chains.pop(end.run_id, None)

    def _chain(self, run_id: str, chains: dict[str, _Chain]) -> _Chain:
        chain = chains.get(run_id)
        if chain is None:
            committed = self._chains.get(run_id)
            chain = _Chain(run_id)
            if committed is not None:
                chain.count, chain.head = committed.count, committed.head
            chains[run_id] = chain
        return chain

    def _build_event(self, p: PendingEvent, chains: dict[str, _Chain]) -> Event:
        (
            run_id,
            seq,
            kind,
            name,
            key,
            parent,
            call_site,
            req,
            resp,
            tagged,
            err,
            side_effect,
            started_at,
            duration_ns,
            meta,
        ) = p
        redact = self.redactor.redact_bytes
        req = redact(req)
        request = req.decode()
        response = None if resp is None else redact(resp).decode()
        error = None if err is None else redact(err).decode()
        fp = fingerprint(kind, name, req)
        metadata = meta or {}
        encoding = "tagged" if tagged else "json"
        chain = self._chain(run_id, chains)
        prev = chain.head
        digest = chain_hash(
            prev,
            (
                run_id,
                seq,
                chain.count,
                kind,
                name,
                key,
                parent,
                call_site,
                request,
                fp,
                response,
                encoding,
                error,
                side_effect,
                started_at,
                duration_ns,
                metadata,
                SCHEMA_VERSION,
            ),
        )
        event = Event(
            run_id=run_id,
            seq=seq,
            kind=kind,
            name=name,
            key=key,
            parent=parent,
            call_site=call_site,
            request=request,
            fingerprint=fp,
            response=response,
            encoding=encoding,
            error=error,
            side_effect=side_effect,
            started_at=started_at,
            duration_ns=duration_ns,
            metadata=metadata,
            chain_index=chain.count,
            prev_hash=prev,
            hash=digest,
        )
        chain.count += 1
        chain.head = digest
        return event

    def _redact_start(self, start: RunStart) -> RunStart:
        redacted = self.redactor.redact_bytes(start.input.encode()).decode()
        # Run metadata is stored and indexed as given, so a secret in it (an
        # ``api_key`` tag) must be caught here like one in the input.
        metadata = start.metadata
        try:
            if metadata and self.redactor.needs_redaction(canonical(metadata)):
                metadata = self.redactor(metadata)
        except TypeError:
            pass  # not JSON: the store refuses it with its own error
        if redacted == start.input and metadata is start.metadata:
            return start
        import msgspec

        return msgspec.structs.replace(start, input=redacted, metadata=metadata)

    def _build_end(
        self, item: tuple[str, str, bytes | None, bytes | None, float], chains: dict[str, _Chain]
    ) -> RunEnd:
        run_id, status, output, error, ended_at = item
        chain = self._chain(run_id, chains)
        redact = self.redactor.redact_bytes
        out = None if output is None else redact(output).decode()
        err = None if error is None else redact(error).decode()
        start = self._starts.pop(run_id, None) or self.store.get_run(run_id).start
        return RunEnd(
            run_id=run_id,
            status=status,  # type: ignore[arg-type]
            output=out,
            error=err,
            ended_at=ended_at,
            event_count=chain.count,
            last_hash=run_seal(chain.head, start, status, out, err, ended_at, chain.count),
        )

    def close(self) -> None:
        """Flush and stop the thread."""
        if self._closed:
            return
        try:
            self.flush(timeout=self.durable_timeout)
        finally:
            self._closed = True
            self._wake.set()
            with _writers_lock:
                if _writers.get(self.store) is self:
                    del _writers[self.store]


_writers: weakref.WeakKeyDictionary[EventStore, Writer] = weakref.WeakKeyDictionary()
_writers_lock = threading.Lock()


def writer_for(store: EventStore) -> Writer:
    """The store's writer, started on first use."""
    with _writers_lock:
        writer = _writers.get(store)
        if writer is None or writer._closed:
            writer = _writers[store] = Writer(store, redactor=settings.redactor)
            store.add_close_hook(writer.close)
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
