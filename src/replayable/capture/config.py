"""Process-wide settings: redaction and the environment variables runs record."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from replayable.events.redaction import Redactor

__all__ = ["configure", "settings"]


#: The writer process yields the CPU to the agent: with both busy on two cores, an
#: agent beside a writer at the same priority was preempted hundreds of times a
#: second and a recorded 1 KB tool call took 8-14 µs instead of 6-8 µs.
DEFAULT_NICE = 10


def _nice(value: object, where: str = "writer_nice") -> int:
    nice = -1
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        nice = int(value)
    if not 0 <= nice <= 19:
        from replayable.errors import ConfigurationError

        raise ConfigurationError(f"{where} must be a whole number from 0 to 19, not {value!r}")
    return nice


def _split(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())


def project_config(start: Path | None = None) -> dict[str, Any]:
    """``[tool.replayable]`` of the nearest pyproject.toml at or above ``start`` (the cwd)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text())
            except (OSError, tomllib.TOMLDecodeError):
                return {}
            section = data.get("tool", {}).get("replayable", {})
            return section if isinstance(section, dict) else {}
    return {}


class Settings:
    """The active configuration; change it with :func:`configure`.

    Read at import from ``[tool.replayable]`` in the nearest pyproject.toml
    (``side_effects``, ``env_vars``, ``redact_keys``) and from
    ``$REPLAYABLE_SIDE_EFFECTS`` / ``$REPLAYABLE_CAPTURE_ENV`` (comma-separated).
    """

    def __init__(self) -> None:
        cfg = project_config()
        self.redactor = Redactor(extra_keys=cfg.get("redact_keys", ()))
        self.env_vars: tuple[str, ...] = (
            *cfg.get("env_vars", ()),
            *_split(os.environ.get("REPLAYABLE_CAPTURE_ENV", "")),
        )
        #: ``process`` (default) or ``thread``: where recorded events are persisted.
        self.writer: str = os.environ.get("REPLAYABLE_WRITER") or cfg.get("writer", "process")
        #: How much the writer process lowers its scheduling priority (``nice``, 0-19).
        env_nice = os.environ.get("REPLAYABLE_WRITER_NICE")
        self.writer_nice: int = (
            _nice(env_nice, "$REPLAYABLE_WRITER_NICE")
            if env_nice
            else _nice(cfg.get("writer_nice", DEFAULT_NICE), "[tool.replayable] writer_nice")
        )
        #: Tool names replay treats as side-effecting even without ``side_effect=True``.
        self.side_effects: frozenset[str] = frozenset(
            (*cfg.get("side_effects", ()), *_split(os.environ.get("REPLAYABLE_SIDE_EFFECTS", "")))
        )


settings = Settings()


def configure(
    *,
    redact_keys: Iterable[str] | None = None,
    redact_patterns: Iterable[str] | None = None,
    env_vars: Iterable[str] | None = None,
    side_effects: Iterable[str] | None = None,
    writer: str | None = None,
    writer_nice: int | None = None,
) -> None:
    """Add secret key names or value patterns to redact, or name environment variables
    whose values every run records (secret-looking ones are redacted), or name
    third-party tools replay must guard as side effects, or choose where
    events are persisted (``writer="process"``, the default: one writer process
    shared by every store, so the agent's process only encodes and forwards;
    ``writer="thread"``: a thread in this process; for stores opened afterwards),
    or how far the writer process lowers its priority (``writer_nice``, 0-19,
    default 10, so that the agent comes first on a busy machine; for writer
    processes started afterwards).

    Redaction applies to everything recorded afterwards, and to the requests
    replay compares, so set it before recording.
    """
    from replayable.capture.writer import _writers

    if redact_keys is not None or redact_patterns is not None:
        settings.redactor = Redactor(
            extra_keys=redact_keys or (), extra_patterns=redact_patterns or ()
        )
        for running in list(_writers.values()):
            running.redactor = settings.redactor
    if env_vars is not None:
        settings.env_vars = tuple(env_vars)
    if side_effects is not None:
        settings.side_effects = frozenset(side_effects)
    if writer is not None:
        if writer not in ("thread", "process"):
            from replayable.errors import ConfigurationError

            raise ConfigurationError(f"writer must be 'thread' or 'process', not {writer!r}")
        settings.writer = writer
    if writer_nice is not None:
        settings.writer_nice = _nice(writer_nice)
