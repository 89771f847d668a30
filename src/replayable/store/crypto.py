"""Payload encryption: AES-256-GCM under data keys, wrapped by key-encryption keys.

Each key space (a tenant, or one data subject of a tenant: see
:func:`replayable.store.payloads.space`) has its own random 256-bit data
key. Blobs are encrypted with it (AES-256-GCM, a random 96-bit nonce, the
key space, the blob's digest and the key id as associated data), and the
key id travels in the blob's codec. A data key is stored only wrapped by a
key-encryption key (KEK) from a :class:`KeyWrapper`:

``REPLAYABLE_DATA_KEY=<kek id>:<base64 secret>``
    One KEK (32 bytes or more; ``replayable keys new --data`` prints one).
``REPLAYABLE_DATA_KEYRING=/path/keyring.json``
    ``{"current": "k2", "keys": {"k1": "<base64>", "k2": "<base64>"}}``, mode 0600.
``REPLAYABLE_DATA_KEY_PROVIDER=package.module:factory``
    ``factory()`` returns a :class:`KeyWrapper` (a cloud KMS: wrap and unwrap
    happen in the KMS, the KEK never leaves it) or a chain-key style
    :class:`~replayable.events.chain.KeyProvider` whose keys become KEKs.

**Rotation.** ``replayable keys rotate`` wraps every data key again under
the current KEK (new rows; payloads are not rewritten); keys wrapped by an
old KEK stay readable as long as that KEK is configured.

**Erasure.** Destroying a key space's wrapped data keys (crypto-shredding,
``replayable erase``) makes its blobs unreadable for good; the erasure is
recorded (when, by whom, which keys) and readers show "erased on DATE by
WHO" where the payload was. Event hashes cover payload digests, so chains
still verify.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import importlib
import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from replayable.errors import ConfigurationError
from replayable.events.chain import KeyProvider
from replayable.store.keys import FileKeyring, StaticKeys, parse_key
from replayable.store.payloads import Erased, Unreadable, closed_by, space, split_space

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def _aesgcm(key: bytes) -> AESGCM:
    """AES-256-GCM under ``key``. ``cryptography`` is imported on first use, not with the
    store: an agent whose payloads stay in clear never loads it."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = [
    "ENV_DATA_KEY",
    "ENV_DATA_KEYRING",
    "ENV_DATA_PROVIDER",
    "DataKeys",
    "ErasureRow",
    "KeyRow",
    "KeyWrapper",
    "LocalWrapper",
    "data_key_env",
    "data_keys_from_env",
    "enable_encryption",
]

ENV_DATA_KEY = "REPLAYABLE_DATA_KEY"
ENV_DATA_KEYRING = "REPLAYABLE_DATA_KEYRING"
ENV_DATA_PROVIDER = "REPLAYABLE_DATA_KEY_PROVIDER"
_NONCE = 12
#: The key id of a payload that reached its key space after the space was erased: it
#: is stored without its bytes, and reads as erased (see
#: :func:`~replayable.store.payloads.closed_by`).
ERASED_KEY = "erased"


class KeyRow(NamedTuple):
    """One wrapped copy of a data key (a key may have one per KEK it was wrapped by)."""

    tenant: str
    subject: str
    key_id: str
    kek_id: str
    wrapped: bytes
    created_at: float


class ErasureRow(NamedTuple):
    """The record of an erasure: which key space, when, by whom, which data keys."""

    tenant: str
    subject: str | None  # None: the whole tenant, every subject in it
    erased_at: float
    erased_by: str
    key_ids: tuple[str, ...]

    def notice(self) -> str:
        day = dt.datetime.fromtimestamp(self.erased_at, dt.UTC).strftime("%Y-%m-%d")
        return f"erased on {day} by {self.erased_by}"


@runtime_checkable
class KeyWrapper(Protocol):
    """Wraps and unwraps data keys under key-encryption keys (what a KMS plugin implements).

    ``current_kek`` names the KEK new data keys are wrapped by (``None``: no
    encryption). ``unwrap`` returns ``None`` when it holds no such KEK or the
    wrapped bytes do not open under it; ``context`` must be bound to the wrap.
    """

    def current_kek(self) -> str | None: ...

    def wrap(self, kek_id: str, data_key: bytes, context: bytes) -> bytes: ...

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes | None: ...


class LocalWrapper:
    """KEKs derived from the keys of a :class:`KeyProvider` (env, keyring file, plugin)."""

    def __init__(self, keys: KeyProvider) -> None:
        self.keys = keys

    def _kek(self, kek_id: str) -> AESGCM | None:
        key = self.keys.get(kek_id)
        if key is None:
            return None
        return _aesgcm(hmac.digest(key.secret, b"replayable data kek aes-256-gcm", "sha256"))

    def current_kek(self) -> str | None:
        key = self.keys.current()
        return None if key is None else key.key_id

    def wrap(self, kek_id: str, data_key: bytes, context: bytes) -> bytes:
        kek = self._kek(kek_id)
        if kek is None:
            raise ConfigurationError(f"key-encryption key {kek_id!r} is not configured")
        nonce = secrets.token_bytes(_NONCE)
        return nonce + kek.encrypt(nonce, data_key, context)

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes | None:
        kek = self._kek(kek_id)
        if kek is None or len(wrapped) <= _NONCE:
            return None
        try:
            return kek.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], context)
        except _invalid_tag():
            return None


