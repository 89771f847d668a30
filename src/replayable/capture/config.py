"""Process-wide settings: redaction and the environment variables runs record."""

from __future__ import annotations

import os
from collections.abc import Iterable

from replayable._pyproject import project_config
from replayable.capture.writer.options import options, parse_mode, parse_nice
from replayable.events.redaction import Redactor

__all__ = ["configure", "project_config", "settings"]


def _split(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())


class Settings:
    """The active configuration; change it with :func:`configure`.

    Read at import from ``[tool.replayable]`` in the nearest pyproject.toml
    (``side_effects``, ``env_vars``, ``redact_keys``) and from
    ``$REPLAYABLE_SIDE_EFFECTS`` / ``$REPLAYABLE_CAPTURE_ENV`` (comma-separated).
    """

    def __init__(self) -> None:
        cfg = project_config()
        self.env_vars: tuple[str, ...] = (
            *cfg.get("env_vars", ()),
            *_split(os.environ.get("REPLAYABLE_CAPTURE_ENV", "")),
        )
        #: Tool names replay treats as side-effecting even without ``side_effect=True``.
        self.side_effects: frozenset[str] = frozenset(
            (*cfg.get("side_effects", ()), *_split(os.environ.get("REPLAYABLE_SIDE_EFFECTS", "")))
        )

    # The writer's options live with the writer; these read and set them.

    @property
    def redactor(self) -> Redactor:
        """The redaction applied to everything recorded and to the requests replay compares."""
        return options.redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        options.redactor = redactor

    @property
    def writer(self) -> str:
        """``process`` (default) or ``thread``: where recorded events are persisted."""
        return options.mode

    @writer.setter
    def writer(self, mode: str) -> None:
        options.mode = parse_mode(mode)

    @property
    def writer_nice(self) -> int:
        """How much the writer process lowers its scheduling priority (``nice``, 0-19)."""
        return options.nice

    @writer_nice.setter
    def writer_nice(self, nice: int) -> None:
        options.nice = parse_nice(nice)


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
    if redact_keys is not None or redact_patterns is not None:
        redactor = Redactor(extra_keys=redact_keys or (), extra_patterns=redact_patterns or ())
        settings.redactor = redactor
        from replayable.capture.writer.registry import set_redactor

        set_redactor(redactor)
    if env_vars is not None:
        settings.env_vars = tuple(env_vars)
    if side_effects is not None:
        settings.side_effects = frozenset(side_effects)
    if writer is not None:
        settings.writer = writer
    if writer_nice is not None:
        settings.writer_nice = writer_nice
