"""The live exporter: the writer hands each committed batch over, spans leave in the background.

Set ``REPLAYABLE_OTLP_ENDPOINT=http://127.0.0.1:4318`` where the agent runs and the
writer (the writer process, or the in-process writer) starts a :class:`LiveSink`
for each store: every batch it commits is queued here, and a thread of this sink
builds the spans (an event's span as soon as it is committed, a run's span once
its end record is) and sends them over OTLP/HTTP at most every
``REPLAYABLE_OTLP_INTERVAL`` seconds (default 1). The agent never waits for it,
and the writer only appends to a queue; a receiver that is down costs spans
(logged, with how many), never a run: the store has everything.
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` set the resource.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from typing import Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from replayable.capture.writer.spool import SpoolBatch
from replayable.events.model import Run, RunStart
from replayable.integrations.otel.export import OtlpExportError, _resource, _Sender
from replayable.integrations.otel.spans import _event_span, run_span, span_id, trace_id
from replayable.store.base import EventStore

__all__ = ["LiveSink", "writer_sink"]

log = logging.getLogger("replayable.otel")
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
#: Spans held before a send whatever the interval.
_MAX_PENDING: Final = 4096
#: Run starts remembered for runs still open (their events need the root's trace id).
_MAX_OPEN: Final = 100_000


def writer_sink(store_url: str) -> LiveSink | None:
    """The writer's sink factory (see :mod:`replayable.capture.writer.sinks`)."""
    url = os.environ.get("REPLAYABLE_OTLP_ENDPOINT")
    if not url:
        return None
    interval = float(os.environ.get("REPLAYABLE_OTLP_INTERVAL", "1") or 1)
    return LiveSink(url, interval=interval, store_url=store_url)


class LiveSink:
    """Turns committed batches into spans and ships them from its own thread."""

    def __init__(
        self,
        url: str,
        *,
        interval: float = 1.0,
        service: str | None = None,
        store_url: str | None = None,
    ) -> None:
        self.url = url
        #: Where to read a run's start record that another writer committed (the agent's
        #: process stores a run's start while the writer process is starting).
        self.store_url = store_url
        self._store: EventStore | None = None
        self.interval = interval
        self.resource = _resource(
            service or os.environ.get("OTEL_SERVICE_NAME", "replayable"), None
        )
        self._sender = _Sender(url, timeout=5.0)
        self._queue: queue.SimpleQueue[SpoolBatch | None] = queue.SimpleQueue()
        self._starts: dict[str, RunStart] = {}
        self.spans_sent = 0
        self.spans_dropped = 0
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="replayable-otlp", daemon=True)
        self._thread.start()
        # The writers only flush at exit; this sink's thread is a daemon, so what it
        # holds is sent here (before the interpreter stops it).
        atexit.register(self.close)

    def __call__(self, batch: SpoolBatch) -> None:
        if self._closed:
            self._send(self._spans(batch))  # a batch committed after the close: send it now
            return
        self._queue.put(batch)

    def close(self) -> None:
        """Send what is queued, then stop (once; later batches are sent as they come)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        if self._store is not None:
            self._store.close()

    def _loop(self) -> None:
        pending: list[ReadableSpan] = []
        due = time.monotonic() + self.interval
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                pass  # the interval is up
            else:
                if item is None:
                    break
                pending += self._spans(item)
            if pending and (len(pending) >= _MAX_PENDING or time.monotonic() >= due):
                self._send(pending)
                pending = []
            if time.monotonic() >= due:
                due = time.monotonic() + self.interval
        if pending:
            self._send(pending)

    def _send(self, spans: list[ReadableSpan]) -> None:
        try:
            self._sender.send(spans)
            self.spans_sent += len(spans)
        except OtlpExportError as exc:
            self.spans_dropped += len(spans)
            log.warning(
                "replayable: %s; %d spans dropped (the store has the runs)", exc, len(spans)
            )

    def _start(self, run_id: str) -> RunStart | None:
        found = self._starts.get(run_id)
        if found is not None or self.store_url is None:
            return found
        try:
            if self._store is None:
                from replayable.store import open_store

                self._store = open_store(self.store_url, create=False)
            found = self._store.get_run(run_id).start
        except Exception:
            return None
        if len(self._starts) < _MAX_OPEN:
            self._starts[run_id] = found
        return found

    def _spans(self, batch: SpoolBatch) -> list[ReadableSpan]:
        out: list[ReadableSpan] = []
        for s in batch.starts:
            if len(self._starts) < _MAX_OPEN:
                self._starts[s.run_id] = s
        for e in batch.events:
            start = self._start(e.run_id)
            trace = trace_id(start.root_run_id if start is not None else e.run_id)
            pid = span_id(e.run_id, e.parent) if e.parent is not None else span_id(e.run_id)
            out.append(
                _event_span(e, trace, SpanContext(trace, pid, False, _SAMPLED), self.resource)
            )
        for end in batch.ends:
            start = self._start(end.run_id)
            self._starts.pop(end.run_id, None)
            if start is None:
                continue  # a start no store holds: its events went out, its span cannot
            run = Run(start=start, end=end)
            parent: SpanContext | None = None
            if start.parent_run_id is not None:
                trace = trace_id(start.root_run_id)
                pid = (
                    span_id(start.parent_run_id, start.parent_seq)
                    if start.parent_seq is not None
                    else span_id(start.parent_run_id)
                )
                parent = SpanContext(trace, pid, False, _SAMPLED)
            out.append(run_span(run, (), parent, self.resource))
        return out
