"""Tasks started beneath a boundary take no ordinal from the agent's task lineage.

Opening a connection, the transport under the HTTP seam (httpcore2 on anyio,
with happy eyeballs) starts tasks of its own. A replay opens no connection,
so if those tasks were numbered as the agent's, the agent's next
``asyncio.create_task`` would replay at another causal position.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

import replayable
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"


@replayable.tool
async def lookup(city: str) -> str:
    await asyncio.sleep(0)
    return f"sunny in {city}"


async def _ask(client: openai.AsyncOpenAI, prompt: str) -> str:
    r = await client.chat.completions.create(
        model="fake-1", messages=[{"role": "user", "content": prompt}]
    )
    return r.choices[0].message.content or ""


async def _agent(client: openai.AsyncOpenAI, calls: int) -> list[str]:
    out = [await _ask(client, f"question {i}") for i in range(calls)]
    out.append(await asyncio.create_task(lookup("Oslo")))
    # A second task, started after another call, checks the ordinals keep in step.
    out.append(await _ask(client, "again"))
    out.append(await asyncio.create_task(lookup("Rome")))
    return out


def _workflow(base_url: str, calls: int, client: openai.AsyncOpenAI | None = None) -> Any:
    @replayable.workflow("lineage_agent")
    async def lineage_agent(tag: str) -> list[str]:
        if client is not None:
            return await _agent(client, calls)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY) as fresh:
            return await _agent(fresh, calls)

    return lineage_agent


@pytest.mark.parametrize(("calls", "failures"), [(1, []), (2, []), (1, [500, 503])])
def test_sdk_call_then_task_replays_identical(
    provider: FakeProvider, store: MemoryStore, calls: int, failures: list[int]
) -> None:
    """A new connection, a reused one, and retries (each on a new connection)."""
    provider.fail_next = list(failures)
    wf = _workflow(provider.url + "/v1", calls)

    async def record() -> list[str]:
        async with replayable.recording(store):
            out: list[str] = await wf("t")
        return out

    out = asyncio.run(record())
    assert out[calls] == "sunny in Oslo"
    (run_id,) = [r.run_id for r in store.list_runs()]
    keys = [e.key for e in store.events(run_id) if e.kind == "tool"]
    assert keys == ["r.0:0", "r.1:0"]
    hits = len(provider.requests)
    result = replayable.replay(run_id, store=store, fn=wf)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert len(provider.requests) == hits


def test_pool_warmed_before_the_recording(provider: FakeProvider, store: MemoryStore) -> None:
    """A client whose connection was opened before the run: no new connection inside it."""

    async def record() -> list[str]:
        client = openai.AsyncOpenAI(base_url=provider.url + "/v1", api_key=KEY)
        await _ask(client, "warm up")
        wf = _workflow("unused", 1, client)
        async with replayable.recording(store):
            out: list[str] = await wf("t")
        await client.close()
        return out

    out = asyncio.run(record())
    (run_id,) = [r.run_id for r in store.list_runs()]

    async def replay_with_fresh_client() -> Any:
        client = openai.AsyncOpenAI(base_url=provider.url + "/v1", api_key=KEY)
        wf = _workflow("unused", 1, client)
        # The replay runs on its own loop thread when called inside one.
        result = await asyncio.to_thread(replayable.replay, run_id, store=store, fn=wf)
        await client.close()
        return result

    hits = len(provider.requests)
    result = asyncio.run(replay_with_fresh_client())
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert len(provider.requests) == hits


class _LeftOpen:
    """Like an SDK client nobody closed: its finalizer schedules the close as a task."""

    def __del__(self) -> None:
        asyncio.get_running_loop().create_task(asyncio.sleep(0))


def test_task_from_a_finalizer_takes_no_ordinal(store: MemoryStore) -> None:
    """Garbage collected while recording only: the agent's next task keeps its position."""
    collect = [True]

    @replayable.workflow("finalizer_agent")
    async def finalizer_agent() -> list[str]:
        if collect[0]:
            leftover = _LeftOpen()
            del leftover  # collected here, while recording, and not on replay
        first = await asyncio.create_task(lookup("Oslo"))
        return [first, await asyncio.create_task(lookup("Rome"))]

    async def record() -> list[str]:
        async with replayable.recording(store):
            out: list[str] = await finalizer_agent()
        return out

    out = asyncio.run(record())
    (run_id,) = [r.run_id for r in store.list_runs()]
    assert [e.key for e in store.events(run_id)] == ["r.0:0", "r.1:0"]
    collect[0] = False
    result = replayable.replay(run_id, store=store, fn=finalizer_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out
