"""What each writer last did, kept beside its spool for ``replayable status``.

A writer with a spool directory keeps ``<store key>.status.json`` there: the
store's (password-free) URL, the writer's pid, whether the store is up, the
last error and when, and when the last batch was committed. It is rewritten
when the store goes down or comes back, and at most once a second while
batches commit, so reading it costs the writer next to nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from replayable._files import write_private
from replayable.capture.writer.spool import store_key

__all__ = ["StoreStatus", "WriterStatus", "read_statuses"]

_EVERY_S = 1.0


class StoreStatus(msgspec.Struct):
    """One store's writer, as its status file says."""

    url: str
    pid: int
    up: bool
    last_error: str | None = None
    last_error_at: float | None = None
    last_commit_at: float | None = None
    updated_at: float = 0.0


_decode = msgspec.json.Decoder(StoreStatus).decode
_encode = msgspec.json.Encoder().encode


@dataclass
class WriterStatus:
    """Keeps a writer's status file current (touched by the writer thread only)."""

    url: str
    directory: Path | None = None
    up: bool = True
    last_error: str | None = None
    last_error_at: float | None = None
    last_commit_at: float | None = None
    _written_at: float = 0.0

    def committed(self) -> None:
        now = time.time()
        self.last_commit_at = now
        if not self.up or now - self._written_at >= _EVERY_S:
            self.up = True
            self.write()

    def failed(self, error: BaseException) -> None:
        self.last_error = f"{type(error).__name__}: {error}".replace("\n", " ")
        self.last_error_at = time.time()
        if self.up or time.time() - self._written_at >= _EVERY_S:
            self.up = False
            self.write()

    def back(self) -> None:
        self.up = True
        self.write()

    def write(self) -> None:
        if self.directory is None:
            return
        self._written_at = time.time()
        status = StoreStatus(
            url=self.url,
            pid=os.getpid(),
            up=self.up,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            last_commit_at=self.last_commit_at,
            updated_at=self._written_at,
        )
        path = self.directory / f"{store_key(self.url)}.status.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        # Best effort: a status file that cannot be written must not stop the writer.
        with contextlib.suppress(OSError):
            write_private(temporary, _encode(status))
            os.replace(temporary, path)


def read_statuses(directory: Path) -> list[tuple[StoreStatus | None, dict[str, Any]]]:
    """Every store with a status file or a spool in ``directory``: its status (``None``
    if unreadable or missing) and its spool: ``files``, ``bytes`` waiting and ``rejected``."""
    found: dict[str, tuple[StoreStatus | None, dict[str, Any]]] = {}

    def entry(key: str) -> dict[str, Any]:
        if key not in found:
            found[key] = (None, {"key": key, "files": 0, "bytes": 0, "rejected": 0})
        return found[key][1]

    if not directory.is_dir():
        return []
    for path in sorted(directory.iterdir()):
        name = path.name
        key = name.split("-", 1)[0].split(".", 1)[0]
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if name.endswith(".status.json"):
            spool = entry(key)
            try:
                status: StoreStatus | None = _decode(path.read_bytes())
            except (OSError, msgspec.DecodeError):
                status = None
            found[key] = (status, spool)
        elif name.endswith(".rejected.jsonl"):
            entry(key)["rejected"] += size
        elif name.endswith(".jsonl") and "-" in name:
            spool = entry(key)
            spool["files"] += 1
            spool["bytes"] += size
    return list(found.values())
