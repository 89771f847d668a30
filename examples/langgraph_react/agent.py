"""LangGraph's prebuilt ReAct agent with ChatOpenAI, recorded and replayed.

Run it from the repository root: ``python examples/langgraph_react/agent.py``
(add ``--instrument`` for the LangGraph integration). The agent is
``create_react_agent`` as LangGraph's docs write it (LangChain 1.x names it
``langchain.agents.create_agent``; the prebuilt one is used when LangChain 1.x
is not installed); the only additions are ``@replayable.workflow`` on the entry
function and ``@replayable.tool`` on the forecast service its tool asks.

Without ``instrument()`` the HTTP seam records each model request beneath
ChatOpenAI, and the tools run again on replay (their ``@replayable.tool``
calls are served). With ``replayable.integrations.langgraph.instrument()``
each model call and each tool call is one event named after the LangChain
object, keyed by the LangGraph task; the tool's body still runs on replay
when it made recorded calls of its own, so a changed argument inside it is
caught, and token streaming (``stream_mode="messages"``) sees the recorded
tokens.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import replayable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

try:  # LangChain 1.x: the successor of create_react_agent
    from langchain.agents import create_agent as _create  # type: ignore[import-not-found]
except ImportError:
    from langgraph.prebuilt import create_react_agent as _create

INSTRUCTIONS = (
    "You are a travel assistant. Look up the weather with the get_weather tool "
    "before you answer, and answer in one short sentence."
)
UNITS = "metric"


@replayable.tool
def lookup_forecast(city: str, units: str) -> str:
    """The weather service the tool asks (a real agent would call an API here)."""
    return f"sunny, {21 if units == 'metric' else 70} degrees"


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"{city}: {lookup_forecast(city, units=UNITS)}"


def build(base_url: str) -> Any:
    """The ReAct agent: the model, its tool, the system prompt."""
    model = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="sk-example-not-a-real-key")  # type: ignore[arg-type]
    with warnings.catch_warnings():
        # LangGraph 1.x names create_react_agent's new home; the prebuilt one still works.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return _create(model, [get_weather], system_prompt=INSTRUCTIONS)
        except TypeError:
            return _create(model, [get_weather], prompt=INSTRUCTIONS)


@replayable.workflow("examples.langgraph_react")
def ask(base_url: str, question: str) -> str:
    """``agent.invoke``: the answer after the tool loop."""
    result = build(base_url).invoke({"messages": [("user", question)]})
    return str(result["messages"][-1].content)


@replayable.workflow("examples.langgraph_react.streamed")
def ask_streamed(base_url: str, question: str) -> list[str]:
    """``stream_mode="messages"``: every token and message as LangGraph streams it."""
    agent = build(base_url)
    return [
        f"{meta['langgraph_node']}: {message.content}"
        for message, meta in agent.stream(
            {"messages": [("user", question)]}, stream_mode="messages"
        )
    ]


def main() -> None:
    from tests.integrations.servers import FakeProvider

    if "--instrument" in sys.argv:
        from replayable.integrations import langgraph

        langgraph.instrument()
    store = replayable.open_store("memory://")
    with FakeProvider() as server, replayable.recording(store) as rec:
        print("live:  ", ask(server.url + "/v1", "What is the weather in Lisbon"))
        run_id = rec.run_ids[0]
        for event in store.events(run_id):
            print(f"  step {event.seq}: {event.kind:<4} {event.name}")
        step = next(e.seq for e in store.events(run_id) if e.name == "lookup_forecast")
        forked = replayable.replay(
            run_id, store=store, fn=ask, fork_at=step, overrides={step: "storm warning"}
        )
        print(f"fork at step {step}:", forked.status, "-", forked.output)
    result = replayable.replay(run_id, store=store, fn=ask)  # the server is stopped now
    print("replay:", result.status, "-", result.output)
    store.close()


if __name__ == "__main__":
    main()
