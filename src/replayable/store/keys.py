"""Chain keys from the environment, a keyring file, or a plugin (a KMS).

Configure one of these (the writer process reads the same environment):

``REPLAYABLE_CHAIN_KEY=<key id>:<secret>``
    One key, current for new runs. The secret is base64 (standard or URL-safe)
    of at least 32 bytes: ``replayable keys new`` prints one.
``REPLAYABLE_KEYRING=/path/keyring.json``
    ``{"current": "k2", "keys": {"k1": "<base64>", "k2": "<base64>"}}``: old
    keys stay for verifying runs chained before a rotation. The file must be
    readable by its owner only (mode 0600), or it is refused.
``REPLAYABLE_KEY_PROVIDER=package.module:factory``
    ``factory()`` returns a :class:`~replayable.events.chain.KeyProvider`
    (``current()`` and ``get(key_id)``), for keys held by a KMS.

When several are set, the first named key that answers wins: the plugin, then
``REPLAYABLE_CHAIN_KEY``, then the keyring; any of them may hold old keys.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import orjson

from replayable.errors import ConfigurationError
from replayable.events.chain import KEY_ID, ChainKey, KeyProvider

__all__ = [
    "ENV_KEY",
    "ENV_KEYRING",
    "ENV_PROVIDER",
    "FileKeyring",
    "StaticKeys",
    "keys_from_env",
    "new_key_text",
    "parse_key",
]

ENV_KEY = "REPLAYABLE_CHAIN_KEY"
ENV_KEYRING = "REPLAYABLE_KEYRING"
ENV_PROVIDER = "REPLAYABLE_KEY_PROVIDER"


def _decode_secret(text: str, where: str) -> bytes:
    text = text.strip()
    try:
        padded = text + "=" * (-len(text) % 4)
        alt = b"-_" if ("-" in text or "_" in text) else None
        return base64.b64decode(padded, altchars=alt, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigurationError(f"{where}: the secret is not base64 ({exc})") from None


def _key(key_id: str, secret_text: str, where: str) -> ChainKey:
    try:
        return ChainKey(key_id, _decode_secret(secret_text, where))
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def parse_key(text: str, where: str = ENV_KEY) -> ChainKey:
    """A key from ``<key id>:<base64 secret>`` (what ``REPLAYABLE_CHAIN_KEY`` holds)."""
    key_id, sep, secret_text = text.partition(":")
    if not sep or not KEY_ID.fullmatch(key_id):
        raise ConfigurationError(
            f"{where} must be '<key id>:<base64 secret>' with a key id of letters, digits, "
            "'.', '_' or '-' (run `replayable keys new` for one)"
        )
    return _key(key_id, secret_text, where)


def new_key_text(key_id: str) -> str:
    """A fresh ``<key id>:<secret>`` value for ``REPLAYABLE_CHAIN_KEY`` (32 random bytes)."""
    if not KEY_ID.fullmatch(key_id):
        raise ConfigurationError(f"key id {key_id!r} must be 1-64 letters, digits, '.', '_', '-'")
    return f"{key_id}:{base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip('=')}"


class StaticKeys:
    """Keys held in memory: the first given, or ``current``, chains new runs."""

    def __init__(self, keys: Iterable[ChainKey], current: str | None = None) -> None:
        self._keys = {k.key_id: k for k in keys}
        if current is None and self._keys:
            current = next(iter(self._keys))
        if current is not None and current not in self._keys:
            raise ConfigurationError(f"current key {current!r} is not among the keys given")
        self._current = current

    def current(self) -> ChainKey | None:
        return None if self._current is None else self._keys[self._current]

    def get(self, key_id: str) -> ChainKey | None:
        return self._keys.get(key_id)

    def __repr__(self) -> str:
        return f"StaticKeys({sorted(self._keys)!r}, current={self._current!r})"


class FileKeyring(StaticKeys):
    """Keys from a JSON keyring file readable by its owner only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        where = f"keyring {self.path}"
        try:
            mode = self.path.stat().st_mode
            data = orjson.loads(self.path.read_bytes())
        except OSError as exc:
            raise ConfigurationError(f"{where} cannot be read: {exc.strerror}") from None
        except orjson.JSONDecodeError as exc:
            raise ConfigurationError(f"{where} is not JSON: {exc}") from None
        if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigurationError(
                f"{where} is readable by others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
            )
        if not isinstance(data, dict) or not isinstance(data.get("keys"), dict):
            raise ConfigurationError(
                f'{where} must hold {{"current": ..., "keys": {{id: secret}}}}'
            )
        keys = []
        for key_id, secret_text in data["keys"].items():
            if not isinstance(secret_text, str) or not KEY_ID.fullmatch(key_id):
                raise ConfigurationError(f"{where}: key {key_id!r} is not '<id>': '<base64>'")
            keys.append(_key(key_id, secret_text, f"{where}, key {key_id!r}"))
        current = data.get("current")
        if current is not None and not isinstance(current, str):
            raise ConfigurationError(f"{where}: current must name a key id")
        super().__init__(keys, current)


class _Chained:
    """The first provider's current key; any provider's key by id."""

    def __init__(self, providers: list[KeyProvider]) -> None:
        self.providers = providers

    def current(self) -> ChainKey | None:
        for p in self.providers:
            key = p.current()
            if key is not None:
                return key
        return None

    def get(self, key_id: str) -> ChainKey | None:
        for p in self.providers:
            key = p.get(key_id)
            if key is not None:
                return key
        return None


def _plugin(spec: str) -> KeyProvider:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{ENV_PROVIDER}={spec!r} must be 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{ENV_PROVIDER}={spec!r} cannot be loaded: {exc}") from None
    provider = factory()
    if not isinstance(provider, KeyProvider):
        raise ConfigurationError(
            f"{ENV_PROVIDER}={spec!r} returned {type(provider).__name__}, "
            "which has no current() and get(key_id)"
        )
    return provider


def keys_from_env(environ: Mapping[str, str] | None = None) -> KeyProvider | None:
    """The key provider the environment configures, or ``None`` (chains stay unkeyed)."""
    env = os.environ if environ is None else environ
    providers: list[KeyProvider] = []
    if env.get(ENV_PROVIDER):
        providers.append(_plugin(env[ENV_PROVIDER]))
    if env.get(ENV_KEY):
        providers.append(StaticKeys([parse_key(env[ENV_KEY])]))
    if env.get(ENV_KEYRING):
        providers.append(FileKeyring(env[ENV_KEYRING]))
    if not providers:
        return None
    return providers[0] if len(providers) == 1 else _Chained(providers)
