"""What records look like on the stream: their subject, message id and bytes.

The writer publishes a batch's records of one run as one message, a *frame*
(see :func:`frames`); a stream may also hold messages of one record each, the
form before frames, which every reader still takes. The subject is
``<prefix>.<tenant>.<workflow>.<run id>`` (``_`` for no tenant; a workflow's
characters that NATS reserves become ``_``), so a subscriber can take one
tenant, one workflow or one run, and a reader finds a run's records still in
the stream by ``<prefix>.*.*.<run id>``. Blobs go to ``<prefix>._blob.<digest>``.

The message id (``Nats-Msg-Id``) is a key of what the message holds, so the
server drops a publish it has taken already (within the stream's duplicate
window). A frame's is ``<run id>:<first>-<last>:<digest>``: its first and last
record's keys (``s`` for the start, the seq of an event, ``x`` for the end) and
64 bits of the SHA-256 of its body. The same records published again make the
same bytes and so the same id; records batched otherwise make another frame with
another id, which the server keeps, and the compactor writes each record once
all the same (the sink holds a record once: UNIQUE (run_id, seq)). One id never
names two different frames, so a deduplicated publish never drops a record.
A single record's id is its key: ``<run id>:s``, ``<run id>:<seq>``,
``<run id>:x``; a blob's ``b:<digest>``.

The body is one letter of kind, then msgpack: for a frame (``f``) the array
``[starts, events, ends]`` of the records, for a single record (``s``, ``e``,
``x``, ``b``) the record, exactly as the writer built it (hash chain included).
A frame over :data:`COMPRESS_OVER` bytes goes as ``z`` and the zstd of its ``f``
body (its id's digest is the ``f`` body's). Where the store encrypts its payloads,
every body is sealed as it is published (``c``, see :mod:`._cipher`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec
import zstandard

from replayable.errors import ConfigurationError
from replayable.events.model import Event, RunEnd, RunStart
from replayable.store.stream._cipher import SEALED, FrameCipher, SealedMessageError

__all__ = [
    "BLOB_TOKEN",
    "Frame",
    "decode",
    "decode_event",
    "decode_frame",
    "encode",
    "frames",
    "message_id",
    "records",
    "run_filter",
    "run_subject",
    "token",
    "unpacked",
    "unpacked_size",
]

BLOB_TOKEN: Final = "_blob"
#: Frames longer than this go compressed (zstd, level 1): the server's CPU and the
#: stream's disk go by the byte.
COMPRESS_OVER: Final = 4096
#: The most bytes a compressed frame may unpack into (NATS's largest message size).
UNPACKED_MAX: Final = 64 << 20


class Frame(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The records of one run in one message, each list in the writer's order."""

    starts: list[RunStart]
    events: list[Event]
    ends: list[RunEnd]


_encode = msgspec.msgpack.Encoder().encode
_DECODERS: Final[dict[int, msgspec.msgpack.Decoder[Any]]] = {
    ord("f"): msgspec.msgpack.Decoder(Frame),
    ord("s"): msgspec.msgpack.Decoder(RunStart),
    ord("e"): msgspec.msgpack.Decoder(Event),
    ord("x"): msgspec.msgpack.Decoder(RunEnd),
    ord("b"): msgspec.msgpack.Decoder(tuple[str, bytes]),
}
#: An event's body after its kind letter, into the Event type only.
decode_event: Final = _DECODERS[ord("e")].decode
#: A frame's body after its kind letter.
decode_frame: Final = _DECODERS[ord("f")].decode
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


