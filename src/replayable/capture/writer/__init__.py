"""The background writer: hand-offs go in, linked records come out in a store.

**In**: what the agent's boundaries hand off through a writer's ``event``,
``start``, ``end`` and ``blob`` (encoded requests and responses, not yet
redacted, fingerprinted or chained). :func:`writer_for` gives each store its
writer: a :class:`ProcessWriter` forwarding to the writer process by default,
an in-process :class:`Writer` otherwise.

**Out**: :class:`~replayable.events.model.Event`, ``RunStart`` and ``RunEnd``
records, redacted, fingerprinted and hash-chained, appended to the store in
batches (one transaction each), or to the local spool while the store is
down. A record the store refuses for good goes to the rejects file beside the
spool, with a warning.

Files, in the order a record passes them: ``process`` and ``channel`` (the
agent's side of the pipe), ``handoff`` (the wire format), ``_child`` (the
writer process), ``core`` (queueing and the writer thread), ``linker``
(redaction, fingerprints, chains; ``deferred`` builds events from raw parts),
``batches`` (waiters, bounded store calls), ``outage``, ``backoff`` and
``spool`` (the store is down), ``refusals`` (the store says no), ``registry``
(one writer per store) and ``options`` (process-wide settings).

This package imports ``events``, ``store`` and ``errors``, never the agent's
side of ``capture``: the writer process runs it without any boundary code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayable._lazy import lazy

if TYPE_CHECKING:
    from replayable.capture.writer.core import Writer
    from replayable.capture.writer.deferred import register_builder
    from replayable.capture.writer.linker import PendingEvent
    from replayable.capture.writer.options import OnStoreFailure
    from replayable.capture.writer.process import ProcessWriter
    from replayable.capture.writer.registry import close_writer, writer_for

_LAZY = {
    "OnStoreFailure": "replayable.capture.writer.options",
    "PendingEvent": "replayable.capture.writer.linker",
    "ProcessWriter": "replayable.capture.writer.process",
    "Writer": "replayable.capture.writer.core",
    "close_writer": "replayable.capture.writer.registry",
    "register_builder": "replayable.capture.writer.deferred",
    "writer_for": "replayable.capture.writer.registry",
}

__all__ = [
    "OnStoreFailure",
    "PendingEvent",
    "ProcessWriter",
    "Writer",
    "close_writer",
    "register_builder",
    "writer_for",
]

__getattr__, __dir__ = lazy(__name__, _LAZY)
