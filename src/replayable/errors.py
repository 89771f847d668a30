"""Every error replayable raises, in one tree.

::

    ReplayableError
    ├── ConfigurationError (ValueError)      bad store URL, bad option value
    ├── SerializationError (TypeError)       a value crossing a boundary cannot be encoded
    ├── StoreError                           a backend failed; the driver's error is chained
    │   ├── AppendOnlyError                  the store refused an update or delete
    │   ├── SchemaVersionError               the database was written by a newer replayable
    │   └── RunNotFoundError (LookupError)   no run has that id or prefix
    │       └── AmbiguousRunIdError          a prefix names more than one run
    ├── ReplayError                          replay could not be set up
    │   └── EntrypointNotFoundError (ImportError)
    └── ReplayDivergenceError                replay parted from the tape (``strict=True``)

Errors raised by the agent's own code are never wrapped: a recorded tool error
is re-raised on replay as its own type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replayable.replay.divergence import Divergence

__all__ = [
    "AmbiguousRunIdError",
    "AppendOnlyError",
    "ConfigurationError",
    "EntrypointNotFoundError",
    "RecordedError",
    "ReplayDivergenceError",
    "ReplayError",
    "ReplayableError",
    "RunNotFoundError",
    "SchemaVersionError",
    "SerializationError",
    "StoreError",
]


class ReplayableError(Exception):
    """Base of every error raised by replayable itself."""


class ConfigurationError(ReplayableError, ValueError):
    """An option, URL or setting is not valid; the message names it."""


class SerializationError(ReplayableError, TypeError):
    """A value crossing a boundary cannot be encoded.

    ``boundary`` is the boundary's name, ``step`` the event's seq and
    ``type_name`` the offending type; ``path`` points inside the value.
    """

    def __init__(
        self,
        message: str,
        *,
        boundary: str | None = None,
        step: int | None = None,
        type_name: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.boundary = boundary
        self.step = step
        self.type_name = type_name
        self.path = path


class StoreError(ReplayableError):
    """The event store failed; the backend's own exception is chained."""


class AppendOnlyError(StoreError):
    """The store refused to update or delete a recorded row."""


class SchemaVersionError(StoreError):
    """The database holds a schema this version of replayable does not know."""


class RunNotFoundError(StoreError, LookupError):
    """No run has the given id or id prefix."""


class AmbiguousRunIdError(RunNotFoundError):
    """A run-id prefix matches more than one run."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:5]) + (" …" if len(candidates) > 5 else "")
        super().__init__(f"run id prefix {prefix!r} is ambiguous: matches {shown}")
        self.prefix = prefix
        self.candidates = candidates


class ReplayError(ReplayableError):
    """A replay could not be set up (the run or its entrypoint is unusable)."""


class EntrypointNotFoundError(ReplayError, ImportError):
    """The recorded entrypoint cannot be imported; pass ``fn=`` to replay()."""


class ReplayDivergenceError(ReplayableError):
    """Raised by ``replay(strict=True)`` when the replay diverges from the tape."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.message)
        self.divergence = divergence


class RecordedError(Exception):
    """Stands in on replay for a recorded exception whose type cannot be imported."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
