"""What tamper evidence is configured with: chain keys and an anchor.

:class:`Integrity` bundles a :class:`~replayable.events.chain.KeyProvider`
and an :class:`~replayable.store.anchor.Anchor`; :meth:`Integrity.from_env`
reads ``REPLAYABLE_CHAIN_KEY`` / ``REPLAYABLE_KEYRING`` /
``REPLAYABLE_KEY_PROVIDER`` and ``REPLAYABLE_ANCHOR``. The writer chains and
anchors with it; ``verify`` checks with it. Neither is required: without a
key the chain is the unkeyed v1 format, without an anchor deleted and
truncated runs cannot be told from incomplete ones.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayable.events.canonical import canonical
from replayable.events.chain import ChainKey, KeyProvider, signed_entry, start_fields
from replayable.store.anchor import ENTRY_VERSION, ENV_ANCHOR, Anchor, anchor_from_env
from replayable.store.keys import ENV_KEY, ENV_KEYRING, ENV_PROVIDER, keys_from_env

if TYPE_CHECKING:
    from replayable.events.model import RunStart

__all__ = [
    "ENV_NAMES",
    "Integrity",
    "anchor_entry",
    "integrity_env",
    "start_anchor_fields",
    "start_digest",
]

#: The environment variables tamper evidence is configured with.
ENV_NAMES = (ENV_PROVIDER, ENV_KEY, ENV_KEYRING, ENV_ANCHOR)


def integrity_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tamper-evidence settings of the environment, to hand to a writer process."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in ENV_NAMES if env.get(name)}


@dataclass(frozen=True)
class Integrity:
    """Chain keys and an anchor; either may be ``None``."""

    keys: KeyProvider | None = None
    anchor: Anchor | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Integrity:
        """What the environment configures (raises ``ConfigurationError`` on a bad value)."""
        return cls(keys_from_env(environ), anchor_from_env(environ))

    def current_key(self) -> ChainKey | None:
        return None if self.keys is None else self.keys.current()

    def key(self, key_id: str) -> ChainKey | None:
        return None if self.keys is None else self.keys.get(key_id)

    def describe(self) -> str:
        key = self.current_key()
        parts = [f"key {key.key_id!r}" if key is not None else "no key (chains unkeyed)"]
        parts.append(f"anchor {self.anchor.url}" if self.anchor is not None else "no anchor")
        return ", ".join(parts)


def anchor_entry(
    key: ChainKey | None,
    kind: str,
    store_id: str,
    tenant: str | None,
    run_id: str,
    **fields: Any,
) -> dict[str, Any]:
    """One anchor entry, signed with ``key`` when there is one."""
    entry = {
        "v": ENTRY_VERSION,
        "type": kind,
        "store": store_id,
        "tenant": tenant,
        "run": run_id,
        **fields,
    }
    return entry if key is None else signed_entry(key, entry)


def start_anchor_fields(start: RunStart) -> dict[str, Any]:
    """What a start entry holds: the chain label (with its MAC for a keyed chain) and a
    digest of the start record's fields."""
    return {"chain": start.chain, "digest": start_digest(start)}


def start_digest(start: RunStart) -> str:
    """sha256 of a start record's canonical fields (what an anchor's start entry names)."""
    return hashlib.sha256(canonical(start_fields(start))).hexdigest()
