"""Redaction: secrets are replaced before anything is fingerprinted or stored.

A :class:`Redactor` first scans the serialized bytes (most payloads hold no
secret, and then nothing else runs), then walks the JSON tree of a payload
that may hold one. What counts as a secret is in
:mod:`~replayable.events._secrets` (names and value shapes); bytes, compressed
bodies and recorded streams are handled by :mod:`~replayable.events._payloads`.
The byte scans run on google-re2 where it reads a pattern as ``re`` does, and
on ``re`` otherwise.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from replayable.events import _payloads
from replayable.events._re2 import (
    _SPACE,
    _re2,
    _re2_compile,
    _re2_matcher,
    _re2_syntax,
    _scanned_apart,
)
from replayable.events._secrets import (
    DETECTORS,
    KEY_FRAGMENTS,
    NAME_FRAGMENT,
    Detector,
    name_fragment_re2,
    query_secret_name,
    secret_name,
)
from replayable.events.codec import TAG, dump_tree

__all__ = ["REDACTED", "Redactor", "query_secret_name", "secret_name"]

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

#: The default value patterns: the text form of each detector, in order. A redactor
#: given these (as the writer process is) uses the detectors themselves.
_DEFAULT_VALUE_PATTERNS: Final = tuple(d.text for d in DETECTORS)
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
#: Serialized text that sends a payload to the walk whatever else it holds: a ``bytes``
#: value (base64, which no pattern reads), and a recorded stream.
_BYTES_TAG: Final = f'"{TAG}":"byte'
#: A string with a lone surrogate, which the codec stores as its UTF-8 bytes in base64.
_STR_TAG: Final = f'"{TAG}":"str"'
_STREAM: Final = '"chunks":['
_STREAM_B: Final = _STREAM.encode()


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


_ESCAPE_BEFORE: Final = re.compile(rf"(?:{_ESCAPE})\Z".encode())


def _after_escape(payload: bytes, start: int) -> bool:
    """Whether a JSON escape (``_ESCAPE``, two or six bytes) ends right before ``start``."""
    return _ESCAPE_BEFORE.search(payload, max(0, start - 6), start) is not None


#: Detector patterns compiled once a process, when first used (a writer that never meets
#: a fragment never compiles the detector).
_compiled = functools.lru_cache(maxsize=None)(re.compile)


@functools.lru_cache(maxsize=16)
def _hides(fragments: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """For each fragment, the fragments a match of it may hide from ``findall`` (which does
    not overlap its matches): those inside it, and those its end may begin."""
    frags = list(dict.fromkeys(fragments))
    # Each fragment's proper prefixes, and which fragments begin with each: a fragment
    # ``f`` reaches ``g`` through its end where one of ``f``'s suffixes is such a prefix
    # of ``g``. A lookup per suffix, not a comparison per pair (the writer builds this at
    # start-up, for a few hundred fragments).
    starting: dict[str, list[str]] = {}
    for g in frags:
        for n in range(1, len(g)):
            starting.setdefault(g[:n], []).append(g)
    longest = max((len(g) for g in frags), default=0)
    out: dict[str, frozenset[str]] = {}
    for f in frags:
        found = {g for g in frags if g != f and g in f}
        for n in range(1, min(len(f), longest - 1) + 1):
            found.update(starting.get(f[-n:], ()))
        found.discard(f)
        out[f] = frozenset(found)
    return out


#: Below this size a payload is scanned by ``re``, and below the next a string is not
#: checked by re2 first. re2 releases the interpreter lock on every call: where another
#: thread waits for it (the writer process runs several), giving it up and waiting to get
#: it back costs more than re2 saves on a smaller text (in the writer process, about even
#: at 300 to 450 bytes, re2 ahead from 600).
_RE2_MIN_PAYLOAD: Final = 0
_TEXT_HINT_MIN: Final = 512


class _Scan:
    """One detector's byte scan (``re``): over the lower-cased payload when ``lower``."""

    __slots__ = ("bounded", "lower", "pattern")

    def __init__(self, detector: Detector) -> None:
        pattern = detector.scan.replace("{name}", rf"(?:{NAME_FRAGMENT.pattern})[a-z0-9_.\-]*")
        self.pattern = _serialized(pattern).encode()
        self.lower = detector.lower
        self.bounded = detector.bounded

    def found(self, payload: bytes, low: bytes) -> bool:
        text = low if self.lower else payload
        rx = _compiled(self.pattern)
        m = rx.search(text)
        if not self.bounded:
            return m is not None
        while m is not None:
            start = m.start()
            if start == 0 or text[start - 1] not in _WORD or _after_escape(text, start):
                return True
            m = rx.search(text, start + 1)  # a later start may still match
        return False


