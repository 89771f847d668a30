"""Every error replayable raises, in one tree.

::

    ReplayableError
    ├── ConfigurationError (ValueError)      bad store URL, bad option value
    ├── SerializationError (TypeError)       a value crossing a boundary cannot be encoded
    ├── StoreError                           a backend failed; the driver's error is chained
    │   ├── StoreUnavailableError            the store cannot be reached now; a retry may work
    │   ├── StoreRefusedError                the store said no; retrying the same cannot help
    │   │   ├── AppendOnlyError              the store refused an update, delete or duplicate
    │   │   ├── SchemaVersionError           the database was written by a newer replayable
    │   │   ├── StoreAuthenticationError     the login was refused (password, role, database)
    │   │   └── AccessDeniedError (PermissionError)  this role or login may not do that
    │   └── RunNotFoundError (LookupError)   no run has that id or prefix
    │       └── AmbiguousRunIdError          a prefix names more than one run
    ├── ReplayError                          replay could not be set up
    │   ├── EntrypointNotFoundError (ImportError)
    │   ├── EntryImportError                 importing the entry module failed or ran live code
    │   └── UntrustedRecordError             a record names code or a type replay will not load
    ├── ReplayDivergenceError                replay parted from the tape (``strict=True``)
    └── FixtureError (ValueError)            a fixture file that cannot be read or written

Each store driver maps its own exceptions into this tree once (the SQLite
store in ``store/sqlite.py``, the PostgreSQL store in
``store/postgres/_connect.py``); the writer decides whether to retry or to
spool from these names alone.

Errors raised by the agent's own code are never wrapped: a recorded tool error
is re-raised on replay as its own type.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from replayable.replay.divergence import Divergence

__all__ = [
    "AccessDeniedError",
    "AmbiguousRunIdError",
    "AppendOnlyError",
    "ConfigurationError",
    "EntryImportError",
    "EntrypointNotFoundError",
    "FixtureError",
    "RecordedError",
    "ReplayDivergenceError",
    "ReplayError",
    "ReplayableError",
    "RunNotFoundError",
    "SchemaVersionError",
    "SerializationError",
    "StoreAuthenticationError",
    "StoreError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "UnreadableRecordError",
    "UntrustedRecordError",
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


class StoreUnavailableError(StoreError):
    """The store cannot be reached now (no connection, a timeout, a locked database);
    the writer spools and retries."""


class StoreRefusedError(StoreError):
    """The store refused the request itself; the same request will be refused again."""


class StoreAuthenticationError(StoreRefusedError):
    """The store refused the login: a wrong password, an unknown role, no right to connect."""


class AppendOnlyError(StoreRefusedError):
    """The store refused to update or delete a recorded row."""


class SchemaVersionError(StoreRefusedError):
    """The database holds a schema this version of replayable does not know."""


class AccessDeniedError(StoreRefusedError, PermissionError):
    """The role or database login may not do this (annotate as an auditor, say).

    Raised by the library's own role check and, on PostgreSQL, when the
    database refuses the login the privilege.
    """


class UnreadableRecordError(StoreRefusedError):
    """A stored audit record (an annotation, an access-log entry, a flag) holds a value
    its column cannot: text that is not UTF-8, JSON that does not parse. The message
    names the record and the column; reading it again gives the same answer."""


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


class EntryImportError(ReplayError):
    """Importing a run's entry module for replay failed, or its top level tried to run
    live code (a boundary, a recording, a tool); the message says how to fix it."""


class UntrustedRecordError(ReplayError):
    """A stored record names code or a type that replay will not import, call or build.

    ``name`` is the ``module:qualname`` the record gave, ``what`` what it was
    meant to be (an entrypoint, an enum, a dataclass …), ``reason`` why it was
    refused; ``run_id`` and ``step`` say where it was found, when known.
    Nothing was imported.
    """

    def __init__(
        self,
        name: str,
        what: str,
        reason: str,
        *,
        run_id: str | None = None,
        step: int | None = None,
    ) -> None:
        where = ""
        if run_id is not None:
            where = f" in run {run_id}" + (f" at step {step}" if step is not None else "")
        super().__init__(f"refused to load {what} {name!r}{where}: {reason}")
        self.name = name
        self.what = what
        self.reason = reason
        self.run_id = run_id
        self.step = step

    def located(self, run_id: str, step: int | None) -> UntrustedRecordError:
        """The same refusal, naming the run and step it was found in."""
        return UntrustedRecordError(self.name, self.what, self.reason, run_id=run_id, step=step)


class ReplayDivergenceError(ReplayableError):
    """Raised by ``replay(strict=True)`` when the replay diverges from the tape."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.message)
        self.divergence = divergence


class FixtureError(ReplayableError, ValueError):
    """A fixture file of another format or a newer version, a bad record in one, or a
    run that cannot be exported (unreadable, or its chain does not verify)."""


class RecordedError(Exception):
    """Stands in on replay for a recorded exception whose type cannot be imported."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