def unpacked(data: bytes, cipher: FrameCipher | None = None) -> bytes:
    """A compressed frame's body (``z`` + zstd of an ``f`` body) as the ``f`` body, a
    sealed message's (``c``, see :mod:`._cipher`) as what it holds; any other body as it
    is. A ``z`` body that does not decompress into a frame within :data:`UNPACKED_MAX`
    bytes raises :class:`ConfigurationError`; a sealed one that ``cipher`` cannot open,
    :class:`~._cipher.SealedMessageError` (no key here) or ``ConfigurationError``."""
    if data[:1] == SEALED:
        if cipher is None:
            raise SealedMessageError(
                "a sealed message on the stream, and no data key configured here to open it "
                "(REPLAYABLE_DATA_KEY, REPLAYABLE_DATA_KEYRING or REPLAYABLE_DATA_KEY_PROVIDER)"
            )
        data = cipher.open(data)
        if data[:1] == SEALED:
            raise ConfigurationError("a sealed message holds another sealed message")
    if data[:1] != b"z":
        return data
    try:
        if zstandard.frame_content_size(data[1:]) > UNPACKED_MAX:
            raise ConfigurationError(f"a 'z' message unpacks into over {UNPACKED_MAX:,} bytes")
        inner = zstandard.ZstdDecompressor().decompress(data[1:], max_output_size=UNPACKED_MAX)
    except zstandard.ZstdError as exc:
        raise ConfigurationError(f"a 'z' message does not decompress: {exc}") from exc
    if len(inner) > UNPACKED_MAX or inner[:1] != b"f":
        raise ConfigurationError(
            f"a 'z' message does not hold a frame of at most {UNPACKED_MAX:,} bytes"
        )
    return inner


def unpacked_size(data: bytes) -> int:
    """How long a message body is once unpacked, as far as it says (its own length for
    one that is not compressed or does not say)."""
    if data[:1] != b"z":
        return len(data)
    try:
        size = zstandard.frame_content_size(data[1:])
    except zstandard.ZstdError:
        return len(data)
    return size if size >= 0 else len(data)


def decode(data: bytes, cipher: FrameCipher | None = None) -> tuple[str, Any]:
    """``(kind, record)`` of a message body (a compressed or sealed frame as ``f``); a
    body that is not one raises :class:`ConfigurationError` naming what is wrong (a
    stored record is data, never trusted: it is decoded into the record types only)."""
    if not data:
        raise ConfigurationError("an empty message is not a replayable record")
    data = unpacked(data, cipher)
    decoder = _DECODERS.get(data[0])
    if decoder is None:
        raise ConfigurationError(f"a message of unknown kind {data[:1]!r} is not a record")
    try:
        return chr(data[0]), decoder.decode(data[1:])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigurationError(f"a {chr(data[0])!r} message does not decode: {exc}") from exc


def _array(n: int) -> bytes:
    """A msgpack array header for ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def frames(
    rid: str,
    starts: Sequence[RunStart],
    events: Sequence[Event],
    ends: Sequence[RunEnd],
    limit: int,
) -> Iterator[tuple[str, bytes]]:
    """One run's records as frames of at most ``limit`` bytes each (a record larger
    than that alone in its frame): ``(message id, body)`` each, in order.

    ``rid`` is the run id as a subject token. Records are cut in order, starts, then
    events, then ends, so a frame's first and last key bound what it holds.
    """
    items: list[tuple[int, str, bytes]] = []
    items += [(0, "s", _encode(s)) for s in starts]
    items += [(1, str(e.seq), _encode(e)) for e in events]
    items += [(2, "x", _encode(x)) for x in ends]
    room = limit - 8  # the kind letter and the array headers
    i = 0
    while i < len(items):
        size = len(items[i][2])
        j = i + 1
        while j < len(items) and size + len(items[j][2]) <= room:
            size += len(items[j][2])
            j += 1
        part = items[i:j]
        body = [b"f\x93"]
        for kind in (0, 1, 2):
            chunk = [data for k, _, data in part if k == kind]
            body.append(_array(len(chunk)))
            body += chunk
        data = b"".join(body)
        digest = hashlib.sha256(data).hexdigest()[:16]
        if len(data) > COMPRESS_OVER:
            packed = zstandard.ZstdCompressor(level=1).compress(data)
            if len(packed) + 1 < len(data):
                data = b"z" + packed
        yield f"{rid}:{part[0][1]}-{part[-1][1]}:{digest}", data
        i = j


def records(data: bytes, cipher: FrameCipher | None = None) -> list[tuple[str, Any]]:
    """``(kind, record)`` of each record a message body holds, a frame's or a single
    record's (as :func:`decode`, which raises for a body that is neither)."""
    kind, record = decode(data, cipher)
    if kind != "f":
        return [(kind, record)]
    return [
        *(("s", r) for r in record.starts),
        *(("e", r) for r in record.events),
        *(("x", r) for r in record.ends),
    ]
