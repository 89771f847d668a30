"""Agents run in a fresh interpreter, importing the SDKs at a chosen moment.

``python -m tests.integrations.agents_import_order ORDER URL DB MODE`` with
MODE ``record`` records a sync and an async workflow (OpenAI chat, plain and
streamed; Anthropic messages, plain and streamed; a ``requests`` call) into
the store ``DB`` and replays both; with MODE ``replay`` it only replays every
run in ``DB`` (in a process that never recorded). It prints one JSON line:
the statuses, the kinds of the recorded events and which SDKs were loaded
before the first workflow ran.

``ORDER`` is when the SDKs are imported: ``before`` (ahead of replayable, the
sync clients built at module level), ``inside`` (inside the workflow function)
or ``thread`` (inside the workflow, by a thread of its own).
"""

# ruff: noqa: E402  (the SDKs are imported at a chosen moment, before the rest)
from __future__ import annotations

import sys

ORDER, URL, DB, MODE = sys.argv[1:5]

if ORDER == "before":
    import anthropic
    import openai
    import requests  # noqa: F401  (imported before replayable on purpose)

import asyncio
import importlib
import threading
from typing import Any

import orjson

import replayable

OPENAI_KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"
ANTHROPIC_KEY = "sk-ant-test-abcdefghijklmnopqrstuvwxyz0123"
#: Clients built at import, before any recording (``before`` only).
PREBUILT: dict[str, Any] = {}
if ORDER == "before":
    PREBUILT["openai"] = openai.OpenAI(base_url=URL + "/v1", api_key=OPENAI_KEY, max_retries=0)
    PREBUILT["anthropic"] = anthropic.Anthropic(base_url=URL, api_key=ANTHROPIC_KEY, max_retries=0)
LOADED_AT_START = sorted(m for m in ("openai", "anthropic", "requests") if m in sys.modules)


def _sdks() -> tuple[Any, Any, Any]:
    """The SDK modules, imported now if the order says so."""
    if ORDER == "thread":
        done: list[Any] = []
        t = threading.Thread(
            target=lambda: done.extend(
                importlib.import_module(n) for n in ("openai", "anthropic", "requests")
            )
        )
        t.start()
        t.join()
        return done[0], done[1], done[2]
    return (
        importlib.import_module("openai"),
        importlib.import_module("anthropic"),
        importlib.import_module("requests"),
    )


@replayable.workflow
def sync_agent(prompt: str) -> dict[str, Any]:
    oa, an, rq = _sdks()
    out: dict[str, Any] = {}
    client = PREBUILT.get("openai") or oa.OpenAI(
        base_url=URL + "/v1", api_key=OPENAI_KEY, max_retries=0
    )
    r = client.chat.completions.create(
        model="fake-1", messages=[{"role": "user", "content": prompt}]
    )
    out["chat"] = r.choices[0].message.content
    stream = client.chat.completions.create(
        model="fake-1", messages=[{"role": "user", "content": prompt}], stream=True
    )
    out["chat_stream"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    client = PREBUILT.get("anthropic") or an.Anthropic(
        base_url=URL, api_key=ANTHROPIC_KEY, max_retries=0
    )
    m = client.messages.create(
        model="claude-fake", max_tokens=32, messages=[{"role": "user", "content": prompt}]
    )
    out["messages"] = m.content[0].text
    with client.messages.stream(
        model="claude-fake", max_tokens=32, messages=[{"role": "user", "content": prompt}]
    ) as s:
        out["messages_stream"] = "".join(s.text_stream)
    resp = rq.get(URL + "/v1/models", timeout=5)
    out["requests"] = resp.json()["data"][0]["id"]
    return out


@replayable.workflow
async def async_agent(prompt: str) -> dict[str, Any]:
    oa, an, _ = _sdks()
    out: dict[str, Any] = {}
    async with oa.AsyncOpenAI(base_url=URL + "/v1", api_key=OPENAI_KEY, max_retries=0) as client:
        r = await client.chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": prompt}]
        )
        out["chat"] = r.choices[0].message.content
        stream = await client.chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": prompt}], stream=True
        )
        out["chat_stream"] = "".join(
            [c.choices[0].delta.content or "" async for c in stream if c.choices]
        )
    async with an.AsyncAnthropic(base_url=URL, api_key=ANTHROPIC_KEY, max_retries=0) as client:
        m = await client.messages.create(
            model="claude-fake", max_tokens=32, messages=[{"role": "user", "content": prompt}]
        )
        out["messages"] = m.content[0].text
        async with client.messages.stream(
            model="claude-fake", max_tokens=32, messages=[{"role": "user", "content": prompt}]
        ) as s:
            out["messages_stream"] = "".join([t async for t in s.text_stream])
    return out


def main() -> None:
    if MODE == "record":
        with replayable.recording(DB) as rec:
            outputs = [sync_agent("hello sync"), asyncio.run(async_agent("hello async"))]
        run_ids = rec.run_ids
    else:
        outputs = []
        run_ids = sorted(r.run_id for r in replayable.open_store(DB).list_runs())
    store = replayable.open_store(DB)
    agents = {"sync_agent": sync_agent, "async_agent": async_agent}
    results = [replayable.replay(r, store=store, fn=agents[store.run(r).workflow]) for r in run_ids]
    print(
        orjson.dumps(
            {
                "loaded_at_start": LOADED_AT_START,
                "outputs": outputs,
                "kinds": [[f"{e.kind}:{e.name}" for e in store.events(r)] for r in run_ids],
                "statuses": [r.status for r in results],
                "divergences": [str(r.divergence) if r.divergence else None for r in results],
                "replayed": [r.output for r in results],
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
