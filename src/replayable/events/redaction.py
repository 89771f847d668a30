"""Redaction: secrets are replaced before anything is fingerprinted or stored.

A :class:`Redactor` first scans the serialized bytes (most payloads hold no
secret, and then nothing else runs), then walks the JSON tree of a payload
that may hold one. The byte scans run on google-re2 where it reads a pattern
as ``re`` does, and on ``re`` otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from replayable.events._re2 import _re2, _re2_compile, _re2_scans
from replayable.events.codec import dump_tree

__all__ = ["REDACTED", "Redactor"]

REDACTED: Final = "[REDACTED]"

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
_WORD: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
#: A JSON escape in serialized bytes (``\n``, ``\t`` … ``\u0001``): in the text it
#: stands for a character that is not a word character.
_ESCAPE: Final = r"\\(?:[ntrbf]|u[0-9A-Fa-f]{4})"
#: What ``\s`` matches in the text, as it stands in canonical JSON bytes (orjson: UTF-8,
#: control characters escaped): a space or other ASCII space, an escaped one, or the
#: UTF-8 bytes of a Unicode space (no-break, en and em spaces, ideographic space …).
_SERIALIZED_SPACE: Final = (
    r"(?:[\t\n\x0b\x0c\r\x1c-\x1f ]|\\[ntrf]|\\u00(?:0[bB]|1[c-fC-F])"
    r"|\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80)"
)


def _serialized(pattern: str) -> str:
    """``pattern`` for a scan over serialized JSON, matching wherever it matches the text.

    ``"key:\\nsk-…"`` holds a newline and then the key, but in its bytes the ``n`` of the
    escape stands before ``sk-``: a leading ``\\b`` also holds right after a JSON escape.
    ``\\s`` outside a class also matches an escaped space and a Unicode space's bytes.
    """
    if pattern.startswith(r"\b"):
        pattern = rf"(?:\b|{_ESCAPE}){pattern[2:]}"
    out: list[str] = []
    i, end = 0, len(pattern)
    in_class = False
    while i < end:
        c = pattern[i]
        if c == "\\":
            pair = pattern[i : i + 2]
            out.append(_SERIALIZED_SPACE if pair == r"\s" and not in_class else pair)
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            # A "]" first in a class (after an optional "^") is a literal.
            j = i + 2 if pattern.startswith("^", i + 1) else i + 1
            if pattern.startswith("]", j):
                out.append(pattern[i : j + 1])
                i = j + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


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
    b"bearer": (re.compile(_serialized(r"Bearer\s+[A-Za-z0-9._~+/=\-]{8,}").encode()), True),
    b"private key": (re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----"), False),
}
#: Every default value pattern contains one of these, lower-cased.
_VALUE_FRAGMENTS: Final = tuple(f.decode() for f in _VALUE_SCANS)


#: For each fragment: (may be part of a secret key name, may start a secret value). A
#: fragment whose end may begin a key fragment counts as part of a key name too: ``findall``
#: does not overlap its matches, so in "akiauth" it finds "akia" and never sees "auth".
_FRAGMENT_KINDS: Final = {
    f.encode(): (
        any(k in f or any(f.endswith(k[:n]) for n in range(1, len(k))) for k in _KEY_FRAGMENTS),
        f in _VALUE_FRAGMENTS,
    )
    for f in (*_KEY_FRAGMENTS, *_VALUE_FRAGMENTS)
}


_ESCAPE_BEFORE: Final = re.compile(rf"(?:{_ESCAPE})\Z".encode())


def _after_escape(payload: bytes, start: int) -> bool:
    """Whether a JSON escape (``_ESCAPE``, two or six bytes) ends right before ``start``."""
    return _ESCAPE_BEFORE.search(payload, max(0, start - 6), start) is not None


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
            if (
                not bounded
                or start == 0
                or payload[start - 1] not in _WORD
                or _after_escape(payload, start)
            ):
                return True
            m = rx.search(payload, start + 1)  # a later start may still match
    return False


#: Text every match of a default value pattern contains, case and all: a string holding
#: none of them is left as it is without running the patterns over it.
_DEFAULT_VALUE_LITERALS: Final = (
    "sk-",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "xox",
    "AKIA",
    "Bearer",
    "-----BEGIN ",
)
#: Below this size a payload is scanned by ``re``, and below the next a string is not
#: checked by re2 first. re2 releases the interpreter lock on every call: where another
#: thread waits for it (the writer process runs several), giving it up and waiting to get
#: it back costs more than re2 saves on a smaller text (in the writer process, about even
#: at 300 to 450 bytes, re2 ahead from 600).
_RE2_MIN_PAYLOAD: Final = 512
_TEXT_HINT_MIN: Final = 512


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

        serialized = [_serialized(p) for p in patterns]
        self._value_scan = (
            re.compile("|".join(f"(?:{p})" for p in serialized).encode()) if patterns else None
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
        # With re2 the scans above serve only for what it does not take, and there is no
        # pre-filter: one re2 pass over everything costs less than the pre-filter alone.
        self._re2_scans = _re2_scans(self.keys, serialized) if _re2 is not None else None
        # Over a string the value patterns stay with ``re``, whose Unicode reading of ``\b``
        # and ``\s`` re2 does not share; re2 only rules out long strings that hold none of
        # the defaults' literal text.
        self._text_hint = (
            _re2_compile("|".join(re.escape(t) for t in _DEFAULT_VALUE_LITERALS).encode())
            if _re2 is not None and tuple(patterns) == _DEFAULT_VALUE_PATTERNS
            else None
        )

    def needs_redaction(self, payload: bytes) -> bool:
        """Whether serialized ``payload`` may hold a secret (a cheap, conservative scan)."""
        scans = self._re2_scans
        if scans is not None and len(payload) >= _RE2_MIN_PAYLOAD:
            scan, low_scan, rest = scans
            return (
                (scan is not None and scan.search(payload) is not None)
                or (low_scan is not None and low_scan.search(payload.lower()) is not None)
                or (rest is not None and rest.search(payload) is not None)
            )
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
            return self._redact_text(value)
        return value

    def _redact_text(self, text: str) -> str:
        """``text`` with every match of the value patterns replaced."""
        hint = self._text_hint
        if (
            hint is not None
            and len(text) >= _TEXT_HINT_MIN
            and hint.search(text.encode("utf-8", "surrogatepass")) is None
        ):
            return text
        assert self._value_re is not None
        return self._value_re.sub(REDACTED, text)

    def redact_bytes(self, payload: bytes) -> bytes:
        """``payload`` with secrets redacted, its keys in the order they had (a canonical
        request stays canonical, a stored value keeps its order); the input itself when
        it has none."""
        if not self.needs_redaction(payload):
            return payload
        return dump_tree(self(orjson.loads(payload)))

    def redact_mapping(self, env: Mapping[str, str]) -> dict[str, str]:
        """Environment-style names and values: secret-looking names or values are redacted."""
        out: dict[str, str] = {}
        for name, value in env.items():
            lowered = name.lower()
            if any(part in lowered for part in ("key", "token", "secret", "password", "auth")):
                out[name] = REDACTED
            elif self._value_re is not None:
                out[name] = self._redact_text(value)
            else:
                out[name] = value
        return out
