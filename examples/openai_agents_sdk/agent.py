"""An OpenAI Agents SDK agent, written as the SDK's docs write it, recorded and replayed.

Run it from the repository root: ``python examples/openai_agents_sdk/agent.py``.
The agent code below is plain Agents SDK code (``Agent``, ``@function_tool``,
``Runner``); the only additions are ``@replayable.workflow`` on the entry
function and ``@replayable.tool`` on the forecast service the tool calls. It
starts the local fake provider (``tests/integrations/servers.py``), records a
run with the SDK's default Responses-API model and one with its
chat-completions model, stops the server, replays both from the tape, and
forks one at the tool step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

import replayable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The SDK exports traces to OpenAI by default; a recorded run needs no network but the model's.
set_tracing_disabled(True)

INSTRUCTIONS = (
    "You are a travel assistant. Look up the weather with the get_weather tool "
    "before you answer, and answer in one short sentence."
)
UNITS = "metric"


@replayable.tool
def lookup_forecast(city: str, units: str) -> str:
    """The weather service the tool asks (a real agent would call an API here)."""
    return f"sunny, {21 if units == 'metric' else 70} degrees"


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city to look up.
    """
    return f"{city}: {lookup_forecast(city, units=UNITS)}"


def build(base_url: str, api: str = "responses") -> Agent:
    """The agent, on the Responses API (the SDK's default) or on chat completions."""
    client = AsyncOpenAI(base_url=base_url, api_key="sk-example-not-a-real-key")
    model: Any
    if api == "responses":
        model = OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)
    else:
        model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
    return Agent(name="Travel", instructions=INSTRUCTIONS, tools=[get_weather], model=model)


@replayable.workflow("examples.openai_agents_sdk")
def ask(base_url: str, question: str, api: str = "responses") -> str:
    """``Runner.run_sync``: the agent loop runs the tool the model calls, then answers."""
    return str(Runner.run_sync(build(base_url, api), question).final_output)


@replayable.workflow("examples.openai_agents_sdk.default")
def ask_default(question: str) -> str:
    """The SDK's defaults: no model named, the client set once with
    ``set_default_openai_client`` (or ``OPENAI_BASE_URL``), the Responses API."""
    agent = Agent(name="Travel", instructions=INSTRUCTIONS, tools=[get_weather])
    return str(Runner.run_sync(agent, question).final_output)


@replayable.workflow("examples.openai_agents_sdk.async")
async def aask(base_url: str, question: str) -> str:
    """``await Runner.run(...)`` on the Responses API."""
    return str((await Runner.run(build(base_url), question)).final_output)


@replayable.workflow("examples.openai_agents_sdk.streamed")
async def ask_streamed(base_url: str, question: str) -> dict[str, Any]:
    """``Runner.run_streamed``: the text deltas as they arrive, and the final output."""
    result = Runner.run_streamed(build(base_url), question)
    deltas: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas.append(event.data.delta)
    return {"deltas": deltas, "final": str(result.final_output)}


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        for api in ("responses", "chat"):
            print(f"live ({api}):", ask(server.url + "/v1", "What is the weather in Lisbon", api))
        run_id = rec.run_ids[0]
        for event in store.events(run_id):
            print(f"  step {event.seq}: {event.kind:<4} {event.name}")
        step = next(e.seq for e in store.events(run_id) if e.name == "lookup_forecast")
        forked = replayable.replay(
            run_id, store=store, fn=ask, fork_at=step, overrides={step: "storm warning"}
        )
        print(f"fork at step {step}:", forked.status, "-", forked.output)
    for rid in rec.run_ids:  # the server is stopped now
        result = replayable.replay(rid, store=store, fn=ask)
        print("replay:", result.status, "-", result.output)
    store.close()


if __name__ == "__main__":
    main()
