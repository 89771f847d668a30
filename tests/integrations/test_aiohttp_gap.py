"""aiohttp is not a recorded boundary: its connections are gaps, and a pure replay refuses them."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

import replayable
from replayable.capture.network import CaptureGapWarning
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider


@replayable.workflow
async def aiohttp_agent(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as r:
        body = await r.json()
    return str(body["data"][0]["id"])


def test_aiohttp_call_is_a_gap_and_its_replay_diverges(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """Recorded as a gap with a warning; the pure replay stops with unrecorded_io."""

    async def record() -> tuple[str, str]:
        async with replayable.recording(store) as rec:
            out = await aiohttp_agent(provider.url)
        return out, rec.run_ids[0]

    with pytest.warns(CaptureGapWarning, match="through aiohttp"):
        out, run_id = asyncio.run(record())
    assert out == "fake-1"
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [("gap", f"127.0.0.1:{provider.port}")]
    assert events[0].request_value()["via"].startswith("aiohttp.")
    assert events[0].call_site is not None
    assert "in aiohttp_agent" in events[0].call_site
    result = replayable.replay(run_id, store=store, fn=aiohttp_agent)
    assert result.status == "diverged"
    assert result.divergence is not None
    assert result.divergence.reason == "unrecorded_io"
