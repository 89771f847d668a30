"""What a run records about the code and the machine it ran on."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import locale
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from replayable.events.canonical import canonical
from replayable.events.redaction import Redactor

__all__ = ["code_fingerprint", "environment_snapshot", "git_commit"]


def code_fingerprint(fn: Callable[..., Any]) -> dict[str, Any]:
    """The entry module's file, a hash of its source, and the git commit when there is one."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path:
        return {
            "module": getattr(fn, "__module__", None),
            "file": None,
            "sha256": None,
            "git_commit": None,
        }
    file = Path(path).resolve()
    return {
        "module": fn.__module__,
        "file": str(file),
        "sha256": _file_hash(file, _mtime(file)),
        "git_commit": git_commit(file.parent),
    }


def _mtime(file: Path) -> float:
    try:
        return file.stat().st_mtime
    except OSError:
        return 0.0


@functools.lru_cache(maxsize=256)
def _file_hash(file: Path, mtime: float) -> str | None:
    try:
        return hashlib.sha256(file.read_bytes()).hexdigest()
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def git_commit(directory: Path) -> str | None:
    """HEAD of the git checkout holding ``directory``, or ``None`` outside one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


#: What ``str.splitlines`` breaks lines at besides "\r" and "\n"; the e-mail parser
#: that reads METADATA for ``importlib.metadata`` does not.
_OTHER_BREAKS = ("\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def _name_version(dist: importlib.metadata.Distribution) -> tuple[str, str]:
    """The ``Name`` and ``Version`` of a distribution's metadata.

    Read from the top of its METADATA file: ``dist.name`` and ``dist.version``
    parse the whole file as an e-mail message, which for a hundred packages cost
    the first recorded run of a process about 50 ms. They still answer for a
    file this does not read plainly (a folded header, no METADATA).
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    name = version = None
    # The headers only: the description after them is most of the text (2 MB for 190
    # packages, whose lines took 10 ms to split). Cut after the first "\n\n", which
    # ends an empty line at the latest there, so the lines up to the first empty one
    # are those of the whole text.
    end = text.find("\n\n")
    head = text if end < 0 else text[: end + 2]
    if any(c in head for c in _OTHER_BREAKS):
        return dist.name, dist.version  # a line break the e-mail parser does not take
    lines = head.splitlines()
    for i, line in enumerate(lines):
        if not line:
            break  # the end of the headers
        folded = i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t")
        if name is None and line.startswith("Name:") and not folded:
            name = line[5:].strip()
        elif version is None and line.startswith("Version:") and not folded:
            version = line[8:].strip()
        if name and version:
            return name, version
    return dist.name, dist.version


@functools.lru_cache(maxsize=16)
def _packages() -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name, version = _name_version(dist)
        if name:
            seen.setdefault(name.lower(), version)
    return tuple(sorted(seen.items()))


def environment_snapshot(env_vars: Iterable[str], redactor: Redactor) -> tuple[str, bytes]:
    """The environment as canonical JSON and its sha256: Python, packages, timezone, locale,
    and the named environment variables with secret-looking values redacted."""
    names = sorted(set(env_vars))
    snapshot = {
        "python": sys.version,
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "packages": dict(_packages()),
        "timezone": {
            "name": list(time.tzname),
            "utcoffset_s": -time.timezone,
            "TZ": os.environ.get("TZ"),
        },
        "locale": list(locale.getlocale()),
        "env": redactor.redact_mapping({n: os.environ[n] for n in names if n in os.environ}),
    }
    data = canonical(snapshot)
    return hashlib.sha256(data).hexdigest(), data


def load_snapshot(data: bytes) -> dict[str, Any]:
    """Read back an environment snapshot blob."""
    value = orjson.loads(data)
    assert isinstance(value, dict)
    return value
