"""re2 (google-re2) for the redaction byte scans, where it reads a pattern as ``re`` does.

re2 runs a scan in one linear pass, several times faster than ``re`` on these
alternations. It serves only where it gives the same answers: :func:`_re2_syntax`
spells a pattern for re2 or refuses it, and :func:`_re2_matcher` runs the
scan of :meth:`~replayable.events.redaction.Redactor.needs_redaction`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any, Final

try:
    import re2 as _re2
except ImportError:  # every scan then runs on ``re``, deciding the same
    _re2 = None

__all__ = ["_SPACE", "_re2", "_re2_compile", "_re2_matcher", "_re2_syntax", "_scanned_apart"]

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


def _re2_matcher(rx: Any) -> Callable[[bytes, int], list[tuple[int, int]] | None]:
    """A search with ``rx`` from a position: the spans of the match and its groups
    (``(-1, -1)`` for a group that took no part), or ``None`` when nothing matches.

    It calls re2's own ``Match`` where the binding has it: the module's ``search`` builds
    a match object in Python, which costs more than the scan of a small payload.
    """
    raw = getattr(rx, "_regexp", None)
    anchor = getattr(getattr(_re2, "_Anchor", None), "UNANCHORED", None)
    if raw is not None and anchor is not None and hasattr(raw, "Match"):
        match = raw.Match

        def fast(data: bytes, pos: int) -> list[tuple[int, int]] | None:
            end = len(data)
            if pos > end:  # re2 reads past the text from there
                return None
            spans: list[tuple[int, int]] = match(anchor, data, pos, end)
            return None if spans[0][0] < 0 else spans

        return fast

    def slow(data: bytes, pos: int) -> list[tuple[int, int]] | None:
        if pos > len(data):
            return None
        m = rx.search(data, pos)
        return None if m is None else [m.span(i) for i in range(len(m.groups()) + 1)]

    return slow


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
