"""Anchors: an append-only log outside the store that remembers what the store held.

The writer publishes, per committed batch, each new run's start, each touched
run's chain head (count and hash) and each finished run's seal, signed with the
chain key. ``verify`` reads the anchor back, so a run deleted from the store is
*missing*, a run whose tail (or end record) was cut is *truncated*, and neither
passes for a run that is merely incomplete. The anchor must be somewhere the
database's owner cannot rewrite: another machine's file, a JetStream stream
whose deletes are denied, a second database with its own owner.

One seam (:class:`Anchor`): ``publish`` appends entries, ``entries`` reads them
all back. Choose one with ``REPLAYABLE_ANCHOR``:

``file:///var/lib/replayable/anchor.log``
    JSON lines appended with ``O_APPEND``, created 0600 (:class:`FileAnchor`).
``nats://127.0.0.1:4222/replayable.anchor``
    A JetStream subject (:class:`~replayable.store.anchor_nats.JetStreamAnchor`).

A second database fits the same two methods.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from replayable.errors import ConfigurationError, StoreError
from replayable.events.chain import KeyProvider, verify_entry

__all__ = [
    "ENV_ANCHOR",
    "Anchor",
    "AnchorIndex",
    "AnchoredRun",
    "FileAnchor",
    "anchor_from_env",
    "open_anchor",
]

ENV_ANCHOR = "REPLAYABLE_ANCHOR"

#: Version of the anchor entry layout.
ENTRY_VERSION = 1


@runtime_checkable
class Anchor(Protocol):
    """An append-only log of signed entries (plain JSON objects)."""

    url: str

    def publish(self, entries: Sequence[dict[str, Any]]) -> None:
        """Append ``entries``; raise :class:`StoreError` when they could not be kept."""

    def entries(self) -> Iterator[dict[str, Any] | str]:
        """Every entry in the order appended; a ``str`` names a line that is unreadable."""

    def close(self) -> None: ...


class FileAnchor:
    """An anchor in a local file of JSON lines (use a path the database owner cannot write)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path).absolute()
        self.url = f"file://{self.path}"
        self.fsync = fsync

    def publish(self, entries: Sequence[dict[str, Any]]) -> None:
        if not entries:
            return
        data = b"".join(orjson.dumps(e, option=orjson.OPT_SORT_KEYS) + b"\n" for e in entries)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                # One write of whole lines: concurrent writers' lines never interleave.
                os.write(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"writing anchor {self.url} failed: {exc.strerror}") from exc

    def entries(self) -> Iterator[dict[str, Any] | str]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"reading anchor {self.url} failed: {exc.strerror}") from exc
        for number, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                yield f"line {number} is not JSON"
                continue
            if not isinstance(entry, dict):
                yield f"line {number} is not an object"
                continue
            yield entry

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"FileAnchor({str(self.path)!r})"


def open_anchor(url: str) -> Anchor:
    """The anchor a URL names: ``file:///path`` or ``nats://host:port/subject``."""
    scheme, sep, rest = url.partition("://")
    if scheme == "file" and sep and rest:
        return FileAnchor(rest)
    if scheme == "nats" and sep:
        from replayable.store.anchor_nats import JetStreamAnchor

        return JetStreamAnchor(url)
    raise ConfigurationError(f"anchor URL {url!r} is not file:///path or nats://host:port/subject")


def anchor_from_env(environ: Mapping[str, str] | None = None) -> Anchor | None:
    """The anchor ``REPLAYABLE_ANCHOR`` names, or ``None``."""
    env = os.environ if environ is None else environ
    url = env.get(ENV_ANCHOR)
    return open_anchor(url) if url else None


@dataclass
class AnchoredRun:
    """What the anchor says about one run."""

    start: dict[str, Any] | None = None
    head_count: int = 0
    head: str | None = None
    seal: dict[str, Any] | None = None
    adopted: dict[str, Any] | None = None


@dataclass
class AnchorIndex:
    """An anchor read back for one store (and tenant), entries checked against the keys."""

    url: str
    runs: dict[str, AnchoredRun] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def read(
        cls,
        anchor: Anchor,
        store_id: str,
        keys: KeyProvider | None,
        sees_tenant: Any = None,
    ) -> AnchorIndex:
        """Index ``anchor``'s entries for ``store_id``; an entry whose signature does not
        hold is set aside as a problem, never trusted."""
        index = cls(anchor.url)
        for number, entry in enumerate(anchor.entries(), 1):
            if isinstance(entry, str):
                index.problems.append(f"anchor {anchor.url}: {entry}")
                continue
            if entry.get("store") != store_id:
                continue
            if sees_tenant is not None and not sees_tenant(entry.get("tenant")):
                continue
            run_id = entry.get("run")
            kind = entry.get("type")
            if not isinstance(run_id, str) or kind not in ("start", "head", "seal", "adopt"):
                index.problems.append(f"anchor {anchor.url}: entry {number} is malformed")
                continue
            if "kid" in entry or "sig" in entry:
                wrong = verify_entry(keys, entry)
                if wrong is not None:
                    index.problems.append(
                        f"anchor {anchor.url}: entry {number} (run {run_id}) {wrong}"
                    )
                    continue
            run = index.runs.setdefault(run_id, AnchoredRun())
            if kind == "start":
                run.start = entry
            elif kind == "seal":
                run.seal = entry
            elif kind == "adopt":
                run.adopted = entry
            else:
                count = entry.get("count")
                if isinstance(count, int) and count >= run.head_count:
                    run.head_count, run.head = count, entry.get("head")
        return index
