"""OpenTelemetry export: recorded runs as traces any OTLP receiver shows.

``export_runs(store, runs, "http://127.0.0.1:4318")`` (``replayable export --otlp
URL RUN|--since 1h``) sends each run and its child runs as one trace over
OTLP/HTTP, with the ``gen_ai`` semantic conventions (see :mod:`.spans`), so a
run opens in Phoenix, Langfuse, Logfire or a collector. :class:`Follower`
ships runs while they are recorded, from a thread that reads the store: the
agent's hot path and the writer do not wait for the receiver.

Needs the ``otel`` extra: ``pip install 'replayable[otel]'``.
"""

from replayable.integrations.otel.export import (
    ExportSummary,
    Follower,
    OtlpExportError,
    export_runs,
    run_tree,
)
from replayable.integrations.otel.spans import run_spans, span_id, trace_id

__all__ = [
    "ExportSummary",
    "Follower",
    "OtlpExportError",
    "export_runs",
    "run_spans",
    "run_tree",
    "span_id",
    "trace_id",
]
