"""The checks every framework agent must pass, written once.

An example agent under ``examples/`` reads two module-level settings at call
time: ``INSTRUCTIONS`` (its system prompt) and ``UNITS`` (an argument its tool
passes to a ``@replayable.tool`` service). :func:`check_agent` records one run
against the fake provider, forks it at a tool step (the rest runs live),
stops the server, replays it three times, then edits each setting and
replays again: the replay must name the step that changed.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import replayable
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider

__all__ = ["check_agent", "load_example", "record"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>/agent.py`` as the module ``<name>.agent``."""
    if str(EXAMPLES) not in sys.path:
        sys.path.append(str(EXAMPLES))
    return importlib.import_module(f"{name}.agent")


def record(store: MemoryStore, fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """Run the workflow ``fn`` once inside a recording; its run id and output."""
    with replayable.recording(store) as rec:
        if asyncio.iscoroutinefunction(getattr(fn, "__wrapped__", fn)):
            out = asyncio.run(fn(*args))
        else:
            out = fn(*args)
    return rec.run_ids[0], out


def check_agent(
    module: ModuleType,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    provider: FakeProvider,
    store: MemoryStore,
    tool_step: int,
    arg_step: int,
    override: Any,
    forked_text: str,
) -> str:
    """Record ``fn(*args)``, fork it at ``tool_step`` with ``override``, stop the server,
    replay three times (``identical``), then check that a changed system prompt diverges
    at step 1 and a changed tool argument at ``arg_step``. Returns the run id."""
    try:
        return _check(
            module,
            fn,
            args,
            provider,
            store,
            tool_step,
            arg_step,
            override,
            forked_text,
        )
    except BaseException:
        # A connection the SDK left unclosed, finalized while pytest parses source to
        # show this failure, trips CPython 3.11's AST recursion check: collect it first.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        raise


def _check(
    module: ModuleType,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    provider: FakeProvider,
    store: MemoryStore,
    tool_step: int,
    arg_step: int,
    override: Any,
    forked_text: str,
) -> str:
    run_id, out = record(store, fn, *args)
    events = store.events(run_id)
    assert events[0].kind == "llm", [(e.seq, e.kind, e.name) for e in events]

    forked = replayable.replay(
        run_id, store=store, fn=fn, fork_at=tool_step, overrides={tool_step: override}
    )
    assert forked.status == "completed", forked.divergence
    assert forked_text in str(forked.output), forked.output

    provider.stop()
    for _ in range(3):
        result = replayable.replay(run_id, store=store, fn=fn)
        assert result.status == "identical", result.divergence
        assert result.output == out

    french = " Always answer in French."
    with pytest.MonkeyPatch.context() as edit:
        edit.setattr(module, "INSTRUCTIONS", module.INSTRUCTIONS + french)
        result = replayable.replay(run_id, store=store, fn=fn)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", 1), div
    assert french.strip() in div.message, div.message

    with pytest.MonkeyPatch.context() as edit:
        edit.setattr(module, "UNITS", "imperial")
        result = replayable.replay(run_id, store=store, fn=fn)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", arg_step), div
    assert "imperial" in div.message, div.message
    return run_id
