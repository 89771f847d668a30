"""The writer's process-wide options: where it runs, its priority, what it redacts.

Read once from ``[tool.replayable]`` (``writer``, ``writer_nice``,
``redact_keys``) and from ``$REPLAYABLE_WRITER`` / ``$REPLAYABLE_WRITER_NICE``;
:func:`replayable.configure` changes them. Writers started afterwards use them.
"""

from __future__ import annotations

import os
from typing import Literal

from replayable._pyproject import project_config
from replayable.errors import ConfigurationError
from replayable.events.redaction import Redactor

__all__ = ["DEFAULT_NICE", "OnStoreFailure", "WriterOptions", "options", "parse_mode", "parse_nice"]

#: What the agent sees while the store is down: ``"spool"`` keeps running, ``"raise"`` stops.
OnStoreFailure = Literal["spool", "raise"]

#: The writer process yields the CPU to the agent: with both busy on two cores, an
#: agent beside a writer at the same priority was preempted hundreds of times a
#: second and a recorded 1 KB tool call took 8-14 µs instead of 6-8 µs.
DEFAULT_NICE = 10


def parse_nice(value: object, where: str = "writer_nice") -> int:
    """A niceness from 0 to 19; :class:`ConfigurationError` naming ``where`` otherwise."""
    nice = -1
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        nice = int(value)
    if not 0 <= nice <= 19:
        raise ConfigurationError(f"{where} must be a whole number from 0 to 19, not {value!r}")
    return nice


def parse_mode(value: str) -> str:
    """``"process"`` or ``"thread"``; :class:`ConfigurationError` otherwise."""
    if value not in ("thread", "process"):
        raise ConfigurationError(f"writer must be 'thread' or 'process', not {value!r}")
    return value


class WriterOptions:
    """The options every writer started from now on takes."""

    def __init__(self) -> None:
        cfg = project_config()
        #: The redaction every record is built with.
        self.redactor = Redactor(extra_keys=cfg.get("redact_keys", ()))
        #: ``process`` (default) or ``thread``: where recorded events are persisted.
        self.mode: str = os.environ.get("REPLAYABLE_WRITER") or cfg.get("writer", "process")
        #: How much the writer process lowers its scheduling priority (``nice``, 0-19).
        env_nice = os.environ.get("REPLAYABLE_WRITER_NICE")
        self.nice: int = (
            parse_nice(env_nice, "$REPLAYABLE_WRITER_NICE")
            if env_nice
            else parse_nice(cfg.get("writer_nice", DEFAULT_NICE), "[tool.replayable] writer_nice")
        )


options = WriterOptions()
