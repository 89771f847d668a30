"""A writer's batches, their waiters, and the thread that runs store calls with a bound.

A :class:`Batch` holds built records in write order with the waiters to settle
once they are written. A :class:`Committer` runs one store call at a time on
its own thread, so the writer can stop waiting for a hung call after a bound.
:func:`is_permanent` tells a refusal of the data (retrying cannot help) from
an unavailable store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from replayable.capture.writer.spool import SpoolBatch
from replayable.errors import (
    ConfigurationError,
    RunNotFoundError,
    SerializationError,
    StoreAuthenticationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)

__all__ = ["Batch", "Committer", "Flag", "Job", "Outcome", "Stalled", "Waiter", "is_permanent"]

T = TypeVar("T")

_PERMANENT = (StoreRefusedError, RunNotFoundError, ConfigurationError, SerializationError)


def is_permanent(exc: BaseException) -> bool:
    """Whether a failed write would fail again however often it is retried.

    Decided from replayable's own error names, which each store maps its
    driver's exceptions to: a :class:`StoreRefusedError` (a duplicate, a newer
    schema, a value the database cannot hold) is permanent; a refused login
    (:class:`StoreAuthenticationError`) is not, since it concerns no record;
    a :class:`StoreUnavailableError`, any other :class:`StoreError` and an
    ``OSError`` are transient. An exception outside the tree is a bug in the
    store and would recur.
    """
    if isinstance(exc, StoreAuthenticationError):
        # The login, not the data: an administrator can fix it, so the records wait.
        return False
    if isinstance(exc, _PERMANENT):
        return True
    return not isinstance(exc, StoreError | OSError)


class Flag:
    """A one-way ``threading.Event``: set once, never cleared, waited for by one thread
    or several. A bare lock, held until set: every durable boundary makes one and
    waits on it, and an ``Event`` (a condition, a lock, a list of waiters) cost it
    several microseconds more."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._set = False
        self._lock = _allocate_lock()
        self._lock.acquire()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _SETTING:  # two threads setting at once must release the lock once
            if self._set:
                return
            self._set = True
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting at most ``timeout`` seconds (``None``: forever)."""
        if self._set:
            return True
        lock = self._lock
        if lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            lock.release()  # the next waiter's turn: set stays set
        return self._set


_allocate_lock = threading.Lock
_SETTING = threading.Lock()


class Outcome(Generic[T]):
    """Something a thread waits for: ``outcome`` is ``None`` when it went well, else
    what went wrong. The first outcome wins."""

    __slots__ = ("done", "outcome")

    def __init__(self) -> None:
        self.done = Flag()
        self.outcome: T | None = None

    def resolve(self, outcome: T | None) -> None:
        """Settle the waiter; the first outcome wins."""
        if not self.done._set:
            self.outcome = outcome
            self.done.set()


class Waiter(Outcome[BaseException]):
    """A hand-off waiting to be written (or spooled): its error, if it was not."""

    __slots__ = ()


class Batch:
    """Built records in write order, with the waiters to settle once they are written."""

    __slots__ = ("data", "durable", "marks", "owned", "prior")

    def __init__(
        self,
        data: SpoolBatch,
        owned: dict[int, Waiter] | None = None,
        marks: list[Waiter] | None = None,
        durable: bool = False,
    ) -> None:
        self.data = data
        #: The waiter of each record a durable caller waits on, by the record's id.
        self.owned = owned or {}
        self.marks = marks or []
        self.durable = durable
        #: The chain heads its runs had before it was linked (kept by fail-closed writers).
        self.prior: dict[str, Any] | None = None

    @classmethod
    def from_spool(cls, data: SpoolBatch) -> Batch:
        return cls(data, durable=True)

    @classmethod
    def single(cls, kind: str, record: Any, durable: bool) -> Batch:
        data = SpoolBatch()
        data.add(kind, record)
        return cls(data, durable=durable)

    def units(self) -> Iterator[tuple[str, Any, Waiter | None]]:
        """(kind, record, waiter) in write order."""
        owned = self.owned
        data = self.data
        for kind, records in (
            ("b", data.blobs),
            ("s", data.starts),
            ("e", data.events),
            ("x", data.ends),
        ):
            for record in records:
                yield kind, record, owned.get(id(record))

    def waiters(self) -> Iterator[Waiter]:
        yield from self.owned.values()
        yield from self.marks

    def resolve(self, error: BaseException | None) -> None:
        for waiter in self.waiters():
            waiter.resolve(error)


class Stalled(StoreUnavailableError):
    """A store call did not return within the writer's bound."""


class Job:
    """A store call handed to the :class:`Committer`; :meth:`result` waits for it."""

    __slots__ = ("box", "done", "started", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.done = Flag()
        self.box: list[Any] = [None, None]
        self.started = time.monotonic()

    def result(self, timeout: float) -> tuple[Any, Exception | None]:
        """``(result, None)``, ``(None, error)``, or ``(None, Stalled)`` once ``timeout``
        seconds have passed since the call was handed over."""
        left = self.started + timeout - time.monotonic()
        if not self.done.wait(max(left, 0.0)):
            return None, Stalled(f"{self.what}: no answer within {timeout:.1f}s")
        return self.box[0], self.box[1]


class Committer:
    """Runs store calls one at a time on its own thread, so a hung call never holds
    the writer: the writer stops waiting after a bound and the call finishes (or
    fails) on its own. The writer may build its next batch meanwhile (``submit``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: tuple[Callable[[], Any], Job] | None = None
        self._stop = False
        self.busy = False
        self.started = 0.0
        self.interrupted = -1.0
        self._thread = threading.Thread(target=self._run, name="replayable-committer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], what: str) -> tuple[Job | None, Exception | None]:
        """Hand ``fn`` over: ``(job, None)``, or ``(None, Stalled)`` while a call that
        stalled still runs."""
        if self.busy:
            return None, Stalled(f"{what}: the store is still busy with a call that stalled")
        job = Job(what)
        self.started = job.started
        with self._cond:
            self.busy = True
            self._job = (fn, job)
            self._cond.notify()
        return job, None

    def call(
        self, fn: Callable[[], Any], timeout: float, what: str
    ) -> tuple[Any, Exception | None]:
        """``(result, None)``, ``(None, error)``, or ``(None, Stalled)`` after ``timeout``."""
        job, error = self.submit(fn, what)
        if job is None:
            return None, error
        return job.result(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stop:
                    self._cond.wait()
                if self._job is None:
                    return
                fn, job = self._job
                self._job = None
            box = job.box
            try:
                box[0] = fn()
            except Exception as exc:
                box[1] = exc
            self.busy = False
            job.done.set()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
