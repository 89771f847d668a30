"""replayable: record every input of an AI agent run, then replay it exactly.

Mark the agent's entry with ``@workflow`` and its boundaries with ``@tool``,
``llm(...)``, ``now()``, ``random()``; record with ``recording()``; replay
with ``replay(run_id)``.
"""

from __future__ import annotations

import sys
import types

from replayable._lazy import import_module, lazy
from replayable.errors import (
    AccessDeniedError,
    AmbiguousRunIdError,
    AppendOnlyError,
    ConfigurationError,
    EntryImportError,
    EntrypointNotFoundError,
    RecordedError,
    ReplayableError,
    ReplayDivergenceError,
    ReplayError,
    RunNotFoundError,
    SchemaVersionError,
    SerializationError,
    StoreAuthenticationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
    UntrustedRecordError,
)

# ``typing.TYPE_CHECKING`` without importing typing (with collections, re and enum it
# is most of what ``import replayable`` would cost): type checkers take this name
# for theirs.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import os
    from collections.abc import Mapping
    from typing import Any, Literal

    from replayable.audit import (  # type: ignore[assignment]
        annotate,
        annotations,
    )
    from replayable.audit.policies import Policy, policy
    from replayable.capture import (
        ContextThreadPoolExecutor,
        Recording,
        asleep,
        carry,
        configure,
        llm,
        now,
        randint,
        random,
        sleep,
        span,
        tool,
        utcnow,
        uuid4,
        workflow,
    )
    from replayable.capture.deterministic import deterministic
    from replayable.diff import RunDiff, diff
    from replayable.events import Event, Run, register_codec
    from replayable.replay import Divergence, ReplayResult, replay
    from replayable.replay.stepper import Stepper
    from replayable.store import EventStore, RunFilter, open_store, verify_run

#: Where each public name lives. They are imported when first used, so that a
#: process needing only part of the package (the writer process, a CLI command)
#: does not load the rest (asyncio, the replay engine, the diff).
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "ContextThreadPoolExecutor",
            "Recording",
            "asleep",
            "carry",
            "configure",
            "llm",
            "now",
            "prompt",
            "randint",
            "random",
            "retrieval",
            "sleep",
            "snapshot",
            "span",
            "tool",
            "utcnow",
            "uuid4",
            "workflow",
        ),
        "replayable.capture",
    ),
    "annotate": "replayable.audit",
    "annotations": "replayable.audit",
    "deterministic": "replayable.capture.deterministic",
    "Policy": "replayable.audit.policies",
    "policy": "replayable.audit.policies",
    "RunDiff": "replayable.diff",
    "diff": "replayable.diff",
    "Event": "replayable.events",
    "Run": "replayable.events",
    "register_codec": "replayable.events",
    "Divergence": "replayable.replay",
    "ReplayResult": "replayable.replay",
    "replay": "replayable.replay",
    "Stepper": "replayable.replay.stepper",
    "EventStore": "replayable.store",
    "RunFilter": "replayable.store",
    "open_store": "replayable.store",
    "verify_run": "replayable.store",
}


__getattr__, __dir__ = lazy(__name__, _LAZY)

# ``from __future__ import annotations`` bound this name to a compiler flag; the
# public function of that name must be found by ``__getattr__`` instead.
globals().pop("annotations", None)


__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AmbiguousRunIdError",
    "AppendOnlyError",
    "ConfigurationError",
    "ContextThreadPoolExecutor",
    "Divergence",
    "EntryImportError",
    "EntrypointNotFoundError",
    "Event",
    "EventStore",
    "Policy",
    "RecordedError",
    "Recording",
    "ReplayDivergenceError",
    "ReplayError",
    "ReplayResult",
    "ReplayableError",
    "Run",
    "RunDiff",
    "RunFilter",
    "RunNotFoundError",
    "SchemaVersionError",
    "SerializationError",
    "Stepper",
    "StoreAuthenticationError",
    "StoreError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "UntrustedRecordError",
    "__version__",
    "annotate",
    "annotations",
    "asleep",
    "carry",
    "configure",
    "deterministic",
    "diff",
    "llm",
    "now",
    "open_store",
    "policy",
    "prompt",
    "randint",
    "random",
    "recording",
    "register_codec",
    "replay",
    "retrieval",
    "sleep",
    "snapshot",
    "span",
    "tool",
    "utcnow",
    "uuid4",
    "verify_run",
    "workflow",
]


def recording(
    store: EventStore | str | None = None,
    *,
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    tenant: str | None = None,
    subject: str | None = None,
    durability: Literal["buffered", "durable"] = "buffered",
    env_vars: tuple[str, ...] = (),
    on_store_failure: Literal["spool", "raise"] | None = None,
    max_block_s: float | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
) -> Recording:
    """Record every ``@workflow`` call made inside the ``with`` block.

    ``durability="buffered"`` hands events to a background writer and returns at
    once; ``"durable"`` returns from each boundary only after its event is
    committed (group commit across threads). ``env_vars`` names environment
    variables to snapshot with each run (secret-looking values are redacted).
    ``context`` holds what every run decides under (feature flags, tenant
    configuration, permission snapshots): it is kept in each run's metadata under
    ``context``, shown by ``replayable show`` and compared by ``diff``.

    When the store is unreachable, ``on_store_failure="spool"`` (the default)
    keeps the agent running and spools records to a local file under
    ``spool_dir`` until the store is back; ``"raise"`` makes boundaries raise
    :class:`StoreError` instead. A durable boundary waits at most
    ``max_block_s`` seconds (default 5). These settings apply to the store's writer.

    ``subject`` names the data subject the runs are about (``"customer-123"``):
    their payloads are encrypted under that subject's own data key, so
    ``replayable erase --subject customer-123`` can erase them alone. It is kept
    in each run's metadata under ``data_subject``.
    """
    from collections.abc import Mapping as AnyMapping

    from replayable.capture.recording import Recording

    if context is not None:
        if not isinstance(context, AnyMapping):
            raise TypeError(
                f"recording(context=...) takes a mapping (flags, tenant configuration, "
                f"permissions), not {type(context).__name__}"
            )
        metadata = {**(metadata or {}), "context": dict(context)}
    if subject is not None:
        if not isinstance(subject, str) or not subject.strip():
            raise TypeError(f"recording(subject=...) takes a non-empty string, not {subject!r}")
        metadata = {**(metadata or {}), "data_subject": subject}
    return Recording(
        store,
        metadata=metadata,
        tenant=tenant,
        durability=durability,
        env_vars=env_vars,
        on_store_failure=on_store_failure,
        max_block_s=max_block_s,
        spool_dir=spool_dir,
    )


def _shadowed(name: str) -> property:
    """``replay`` and ``diff`` are also subpackages: importing ``replayable.replay``
    sets the package's attribute to that module. A property on the package's class
    comes first and keeps naming the function (the assignment is ignored)."""

    def get(self: types.ModuleType) -> Any:
        return getattr(import_module(_LAZY[name]), name)

    def ignore(self: types.ModuleType, value: Any) -> None:
        pass

    return property(get, ignore)


class _Package(types.ModuleType):
    replay = _shadowed("replay")
    diff = _shadowed("diff")


sys.modules[__name__].__class__ = _Package
