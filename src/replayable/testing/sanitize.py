"""Personal data out of a run before it becomes a fixture, so that the run still replays.

A :class:`Sanitizer` finds personal values in every part of a run tree (the
runs' input, output, error and metadata; each event's request, response,
error and metadata; the environment snapshot) and replaces each with a
pseudonymous token. It works in two passes:

1. **Find.** The detectors (``email``, ``phone``, ``iban`` with its mod-97
   check, ``card`` with its Luhn check, ``national_id``: US SSN and UK NINO
   shapes), the configured ``names`` and the user's rules (a ``regex``, or a
   JSON ``path`` such as ``request.customer.email`` whose string value is
   taken whole) collect the values to replace.
2. **Replace.** Every occurrence of every found value, wherever it is (also
   inside a prompt that quotes a tool's result, and in its JSON-escaped form
   inside a string of JSON), becomes the same token: ``user-3f2a…@example.invalid``
   for an email, ``PHONE-…``, ``IBAN-…``, a 16-digit number starting with 9 for a
   card, ``NATID-…``, ``Person-…``, ``<RULE>-…``.

Tokens are an HMAC of the value under a salt that is random per export (give
``salt`` for reproducible output), so the same value maps to the same token
throughout one fixture and the tokens cannot be reversed by guessing values.
Because the replayed agent receives sanitized inputs and sanitized results,
the requests it makes contain the same tokens as the sanitized recording.
What this cannot see: a value the agent transforms before sending it on
(upper-casing an email, slicing a phone number), and a value written in the
agent's own code (a team mailbox it always mails): the replayed code asks with
the original, so such a run replays divergent at that step, and the divergence
names the token and the value. List such constants in ``keep``.

The :class:`Manifest` says which rule replaced how many values where, never
the values or their tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from replayable.errors import ConfigurationError

__all__ = ["DETECTORS", "Manifest", "SanitizeRules", "Sanitizer", "luhn_ok", "mod97_ok"]

TAG: Final = "$t"
#: Tags whose ``v`` holds values (walked); the others hold bytes, numbers, ids, clocks.
_VALUE_TAGS: Final = frozenset(
    {"dict", "tuple", "namedtuple", "set", "frozenset", "dataclass", "pydantic", "custom", "map"}
)
#: How many places the manifest names per rule before it only counts.
MAX_WHERE: Final = 200


def luhn_ok(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (payment card numbers)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def mod97_ok(iban: str) -> bool:
    """Whether an IBAN (spaces removed) passes its ISO 13616 mod-97 check."""
    text = iban[4:] + iban[:4]
    number = "".join(str(int(c, 36)) for c in text)
    return int(number) % 97 == 1


_EMAIL: Final = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# International (+CC …) or national (0… with separators) numbers; 8-15 digits in all.
_PHONE: Final = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}"
    r"|\(?0\d{2,4}\)?[ .-]\d{3,4}[ .-]?\d{3,4})(?![\w])"
)
_IBAN: Final = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")
# Visa, Mastercard, Amex, Discover, JCB, Diners prefixes; 13-19 digits, spaces or dashes.
_CARD: Final = re.compile(
    r"(?<![\w-])(?:3[0478]|4|5[1-5]|2[2-7]|6[05])\d(?:[ -]?\d){11,17}(?![\w-])"
)
_SSN: Final = re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])")
_NINO: Final = re.compile(
    r"\b(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
)
# A JSON escape in the text: looked through when finding values, so that
# "\nalice@x.org" inside a string of JSON is found as alice@x.org.
_ESCAPE: Final = re.compile(r"\\(?:u[0-9a-fA-F]{4}|.)")


def _emails(text: str) -> Iterator[str]:
    for m in _EMAIL.finditer(text):
        if not m.group().lower().endswith("@example.invalid"):
            yield m.group()


def _phones(text: str) -> Iterator[str]:
    for m in _PHONE.finditer(text):
        if 8 <= sum(c.isdigit() for c in m.group()) <= 15:
            yield m.group()


def _ibans(text: str) -> Iterator[str]:
    for m in _IBAN.finditer(text):
        found = m.group()
        # The pattern may run on into the next word ("… 7654 32 TICKET"): the longest
        # prefix that passes the check is the IBAN.
        ends = [i + 1 for i, c in enumerate(found) if c != " "]
        for end in reversed(ends[14:]):
            if (end == len(found) or found[end] == " ") and mod97_ok(found[:end].replace(" ", "")):
                yield found[:end]
                break


def _cards(text: str) -> Iterator[str]:
    for m in _CARD.finditer(text):
        digits = re.sub(r"[ -]", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_ok(digits):
            yield m.group()


def _national_ids(text: str) -> Iterator[str]:
    for m in _SSN.finditer(text):
        yield m.group()
    for m in _NINO.finditer(text):
        yield m.group()


#: The built-in detectors by rule name: each yields the personal values in a text.
DETECTORS: Final[dict[str, Callable[[str], Iterator[str]]]] = {
    "email": _emails,
    "phone": _phones,
    "iban": _ibans,
    "card": _cards,
    "national_id": _national_ids,
}
_HAS_DIGIT: Final = re.compile(r"\d").search
#: A JSON number long enough to be a card number (13 digits or more).
_LONG_NUMBER: Final = re.compile(r"(?<![\d.\"])\d{13,19}(?![\d.\"])")
#: A cheap test per detector: a text without it holds nothing that detector finds.
_NEEDS: Final[dict[str, Callable[[str], object]]] = {
    "email": lambda t: "@" in t,
    "phone": _HAS_DIGIT,
    "iban": _HAS_DIGIT,
    "card": _HAS_DIGIT,
    "national_id": _HAS_DIGIT,
}
_RULE_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


@dataclass(frozen=True)
class PathRule:
    """A JSON path whose string value is personal, e.g. ``request.customer.email``.

    The first part names the record part (``input``, ``output``, ``error``,
    ``metadata``, ``request``, ``response``); then keys, ``[N]`` for a list
    item and ``*`` / ``[*]`` for any. ``tool`` limits it to events of that name.
    """

    name: str
    path: str
    tool: str | None = None
    parts: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parts: list[str] = []
        for piece in re.split(r"\.(?![^\[]*\])", self.path.removeprefix("$.")):
            m = re.fullmatch(r"([^\[\]]*)((?:\[(?:\d+|\*)\])*)", piece)
            if m is None or (not m[1] and not m[2]):
                raise ConfigurationError(f"sanitize rule {self.name!r}: bad path {self.path!r}")
            if m[1]:
                parts.append(m[1])
            parts += re.findall(r"\[(\d+|\*)\]", m[2])
        if parts[0] not in _PARTS:
            raise ConfigurationError(
                f"sanitize rule {self.name!r}: path {self.path!r} must start with one of "
                + ", ".join(sorted(_PARTS))
            )
        object.__setattr__(self, "parts", tuple(parts))


_PARTS: Final = frozenset({"input", "output", "error", "metadata", "request", "response"})


@dataclass(frozen=True)
class SanitizeRules:
    """What to replace: detectors by name, a list of names, regexes and JSON paths.

    Read from a JSON or TOML file with :meth:`load`::

        {"detectors": ["email", "phone", "iban", "card", "national_id"],
         "names": ["Fiona MacLeod"], "names_files": ["people.txt"],
         "regexes": [{"name": "contract_ref", "pattern": "CR-\\\\d{6}"}],
         "paths": [{"name": "customer", "path": "request.customer_id", "tool": "lookup"}],
         "keep": ["ops@example.com"], "salt": "fixed text for reproducible tokens"}
    """

    detectors: tuple[str, ...] = tuple(DETECTORS)
    names: tuple[str, ...] = ()
    regexes: tuple[tuple[str, str], ...] = ()
    paths: tuple[PathRule, ...] = ()
    salt: bytes | None = None
    #: Values never replaced: constants of the agent's own code (a team mailbox it always
    #: writes to), which the replayed code asks with again and which must match.
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in self.detectors:
            if name not in DETECTORS:
                raise ConfigurationError(
                    f"unknown detector {name!r}; known: {', '.join(DETECTORS)}"
                )
        for name, pattern in self.regexes:
            if not _RULE_NAME.fullmatch(name):
                raise ConfigurationError(f"sanitize rule name {name!r} must be a plain word")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigurationError(
                    f"sanitize rule {name!r}: pattern {pattern!r} is not a regex: {exc}"
                ) from None

    @classmethod
    def load(cls, source: str | Path) -> SanitizeRules:
        """Rules from a ``.json`` or ``.toml`` file; ``"default"`` is the detectors alone."""
        if str(source) == "default":
            return cls()
        path = Path(source)
        if not path.is_file():
            raise ConfigurationError(f"no sanitize rules file at {path}")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".toml":
                import tomllib

                data: Any = tomllib.loads(text)
            else:
                data = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"sanitize rules {path}: cannot read: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigurationError(f"sanitize rules {path}: must be an object")
        return cls.from_mapping(data, base=path.parent, where=str(path))

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, base: Path | None = None, where: str = "rules"
    ) -> SanitizeRules:
        known = {"detectors", "names", "names_files", "regexes", "paths", "salt", "keep"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(
                f"sanitize {where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        names = [str(n) for n in data.get("names", [])]
        for f in data.get("names_files", []):
            p = (base or Path.cwd()) / str(f)
            if not p.is_file():
                raise ConfigurationError(f"sanitize {where}: no names file at {p}")
            names += [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
        try:
            regexes = tuple((str(r["name"]), str(r["pattern"])) for r in data.get("regexes", []))
            paths = tuple(
                PathRule(str(r["name"]), str(r["path"]), r.get("tool"))
                for r in data.get("paths", [])
            )
        except (KeyError, TypeError) as exc:
            raise ConfigurationError(
                f"sanitize {where}: each regex needs name and pattern, each path name and "
                f"path ({exc})"
            ) from None
        salt = data.get("salt")
        return cls(
            detectors=tuple(data.get("detectors", DETECTORS)),
            names=tuple(n for n in names if n and not n.startswith("#")),
            regexes=regexes,
            paths=paths,
            salt=None if salt is None else str(salt).encode(),
            keep=tuple(str(k) for k in data.get("keep", [])),
        )


@dataclass
class Manifest:
    """Which rule replaced how many values where; never the values."""

    counts: dict[str, int] = field(default_factory=dict)
    where: dict[str, list[str]] = field(default_factory=dict)
    distinct: dict[str, int] = field(default_factory=dict)

    def add(self, rule: str, place: str) -> None:
        self.counts[rule] = self.counts.get(rule, 0) + 1
        places = self.where.setdefault(rule, [])
        if len(places) < MAX_WHERE and (not places or places[-1] != place):
            places.append(place)

    def to_json(self) -> dict[str, Any]:
        return {
            rule: {
                "replaced": self.counts[rule],
                "values": self.distinct.get(rule, 0),
                "where": self.where.get(rule, []),
            }
            for rule in sorted(self.counts)
        }

    @property
    def total(self) -> int:
        return sum(self.counts.values())


#: One place a sanitizer reads and rewrites: a label, the record part and its JSON tree.
Document = tuple[str, str, Any]


class Sanitizer:
    """Finds personal values across documents, then replaces them with tokens.

    ``scan`` every document first (the run tree is one namespace: a value found
    in one place is replaced everywhere), then ``rewrite`` each.
    """

    def __init__(self, rules: SanitizeRules) -> None:
        self.rules = rules
        self.salt = rules.salt if rules.salt is not None else secrets.token_bytes(32)
        self.found: dict[str, str] = {}  # value -> rule that found it
        self.manifest = Manifest()
        self._names = (
            re.compile(
                r"(?<!\w)(?:"
                + "|".join(re.escape(n) for n in sorted(set(rules.names), key=len, reverse=True))
                + r")(?!\w)",
                re.IGNORECASE,
            )
            if rules.names
            else None
        )
        self._regexes = [(n, re.compile(p)) for n, p in rules.regexes]
        self._pattern: re.Pattern[str] | None = None
        self._tokens: dict[str, tuple[str, str]] = {}  # variant -> (rule, token)
        self._kept = frozenset(k.casefold() for k in rules.keep)
        self._seen: set[str] = set()

    # -- pass 1 ------------------------------------------------------------------

    def scan(self, part: str, tree: Any, tool: str | None = None) -> None:
        """Collect the personal values in one document (``part`` names what it is)."""
        for rule in self.rules.paths:
            if rule.parts[0] == part and (rule.tool is None or rule.tool == tool):
                for value in _at_path(tree, rule.parts[1:]):
                    self._keep(value, rule.name)
        seen = self._seen
        for text in _strings(tree):
            if text in seen:
                continue  # keys and values repeat across events: each text is read once
            seen.add(text)
            self._scan_text(text)
            if "\\" in text:
                self._scan_text(_ESCAPE.sub(" ", text))

    def _scan_text(self, text: str) -> None:
        for name in self.rules.detectors:
            if _NEEDS[name](text):
                for value in DETECTORS[name](text):
                    self._keep(value, name)
        if self._names is not None:
            for m in self._names.finditer(text):
                self._keep(m.group(), "name")
        for name, rx in self._regexes:
            for m in rx.finditer(text):
                self._keep(m.group(), name)

    def _keep(self, value: str, rule: str) -> None:
        if value and value not in self.found and value.casefold() not in self._kept:
            self.found[value] = rule
            self._pattern = None

    # -- pass 2 ------------------------------------------------------------------

    def token(self, value: str, rule: str) -> str:
        """The pseudonym of ``value`` found by ``rule`` (the same for every occurrence)."""
        norm = value.casefold() if rule in ("email", "name") else value
        if rule == "card":
            norm = re.sub(r"[ -]", "", value)
        digest = hmac.new(self.salt, f"{rule}\0{norm}".encode(), hashlib.sha256).hexdigest()
        if rule == "email":
            return f"user-{digest[:10]}@example.invalid"
        if rule == "card":
            return "9" + str(int(digest[:16], 16)).zfill(20)[-15:]
        if rule == "name":
            return f"Person-{digest[:8]}"
        label = {"phone": "PHONE", "iban": "IBAN", "national_id": "NATID"}.get(rule)
        return f"{label or rule.upper()}-{digest[:10]}"

    def _compile(self) -> re.Pattern[str] | None:
        if self._pattern is None and self.found:
            variants: dict[str, tuple[str, str]] = {}
            for value, rule in self.found.items():
                tok = self.token(value, rule)
                for form in _forms(value):
                    variants.setdefault(form, (rule, tok))
            self._tokens = variants
            self.manifest.distinct = {}
            for rule in self.found.values():
                self.manifest.distinct[rule] = self.manifest.distinct.get(rule, 0) + 1
            alts = sorted(variants, key=len, reverse=True)
            self._pattern = re.compile("|".join(_bounded(v) for v in alts))
        return self._pattern

    def rewrite(self, label: str, tree: Any, text: str | None = None) -> tuple[Any, bool]:
        """``tree`` with every found value replaced, and whether anything changed.

        ``text``, the JSON the tree was read from, lets a document holding no found
        value (in any of its written forms) and no long number skip the walk.
        """
        pattern = self._compile()
        if (
            text is not None
            and (pattern is None or not pattern.search(text))
            and ("card" not in self.rules.detectors or not _LONG_NUMBER.search(text))
        ):
            return tree, False
        changed = False

        def sub(text: str, where: str) -> str:
            nonlocal changed
            if pattern is None or not pattern.search(text):
                return text

            def one(m: re.Match[str]) -> str:
                rule, tok = self._tokens[m.group()]
                self.manifest.add(rule, where)
                return tok

            changed = True
            return pattern.sub(one, text)

        def card(value: int, where: str) -> int:
            nonlocal changed
            new = self._card_int(value, where)
            changed = changed or new != value
            return new

        out = _map_strings(tree, label, sub, card)
        return out, changed

    def _card_int(self, value: int, where: str) -> int:
        text = str(value)
        if (
            "card" in self.rules.detectors
            and 13 <= len(text) <= 19
            and _CARD.fullmatch(text)
            and luhn_ok(text)
        ):
            self.manifest.add("card", where)
            return int(self.token(text, "card"))
        return value


def _forms(value: str) -> Iterable[str]:
    """The value as written, and as it reads inside a string of JSON."""
    yield value
    yield json.dumps(value)[1:-1]
    yield json.dumps(value, ensure_ascii=False)[1:-1]


def _bounded(value: str) -> str:
    # Word characters next to a value mean it is part of a longer word; a JSON escape
    # (\n, \t) right before it is a line break in a string of JSON, not a letter.
    head = r"(?:(?<!\w)|(?<=\\[nrtbf]))" if value[:1].isalnum() or value[:1] == "_" else ""
    tail = r"(?!\w)" if value[-1:].isalnum() or value[-1:] == "_" else ""
    return head + re.escape(value) + tail


def _is_tag(tree: dict[str, Any]) -> bool:
    return TAG in tree and isinstance(tree.get(TAG), str)


def _strings(tree: Any) -> Iterator[str]:
    """Every string a JSON tree holds as a value or key (tag names and classes excluded)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        t = type(node)
        if t is str:
            yield node
        elif t is list:
            stack.extend(node)
        elif t is dict:
            if _is_tag(node):
                if node[TAG] in _VALUE_TAGS:
                    stack.extend(node[k] for k in ("v", "t") if k in node)
                continue
            for k, v in node.items():
                yield k
                stack.append(v)


