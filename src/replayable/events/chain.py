"""The hash chain's formats: what links events, seals runs and signs anchor entries.

Two formats, named explicitly by a run's start record (``RunStart.chain``):

* **v1** (``chain`` is ``None``): sha256 links, as written before keys existed
  and whenever no key is configured. Anyone can recompute it, so it shows
  accidents and careless edits, not a deliberate rewrite.
* **v2** (``chain`` is ``"2:<key id>:<start mac>"``): every link, the start
  record and the seal are HMAC-SHA256 under the key named by the key id, and
  the end record carries an Ed25519 signature of the seal. Without the key,
  nothing can be rewritten so that it verifies.

A format is never guessed: :func:`parse_chain` reads the label and refuses
one it does not know. This module is pure (no I/O); keys come from a
:class:`KeyProvider` (see :mod:`replayable.store.keys`), anchors from
:mod:`replayable.store.anchor`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import orjson

from replayable.events.canonical import (
    event_fields,
    event_hash,
    genesis_hash,
    run_seal,
    seal_outcome,
    seal_tail,
    start_fields,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from replayable.events.model import Event, RunEnd, RunStart

__all__ = [
    "CHAIN_V1",
    "CHAIN_V2",
    "ChainFormat",
    "ChainFormatError",
    "ChainKey",
    "KeyProvider",
    "chain_label",
    "end_seal",
    "event_digest",
    "genesis",
    "link",
    "parse_chain",
    "seal_for",
    "seal_message",
    "signed_entry",
    "start_fields",
    "start_mac",
    "verify_entry",
]

CHAIN_V1: Final = 1
CHAIN_V2: Final = 2

#: A key id is short and plain, so that it fits the ``chain`` label unquoted.
KEY_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SORT: Final = orjson.OPT_SORT_KEYS


class ChainFormatError(ValueError):
    """A ``chain`` label this version does not know, or one that is malformed."""


@dataclass(frozen=True)
class ChainKey:
    """One chain key: an id and a secret of at least 32 bytes.

    The HMAC key and the Ed25519 signing key are derived from the secret, so
    configuring a key is one value. The public key (:attr:`public_key`) can be
    handed to whoever checks anchor entries and seal signatures.
    """

    key_id: str
    secret: bytes = field(repr=False)
    mac_key: bytes = field(init=False, repr=False)
    # Made on first use (``cryptography`` is imported then, not with this module).
    _signer: Ed25519PrivateKey | None = field(init=False, repr=False, compare=False, default=None)
    _inner: Any = field(init=False, repr=False, compare=False)
    _outer: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not KEY_ID.fullmatch(self.key_id):
            raise ValueError(
                f"key id {self.key_id!r} must be 1-64 letters, digits, '.', '_' or '-'"
            )
        if len(self.secret) < 32:
            raise ValueError(
                f"key {self.key_id!r} has {len(self.secret)} bytes; a chain key needs at least 32"
            )
        mac_key = hmac.digest(self.secret, b"replayable chain hmac-sha256", "sha256")
        object.__setattr__(self, "mac_key", mac_key)
        # HMAC's padded inner and outer states, hashed once: each MAC then costs two
        # state copies instead of a new OpenSSL context (about half of one-shot HMAC).
        padded = mac_key.ljust(64, b"\0")
        object.__setattr__(self, "_inner", hashlib.sha256(bytes(b ^ 0x36 for b in padded)))
        object.__setattr__(self, "_outer", hashlib.sha256(bytes(b ^ 0x5C for b in padded)))

    @property
    def signer(self) -> Ed25519PrivateKey:
        """The Ed25519 key seals are signed with, derived from the secret."""
        signer = self._signer
        if signer is None:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            seed = hmac.digest(self.secret, b"replayable seal ed25519", "sha256")
            signer = Ed25519PrivateKey.from_private_bytes(seed)
            object.__setattr__(self, "_signer", signer)
        return signer

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.signer.public_key()

    def mac(self, data: bytes) -> str:
        """HMAC-SHA256 of ``data`` under this key, as hex."""
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        digest: str = outer.hexdigest()
        return digest

    def sign(self, data: bytes) -> str:
        """An Ed25519 signature of ``data``, as hex."""
        return self.signer.sign(data).hex()

    def signature_holds(self, data: bytes, signature: str | None) -> bool:
        """Whether ``signature`` (hex) is this key's signature of ``data``."""
        if not isinstance(signature, str):
            return False
        from cryptography.exceptions import InvalidSignature

        try:
            self.public_key.verify(bytes.fromhex(signature), data)
        except (InvalidSignature, ValueError):
            return False
        return True


@runtime_checkable
class KeyProvider(Protocol):
    """Where chain keys come from: an environment variable, a keyring file, a KMS.

    ``current`` is the key new runs are chained with (``None``: record
    unkeyed, as v1). ``get`` finds any key by id, old ones included, so runs
    chained before a rotation still verify. A KMS plugin implements these two
    methods and is named by ``REPLAYABLE_KEY_PROVIDER=module:factory``.
    """

    def current(self) -> ChainKey | None: ...

    def get(self, key_id: str) -> ChainKey | None: ...


