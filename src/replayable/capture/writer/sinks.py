"""Sinks: where else a writer hands each batch it has committed.

A sink is a callable taking the committed :class:`SpoolBatch` (its run starts,
events and run ends, redacted, fingerprinted and chained, exactly as stored). It
is called on the writer's committing thread, so it must return at once: a sink
queues the batch and does its work on a thread of its own. A sink that raises is
logged and never affects the store or the agent.

Sinks are named by ``package.module:factory`` paths and imported on first use
(as the event builders are), so the writer process needs no code of the
agent's: ``$REPLAYABLE_WRITER_SINKS`` lists paths (comma-separated), and
``$REPLAYABLE_OTLP_ENDPOINT`` adds the OpenTelemetry exporter
(``replayable.integrations.otel.live:writer_sink``). A factory is called with the
store's URL once per writer and returns the sink, or ``None`` to decline.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from typing import Any, Final, Protocol

from replayable.capture.writer.spool import SpoolBatch

__all__ = ["ENV_OTLP", "ENV_SINKS", "Sink", "writer_sinks"]

log = logging.getLogger("replayable.writer")

ENV_SINKS: Final = "REPLAYABLE_WRITER_SINKS"
ENV_OTLP: Final = "REPLAYABLE_OTLP_ENDPOINT"
_OTLP_SINK: Final = "replayable.integrations.otel.live:writer_sink"


class Sink(Protocol):
    """Takes a committed batch and returns at once; a ``close()`` method, if it has one,
    is called when the writer closes."""

    def __call__(self, batch: SpoolBatch) -> None: ...


def _paths(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    paths = [p.strip() for p in environ.get(ENV_SINKS, "").split(",") if p.strip()]
    if environ.get(ENV_OTLP) and _OTLP_SINK not in paths:
        paths.append(_OTLP_SINK)
    return paths


def writer_sinks(store_url: str) -> list[Sink]:
    """The sinks the environment names, made for the store at ``store_url``."""
    made: list[Sink] = []
    for path in _paths(os.environ):
        module, _, attr = path.partition(":")
        try:
            factory: Callable[[str], Any] = getattr(importlib.import_module(module), attr)
            sink = factory(store_url)
        except Exception:
            log.exception("replayable: the writer sink %s could not be started", path)
            continue
        if sink is not None:
            made.append(sink)
    return made


def hand_off(sinks: list[Sink], batch: SpoolBatch) -> None:
    """Give ``batch`` to every sink; a failing sink is logged, never raised."""
    for sink in sinks:
        try:
            sink(batch)
        except Exception:
            log.exception("replayable: a writer sink failed on a batch")


def close_all(sinks: list[Sink]) -> None:
    for sink in sinks:
        close = getattr(sink, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception:
            log.exception("replayable: a writer sink failed to close")
