"""Messages on the stream encrypted at rest, when the store encrypts its payloads.

With a data key configured (``REPLAYABLE_DATA_KEY``, a keyring or a KMS plugin), the
sink keeps every payload encrypted, but records waiting in JetStream sat on the
server's disk in clear (redacted only) until a compactor took them. A writer now
seals each message body it publishes: ``c``, the length of a header (two bytes), the
header (msgpack ``[kek id, key id, wrapped key]``), the 12-byte nonce and the
AES-256-GCM ciphertext of the body (a frame, compressed or not, a record or a blob),
with the header as associated data.
The key is a random one per writing process, wrapped by the current key-encryption
key as the blob tier's data keys are, so a compactor or reader that holds that KEK
opens it and no one else does.

A message that cannot be opened here is one of two things, kept apart:
:class:`SealedMessageError` when no configured KEK opens its key (the compactor leaves
it in the stream and says so: a compactor started without the key must not drop what
the writers sent), :class:`~replayable.errors.ConfigurationError` when its key opens
but the message does not (altered: refused like any message that is no record).
"""

from __future__ import annotations

import secrets
import threading
from typing import TYPE_CHECKING, Final

import msgspec

from replayable.errors import ConfigurationError, StoreUnavailableError
from replayable.store.crypto import _aesgcm, _invalid_tag, data_keys_from_env

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from replayable.store.crypto import KeyWrapper

__all__ = ["SEALED", "FrameCipher", "SealedMessageError", "stream_cipher"]

#: The first byte of a sealed message body.
SEALED: Final = b"c"
_NONCE: Final = 12
_HEADER = msgspec.msgpack.Decoder(tuple[str, str, bytes])
_ENCODER = msgspec.msgpack.Encoder()


class SealedMessageError(StoreUnavailableError):
    """A sealed message whose key no configured key-encryption key opens: it stays in
    the stream until a process that holds the KEK reads it."""


def _context(key_id: str) -> bytes:
    return b"replayable-stream-key\x00" + key_id.encode()


class FrameCipher:
    """Seals message bodies under this process's stream key; opens any message whose key
    a configured KEK opens (keys unwrapped once each)."""

    def __init__(self, wrapper: KeyWrapper) -> None:
        self.wrapper = wrapper
        self._lock = threading.Lock()
        self._sealing: tuple[bytes, AESGCM] | None = None
        self._opened: dict[tuple[str, str, bytes], AESGCM] = {}

    @property
    def seals(self) -> bool:
        """Whether new messages are sealed (a current KEK is configured)."""
        return self.wrapper.current_kek() is not None

    def _key(self) -> tuple[bytes, AESGCM]:
        found = self._sealing
        if found is None:
            with self._lock:
                found = self._sealing
                if found is None:
                    kek_id = self.wrapper.current_kek()
                    if kek_id is None:
                        raise ConfigurationError("no current key-encryption key to seal with")
                    key = secrets.token_bytes(32)
                    key_id = "sk-" + secrets.token_hex(8)
                    wrapped = self.wrapper.wrap(kek_id, key, _context(key_id))
                    header = _ENCODER.encode((kek_id, key_id, wrapped))
                    header = len(header).to_bytes(2, "big") + header
                    found = self._sealing = (header, _aesgcm(key))
        return found

    def seal(self, body: bytes) -> bytes:
        header, aes = self._key()
        nonce = secrets.token_bytes(_NONCE)
        return b"".join((SEALED, header, nonce, aes.encrypt(nonce, body, header)))

    def open(self, data: bytes | memoryview) -> bytes:
        """The body a sealed message holds."""
        if len(data) < 3:
            raise ConfigurationError("a sealed message is cut short")
        end = 3 + int.from_bytes(data[1:3], "big")
        header = bytes(data[1:end])
        if len(data) < end + _NONCE:
            raise ConfigurationError("a sealed message is cut short")
        try:
            kek_id, key_id, wrapped = _HEADER.decode(header[2:])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConfigurationError(f"a sealed message's header does not decode: {exc}") from None
        index = (kek_id, key_id, wrapped)
        aes = self._opened.get(index)
        if aes is None:
            raw = self.wrapper.unwrap(kek_id, wrapped, _context(key_id))
            if raw is None:
                raise SealedMessageError(
                    f"a message sealed under stream key {key_id} (wrapped by key-encryption "
                    f"key {kek_id}) cannot be opened: that KEK is not configured here"
                )
            aes = self._opened[index] = _aesgcm(raw)
        nonce = bytes(data[end : end + _NONCE])
        try:
            return aes.decrypt(nonce, bytes(data[end + _NONCE :]), header)
        except _invalid_tag():
            raise ConfigurationError(
                f"a message sealed under stream key {key_id} does not decrypt (it was altered)"
            ) from None


def stream_cipher() -> FrameCipher | None:
    """The cipher this process's data-key settings give (``None``: none configured, and
    nothing on the stream is sealed or can be opened)."""
    wrapper = data_keys_from_env()
    return None if wrapper is None else FrameCipher(wrapper)
