"""UUIDv7 run ids, built from a time and random bytes the caller supplies."""

from __future__ import annotations

import uuid

__all__ = ["uuid7"]


def uuid7(unix_ms: int, rand: bytes) -> str:
    """A UUIDv7 string: 48 bits of Unix milliseconds, then 74 random bits.

    ``rand`` must hold at least 10 bytes. Ids made later sort later, so a
    prefix of a recent run id is short and listing by id is listing by time.
    """
    if len(rand) < 10:
        raise ValueError("uuid7 needs 10 random bytes")
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= (int.from_bytes(rand[0:2], "big") & 0x0FFF) << 64
    value |= 0b10 << 62
    value |= int.from_bytes(rand[2:10], "big") & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))
