"""Files and directories readable by their owner only, whatever the umask.

Everything replayable writes to disk (the SQLite database and its WAL, the
spool, reports) holds prompts, tool arguments and API responses, so a file it
creates is 0600 and a directory it creates 0700. The mode is set with
``chmod`` after creation, because the umask can only take bits away and a
permissive one (``0o000``) must not widen what we asked for. Existing
directories and files are left as their owner made them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "private_file", "write_private"]

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents as 0700 directories; returns ``path``."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: theirs to keep
        os.chmod(directory, DIR_MODE)
    return path


def private_file(path: Path) -> bool:
    """Create ``path`` empty as a 0600 file if it does not exist; whether it was created."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return True


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (replacing its content), the file made 0600."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