def _plugin(spec: str) -> KeyWrapper:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{ENV_DATA_PROVIDER}={spec!r} must be 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{ENV_DATA_PROVIDER}={spec!r} cannot be loaded: {exc}") from None
    made = factory()
    if isinstance(made, KeyWrapper):
        return made
    if isinstance(made, KeyProvider):
        return LocalWrapper(made)
    raise ConfigurationError(
        f"{ENV_DATA_PROVIDER}={spec!r} returned {type(made).__name__}, which is neither a "
        "key wrapper (current_kek, wrap, unwrap) nor a key provider (current, get)"
    )


def data_keys_from_env(environ: Mapping[str, str] | None = None) -> KeyWrapper | None:
    """The KEK source the environment configures, or ``None`` (payloads are not encrypted)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_DATA_PROVIDER):
        return _plugin(env[ENV_DATA_PROVIDER])
    keys = []
    current = None
    if env.get(ENV_DATA_KEY):
        key = parse_key(env[ENV_DATA_KEY], ENV_DATA_KEY)
        keys.append(key)
        current = key.key_id
    if env.get(ENV_DATA_KEYRING):
        ring = FileKeyring(env[ENV_DATA_KEYRING])
        found = ring.current()
        keys.extend(k for k in ring._keys.values() if k.key_id != current)
        if current is None and found is not None:
            current = found.key_id
    if not keys:
        return None
    return LocalWrapper(StaticKeys(keys, current))


def _context(key_space: str, key_id: str) -> bytes:
    return b"replayable-data-key\x00" + key_space.encode() + b"\x00" + key_id.encode()


def _aad(key_space: str, digest: str, key_id: str) -> bytes:
    return (
        b"replayable-blob\x00"
        + key_space.encode()
        + b"\x00"
        + digest.encode()
        + b"\x00"
        + key_id.encode()
    )


class DataKeys:
    """The data keys of one store: made on first use per key space, unwrapped once."""

    def __init__(self, store: EventStore, wrapper: KeyWrapper | None) -> None:
        self.store = store
        self.wrapper = wrapper
        self._current: dict[str, tuple[str, AESGCM | None]] = {}
        self._by_id: dict[tuple[str, str], AESGCM] = {}
        self._lock = threading.Lock()

    # -- writing ------------------------------------------------------------------

    def seal(self, key_space: str, packed: bytes, digest: str) -> tuple[str | None, bytes]:
        """``packed`` encrypted under the key space's current data key, and its key id."""
        found = self._current.get(key_space)
        if found is None:
            with self._lock:
                found = self._current.get(key_space) or self._make(key_space)
                self._current[key_space] = found
        key_id, aes = found
        if aes is None:
            return key_id, b""  # an erased epoch: the payload is stored erased
        nonce = secrets.token_bytes(_NONCE)
        return key_id, nonce + aes.encrypt(nonce, packed, _aad(key_space, digest, key_id))

    def _make(self, key_space: str) -> tuple[str, AESGCM | None]:
        assert self.wrapper is not None
        kek_id = self.wrapper.current_kek()
        if kek_id is None:
            raise ConfigurationError("no current key-encryption key to wrap a data key with")
        tenant, subject = split_space(key_space)
        if closed_by(self.store.erasures(tenant), key_space) is not None:
            # Its keys were destroyed: what still arrives for it (a record from a stream
            # or a spool, a run in progress at the erasure) is erased as it lands, never
            # encrypted under a key that would make it readable again.
            return ERASED_KEY, None
        # The newest data key of the key space that the configured KEKs open.
        for row in sorted(
            self.store.key_rows(tenant, subject), key=lambda r: r.created_at, reverse=True
        ):
            aes = self._unwrap(key_space, row)
            if aes is not None:
                return row.key_id, aes
        data_key = secrets.token_bytes(32)
        key_id = "dk-" + secrets.token_hex(8)
        wrapped = self.wrapper.wrap(kek_id, data_key, _context(key_space, key_id))
        import time

        self.store.put_key_rows([KeyRow(tenant, subject, key_id, kek_id, wrapped, time.time())])
        aes = _aesgcm(data_key)
        self._by_id[(key_space, key_id)] = aes
        return key_id, aes

    def _unwrap(self, key_space: str, row: KeyRow) -> AESGCM | None:
        if self.wrapper is None:
            return None
        raw = self.wrapper.unwrap(row.kek_id, row.wrapped, _context(key_space, row.key_id))
        if raw is None:
            return None
        aes = _aesgcm(raw)
        self._by_id[(key_space, row.key_id)] = aes
        return aes

    # -- reading ------------------------------------------------------------------

    def open(self, key_space: str, digest: str, key_id: str, data: bytes) -> bytes:
        """The plaintext of an encrypted blob; :class:`Erased` when its key was destroyed."""
        aes = self._by_id.get((key_space, key_id)) or self._find(key_space, key_id)
        if len(data) <= _NONCE:
            raise Unreadable(f"blob {digest[:12]} is too short to be encrypted data")
        try:
            return aes.decrypt(data[:_NONCE], data[_NONCE:], _aad(key_space, digest, key_id))
        except _invalid_tag():
            raise Unreadable(
                f"blob {digest[:12]} does not decrypt under data key {key_id} (it was altered)"
            ) from None

    def _find(self, key_space: str, key_id: str) -> AESGCM:
        tenant, subject = split_space(key_space)
        if key_id == ERASED_KEY:
            erasure = closed_by(self.store.erasures(tenant), key_space)
            if erasure is None:
                raise Unreadable(f"data key {key_id} names an erasure that is not recorded")
            raise Erased(erasure.notice())
        rows = [r for r in self.store.key_rows(tenant, subject) if r.key_id == key_id]
        for row in rows:
            aes = self._unwrap(key_space, row)
            if aes is not None:
                return aes
        if rows:
            keks = ", ".join(sorted({r.kek_id for r in rows}))
            raise Unreadable(
                f"data key {key_id} is wrapped by key-encryption key(s) {keks}, none of which "
                f"is configured ({ENV_DATA_KEY}, {ENV_DATA_KEYRING} or {ENV_DATA_PROVIDER})"
            )
        for erasure in self.store.erasures(tenant):
            if key_id in erasure.key_ids:
                raise Erased(erasure.notice())
        raise Unreadable(f"data key {key_id} is missing")

    def forget(self) -> None:
        """Drop every unwrapped key held in memory (after an erasure)."""
        with self._lock:
            self._current.clear()
            self._by_id.clear()

    # -- rotation -----------------------------------------------------------------

    def rotate(self) -> tuple[int, int]:
        """Wrap every data key again under the current KEK; (re-wrapped, already current).

        Raises :class:`ConfigurationError` for a data key no configured KEK opens.
        """
        if self.wrapper is None or (kek_id := self.wrapper.current_kek()) is None:
            raise ConfigurationError(
                f"no key-encryption key configured: set {ENV_DATA_KEY} or {ENV_DATA_KEYRING}"
            )
        import time

        by_key: dict[tuple[str, str, str], list[KeyRow]] = {}
        for row in self.store.all_key_rows():
            by_key.setdefault((row.tenant, row.subject, row.key_id), []).append(row)
        new: list[KeyRow] = []
        current = 0
        for (tenant, subject, key_id), rows in sorted(by_key.items()):
            if any(r.kek_id == kek_id for r in rows):
                current += 1
                continue
            key_space = space(tenant, subject)
            context = _context(key_space, key_id)
            raw = None
            for row in rows:
                raw = self.wrapper.unwrap(row.kek_id, row.wrapped, context)
                if raw is not None:
                    break
            if raw is None:
                raise ConfigurationError(
                    f"data key {key_id} of {key_space or 'the store'!r} is wrapped by "
                    f"{', '.join(sorted(r.kek_id for r in rows))}: configure one of them "
                    "(as an old key of the keyring) to rotate"
                )
            wrapped = self.wrapper.wrap(kek_id, raw, context)
            new.append(KeyRow(tenant, subject, key_id, kek_id, wrapped, time.time()))
        if new:
            self.store.put_key_rows(new)
        return len(new), current


