"""Two AG2 agents recorded through ag2's middleware, replayed and forked.

Run it from the repository root: ``python examples/ag2_agent/agent.py``.
It starts the local fake OpenAI-wire provider (``tests/integrations/servers.py``)
and records one run in which a weather agent calls its ``get_weather`` tool and
a dispatch agent calls ``send_alert``, a side-effecting tool. It replays the
run with the server stopped, then forks it at the weather tool with another
result: the model runs live again, and the new alert is sent only because the
fork names ``send_alert`` in ``allow_live``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx2
from ag2 import Agent, tool
from ag2.config.openai import OpenAIConfig

import replayable
from replayable.integrations import ag2 as rag2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ALERTS: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"sunny, 21 °C in {city}"


@tool
def send_alert(city: str) -> str:
    """Send a weather alert for a city (changes the world)."""
    ALERTS.append(city)
    return f"alert sent for {city}"


@replayable.workflow("examples.ag2_agent")
async def brief(base_url: str, city: str) -> dict[str, Any]:
    """Ask for the weather in a city, then have the alert sent."""
    async with httpx2.AsyncClient() as http:
        config = OpenAIConfig(
            model="gpt-4o-mini",
            base_url=base_url,
            api_key="sk-example-not-a-real-key",
            http_client=http,
        )
        weather = Agent(
            "weather",
            "You report the weather.",
            config=config,
            tools=[get_weather],
            middleware=[rag2.middleware()],
        )
        dispatch = rag2.instrument(
            Agent("dispatch", "You send weather alerts.", config=config, tools=[send_alert]),
            side_effects={"send_alert"},
        )
        report = (await weather.ask(f"weather in {city}")).body
        sent = (await dispatch.ask(f"alert: {report}")).body
        return {"report": report, "sent": sent}


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    server = FakeProvider().start()
    with replayable.recording(store) as rec:
        out = asyncio.run(brief(server.url + "/v1", "Oslo"))
    run_id = rec.run_ids[0]
    print("recorded", run_id, out, "alerts:", ALERTS)
    for event in store.events(run_id):
        effect = "  (side effect)" if event.side_effect else ""
        print(f"  {event.seq}. {event.kind:5} {event.name}{effect}")

    step = next(e.seq for e in store.events(run_id) if e.name == "get_weather")
    forked = replayable.replay(
        run_id,
        store=store,
        fn=brief,
        fork_at=step,
        overrides={step: "storm warning in Bergen"},
        allow_live={"send_alert"},
    )
    print(f"fork at step {step}:", forked.status, forked.output, "alerts:", ALERTS)

    server.stop()
    result = replayable.replay(run_id, store=store, fn=brief)
    print("replay with the server stopped:", result.status, result.output)
    store.close()


if __name__ == "__main__":
    main()
