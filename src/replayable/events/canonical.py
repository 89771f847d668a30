"""Canonical JSON, redaction, fingerprints and the hash chain.

Canonical JSON is orjson with sorted keys: UTF-8, no insignificant
whitespace, one spelling per number. Everything that is hashed goes through
here, so the bytes that are fingerprinted are exactly the bytes that are
stored.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from replayable.events.model import Event, RunStart

__all__ = [
    "REDACTED",
    "Redactor",
    "canonical",
    "chain_hash",
    "event_hash",
    "fingerprint",
    "genesis_hash",
    "run_seal",
]

REDACTED: Final = "[REDACTED]"
_SORT: Final = orjson.OPT_SORT_KEYS


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes of a plain JSON value (sorted keys)."""
    return orjson.dumps(value, option=_SORT)


_DEFAULT_SECRET_KEYS: Final = (
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "api_key",
    "apikey",
    "x-goog-api-key",
    "password",
    "passwd",
    "secret",
    "client_secret",
    "secret_key",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "session_token",
    "private_key",
    "cookie",
    "set-cookie",
)

_DEFAULT_VALUE_PATTERNS: Final = (
    r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic keys
    r"\b(?:ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}",  # GitHub tokens
    r"\bxox[abpr]-[A-Za-z0-9\-]{10,}",  # Slack tokens
    r"\bAKIA[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bBearer\s+[A-Za-z0-9._~+/=\-]{8,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
)
#: Every default secret key name contains one of these (lower-cased).
_KEY_FRAGMENTS: Final = ("auth", "key", "pass", "secret", "token", "cookie")
#: The default value patterns by the fragment the pre-filter finds for them, each
#: starting with its literal text, so that ``re`` searches with a fast literal scan
#: (an alternation behind ``\b`` costs ~40 ns a byte), and whether a word boundary
#: must come before it (checked by hand).
_VALUE_SCANS: Final = {
    b"sk-": (re.compile(rb"sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}"), True),
    b"ghp_": (re.compile(rb"ghp_[A-Za-z0-9_]{20,}"), True),
    b"gho_": (re.compile(rb"gho_[A-Za-z0-9_]{20,}"), True),
    b"ghs_": (re.compile(rb"ghs_[A-Za-z0-9_]{20,}"), True),
    b"github_pat_": (re.compile(rb"github_pat_[A-Za-z0-9_]{20,}"), True),
    b"xox": (re.compile(rb"xox[abpr]-[A-Za-z0-9\-]{10,}"), True),
    b"akia": (re.compile(rb"AKIA[0-9A-Z]{16}\b"), True),
    b"bearer": (re.compile(rb"Bearer\s+[A-Za-z0-9._~+/=\-]{8,}"), True),
    b"private key": (re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----"), False),
}
#: Every default value pattern contains one of these, lower-cased.
_VALUE_FRAGMENTS: Final = tuple(f.decode() for f in _VALUE_SCANS)


#: For each fragment: (may be part of a secret key name, may start a secret value).
_FRAGMENT_KINDS: Final = {
    f.encode(): (any(k in f for k in _KEY_FRAGMENTS), f in _VALUE_FRAGMENTS)
    for f in (*_KEY_FRAGMENTS, *_VALUE_FRAGMENTS)
}


_WORD: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _value_found(payload: bytes, fragments: set[bytes]) -> bool:
    """Whether a default value pattern matches ``payload``, trying only the patterns
    of the fragments found (what ``\\b(?:…)|…`` over the whole payload decides)."""
    for fragment in fragments:
        scan = _VALUE_SCANS.get(fragment)
        if scan is None:
            continue
        rx, bounded = scan
        m = rx.search(payload)
        while m is not None:
            start = m.start()
            if not bounded or start == 0 or payload[start - 1] not in _WORD:
                return True
            m = rx.search(payload, start + 1)  # a later start may still match
    return False


class Redactor:
    """Replaces secrets in a JSON payload before it is fingerprinted or stored.

    A value is redacted when its key is a secret-looking name (``authorization``,
    ``api_key`` …, matched case-insensitively), when it is the second item of a
    ``[name, value]`` pair with such a name (headers as a list of pairs), or when
    a string matches a secret pattern (``sk-…``, ``Bearer …``). The check runs first over the
    serialized bytes, so payloads without secrets cost one regex scan.
    """

    def __init__(
        self,
        keys: Iterable[str] = _DEFAULT_SECRET_KEYS,
        value_patterns: Iterable[str] = _DEFAULT_VALUE_PATTERNS,
        *,
        extra_keys: Iterable[str] = (),
        extra_patterns: Iterable[str] = (),
    ) -> None:
        self.keys = frozenset(k.lower() for k in (*keys, *extra_keys))
        patterns = [*value_patterns, *extra_patterns]
        self.patterns = tuple(patterns)
        self._value_re = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        key_alt = "|".join(re.escape(k) for k in sorted(self.keys, key=len, reverse=True))
        # A secret name followed by ':' (a dict key) or ',' (the name of a pair), matched
        # on the lower-cased payload: a case-insensitive regex costs ten times more.
        self._key_scan = re.compile(rf'"(?:{key_alt})"\s*[:,]'.encode()) if self.keys else None

        self._value_scan = (
            re.compile("|".join(f"(?:{p})" for p in patterns).encode()) if patterns else None
        )
        # One pass over the lower-cased payload for fragments that every default key
        # and pattern contains; most payloads hold none, and then nothing else runs.
        defaults = (
            not extra_patterns
            and tuple(value_patterns) == _DEFAULT_VALUE_PATTERNS
            and all(any(f in k for f in _KEY_FRAGMENTS) for k in self.keys)
        )
        self._prefilter = (
            re.compile(
                "|".join(re.escape(f) for f in (*_KEY_FRAGMENTS, *_VALUE_FRAGMENTS)).encode()
            )
            if defaults
            else None
        )

    def needs_redaction(self, payload: bytes) -> bool:
        """Whether serialized ``payload`` may hold a secret (a cheap, conservative scan)."""
        low = payload.lower()
        prefilter = self._prefilter
        if prefilter is None:
            if self._key_scan is not None and self._key_scan.search(low) is not None:
                return True
            return self._value_scan is not None and self._value_scan.search(payload) is not None
        found = prefilter.findall(low)
        if not found:
            return False
        # Only the scans the fragments call for: "token" in every LLM usage block
        # ("prompt_tokens") must not send the payload through the value patterns.
        kinds = _FRAGMENT_KINDS
        if (
            self._key_scan is not None
            and any(kinds[f][0] for f in found)
            and self._key_scan.search(low) is not None
        ):
            return True
        return any(kinds[f][1] for f in found) and _value_found(payload, set(found))

    def __call__(self, tree: Any) -> Any:
        """A copy of the JSON ``tree`` with secrets replaced by ``[REDACTED]``."""
        return self._walk(tree)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if isinstance(k, str) and k.lower() in self.keys and v is not None:
                    out[k] = REDACTED
                else:
                    out[k] = self._walk(v)
            return out
        if isinstance(value, list):
            if (
                len(value) == 2
                and isinstance(value[0], str)
                and value[0].lower() in self.keys
                and value[1] is not None
            ):
                # A (name, value) pair: headers as a list of pairs, a tagged non-str-key map.
                return [value[0], REDACTED]
            return [self._walk(v) for v in value]
        if isinstance(value, str) and self._value_re is not None:
            return self._value_re.sub(REDACTED, value)
        return value

    def redact_bytes(self, payload: bytes) -> bytes:
        """Canonical ``payload`` with secrets redacted; the input itself when it has none."""
        if not self.needs_redaction(payload):
            return payload
        return canonical(self(orjson.loads(payload)))

    def redact_mapping(self, env: Mapping[str, str]) -> dict[str, str]:
        """Environment-style names and values: secret-looking names or values are redacted."""
        out: dict[str, str] = {}
        for name, value in env.items():
            lowered = name.lower()
            if any(part in lowered for part in ("key", "token", "secret", "password", "auth")):
                out[name] = REDACTED
            elif self._value_re is not None:
                out[name] = self._value_re.sub(REDACTED, value)
            else:
                out[name] = value
        return out


def fingerprint(kind: str, name: str, request: bytes) -> str:
    """What replay compares: a hash of the boundary and its canonical, redacted request
    (``kind NUL name NUL request``)."""
    return hashlib.sha256(_boundary_prefix(kind, name) + request).hexdigest()


@functools.lru_cache(maxsize=4096)
def _boundary_prefix(kind: str, name: str) -> bytes:
    return f"{kind}\x00{name}\x00".encode()


def genesis_hash(run_id: str) -> str:
    """The ``prev_hash`` of a run's first event."""
    return hashlib.sha256(b"replayable-chain:" + run_id.encode()).hexdigest()


def event_hash(event: Event) -> str:
    """The hash an event must carry, given the ``prev_hash`` it carries."""
    return chain_hash(
        event.prev_hash,
        (
            event.run_id,
            event.seq,
            event.chain_index,
            event.kind,
            event.name,
            event.key,
            event.parent,
            event.call_site,
            event.request,
            event.fingerprint,
            event.response,
            event.encoding,
            event.error,
            event.side_effect,
            event.started_at,
            event.duration_ns,
            event.metadata,
            event.schema_version,
        ),
    )


def run_seal(
    head: str,
    start: RunStart,
    status: str,
    output: str | None,
    error: str | None,
    ended_at: float,
    event_count: int,
) -> str:
    """The end record's ``last_hash``: the chain head hashed with the run's start and end.

    It makes the run records tamper-evident too: editing a finished run's input,
    metadata, outcome or event count breaks the seal.
    """
    return chain_hash(
        head,
        (
            "run-seal",
            start.run_id,
            start.workflow,
            start.entrypoint,
            start.parent_run_id,
            start.parent_seq,
            start.root_run_id,
            start.tenant,
            start.input,
            start.metadata,
            start.code,
            start.env_hash,
            start.lineage,
            start.started_at,
            start.schema_version,
            status,
            output,
            error,
            ended_at,
            event_count,
        ),
    )


def chain_hash(prev_hash: str, fields: tuple[Any, ...]) -> str:
    """sha256 of the previous hash and the canonical JSON of an event's fields."""
    h = hashlib.sha256(prev_hash.encode())
    h.update(orjson.dumps(fields, option=_SORT))
    return h.hexdigest()
