"""The hand-off's wire format between the agent's process and the writer process.

A record crosses the pipe as a msgpack array ``(kind, item)``: ``e`` an event
(a :data:`~replayable.capture.writer.linker.PendingEvent`), ``s`` a run start,
``x`` a run end, ``b`` a blob, ``S`` a run start the agent's process has
stored already (linked: the writer builds on it and does not write it); the
control records are described in :mod:`replayable.capture.writer._child`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from replayable.events.codec import encode_request

if TYPE_CHECKING:
    from replayable.capture.writer.core import Writer
    from replayable.capture.writer.linker import PendingEvent

__all__ = ["ENCODER", "apply", "decode", "encode"]

ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
#: Decode one record: ``(kind, item)``.
decode = _DECODER.decode


def encode(kind: str, item: Any) -> bytes:
    """One record as it crosses the pipe."""
    try:
        return ENCODER.encode((kind, item))
    except TypeError:
        if kind != "e":
            raise
        return ENCODER.encode((kind, plain(item)))


def plain(pending: PendingEvent) -> tuple[Any, ...]:
    """The hand-off with its metadata reduced to JSON values (an SDK may pass a class
    as ``response_format``), so that it can cross the pipe."""
    items = list(pending)
    meta = items[14]
    if meta:
        import orjson

        items[14] = orjson.loads(encode_request(meta))
    return tuple(items)


def apply(writer: Writer, kind: str, item: Any, durable: bool = False) -> None:
    """Hand one decoded record to an in-process writer. One that is not the record its
    kind says (a run start whose metadata no store can hold, say) is refused like a
    record the store refuses: kept in the rejects file, with a warning; it never stops
    the records after it."""
    from replayable.events.model import RunStart

    if kind == "s" or kind == "S":
        try:
            start = msgspec.convert(item, RunStart)
        except msgspec.ValidationError as exc:
            writer.refuse(kind.lower(), item, exc)
            return
        if kind == "s":
            writer.start(start, durable)
        else:
            writer.known_start(start)
    elif kind == "e":
        writer.event(tuple(item), durable)
    elif kind == "x":
        writer.end(tuple(item), durable)
    elif kind == "b":
        writer.blob(item[0], item[1])
