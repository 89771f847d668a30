"""Pure records and encodings: no I/O, no clock, no randomness."""

from replayable.events.canonical import (
    canonical,
    event_hash,
    fingerprint,
    genesis_hash,
)
from replayable.events.codec import decode_value, encode_value, register_codec
from replayable.events.model import SCHEMA_VERSION, Event, Run, RunEnd, RunStart, RunStatus
from replayable.events.redaction import REDACTED, Redactor

__all__ = [
    "REDACTED",
    "SCHEMA_VERSION",
    "Event",
    "Redactor",
    "Run",
    "RunEnd",
    "RunStart",
    "RunStatus",
    "canonical",
    "decode_value",
    "encode_value",
    "event_hash",
    "fingerprint",
    "genesis_hash",
    "register_codec",
]
