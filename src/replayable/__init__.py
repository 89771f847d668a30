"""replayable: record every input of an AI agent run, then replay it exactly.

Mark the agent's entry with ``@workflow`` and its boundaries with ``@tool``,
``llm(...)``, ``now()``, ``random()``; record with ``recording()``; replay
with ``replay(run_id)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

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
from replayable.errors import (
    AmbiguousRunIdError,
    AppendOnlyError,
    ConfigurationError,
    EntrypointNotFoundError,
    RecordedError,
    ReplayableError,
    ReplayDivergenceError,
    ReplayError,
    RunNotFoundError,
    SchemaVersionError,
    SerializationError,
    StoreError,
)
from replayable.events import Event, Run, register_codec
from replayable.replay import Divergence, ReplayResult, replay
from replayable.replay.stepper import Stepper
from replayable.store import EventStore, RunFilter, open_store, verify_run

__version__ = "0.1.0"

__all__ = [
    "AmbiguousRunIdError",
    "AppendOnlyError",
    "ConfigurationError",
    "ContextThreadPoolExecutor",
    "Divergence",
    "EntrypointNotFoundError",
    "Event",
    "EventStore",
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
    "StoreError",
    "__version__",
    "asleep",
    "carry",
    "configure",
    "deterministic",
    "diff",
    "llm",
    "now",
    "open_store",
    "randint",
    "random",
    "recording",
    "register_codec",
    "replay",
    "sleep",
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
    tenant: str | None = None,
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

    When the store is unreachable, ``on_store_failure="spool"`` (the default)
    keeps the agent running and spools records to a local file under
    ``spool_dir`` until the store is back; ``"raise"`` makes boundaries raise
    :class:`StoreError` instead. A durable boundary waits at most
    ``max_block_s`` seconds (default 5). These settings apply to the store's writer.
    """
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
