"""A tiny Anthropic agent with a tool-use loop, recorded and replayed.

Run it from the repository root: ``python examples/anthropic_agent/agent.py``.
It uses ``replayable.integrations.anthropic.client()`` (the explicit way in),
starts the local fake provider, records one run (streaming the final answer),
stops the server and replays the run from the tape.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import replayable
from replayable.integrations import anthropic as recorded_anthropic

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


@replayable.tool
def get_weather(city: str) -> str:
    """The tool the model may call."""
    return f"light rain, 12 °C in {city}"


@replayable.workflow("examples.anthropic_agent")
def agent(base_url: str, question: str) -> str:
    """Ask the model; run the tools it uses; stream its final answer."""
    with recorded_anthropic.client(base_url=base_url, api_key="sk-ant-example") as client:
        messages: list[Any] = [{"role": "user", "content": question}]
        for _ in range(5):
            with client.messages.stream(
                model="claude-example",
                max_tokens=256,
                system="Answer briefly.",
                tools=TOOLS,
                messages=messages,
            ) as stream:
                final = stream.get_final_message()
            uses = [block for block in final.content if block.type == "tool_use"]
            if not uses:
                return "".join(block.text for block in final.content if block.type == "text")
            messages.append(
                {"role": "assistant", "content": [block.model_dump() for block in final.content]}
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use.id,
                            "content": get_weather(**use.input),
                        }
                        for use in uses
                    ],
                }
            )
        return "no answer"


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        answer = agent(server.url, "What is the weather in Dublin?")
    print("live:   ", answer)
    run_id = rec.run_ids[0]
    for event in store.events(run_id):
        chunks = event.metadata.get("chunks")
        print(
            f"  step {event.seq}: {event.kind:<4} {event.name}"
            + (f"  ({chunks} chunks)" if chunks else "")
        )
    result = replayable.replay(run_id, store=store, fn=agent)
    print("replay: ", result.status, "-", result.output)


if __name__ == "__main__":
    main()
