"""Interception does not depend on when the SDKs are imported.

Each order runs in a fresh interpreter (see ``agents_import_order``): the SDKs
imported before replayable (clients built at module level), inside the
workflow function, or inside the workflow by a thread. Every call is recorded, the
runs replay ``identical`` in the recording process and in a new one, and the
model server receives nothing while they replay.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integrations.servers import FakeProvider

ROOT = Path(__file__).resolve().parents[2]
SYNC_EVENTS = [
    "llm:openai.chat.completions",
    "llm:openai.chat.completions",
    "llm:anthropic.messages",
    "llm:anthropic.messages",
    "http:GET /v1/models",
]
ASYNC_EVENTS = SYNC_EVENTS[:4]


def _child(order: str, url: str, db: str, mode: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integrations.agents_import_order", order, url, db, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("order", ["before", "inside", "thread"])
def test_sdk_calls_recorded_whatever_the_import_order(
    order: str, provider: FakeProvider, tmp_path: Path
) -> None:
    """Sync, async and streamed SDK calls are recorded and replay identical, live or not."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    recorded = _child(order, provider.url, db, "record")
    assert recorded["loaded_at_start"] == (
        ["anthropic", "openai", "requests"] if order == "before" else []
    )
    assert recorded["kinds"] == [SYNC_EVENTS, ASYNC_EVENTS]
    assert recorded["statuses"] == ["identical", "identical"], recorded["divergences"]
    assert recorded["replayed"] == recorded["outputs"]
    hits = len(provider.requests)
    assert hits == 8  # four POSTs per run, all while recording
    if order != "inside":
        return
    # A process that never recorded: the workflow's own import patches the SDKs.
    again = _child(order, provider.url, db, "replay")
    assert again["statuses"] == ["identical", "identical"], again["divergences"]
    assert again["replayed"] == recorded["outputs"]
    assert len(provider.requests) == hits
