"""Small agents the replay tests record and replay. ``VARIANT`` stands in for an edit
of the agent's code between recording and replay."""

from __future__ import annotations

import asyncio
import random as _random
import threading
from concurrent.futures import ThreadPoolExecutor

import replayable

VARIANT = "original"
CALLS: list[str] = []  # what really ran; replay must leave it untouched
_lock = threading.Lock()


def _ran(name: str) -> None:
    with _lock:
        CALLS.append(name)


@replayable.tool
def search(query: str, limit: int = 3) -> list[dict[str, object]]:
    _ran(f"search:{query}")
    return [{"title": f"{query} #{i}", "score": _random.random()} for i in range(limit)]


@replayable.tool
def fetch(url: str) -> str:
    _ran(f"fetch:{url}")
    return f"<html>{url} {_random.random()}</html>"


@replayable.tool(name="send_email", side_effect=True)
def send_email(to: str, body: str) -> dict[str, str]:
    _ran(f"send_email:{to}")
    return {"status": "sent", "id": str(_random.random())}


@replayable.tool
def flaky(n: int) -> int:
    _ran("flaky")
    raise ValueError(f"bad input {n}")


@replayable.workflow("research")
def research(topic: str) -> dict[str, object]:
    """Search, fetch the top hit, mail a summary; VARIANT edits the code path."""
    query = topic if VARIANT != "different_arg" else topic.upper()
    if VARIANT == "reordered":
        page = fetch(f"https://example.test/{topic}")
        hits = search(query)
    else:
        hits = search(query)
        page = fetch(f"https://example.test/{topic}") if VARIANT != "skip_call" else ""
    if VARIANT == "extra_call":
        fetch("https://example.test/extra")
    stamp = replayable.now()
    token = replayable.uuid4()
    roll = replayable.randint(1, 6)
    receipt = send_email("ops@example.test", f"{hits[0]['title']} {len(page)}")
    out = {
        "best": hits[0]["title"],
        "len": len(page),
        "stamp": stamp,
        "token": str(token),
        "roll": roll,
        "receipt": receipt["id"],
    }
    if VARIANT == "output_changed":
        out["best"] = "something else"
    return out


@replayable.workflow("fails")
def fails(n: int) -> int:
    """Calls a tool that raises and lets the error escape."""
    try:
        flaky(n)
    except ValueError:
        pass
    return flaky(n + 1)


@replayable.tool
async def slow_lookup(key: str) -> dict[str, str]:
    await asyncio.sleep(_random.random() * 0.02)
    _ran(f"lookup:{key}")
    return {"key": key, "value": f"{key}-{_random.random()}"}


@replayable.workflow("fanout")
async def fanout(keys: list[str]) -> list[str]:
    """Same tool in parallel with different arguments; completion order is random."""

    async def branch(k: str) -> str:
        first = await slow_lookup(k)
        second = await slow_lookup(first["value"])
        return second["value"]

    return list(await asyncio.gather(*(branch(k) for k in keys)))


@replayable.workflow("threaded")
def threaded(urls: list[str]) -> list[str]:
    """Tool calls from a thread pool that carries the recording context."""
    with replayable.ContextThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(fetch, urls))


@replayable.workflow("threaded_carry")
def threaded_carry(urls: list[str]) -> list[str]:
    """A plain ThreadPoolExecutor with replayable.carry() around each task."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(replayable.carry(fetch), u) for u in urls]
        return [f.result() for f in futures]


@replayable.workflow("child")
def child(q: str) -> str:
    return search(q, limit=1)[0]["title"]  # type: ignore[return-value]


@replayable.workflow("parent")
def parent(qs: list[str]) -> list[str]:
    """Starts one child run per query, then calls a tool of its own."""
    with replayable.span("children", count=len(qs)):
        titles = [child(q) for q in qs]
    fetch("https://example.test/summary")
    return titles
