"""A key provider plugin as a KMS integration would ship one (used by the key tests)."""

from __future__ import annotations

from replayable.events.chain import ChainKey


class _Kms:
    """Hands out one key, as if unwrapped by a KMS."""

    def __init__(self) -> None:
        self._key = ChainKey("kms-1", b"\x07" * 32)

    def current(self) -> ChainKey | None:
        return self._key

    def get(self, key_id: str) -> ChainKey | None:
        return self._key if key_id == self._key.key_id else None


def provider() -> _Kms:
    return _Kms()


def not_a_provider() -> object:
    return object()
