"""re2 (google-re2) for the redaction byte scans, where it reads a pattern as ``re`` does.

re2 runs a scan in one linear pass, several times faster than ``re`` on these
alternations. It serves only where it gives the same answers: :func:`_re2_syntax`
spells a pattern for re2 or refuses it, and :func:`_re2_scans` builds the
scans of :meth:`~replayable.events.redaction.Redactor.needs_redaction`.
"""

from __future__ import annotations

import re
import string
from typing import Any, Final

try:
    import re2 as _re2
except ImportError:  # every scan then runs on ``re``, deciding the same
    _re2 = None

__all__ = ["_re2", "_re2_compile", "_re2_scans", "_re2_syntax"]

#: What ``\s`` matches in a bytes pattern of ``re``; re2's ``\s`` leaves out ``\v``.
_SPACE: Final = r"\t\n\v\f\r "
#: Escapes that mean the same to re2, reading Latin-1, as to ``re`` in a bytes pattern.
_SAME_ESCAPES: Final = frozenset("dDwWtnrfva" + string.punctuation)
_REPEAT: Final = re.compile(r"\{\d+(?:,\d*)?\}")
#: A reference to a group of the pattern: it would name another group once patterns are
#: scanned apart instead of as one alternation.
_GROUP_REFERENCE: Final = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")


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