class Redactor:
    """Replaces secrets in a JSON payload before it is fingerprinted or stored.

    A value is redacted when its key is a secret-looking name (``authorization``,
    ``db_password``, ``X-Auth-Token``, ``openai_api_key`` …: see
    :func:`~replayable.events._secrets.secret_name`; with ``key_words=False`` only the
    names in ``keys``, matched case-insensitively), when it is the second item of a
    ``[name, value]`` pair with such a name (headers as a list of pairs), or where a
    string holds a secret shape (``sk-…``, a JWT, a private-key block, the password of
    ``postgresql://u:pass@h``, ``password=…`` …). Bytes are looked at decoded and
    decompressed; a recorded stream as the text its events assemble into. The check
    runs first over the serialized bytes, so payloads without secrets cost one scan.
    """

    def __init__(
        self,
        keys: Iterable[str] = _DEFAULT_SECRET_KEYS,
        value_patterns: Iterable[str] = _DEFAULT_VALUE_PATTERNS,
        *,
        extra_keys: Iterable[str] = (),
        extra_patterns: Iterable[str] = (),
        key_words: bool = True,
    ) -> None:
        self.keys = frozenset(k.lower() for k in (*keys, *extra_keys))
        self.key_words = key_words
        patterns = [*value_patterns, *extra_patterns]
        self.patterns = tuple(patterns)
        n = len(_DEFAULT_VALUE_PATTERNS)
        builtin = tuple(patterns[:n]) == _DEFAULT_VALUE_PATTERNS
        self._detectors: tuple[Detector, ...] = DETECTORS if builtin else ()
        user = patterns[n:] if builtin else patterns
        self._user_patterns = tuple(user)
        self._text_rx = self._detectors
        self._user_re = re.compile("|".join(f"(?:{p})" for p in user)) if user else None
        # Names the word rule does not cover are scanned for as they are.
        exact = sorted(
            (k for k in self.keys if not (key_words and secret_name(k))), key=len, reverse=True
        )
        self._exact = tuple(exact)
        key_alt = "|".join(re.escape(k) for k in exact)
        # A secret name followed by ':' (a dict key) or ',' (the name of a pair), matched
        # on the lower-cased payload: a case-insensitive regex costs ten times more.
        self._key_scan = re.compile(rf'"(?:{key_alt})"\s*[:,]'.encode()) if exact else None
        self._name_scan = (
            re.compile(rf'(?:{NAME_FRAGMENT.pattern})[a-z0-9_.\- ]*"\s*[:,]'.encode())
            if key_words
            else None
        )
        serialized = [_serialized(p) for p in user]
        self._user_scan = (
            re.compile("|".join(f"(?:{p})" for p in serialized).encode()) if user else None
        )
        # One pass over the lower-cased payload for the fragments every secret name and
        # every detector's match contains; most payloads hold none, and then only the
        # user's own keys and patterns are scanned for.
        self._scans = {id(d): _Scan(d) for d in self._detectors}
        by_fragment: dict[str, list[Detector]] = {}
        for d in self._detectors:
            for f in d.fragments:
                by_fragment.setdefault(f, []).append(d)
        names = KEY_FRAGMENTS if key_words else ()
        fragments = [*names, *by_fragment, _BYTES_TAG, _STR_TAG, _STREAM]
        hides = _hides(tuple(fragments))
        self._dispatch: dict[bytes, tuple[bool, tuple[Detector, ...], bool]] = {}
        for f in fragments:
            reach = {f, *hides[f]}
            dets = tuple(dict.fromkeys(d for g in reach for d in by_fragment.get(g, ())))
            self._dispatch[f.encode()] = (
                any(g in names for g in reach),
                dets,
                bool(reach & {_BYTES_TAG, _STR_TAG, _STREAM}),
            )
        alternation = "|".join(
            "token(?!s)" if f == "token" and key_words else re.escape(f) for f in fragments
        )
        self._prefilter = _compiled(alternation.encode())
        self._text_prefilter = _compiled(alternation)
        self._nothing = not (self.keys or self.patterns or key_words)
        self._re2_pattern = b""  # what re2 scans for, once built
        self._re2_scans = self._build_re2() if _re2 is not None else None
        # Over a long string, re2 first rules out one that holds no fragment at all.
        self._text_hint = (
            _re2_compile(("(?i:" + "|".join(re.escape(f) for f in fragments) + ")").encode())
            if _re2 is not None and self._user_re is None
            else None
        )

    # -- the byte scans --------------------------------------------------------------

    def _build_re2(self) -> tuple[Any, Any] | None:
        """``(scan, rest)``: one re2 pass over the payload (secret-name candidates in group
        1, the user's names, the detectors, the user's patterns, the bytes tag; ASCII case
        folded where the ``re`` scans read the lower-cased payload), and ``re`` for the
        patterns re2 does not read as ``re`` does."""
        # Group 1: a candidate secret name; group 2: a recorded stream.
        name = f'(?i:"[a-z0-9_.\\-]*{name_fragment_re2()}"[{_SPACE}]*[:,])'
        parts = [
            f"({name})" if self.key_words else "(\\b\\B)",  # \b\B never matches
            f"({re.escape(_STREAM)})",
            re.escape(_BYTES_TAG),
            re.escape(_STR_TAG),
        ]
        rest: list[str] = []
        if self._exact:
            if not all(k.isascii() for k in self._exact):
                return None
            names = "|".join(re.escape(k) for k in self._exact)
            parts.append(f'(?i:"(?:{names})"[{_SPACE}]*[:,])')
        for d in self._detectors:
            spelt = _re2_syntax(_serialized(d.scan.replace("{name}", name_fragment_re2())))
            if spelt is None:
                return None
            if d.bounded:
                spelt = rf"(?:\b|{_ESCAPE}){spelt}"
            parts.append(f"(?i:{spelt})" if d.lower else spelt)
        user = [_serialized(p) for p in self._user_patterns]
        if not _scanned_apart(user):
            rest = user  # one alternation, its groups numbered as ``re`` numbers them
            user = []
        for p in user:
            spelt = _re2_syntax(p)
            if spelt is None or _re2_compile(spelt.encode()) is None:
                rest.append(p)
            else:
                parts.append(f"(?:{spelt})")
        self._re2_pattern = "|".join(parts).encode()
        scan = _re2_compile(self._re2_pattern)
        if scan is None:
            return None
        rest_scan = re.compile("|".join(f"(?:{p})" for p in rest).encode()) if rest else None
        return _re2_matcher(scan), rest_scan

    def needs_redaction_any(self, payloads: list[bytes]) -> bool:
        """Whether any of the serialized ``payloads`` may hold a secret: one scan over
        them all (a writer's batch), where ``needs_redaction`` of each would pay its
        calls thousands of times.

        The payloads are scanned joined by a newline. That never hides a secret: every
        scan matches within one payload as it matches that payload alone (a newline
        stands where the payload's edge stood: not a word character, and never inside
        canonical JSON, which escapes it), and what straddles two payloads only sends
        them to the per-payload check. Patterns of the user's own, which may anchor
        (``^``, ``$``) or look around, are checked payload by payload.
        """
        if self._nothing:
            return False
        if self._user_patterns or self._re2_scans is None:
            return any(self.needs_redaction(p) for p in payloads)
        return self.needs_redaction(b"\n".join(payloads))

    def _name_found(self, payload: bytes, start: int, end: int) -> bool:
        """Whether the candidate name a scan found at ``start:end`` (from within the name,
        or its opening quote, to the ``:`` or ``,`` after it) is a secret name."""
        close = payload.rfind(b'"', start + 1, end)
        open_ = payload.rfind(b'"', max(0, start - 81), start + 1)
        if open_ < 0 or close < 0:
            return False
        try:
            name = payload[open_ + 1 : close].decode("ascii")
        except UnicodeDecodeError:
            return False
        return self.secret_key(name)

    def needs_redaction(self, payload: bytes) -> bool:
        """Whether serialized ``payload`` may hold a secret (a cheap, conservative scan)."""
        if self._nothing:
            return False
        scans = self._re2_scans
        if scans is not None and len(payload) >= _RE2_MIN_PAYLOAD:
            search, rest = scans
            if rest is not None and rest.search(payload) is not None:
                return True
            pos = 0
            while (spans := search(payload, pos)) is not None:
                name_start, name_end = spans[1]
                if name_start >= 0:
                    if self._name_found(payload, name_start, name_end):
                        return True
                    # Not a secret name: what else the name's text holds is looked at.
                    pos = name_start + 1
                elif spans[2][0] < 0 or self._bare_stream(payload, spans[2][0]):
                    return True
                else:
                    pos = spans[0][1]  # a stream with its assembled text: read on
            return False
        low = payload.lower()
        if self._key_scan is not None and self._key_scan.search(low) is not None:
            return True
        if self._user_scan is not None and self._user_scan.search(payload) is not None:
            return True
        prefilter = self._prefilter
        if prefilter is None:  # every scan, as the pre-filter would choose them at most
            names, special = self.key_words, True
            detectors = {id(d): d for d in self._detectors}
        else:
            found = prefilter.findall(low)
            if not found:
                return False
            names = special = False
            detectors = {}
            dispatch = self._dispatch
            for f in set(found):
                n, dets, s = dispatch[f]
                names = names or n
                special = special or s
                for d in dets:
                    detectors[id(d)] = d
        if special and (
            _BYTES_TAG.encode() in payload
            or _STR_TAG.encode() in payload
            or self._bare_stream(payload)
        ):
            return True
        if names and self._name_scan is not None:
            m = self._name_scan.search(low)
            while m is not None:
                if self._name_found(payload, m.start(), m.end()):
                    return True
                m = self._name_scan.search(low, m.end())
        by_id = self._scans
        return any(by_id[i].found(payload, low) for i in detectors)

    @staticmethod
    def _bare_stream(payload: bytes, at: int | None = None) -> bool:
        """A recorded stream without the text it assembles into, which the scans read.

        The assembled text is stored after the stream (``at``: where its chunks are); it
        is looked for there first, so that a long stream is not searched over again."""
        if at is None:
            at = payload.find(_STREAM_B)
        if at < 0:
            return False
        found = payload.find(b'"assembled"', at)
        if found < 0:
            found = payload.find(b'"assembled"')
        return found < 0 or payload.startswith(b'"assembled":null', found)

    # -- the walk --------------------------------------------------------------------

    def __call__(self, tree: Any) -> Any:
        """A copy of the JSON ``tree`` with secrets replaced by ``[REDACTED]``."""
        return self._walk(tree, True)

    def secret_key(self, name: str) -> bool:
        """Whether values under ``name`` (a key, header, variable) are redacted whole."""
        return name.lower() in self.keys or (self.key_words and secret_name(name))

    def _walk(self, value: Any, text: bool) -> Any:
        if isinstance(value, dict):
            if text:
                special = self._special(value)
                if special is not None:
                    return special
            out = {}
            for k, v in value.items():
                if isinstance(k, str) and v is not None and self.secret_key(k):
                    out[k] = REDACTED
                else:
                    out[k] = self._walk(v, text)
            return out
        if isinstance(value, list):
            if (
                len(value) == 2
                and isinstance(value[0], str)
                and value[1] is not None
                and self.secret_key(value[0])
            ):
                # A (name, value) pair: headers as a list of pairs, a tagged non-str-key map.
                return [value[0], REDACTED]
            return [self._walk(v, text) for v in value]
        if text and isinstance(value, str):
            return self._redact_text(value)
        return value

    def _special(self, node: dict[str, Any]) -> Any:
        """A tagged ``bytes`` value or a recorded stream, redacted; ``None`` for other dicts."""
        tag = node.get(TAG)
        if (tag == "bytes" or tag == "bytearray") and len(node) == 2:
            return _payloads.redact_tagged_bytes(node, self._redact_document, self._spans) or node
        if tag == "str" and len(node) == 2 and isinstance(node.get("v"), str):
            try:
                text = base64.b64decode(node["v"]).decode("utf-8", "surrogatepass")
            except (ValueError, UnicodeDecodeError):
                return node
            redacted = self._redact_text(text)
            if redacted == text:
                return node
            raw = redacted.encode("utf-8", "surrogatepass")
            return {TAG: "str", "v": base64.b64encode(raw).decode()}
        chunks = node.get("chunks")
        if "data" not in node or not isinstance(chunks, list):
            return None
        if not all(isinstance(c, list) and c and isinstance(c[0], int) for c in chunks):
            return None
        out = {k: (v if k in ("data", "chunks") else self._walk(v, True)) for k, v in node.items()}
        data = node["data"]
        sizes = [c[0] for c in chunks]
        if isinstance(data, str):
            done = _payloads.redact_stream(
                data,
                sizes,
                self._spans,
                self._redact_text,
                lambda v: self._walk(v, False),
                REDACTED,
            )
            if done is None:
                return out
            out["data"], new_sizes = done
        elif isinstance(data, dict) and data.get(TAG) in ("bytes", "bytearray"):
            body = _payloads.redact_tagged_bytes(data, self._redact_document, self._spans)
            if body is None:
                return out
            old = len(base64.b64decode(data["v"]))
            new = len(base64.b64decode(body["v"]))
            out["data"], new_sizes = body, _payloads.rescale(sizes, old, new)
        else:
            return out
        out["chunks"] = [[n, *c[1:]] for n, c in zip(new_sizes, chunks, strict=True)]
        return out

    # -- text ------------------------------------------------------------------------

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Where ``text`` holds secrets: sorted, disjoint ``(start, end)`` spans."""
        spans: list[tuple[int, int]] = []
        if self._text_rx:
            found = self._text_prefilter.findall(text.lower())
            if found:
                wanted: set[int] = set()
                dispatch = self._dispatch
                for f in set(found):
                    wanted.update(id(d) for d in dispatch[f.encode()][1])
                for d in self._text_rx:
                    if id(d) in wanted:
                        self._matches(d, _compiled(d.text), text, spans)
        if self._user_re is not None:
            spans.extend(m.span() for m in self._user_re.finditer(text) if m.end() > m.start())
        if not spans:
            return spans
        spans.sort()
        merged = [spans[0]]
        for s, e in spans[1:]:
            last_s, last_e = merged[-1]
            if s <= last_e:
                merged[-1] = (last_s, max(last_e, e))
            else:
                merged.append((s, e))
        return merged

    @staticmethod
    def _matches(d: Detector, rx: re.Pattern[str], text: str, spans: list[tuple[int, int]]) -> None:
        check = d.check
        secret = "secret" in rx.groupindex
        m = rx.search(text)
        while m is not None:
            if check is not None and not check(m):
                m = rx.search(text, m.start() + 1)  # a later start may still be one
                continue
            span = m.span("secret") if secret else m.span()
            if span[1] > span[0]:
                spans.append(span)
            m = rx.search(text, max(m.end(), m.start() + 1))

    def _redact_text(self, text: str) -> str:
        """``text`` with every secret in it replaced."""
        hint = self._text_hint
        if (
            hint is not None
            and len(text) >= _TEXT_HINT_MIN
            and hint.search(text.encode("utf-8", "surrogatepass")) is None
        ):
            return text
        spans = self._spans(text)
        return _payloads.splice(text, spans, REDACTED) if spans else text

    def _redact_document(self, text: str) -> str:
        """A body's text: JSON lines (or server-sent events) as JSON, anything else as text."""
        done = _payloads.redact_stream(
            text, [], self._spans, self._redact_text, lambda v: self._walk(v, False), REDACTED
        )
        return text if done is None else done[0]

    def redact_text(self, text: str) -> str:
        """``text`` (an error message, a repr) with the secrets it holds replaced."""
        return self._redact_text(text)

    def redact_object(self, value: Any, depth: int = 0) -> Any:
        """A copy of a live Python value (a paused frame's local) for showing: strings,
        containers and values under secret names redacted; other objects as they are."""
        if isinstance(value, str):
            return self._redact_text(value)
        if depth > 8:
            return value
        if isinstance(value, dict):
            return {
                k: REDACTED
                if isinstance(k, str) and v is not None and self.secret_key(k)
                else self.redact_object(v, depth + 1)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple | set | frozenset) and type(value) in (
            list,
            tuple,
            set,
            frozenset,
        ):
            return type(value)(self.redact_object(v, depth + 1) for v in value)
        if isinstance(value, bytes):
            return _payloads.redact_blob(value, self._redact_document, self._spans)
        return value

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
            if self.secret_key(name) or any(
                part in lowered for part in ("key", "token", "secret", "password", "auth")
            ):
                out[name] = REDACTED
            else:
                out[name] = self._redact_text(value)
        return out
