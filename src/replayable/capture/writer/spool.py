"""The outage spool: a local append-only file of batches the store could not take yet.

While the store is unreachable the writer appends each batch here, one line
per record (``[batch, kind, record]`` as JSON), and fsyncs the file per batch
in durable mode. When the store is back the writer reads the batches back in
order and appends them exactly as they were built, so a batch the store had
committed without acknowledging is recognised by its digest (PostgreSQL) or
record by record, and nothing is written twice.

Each writer owns its file, ``<store key>-<pid>-<token>.jsonl`` in the spool
directory, under an exclusive ``flock``. A file nobody holds a lock on was
left by a process that ended during an outage; the next writer for the same
store adopts it and drains it. Records the store refuses for good go to
``<store key>.rejected.jsonl`` next to it, so even those are never lost.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from replayable._files import private_dir
from replayable.events.model import Event, RunEnd, RunStart

try:  # POSIX: a live writer's spool is locked, so only orphans are adopted
    import fcntl
except ImportError:  # pragma: no cover - Windows: every file of the store is adopted
    fcntl = None  # type: ignore[assignment]

__all__ = ["Spool", "SpoolBatch", "adopt_leftovers", "rejects_path", "store_key"]

_MAGIC = "replayable-spool"
_VERSION = 1
_encode = msgspec.json.Encoder().encode
_line = msgspec.json.Decoder(tuple[int, str, msgspec.Raw])
_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    "s": msgspec.json.Decoder(RunStart),
    "e": msgspec.json.Decoder(Event),
    "x": msgspec.json.Decoder(RunEnd),
    "b": msgspec.json.Decoder(tuple[str, bytes]),
}


@dataclass
class SpoolBatch:
    """One batch as the writer built it: what ``store.append`` (and ``put_blob``) receive."""

    starts: list[RunStart] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    ends: list[RunEnd] = field(default_factory=list)
    blobs: list[tuple[str, bytes]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.starts) + len(self.events) + len(self.ends) + len(self.blobs)

    def lines(self, number: int) -> bytes:
        """The batch as spool lines, numbered ``number``."""
        parts: list[bytes] = []
        for kind, records in (
            ("b", self.blobs),
            ("s", self.starts),
            ("e", self.events),
            ("x", self.ends),
        ):
            for record in records:
                parts.append(_encode((number, kind, record)))
        return b"\n".join(parts) + b"\n" if parts else b""

    def add(self, kind: str, record: Any) -> None:
        if kind == "s":
            self.starts.append(record)
        elif kind == "e":
            self.events.append(record)
        elif kind == "x":
            self.ends.append(record)
        else:
            self.blobs.append(record)


def store_key(url: str) -> str:
    """The file name stem of a store's spools: a digest of its (password-free) URL."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def rejects_path(directory: Path, url: str) -> Path:
    """Where records the store refused for good are kept."""
    return directory / f"{store_key(url)}.rejected.jsonl"


def _lock(fd: int) -> bool:
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


