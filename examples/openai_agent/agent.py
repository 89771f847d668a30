"""A tiny OpenAI agent with a tool-call loop, recorded and replayed with no code change.

Run it from the repository root: ``python examples/openai_agent/agent.py``.
It starts the local fake provider (``tests/integrations/servers.py``),
records one run, stops the server and replays the run from the tape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import openai

import replayable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@replayable.tool
def get_weather(city: str) -> str:
    """The tool the model may call (a real agent would ask a weather service)."""
    return f"sunny, 21 °C in {city}"


@replayable.workflow("examples.openai_agent")
def agent(base_url: str, question: str) -> str:
    """Ask the model; run the tools it calls; stop at its first plain answer."""
    with openai.OpenAI(base_url=base_url, api_key="sk-example-not-a-real-key") as client:
        messages: list[Any] = [{"role": "user", "content": question}]
        for _ in range(5):
            reply = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=TOOLS, temperature=0
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return message.content or ""
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = get_weather(**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return "no answer"


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        answer = agent(server.url + "/v1", "What is the weather in Lisbon?")
    print("live:   ", answer)
    run_id = rec.run_ids[0]
    for event in store.events(run_id):
        print(
            f"  step {event.seq}: {event.kind:<4} {event.name}  {event.metadata.get('usage') or ''}"
        )
    result = replayable.replay(run_id, store=store, fn=agent)  # the server is stopped now
    print("replay: ", result.status, "-", result.output)


if __name__ == "__main__":
    main()
