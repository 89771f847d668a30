"""Semantic comparison of payloads, with each difference ranked by how much it matters."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

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
        return f"{self.side}.{self.path}" if self.path else self.side

    def to_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "rank": self.rank,
        }


class Comparer:
    """Compares JSON trees. Key order and number spelling are noise by construction
    (trees are compared as values); whitespace-only string changes are noise;
    ``ignore`` paths are noise; ``significant`` paths outrank everything but
    structure; free text ranks below structured values."""

    def __init__(
        self, ignore: Iterable[str] = (), significant: Iterable[str] = (), *, defaults: bool = True
    ) -> None:
        self.ignore = tuple(ignore) + (DEFAULT_IGNORE if defaults else ())
        self.significant = tuple(significant) + (DEFAULT_SIGNIFICANT if defaults else ())

    def _ignored(self, where: str) -> bool:
        return any(
            fnmatch.fnmatchcase(where, p) or fnmatch.fnmatchcase(where, f"*.{p}")
            for p in self.ignore
        )

    def _significant(self, where: str) -> bool:
        last = where.rsplit(".", 1)[-1].split("[", 1)[0].lower()
        return any(
            fnmatch.fnmatchcase(last, p) or fnmatch.fnmatchcase(where, p) for p in self.significant
        )

    def compare(self, side: str, old: Any, new: Any) -> list[FieldChange]:
        """Every leaf difference between ``old`` and ``new``, ranked."""
        out: list[FieldChange] = []
        self._walk(side, "", _untag(old), _untag(new), out)
        return out

    def _walk(self, side: str, path: str, old: Any, new: Any, out: list[FieldChange]) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for k in sorted(set(old) | set(new), key=str):
                sub = f"{path}.{k}" if path else str(k)
                if k not in new:
                    out.append(self._change(side, sub, old[k], _MISSING, structural=True))
                elif k not in old:
                    out.append(self._change(side, sub, _MISSING, new[k], structural=True))
                else:
                    self._walk(side, sub, old[k], new[k], out)
            return
        if isinstance(old, list) and isinstance(new, list):
            for i in range(max(len(old), len(new))):
                sub = f"{path}[{i}]"
                if i >= len(new):
                    out.append(self._change(side, sub, old[i], _MISSING, structural=True))
                elif i >= len(old):
                    out.append(self._change(side, sub, _MISSING, new[i], structural=True))
                else:
                    self._walk(side, sub, old[i], new[i], out)
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
                out.append(FieldChange(side, path, old, new, "noise"))
                return
            text = _is_text(old) or _is_text(new)
            out.append(self._change(side, path, old, new, structural=False, text=text))
            return
        out.append(self._change(side, path, old, new, structural=True))

    def _change(
        self, side: str, path: str, old: Any, new: Any, *, structural: bool, text: bool = False
    ) -> FieldChange:
        where = f"{side}.{path}" if path else side
        if self._ignored(where) or self._ignored(path):
            rank: Rank = "noise"
        elif self._significant(where):
            rank = "significant"
        elif text:
            rank = "text"
        elif structural or not text:
            rank = "structural"
        else:
            rank = "text"
        return FieldChange(side, path, old, new, rank)


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