class Spool:
    """One spool file: appended by its writer, read back in order, removed once drained."""

    def __init__(self, path: Path, url: str, fd: int | None = None) -> None:
        self.path = path
        self.url = url
        self._fd = fd
        self._number = 0
        self.read_offset = 0
        self.size = path.stat().st_size if fd is not None else 0

    @classmethod
    def create(cls, directory: Path, url: str) -> Spool:
        """A new, locked spool file for ``url`` in ``directory``."""
        private_dir(directory)
        name = f"{store_key(url)}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        path = directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        _lock(fd)
        spool = cls(path, url, fd)
        header = _encode([_MAGIC, _VERSION, url]) + b"\n"
        spool._write(header, fsync=True)
        spool.read_offset = len(header)
        _fsync_dir(directory)
        return spool

    @property
    def pending(self) -> bool:
        """Whether batches remain that have not been drained."""
        return self.read_offset < self.size

    def append(self, batch: SpoolBatch, *, fsync: bool) -> None:
        """Append ``batch``; with ``fsync`` return only once it is on stable storage."""
        self._number += 1
        self._write(batch.lines(self._number), fsync=fsync)

    def _write(self, data: bytes, *, fsync: bool) -> None:
        if self._fd is None:
            raise OSError(f"spool {self.path} is not open for writing")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if fsync:
                os.fsync(self._fd)
        except OSError:
            # A torn line would hide the batches after it: cut back to the last whole one.
            os.ftruncate(self._fd, self.size)
            raise
        self.size += len(data)

    def next_batch(self) -> tuple[SpoolBatch, int] | None:
        """The next undrained batch and the offset after it (``None`` at the end).

        Call :meth:`advance` with the offset once the batch is committed.
        """
        if not self.pending:
            return None
        batch = SpoolBatch()
        number: int | None = None
        offset = self.read_offset
        with self.path.open("rb") as f:
            f.seek(offset)
            while offset < self.size or self._fd is None:
                raw = f.readline()
                if not raw.endswith(b"\n"):
                    break  # the end, or a torn last line whose batch was never acknowledged
                try:
                    n, kind, record = _line.decode(raw)
                    value = _decoders[kind].decode(record)
                except (msgspec.DecodeError, KeyError, ValueError):
                    if number is not None:
                        break
                    offset += len(raw)  # the header, or a damaged line: skip it
                    continue
                if number is not None and n != number:
                    break
                number = n
                batch.add(kind, value)
                offset += len(raw)
        if number is None:
            # Nothing readable is left: the file is drained.
            self.read_offset = offset
            if self._fd is None:
                self.size = offset
            return None
        return batch, offset

    def advance(self, offset: int) -> None:
        self.read_offset = offset

    def remove(self) -> None:
        """Delete the drained file and release it."""
        self.path.unlink(missing_ok=True)
        self.release()

    def release(self) -> None:
        """Close the file (and its lock) without deleting it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - not every platform opens directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


class _Adopted(Spool):
    """A spool left by an ended process: read-only, held under its lock until drained."""

    def __init__(self, path: Path, url: str, lock_fd: int) -> None:
        super().__init__(path, url)
        self._lock_fd = lock_fd
        self.size = path.stat().st_size

    def release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def adopt_leftovers(directory: Path, url: str, skip: Sequence[Path] = ()) -> list[Spool]:
    """Spools of ``url`` in ``directory`` that no live writer holds, oldest first, now locked."""
    if not directory.is_dir():
        return []
    found: list[tuple[float, Path]] = []
    for path in directory.glob(f"{store_key(url)}-*.jsonl"):
        if path in skip:
            continue
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            continue
    adopted: list[Spool] = []
    for _, path in sorted(found):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        if not _lock(fd) or not _same_store(path, url):
            os.close(fd)
            continue
        adopted.append(_Adopted(path, url, fd))
    return adopted


def _same_store(path: Path, url: str) -> bool:
    with path.open("rb") as f:
        first = f.readline()
    try:
        header = msgspec.json.decode(first)
    except msgspec.DecodeError:
        return False
    return isinstance(header, list) and header[:1] == [_MAGIC] and header[2:3] == [url]


def append_rejects(directory: Path, url: str, records: Iterator[tuple[str, Any]]) -> Path:
    """Append refused records to the store's rejects file; returns its path."""
    path = rejects_path(directory, url)
    private_dir(directory)
    data = b"".join(_encode((0, kind, record)) + b"\n" for kind, record in records)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_records(path: Path) -> list[tuple[str, Any]]:
    """Every ``(kind, record)`` in a spool or rejects file (for inspection and tests)."""
    out: list[tuple[str, Any]] = []
    for raw in path.read_bytes().splitlines():
        try:
            _, kind, record = _line.decode(raw)
            out.append((kind, _decoders[kind].decode(record)))
        except (msgspec.DecodeError, KeyError, ValueError):
            continue
    return out
