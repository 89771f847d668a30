"""What one record looks like on the stream: its subject, its message id, its bytes.

Every record is one message. The subject is
``<prefix>.<tenant>.<workflow>.<run id>`` (``_`` for no tenant; a workflow's
characters that NATS reserves become ``_``), so a subscriber can take one
tenant, one workflow or one run, and a reader finds a run's records still in
the stream by ``<prefix>.*.*.<run id>``. Blobs go to ``<prefix>._blob.<digest>``.

The message id (``Nats-Msg-Id``) is the record's key, so the server drops a
publish it has taken already (within the stream's duplicate window): a start
is ``<run id>:s``, an event ``<run id>:<seq>``, an end ``<run id>:x``, a blob
``b:<digest>``. The body is one letter of kind then the record in msgpack,
exactly as the writer built it (hash chain included).
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from replayable.errors import ConfigurationError
from replayable.events.model import Event, RunEnd, RunStart

__all__ = [
    "BLOB_TOKEN",
    "decode",
    "decode_event",
    "encode",
    "message_id",
    "run_filter",
    "run_subject",
    "token",
]

BLOB_TOKEN: Final = "_blob"
_encode = msgspec.msgpack.Encoder().encode
_DECODERS: Final[dict[int, msgspec.msgpack.Decoder[Any]]] = {
    ord("s"): msgspec.msgpack.Decoder(RunStart),
    ord("e"): msgspec.msgpack.Decoder(Event),
    ord("x"): msgspec.msgpack.Decoder(RunEnd),
    ord("b"): msgspec.msgpack.Decoder(tuple[str, bytes]),
}
#: An event's body after its kind letter, into the Event type only.
decode_event: Final = _DECODERS[ord("e")].decode
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")
#: Longest tenant or workflow token kept whole in a subject.
_TOKEN_MAX: Final = 64


def token(text: str | None) -> str:
    """``text`` as one subject token: ``_`` for none, reserved characters as ``_``."""
    if not text:
        return "_"
    return _UNSAFE.sub("_", text)[:_TOKEN_MAX]


def run_subject(prefix: str, tenant: str | None, workflow: str | None, run_id: str) -> str:
    return f"{prefix}.{token(tenant)}.{token(workflow)}.{token(run_id)}"


def run_filter(prefix: str, run_id: str) -> str:
    """The subjects of one run's records, whatever its tenant and workflow."""
    return f"{prefix}.*.*.{token(run_id)}"


def message_id(kind: str, record: Any) -> str:
    """The record's key, of subject-token characters only (it goes in a header line)."""
    if kind == "e":
        return f"{token(record.run_id)}:{record.seq}"
    if kind == "s":
        return f"{token(record.run_id)}:s"
    if kind == "x":
        return f"{token(record.run_id)}:x"
    return f"b:{token(record[0])}"


def encode(kind: str, record: Any) -> bytes:
    return kind.encode() + _encode(record)


def decode(data: bytes) -> tuple[str, Any]:
    """``(kind, record)`` of a message body; a body that is not one raises
    :class:`ConfigurationError` naming what is wrong (a stored record is data, never
    trusted: it is decoded into the record types only)."""
    if not data:
        raise ConfigurationError("an empty message is not a replayable record")
    decoder = _DECODERS.get(data[0])
    if decoder is None:
        raise ConfigurationError(f"a message of unknown kind {data[:1]!r} is not a record")
    try:
        return chr(data[0]), decoder.decode(data[1:])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigurationError(f"a {chr(data[0])!r} message does not decode: {exc}") from exc