def _map_strings(
    tree: Any,
    where: str,
    sub: Callable[[str, str], str],
    on_int: Callable[[int, str], int],
) -> Any:
    t = type(tree)
    if t is str:
        return sub(tree, where)
    if t is int:
        return on_int(tree, where) if tree >= 10**12 else tree
    if t is list:
        return [_map_strings(v, f"{where}[{i}]", sub, on_int) for i, v in enumerate(tree)]
    if t is dict:
        if _is_tag(tree):
            if tree[TAG] not in _VALUE_TAGS:
                return tree
            return {
                k: (_map_strings(v, where, sub, on_int) if k in ("v", "t") else v)
                for k, v in tree.items()
            }
        return {
            sub(k, f"{where}.<key>"): _map_strings(v, f"{where}.{k}", sub, on_int)
            for k, v in tree.items()
        }
    return tree


def _untag(node: Any) -> Any:
    while type(node) is dict and _is_tag(node) and node[TAG] in _VALUE_TAGS and "v" in node:
        node = node["v"]
    return node


def _at_path(tree: Any, parts: tuple[str, ...]) -> Iterator[str]:
    node = _untag(tree)
    if not parts:
        if type(node) is str:
            yield node
        return
    head, rest = parts[0], parts[1:]
    if type(node) is dict:
        children = list(node.values()) if head == "*" else [node[head]] if head in node else []
    elif type(node) is list:
        if head == "*":
            children = node
        elif head.isdigit() and int(head) < len(node):
            children = [node[int(head)]]
        else:
            children = []
    else:
        children = []
    for child in children:
        yield from _at_path(child, rest)
