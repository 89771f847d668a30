"""Semantic comparison of payloads, with each difference ranked by how much it matters."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = ["DEFAULT_IGNORE", "DEFAULT_SIGNIFICANT", "Comparer", "FieldChange", "Rank"]

Rank = Literal["structural", "significant", "text", "noise"]
RANK_ORDER: dict[str, int] = {"structural": 0, "significant": 1, "text": 2, "noise": 3}

#: Volatile fields that never make a divergence meaningful (provider ids, timestamps, usage).
DEFAULT_IGNORE: tuple[str, ...] = (
    "*.created",
    "*.system_fingerprint",
    "*.usage",
    "*.usage.*",
    "*.x_request_id",
)

#: Fields whose change always matters (matched against the last path segment).
DEFAULT_SIGNIFICANT: tuple[str, ...] = (
    "*amount*",
    "*price*",
    "*total*",
    "*balance*",
    "*currency*",
    "*date*",
    "*deadline*",
    "*risk*",
    "*decision*",
    "*approved*",
    "*allowed*",
    "*permission*",
    "*status*",
    "*action*",
    "*target*",
    "recipient*",
    "to",
    "tool",
    "name",
    "function",
    "output",
    "arguments",
)

_MISSING: Any = "<missing>"
_WORDS = re.compile(r"\s+")


@dataclass(frozen=True)
class FieldChange:
    """One difference: where (``side`` and dotted ``path``), old and new value, and its rank."""

    side: str
    path: str
    old: Any
    new: Any
    rank: Rank

    @property
    def where(self) -> str:
        return _join(self.side, self.path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "rank": self.rank,
        }


_new = object.__new__


def field_change(side: str, path: str, old: Any, new: Any, rank: Rank) -> FieldChange:
    """``FieldChange(side, path, old, new, rank)`` at half the cost, for the hot path (one
    per changed leaf of every step): a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``; this fills the instance's ``__dict__`` at once."""
    change = _new(FieldChange)
    fields = change.__dict__
    fields["side"] = side
    fields["path"] = path
    fields["old"] = old
    fields["new"] = new
    fields["rank"] = rank
    return change


def _join(side: str, path: str) -> str:
    if not path:
        return side
    return f"{side}{path}" if path.startswith("[") else f"{side}.{path}"


#: Fields of a model response that change on every call (provider ids, timestamps, usage).
LLM_VOLATILE = frozenset(
    {"id", "created", "system_fingerprint", "usage", "x_request_id", "request_id", "service_tier"}
)