@dataclass(frozen=True, slots=True)
class ChainFormat:
    """A parsed ``chain`` label: the version, and for v2 the key id and the start's MAC."""

    version: int
    key_id: str | None = None
    start_mac: str | None = None

    @property
    def keyed(self) -> bool:
        return self.version >= CHAIN_V2


V1: Final = ChainFormat(CHAIN_V1)


def parse_chain(label: object) -> ChainFormat:
    """The format a start record's ``chain`` label names; :class:`ChainFormatError` if unknown.

    This is the one place old records are read in their own format (the
    explicit upcast): ``None`` is v1, ``"2:kid:mac"`` is v2, anything else is
    refused rather than guessed.
    """
    if label is None:
        return V1
    if not isinstance(label, str):
        raise ChainFormatError(f"chain label is a {type(label).__name__}, not text")
    parts = label.split(":")
    if parts[0] != str(CHAIN_V2):
        raise ChainFormatError(f"chain format {parts[0]!r} is unknown to this replayable")
    if len(parts) != 3 or not KEY_ID.fullmatch(parts[1]) or not _is_hex(parts[2], 64):
        raise ChainFormatError(f"chain label {label[:80]!r} is malformed")
    return ChainFormat(CHAIN_V2, parts[1], parts[2])


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


def start_mac(key: ChainKey, start: RunStart) -> str:
    """The v2 MAC of a start record: its fields and the key id it is chained with."""
    data = orjson.dumps(("run-start", CHAIN_V2, key.key_id, start_fields(start)), option=_SORT)
    return key.mac(data)


def chain_label(key: ChainKey, start: RunStart) -> str:
    """The ``chain`` label a v2 start record carries."""
    return f"{CHAIN_V2}:{key.key_id}:{start_mac(key, start)}"


def genesis(key: ChainKey | None, run_id: str) -> str:
    """The ``prev_hash`` of a run's first event in the given key's format (v1 unkeyed)."""
    if key is None:
        return genesis_hash(run_id)
    return key.mac(b"replayable-chain/2\x00" + run_id.encode())


def link(key: ChainKey | None, prev_hash: str, data: bytes) -> str:
    """The hash of one event: ``prev_hash`` and the canonical JSON ``data`` of its fields."""
    if key is None:
        h = hashlib.sha256(prev_hash.encode())
        h.update(data)
        return h.hexdigest()
    return key.mac(prev_hash.encode() + data)


def event_digest(key: ChainKey | None, event: Event) -> str:
    """The hash ``event`` must carry given the ``prev_hash`` it carries."""
    if key is None:
        return event_hash(event)
    fields = event_fields(event)
    return link(key, event.prev_hash, orjson.dumps(fields, option=_SORT))


def seal_for(
    key: ChainKey | None,
    head: str,
    start: RunStart,
    status: str,
    output: str | None,
    error: str | None,
    ended_at: float,
    event_count: int,
    *,
    version: int = 1,
    output_digest: str | None = None,
    error_digest: str | None = None,
) -> str:
    """The end record's ``last_hash``: the chain head sealed with the start and the outcome
    (for an end record of ``version`` 2, the outcome's sha256: see ``run_seal``)."""
    if key is None:
        return run_seal(
            head,
            start,
            status,
            output,
            error,
            ended_at,
            event_count,
            version=version,
            output_digest=output_digest,
            error_digest=error_digest,
        )
    out, err = seal_outcome(version, output, error, output_digest, error_digest)
    fields = (
        "run-seal",
        CHAIN_V2,
        start.chain,
        *start_fields(start),
        *seal_tail(status, out, err, ended_at, event_count, version),
    )
    return key.mac(head.encode() + orjson.dumps(fields, option=_SORT))


def seal_message(run_id: str, seal: str) -> bytes:
    """What an end record's Ed25519 ``signature`` signs."""
    return b"replayable-seal/2\x00" + run_id.encode() + b"\x00" + seal.encode()


def end_seal(key: ChainKey | None, head: str, start: RunStart, end: RunEnd) -> str:
    """:func:`seal_for` over a stored end record's fields."""
    return seal_for(
        key,
        head,
        start,
        end.status,
        end.output,
        end.error,
        end.ended_at,
        end.event_count,
        version=end.schema_version,
        output_digest=end.output_digest,
        error_digest=end.error_digest,
    )


# -- anchor entries -------------------------------------------------------------------


def signed_entry(key: ChainKey, entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the key id and an Ed25519 signature over its canonical JSON."""
    body = {**entry, "kid": key.key_id}
    return {**body, "sig": key.sign(orjson.dumps(body, option=_SORT))}


def verify_entry(keys: KeyProvider | None, entry: dict[str, Any]) -> str | None:
    """``None`` when an anchor entry's signature holds, else what is wrong with it."""
    kid = entry.get("kid")
    if not isinstance(kid, str):
        return "names no key id"
    key = keys.get(kid) if keys is not None else None
    if key is None:
        return f"is signed with key {kid!r}, which is not configured"
    body = {k: v for k, v in entry.items() if k != "sig"}
    if not key.signature_holds(orjson.dumps(body, option=_SORT), entry.get("sig")):
        return f"has a signature that does not hold under key {kid!r}"
    return None
