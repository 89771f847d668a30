"""Sending spans over OTLP/HTTP: once for chosen runs, or continuously while runs are recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from replayable.errors import ReplayableError
from replayable.events.model import Event, Run
from replayable.integrations.otel.spans import event_spans, parent_context, run_span, run_spans
from replayable.store.base import EventStore, RunFilter

__all__ = ["ExportSummary", "Follower", "OtlpExportError", "export_runs", "run_tree"]

#: Spans per OTLP request.
BATCH: Final = 4096
#: How late a run's start record may reach the store after a later run's (seconds).
SETTLE_S: Final = 60.0


class OtlpExportError(ReplayableError):
    """The OTLP receiver did not take the spans (unreachable, or it refused them)."""


@dataclass(frozen=True)
class ExportSummary:
    runs: int
    spans: int


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1/traces") else f"{url}/v1/traces"


class _Resource(Resource):
    """A resource whose hash is computed once: the OTLP encoder groups spans by resource
    and hashes it per span (a JSON dump of its attributes each time)."""

    _hash: int | None = None

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = super().__hash__()
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or super().__eq__(other)


def _resource(service: str, attributes: Mapping[str, Any] | None) -> Resource:
    made = Resource.create({"service.name": service, **(attributes or {})})
    return _Resource(made.attributes, made.schema_url)


def run_tree(store: EventStore, run: Run) -> tuple[list[Run], dict[str, list[Event]]]:
    """``run`` and every run below it, with their events."""
    runs: list[Run] = []
    todo = [run]
    while todo:
        current = todo.pop(0)
        runs.append(current)
        todo.extend(store.children(current.run_id))
    return runs, {r.run_id: store.events(r.run_id) for r in runs}


class _Sender:
    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.exporter = OTLPSpanExporter(endpoint=_endpoint(url), timeout=timeout)

    def send(self, spans: Sequence[ReadableSpan]) -> None:
        for i in range(0, len(spans), BATCH):
            result = self.exporter.export(spans[i : i + BATCH])
            if result is not SpanExportResult.SUCCESS:
                raise OtlpExportError(
                    f"the OTLP receiver at {_endpoint(self.url)} did not take "
                    f"{len(spans[i : i + BATCH])} spans (unreachable, or it refused them)"
                )

    def close(self) -> None:
        self.exporter.shutdown()  # type: ignore[no-untyped-call]


def export_runs(
    store: EventStore,
    runs: Iterable[Run],
    url: str,
    *,
    service: str = "replayable",
    resource_attributes: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
) -> ExportSummary:
    """Send each run (with its child runs) as a trace to the OTLP/HTTP receiver at ``url``.

    A run that is a child of another run in ``runs`` goes with its parent's trace.
    """
    chosen = list(runs)
    ids = {r.run_id for r in chosen}
    tops = [r for r in chosen if r.parent_run_id is None or r.parent_run_id not in ids]
    resource = _resource(service, resource_attributes)
    sender = _Sender(url, timeout)
    count = spans = 0
    try:
        for run in tops:
            tree, events = run_tree(store, run)
            made = run_spans(tree, events, resource)
            sender.send(made)
            count += len(tree)
            spans += len(made)
    finally:
        sender.close()
    return ExportSummary(count, spans)


class Follower:
    """Ships runs to an OTLP receiver as they are recorded, from a background thread.

    Every ``interval`` seconds it reads the runs started since it began (and those
    still open) from the store and sends each event's span once the event is stored,
    and the run's span once the run has ended. It reads the store only: the agent and
    the writer never wait for it, and a receiver that is down delays spans, never a run.
    ``stop()`` sends what is left.
    """

    def __init__(
        self,
        store: EventStore,
        url: str,
        *,
        interval: float = 1.0,
        since: float | None = None,
        service: str = "replayable",
        resource_attributes: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.interval = interval
        self.since = time.time() if since is None else since
        self.resource = _resource(service, resource_attributes)
        self._sender = _Sender(url, timeout=5.0)
        self._sent_events: dict[str, set[int]] = {}  # run id -> seqs sent
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="replayable-otel", daemon=True)
        self.spans_sent = 0
        self.last_error: OtlpExportError | None = None

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()
        self._sender.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except OtlpExportError as exc:
                self.last_error = exc  # kept; the next poll sends the same spans again

    def poll(self) -> int:
        """Send what is new since the last poll; returns the number of spans sent."""
        sent = 0
        runs = self.store.list_runs(RunFilter(since=self.since, limit=None))
        for run in sorted(runs, key=lambda r: r.started_at):
            if run.run_id in self._done:
                continue
            events = self.store.events(run.run_id)
            # Parallel calls commit out of seq order: what was sent is kept by seq.
            have = self._sent_events.setdefault(run.run_id, set())
            batch = [
                s
                for s in event_spans(run, events, self.resource)
                if (s.attributes or {}).get("replayable.seq") not in have
            ]
            if run.end is not None:
                parent = parent_context(run, lambda r, q: True)
                batch.insert(0, run_span(run, events, parent, self.resource))
            if batch:
                self._sender.send(batch)
                sent += len(batch)
            have.update(e.seq for e in events)
            if run.end is not None:
                self._done.add(run.run_id)
                del self._sent_events[run.run_id]
        self._advance(runs)
        self.spans_sent += sent
        return sent

    def _advance(self, runs: list[Run]) -> None:
        # Read from the oldest run still open (or the newest seen), less a margin for
        # start records that reach the store after later ones: the window stays short
        # however long the follower runs, and finished runs leave the done set with it.
        open_starts = [r.started_at for r in runs if r.run_id not in self._done]
        latest = max((r.started_at for r in runs), default=self.since)
        since = max(self.since, min(open_starts, default=latest) - SETTLE_S)
        if since > self.since:
            self.since = since
            kept = {r.run_id for r in runs if r.started_at >= since}
            self._done &= kept
