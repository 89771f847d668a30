"""A LangGraph tool agent with parallel branches, recorded and replayed.

Run it from the repository root: ``python examples/langgraph_agent/agent.py``.
It starts the local fake OpenAI-wire provider (``tests/integrations/servers.py``),
records one run of a graph that fans out over cities with ``Send`` (each
branch asks the model and calls a tool, in parallel threads), stops the
server, replays the run from the tape, and forks it at a tool step.
"""

from __future__ import annotations

import operator
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import replayable
from replayable.integrations import langgraph as rlg

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

rlg.instrument(side_effects={"send_alert"})


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"sunny, 21 °C in {city}"


class Trip(TypedDict):
    cities: list[str]
    notes: Annotated[list[str], operator.add]


def build(base_url: str) -> Any:
    model = ChatOpenAI(base_url=base_url, api_key="sk-example-not-a-real-key", model="gpt-4o-mini")  # type: ignore[arg-type]

    def plan(state: Trip) -> list[Send]:
        return [Send("visit", {"cities": [c], "notes": []}) for c in state["cities"]]

    def visit(state: Trip) -> dict[str, Any]:
        city = state["cities"][0]
        tip = model.invoke(f"one tip for {city}").content
        weather = get_weather.invoke(
            {"name": "get_weather", "args": {"city": city}, "id": f"w-{city}", "type": "tool_call"}
        )
        return {"notes": [f"{city}: {tip} ({weather.content})"]}

    graph = StateGraph(Trip)
    graph.add_node("visit", visit)
    graph.add_conditional_edges(START, plan, ["visit"])
    graph.add_edge("visit", END)
    return graph.compile()


@replayable.workflow("examples.langgraph_agent")
def trip(base_url: str, cities: list[str]) -> list[str]:
    """Visit every city in parallel branches and collect the notes."""
    return list(build(base_url).invoke({"cities": cities, "notes": []})["notes"])


def main() -> None:
    from tests.integrations.servers import FakeProvider

    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        notes = trip(server.url + "/v1", ["Oslo", "Lima", "Pune"])
    run_id = rec.run_ids[0]
    print("recorded", run_id)
    for note in notes:
        print("  ", note)
    for event in store.events(run_id):
        print(f"  {event.seq}. {event.kind:5} {event.name:22} key={event.key}")

    result = replayable.replay(run_id, store=store, fn=trip)
    print("replay with the server stopped:", result.status)

    step = next(e.seq for e in store.events(run_id) if e.kind == "tool")
    city = store.events(run_id)[step - 1].request_value()["input"]["city"]
    storm = ToolMessage(content=f"storm warning in {city}", tool_call_id=f"w-{city}")
    forked = replayable.replay(run_id, store=store, fn=trip, fork_at=step, overrides={step: storm})
    print(f"fork at step {step} ({city}):", forked.status)
    for note in forked.output or []:
        print("  ", note)
    store.close()


if __name__ == "__main__":
    main()