def data_key_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The data-key settings of the environment, to hand to the writer process (shared by
    stores opened at different times, it takes them from the process that opened each)."""
    env = os.environ if environ is None else environ
    return {n: env[n] for n in (ENV_DATA_PROVIDER, ENV_DATA_KEY, ENV_DATA_KEYRING) if env.get(n)}


def enable_encryption(
    store: EventStore,
    wrapper: KeyWrapper | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> DataKeys:
    """Encrypt ``store``'s new blobs (and read encrypted ones) with keys from ``wrapper``,
    by default from the environment (``environ``, else this process's). With no KEK,
    blobs are written in clear and encrypted ones still read if an old KEK opens their
    keys."""
    if wrapper is None:
        wrapper = data_keys_from_env(environ)
    keys = DataKeys(store, wrapper)
    tier = store.tier
    tier.open = keys.open
    tier.seal = keys.seal if wrapper is not None and wrapper.current_kek() else None
    if wrapper is not None:
        # Only what a key opened can be held decrypted, and then forgotten at an erasure.
        tier.fresh = store.notice_erasures
    store.__dict__["data_keys"] = keys
    return keys


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key_rows_for(rows: Sequence[Any]) -> list[KeyRow]:
    return [KeyRow(r[0], r[1], r[2], r[3], bytes(r[4]), float(r[5])) for r in rows]
