"""Ingest through a NATS JetStream stream: ``nats://host:port?stream=NAME&sink=URL``.

The writer publishes records to the stream (:class:`StreamStore`); the
compactor (``replayable compactor``, :mod:`replayable.archive.stream`) moves
them into the sink; readers read the sink and whatever is still in the stream.
"""

from __future__ import annotations

from replayable.store.stream._client import StreamClient, StreamConfig, ensure_stream
from replayable.store.stream._store import Pending, StreamStore, parse_stream_url
from replayable.store.stream._wire import decode, run_filter

__all__ = [
    "Pending",
    "StreamClient",
    "StreamConfig",
    "StreamStore",
    "decode",
    "ensure_stream",
    "parse_stream_url",
    "run_filter",
]