class Comparer:
    """Compares JSON trees. Key order and number spelling are noise by construction
    (trees are compared as values); whitespace-only string changes are noise;
    ``ignore`` paths are noise; ``significant`` paths outrank everything but
    structure; free text ranks below structured values. JSON carried inside a
    string (a model's structured answer) is compared as JSON."""

    def __init__(
        self, ignore: Iterable[str] = (), significant: Iterable[str] = (), *, defaults: bool = True
    ) -> None:
        self.ignore = tuple(ignore) + (DEFAULT_IGNORE if defaults else ())
        self.significant = tuple(significant) + (DEFAULT_SIGNIFICANT if defaults else ())
        alts = [fnmatch.translate(p) for p in self.ignore]
        alts += [fnmatch.translate(f"*.{p}") for p in self.ignore]
        self._ignore_re = re.compile("|".join(alts)) if alts else None
        sig = [fnmatch.translate(p) for p in self.significant]
        self._significant_re = re.compile("|".join(sig)) if sig else None
        # Paths repeat across steps (response.price in every lookup): judge each once.
        self._ranks: dict[tuple[str, bool, bool], Rank] = {}

    def compare(
        self, side: str, old: Any, new: Any, *, kind: str | None = None
    ) -> list[FieldChange]:
        """Every leaf difference between ``old`` and ``new``, ranked. For ``kind="llm"``
        provider ids, timestamps and usage are noise."""
        out: list[FieldChange] = []
        if old == new and type(old) is type(new):
            return out
        self._walk(side, "", _untag(old), _untag(new), out)
        return _llm_noise(out) if kind == "llm" else out

    def compare_text(
        self, side: str, old: str | None, new: str | None, *, kind: str | None = None
    ) -> list[FieldChange]:
        """:meth:`compare` of two stored JSON texts (``None`` for no value). A text that
        cannot hold a type tag is compared as parsed, without the untagging copy."""
        if old == new:
            return []
        a = None if old is None else orjson.loads(old)
        b = None if new is None else orjson.loads(new)
        if a == b and type(a) is type(b):
            return []
        if _may_be_tagged(old) or _may_be_tagged(new):
            return self.compare(side, a, b, kind=kind)
        out: list[FieldChange] = []
        self._walk(side, "", a, b, out)
        return _llm_noise(out) if kind == "llm" else out

    def _walk(self, side: str, path: str, old: Any, new: Any, out: list[FieldChange]) -> None:
        # An equal leaf (same type, same value) is skipped before the recursive call and
        # before its path is spelled: in two long runs nearly every leaf is one.
        if isinstance(old, dict) and isinstance(new, dict):
            keys: Iterable[Any] = old.keys()
            if keys != new.keys():
                keys = old.keys() | new.keys()
            for k in sorted(keys, key=str):
                if k not in new:
                    sub = f"{path}.{k}" if path else str(k)
                    out.append(self._change(side, sub, old[k], _MISSING, structural=True))
                elif k not in old:
                    sub = f"{path}.{k}" if path else str(k)
                    out.append(self._change(side, sub, _MISSING, new[k], structural=True))
                else:
                    a, b = old[k], new[k]
                    if type(a) is type(b) and not isinstance(a, _CONTAINERS) and a == b:
                        continue
                    self._walk(side, f"{path}.{k}" if path else str(k), a, b, out)
            return
        if isinstance(old, list) and isinstance(new, list):
            n_old, n_new = len(old), len(new)
            for i in range(max(n_old, n_new)):
                if i >= n_new:
                    out.append(
                        self._change(side, f"{path}[{i}]", old[i], _MISSING, structural=True)
                    )
                elif i >= n_old:
                    out.append(
                        self._change(side, f"{path}[{i}]", _MISSING, new[i], structural=True)
                    )
                else:
                    a, b = old[i], new[i]
                    if type(a) is type(b) and not isinstance(a, _CONTAINERS) and a == b:
                        continue
                    self._walk(side, f"{path}[{i}]", a, b, out)
            return
        if old == new and type(old) is type(new):
            return
        if (
            isinstance(old, (int, float))
            and isinstance(new, (int, float))
            and not isinstance(old, bool)
            and not isinstance(new, bool)
            and old == new
        ):
            return  # 1 and 1.0: number spelling, not a change
        if isinstance(old, str) and isinstance(new, str):
            if _WORDS.sub(" ", old).strip() == _WORDS.sub(" ", new).strip():
                out.append(field_change(side, path, old, new, "noise"))
                return
            inner = _json_pair(old, new)
            if inner is not None:
                self._walk(side, path, inner[0], inner[1], out)
                return
            text = _is_text(old) or _is_text(new)
            out.append(self._change(side, path, old, new, structural=not text))
            return
        out.append(self._change(side, path, old, new, structural=True))

    def _change(self, side: str, path: str, old: Any, new: Any, *, structural: bool) -> FieldChange:
        key = (_join(side, path), structural, True)
        rank = self._ranks.get(key)
        if rank is None:
            where = key[0]
            if self._matches(self._ignore_re, where) or self._matches(self._ignore_re, path):
                rank = "noise"
            elif self._significant(where):
                rank = "significant"
            else:
                rank = "structural" if structural else "text"
            self._ranks[key] = rank
        return field_change(side, path, old, new, rank)

    @staticmethod
    def _matches(rx: re.Pattern[str] | None, text: str) -> bool:
        return rx is not None and rx.match(text) is not None

    def _significant(self, where: str) -> bool:
        last = _last(where).lower()
        return self._matches(self._significant_re, last) or self._matches(
            self._significant_re, where
        )


_CONTAINERS = (dict, list)


def _llm_noise(changes: list[FieldChange]) -> list[FieldChange]:
    """A model response's provider ids, timestamps and usage ranked as noise."""
    return [
        FieldChange(c.side, c.path, c.old, c.new, "noise")
        if _last(c.path) in LLM_VOLATILE or _has_volatile_parent(c.path)
        else c
        for c in changes
    ]


def _may_be_tagged(text: str | None) -> bool:
    """Whether stored JSON text can hold a type tag (an object with a ``"$t"`` key): not
    without that string in it, unless escapes spell it (the codec never writes them)."""
    return text is not None and ('"$t"' in text or "\\u" in text)


def _last(path: str) -> str:
    return path.rsplit(".", 1)[-1].split("[", 1)[0]


def _has_volatile_parent(path: str) -> bool:
    return any(part.split("[", 1)[0] == "usage" for part in path.split("."))


def _json_pair(old: str, new: str) -> tuple[Any, Any] | None:
    """Both strings parsed as JSON objects or arrays, else ``None``."""
    a, b = old.lstrip()[:1], new.lstrip()[:1]
    if a not in ("{", "[") or b not in ("{", "["):
        return None
    try:
        return orjson.loads(old), orjson.loads(new)
    except orjson.JSONDecodeError:
        return None


def _is_text(value: str) -> bool:
    """Natural-language text, as opposed to an identifier or a code."""
    return len(value) > 24 and value.count(" ") >= 3


def _untag(tree: Any) -> Any:
    """A tagged tree as plain values for comparison (type tags kept only where they carry
    meaning: a tuple compares like a list, a model like its fields)."""
    if isinstance(tree, list):
        return [_untag(v) for v in tree]
    if isinstance(tree, dict):
        tag = tree.get("$t")
        if tag is None:
            return {k: _untag(v) for k, v in tree.items()}
        if tag in (
            "tuple",
            "set",
            "frozenset",
            "namedtuple",
            "dataclass",
            "pydantic",
            "dict",
            "custom",
        ):
            return _untag(tree["v"])
        if tag == "enum":
            return tree["name"]
        if tag == "map":
            return {str(_untag(k)): _untag(v) for k, v in tree["v"]}
        if tag == "float":
            return float(tree["v"])
        if tag == "int":
            return int(tree["v"])
        return tree.get("v")
    return tree
