"""Process-wide settings: redaction and the environment variables runs record."""

from __future__ import annotations

import os
from collections.abc import Iterable

from replayable.events.canonical import Redactor

__all__ = ["configure", "settings"]


class Settings:
    """The active configuration; change it with :func:`configure`."""

    def __init__(self) -> None:
        self.redactor = Redactor()
        env = os.environ.get("REPLAYABLE_CAPTURE_ENV", "")
        self.env_vars: tuple[str, ...] = tuple(n.strip() for n in env.split(",") if n.strip())


settings = Settings()


def configure(
    *,
    redact_keys: Iterable[str] | None = None,
    redact_patterns: Iterable[str] | None = None,
    env_vars: Iterable[str] | None = None,
) -> None:
    """Add secret key names or value patterns to redact, or name environment variables
    whose values every run records (secret-looking ones are redacted).

    Redaction applies to everything recorded afterwards, and to the requests
    replay compares, so set it before recording.
    """
    from replayable.capture.writer import _writers

    if redact_keys is not None or redact_patterns is not None:
        settings.redactor = Redactor(
            extra_keys=redact_keys or (), extra_patterns=redact_patterns or ()
        )
        for writer in list(_writers.values()):
            writer.redactor = settings.redactor
    if env_vars is not None:
        settings.env_vars = tuple(env_vars)
