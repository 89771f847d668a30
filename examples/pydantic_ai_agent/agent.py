"""A pydantic-ai agent with a tool, on an OpenAI-compatible model, recorded and replayed.

Run it from the repository root: ``python examples/pydantic_ai_agent/agent.py``.
The agent is written as pydantic-ai's docs write it (``Agent``, a system
prompt, ``@agent.tool_plain``, ``run_sync``); the only additions are
``@replayable.workflow`` on the entry function and ``@replayable.tool`` on the
forecast service its tool asks. It starts the local fake provider
(``tests/integrations/servers.py``), records one run, forks it at the tool
step, stops the server and replays the run from the tape.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import replayable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

INSTRUCTIONS = (
    "You are a travel assistant. Look up the weather with the get_weather tool "
    "before you answer, and answer in one short sentence."
)
UNITS = "metric"


@replayable.tool
def lookup_forecast(city: str, units: str) -> str:
    """The weather service the tool asks (a real agent would call an API here)."""
    return f"sunny, {21 if units == 'metric' else 70} degrees"


def build(base_url: str) -> Agent[None, str]:
    """The agent on any OpenAI-compatible endpoint."""
    model = OpenAIChatModel(
        "gpt-4o-mini",
        provider=OpenAIProvider(base_url=base_url, api_key="sk-example-not-a-real-key"),
    )
    agent = Agent(model, system_prompt=INSTRUCTIONS)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"{city}: {lookup_forecast(city, units=UNITS)}"

    return agent


@replayable.workflow("examples.pydantic_ai_agent")
def ask(base_url: str, question: str) -> str:
    """``agent.run_sync``: the tool the model calls, then its answer."""
    return build(base_url).run_sync(question).output


@replayable.workflow("examples.pydantic_ai_agent.async")
async def aask(base_url: str, question: str) -> str:
    """``await agent.run(...)``."""
    return (await build(base_url).run(question)).output


@replayable.workflow("examples.pydantic_ai_agent.streamed")
async def ask_streamed(base_url: str, question: str) -> dict[str, Any]:
    """``agent.run_stream``: the text as it grows, and the final output."""
    async with build(base_url).run_stream(question) as result:
        pieces = [text async for text in result.stream_text(delta=True)]
        return {"pieces": pieces, "final": await result.get_output()}


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        print("live:  ", ask(server.url + "/v1", "What is the weather in Lisbon"))
        run_id = rec.run_ids[0]
        for event in store.events(run_id):
            print(f"  step {event.seq}: {event.kind:<4} {event.name}")
        forked = replayable.replay(
            run_id, store=store, fn=ask, fork_at=2, overrides={2: "storm warning"}
        )
        print("fork at step 2:", forked.status, "-", forked.output)
    result = replayable.replay(run_id, store=store, fn=ask)  # the server is stopped now
    print("replay:", result.status, "-", result.output)
    store.close()


if __name__ == "__main__":
    main()
