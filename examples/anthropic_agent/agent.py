"""An Anthropic SDK agent: the tool-use loop, with and without the streaming helper.

Run it from the repository root: ``python examples/anthropic_agent/agent.py``.
The loop is the one Anthropic's tool-use guide writes: call
``messages.create(tools=...)``, run every ``tool_use`` block, send the
``tool_result`` blocks back, and stop once ``stop_reason`` is not
``"tool_use"``; the second workflow does the same with ``messages.stream()``.
The only additions are ``@replayable.workflow`` on the entry functions and
``@replayable.tool`` on the forecast service the tool asks. It starts the local
fake provider (``tests/integrations/servers.py``), records a run, forks it at
the tool step, stops the server and replays it from the tape.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anthropic

import replayable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

INSTRUCTIONS = (
    "You are a travel assistant. Look up the weather with the get_weather tool "
    "before you answer, and answer in one short sentence."
)
UNITS = "metric"
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    }
]


@replayable.tool
def lookup_forecast(city: str, units: str) -> str:
    """The weather service the tool asks (a real agent would call an API here)."""
    return f"light rain, {12 if units == 'metric' else 54} degrees"


def get_weather(city: str) -> str:
    """The tool the model may use."""
    return f"{city}: {lookup_forecast(city, units=UNITS)}"


def _results(content: list[Any]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_result", "tool_use_id": block.id, "content": get_weather(**block.input)}
        for block in content
        if block.type == "tool_use"
    ]


@replayable.workflow("examples.anthropic_agent")
def ask(base_url: str, question: str) -> str:
    """``messages.create`` until the model stops asking for tools."""
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-example")
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        response = client.messages.create(
            model="claude-example",
            max_tokens=1024,
            system=INSTRUCTIONS,
            tools=TOOLS,
            messages=messages,
        )
        if response.stop_reason != "tool_use":
            return "".join(block.text for block in response.content if block.type == "text")
        messages.append({"role": "assistant", "content": response.content})
        messages.append({"role": "user", "content": _results(response.content)})


@replayable.workflow("examples.anthropic_agent.streamed")
def ask_streamed(base_url: str, question: str) -> dict[str, Any]:
    """The same loop with ``messages.stream()``: the text as it streams, then the answer."""
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-example")
    messages: list[Any] = [{"role": "user", "content": question}]
    pieces: list[str] = []
    while True:
        with client.messages.stream(
            model="claude-example",
            max_tokens=1024,
            system=INSTRUCTIONS,
            tools=TOOLS,
            messages=messages,
        ) as stream:
            pieces.extend(stream.text_stream)
            message = stream.get_final_message()
        if message.stop_reason != "tool_use":
            return {"pieces": pieces, "answer": message.content[0].text}  # type: ignore[union-attr]
        messages.append({"role": "assistant", "content": message.content})
        messages.append({"role": "user", "content": _results(message.content)})


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        print("live:   ", ask(server.url, "What is the weather in Dublin"))
        run_id = rec.run_ids[0]
        for event in store.events(run_id):
            print(f"  step {event.seq}: {event.kind:<4} {event.name}")
        forked = replayable.replay(
            run_id, store=store, fn=ask, fork_at=2, overrides={2: "snow, -2 degrees"}
        )
        print("fork at step 2:", forked.status, "-", forked.output)
    result = replayable.replay(run_id, store=store, fn=ask)  # the server is stopped now
    print("replay: ", result.status, "-", result.output)
    store.close()


if __name__ == "__main__":
    main()
