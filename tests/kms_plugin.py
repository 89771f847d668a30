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


class _KmsWrapper:
    """Wraps data keys inside the "KMS": the key-encryption key never leaves it."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aes = AESGCM(b"\x09" * 32)
        self.calls = 0

    def current_kek(self) -> str | None:
        return "kms-kek-1"

    def wrap(self, kek_id: str, data_key: bytes, context: bytes) -> bytes:
        self.calls += 1
        return b"\x00" * 12 + self._aes.encrypt(b"\x00" * 12, data_key, context)

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes | None:
        self.calls += 1
        if kek_id != "kms-kek-1":
            return None
        return self._aes.decrypt(wrapped[:12], wrapped[12:], context)


def wrapper() -> _KmsWrapper:
    return _KmsWrapper()
