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
import string
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

try:
    import re2 as _re2
except ImportError:  # every scan then runs on ``re``, deciding the same
    _re2 = None

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
_WORD: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
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


def _after_escape(payload: bytes, start: int) -> bool:
    """Whether a JSON escape ends right before ``start`` in ``payload``."""
    if start >= 2 and payload[start - 2] == 0x5C and payload[start - 1] in b"ntrbf":
        return True
    return (
        start >= 6
        and payload[start - 6] == 0x5C
        and payload[start - 5] == 0x75
        and all(b in _HEX for b in payload[start - 4 : start])
    )


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


# re2 (google-re2) runs the scans in one linear pass, several times faster than ``re`` on
# these alternations; it serves only where it reads a pattern exactly as ``re`` does.

#: What ``\s`` matches in a bytes pattern of ``re``; re2's ``\s`` leaves out ``\v``.
_SPACE: Final = r"\t\n\v\f\r "
#: Escapes that mean the same to re2, reading Latin-1, as to ``re`` in a bytes pattern.
_SAME_ESCAPES: Final = frozenset("dDwWtnrfva" + string.punctuation)
_REPEAT: Final = re.compile(r"\{\d+(?:,\d*)?\}")
#: A reference to a group of the pattern: it would name another group once patterns are
#: scanned apart instead of as one alternation.
_GROUP_REFERENCE: Final = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")
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


def _re2_syntax(pattern: str) -> str | None:
    """``pattern`` spelt for re2 with the meaning ``re`` gives it over bytes, or ``None``.

    Only what both engines read alike passes: ASCII literals, ``.``, ``^``, classes, groups,
    alternation, repetition and the escapes of ``_SAME_ESCAPES`` (``\\s`` is spelt out).
    The rest stays with ``re``: lookarounds, backreferences and flags, which re2 lacks;
    ``$`` (``re`` also matches it before a final newline); ``\\B`` (``re`` never matches it
    in an empty payload); ``{,n}`` (a literal to re2); a class inside a class (a POSIX class
    to re2); possessive repetition; anything not ASCII.
    """
    if not pattern.isascii():
        return None
    out: list[str] = []
    last = ""  # the token before: an "atom" can be repeated, a "repeat" made lazy
    in_class = False
    i, end = 0, len(pattern)
    while i < end:
        c = pattern[i]
        token, kind = c, "atom"
        if c == "\\":
            e = pattern[i + 1 : i + 2]
            token = pattern[i : i + 2]
            if e == "x":
                token = pattern[i : i + 4]
            elif e == "s":
                out.append(_SPACE if in_class else f"[{_SPACE}]")
                i, last = i + 2, last if in_class else "atom"
                continue
            elif e == "S" and not in_class:
                out.append(f"[^{_SPACE}]")
                i, last = i + 2, "atom"
                continue
            elif e in ("b", "A") and not in_class:
                kind = ""  # an assertion: nothing to repeat
            elif e not in _SAME_ESCAPES:
                return None
            if in_class:
                kind = last
        elif in_class:
            if c == "[":
                return None
            kind = last
            if c == "]":
                in_class, kind = False, "atom"
        elif c == "[":
            j = i + 2 if pattern.startswith("^", i + 1) else i + 1
            if pattern.startswith("]", j):
                return None
            token, kind, in_class = pattern[i:j], last, True
        elif c in "*+?{":
            if c == "{":
                repeat = _REPEAT.match(pattern, i)
                if repeat is None:
                    return None
                token = repeat.group()
            if last == "atom":
                kind = "repeat"
            elif last == "repeat" and c == "?":
                kind = "lazy"
            else:
                return None
        elif c == "$":
            return None
        elif c == "(":
            if pattern.startswith("(?", i):
                if not pattern.startswith("(?:", i):
                    return None
                token = "(?:"
            kind = ""
        elif c in "|^":
            kind = ""
        out.append(token)
        i += len(token)
        last = kind
    return "".join(out)


def _re2_compile(pattern: bytes) -> Any:
    """``pattern`` compiled by re2 reading Latin-1 (one byte, one character, as ``re``
    reads bytes), or ``None`` when re2 rejects it."""
    assert _re2 is not None
    options = _re2.Options()
    options.encoding = _re2.Options.Encoding.LATIN1
    options.log_errors = False
    try:
        return _re2.compile(pattern, options)
    except _re2.error:
        return None


def _scanned_apart(patterns: list[str]) -> bool:
    """Whether an alternation of ``patterns`` matches where one of them matches on its own:
    each compiles alone and none refers to a group by number or name."""
    for p in patterns:
        if _GROUP_REFERENCE.search(p) is not None:
            return False
        try:
            re.compile(p.encode())
        except re.error:
            return False
    return True


def _re2_scans(keys: frozenset[str], patterns: list[str]) -> tuple[Any, Any, Any] | None:
    """The scans of ``needs_redaction`` with re2: ``(scan, low_scan, rest)``, each ``None``
    when it has nothing to find, or ``None`` when re2 cannot take them.

    ``scan`` runs over the payload: the key names, case-insensitively when they are ASCII
    (re2 folds an ASCII letter to its other case only, as ``bytes.lower`` does), and every
    pattern re2 reads as ``re`` does. ``low_scan`` finds other key names in the lower-cased
    payload. ``rest`` is ``re`` over the patterns re2 does not take.
    """
    parts: list[bytes] = []
    low_scan = None
    if keys:
        names = b"|".join(_re2.escape(k.encode()) for k in sorted(keys))
        key_scan = b'"(?:' + names + b')"[' + _SPACE.encode() + b"]*[:,]"
        if all(k.isascii() for k in keys):
            parts.append(b"(?i:" + key_scan + b")")
        else:
            low_scan = _re2_compile(key_scan)
            if low_scan is None:
                return None
    rest = patterns
    if patterns and _scanned_apart(patterns):
        rest = []
        for p in patterns:
            form = _re2_syntax(p)
            if form is None or _re2_compile(form.encode()) is None:
                rest.append(p)
            else:
                parts.append(f"(?:{form})".encode())
    scan = _re2_compile(b"|".join(parts)) if parts else None
    if parts and scan is None:
        return None
    rest_scan = re.compile("|".join(f"(?:{p})" for p in rest).encode()) if rest else None
    return scan, low_scan, rest_scan


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
                out[name] = self._redact_text(value)
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
