"""LangGraph and LangChain recorded and replayed against the local fake OpenAI server."""

from __future__ import annotations

import asyncio
import operator
import random
import time
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_core.tracers._streaming import _V2StreamingCallbackHandler
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send, interrupt

import replayable
from replayable.integrations import _wire
from replayable.integrations import langgraph as rlg
from replayable.store import MemoryStore
from replayable.web.views import payload_view
from tests.integrations.servers import FakeProvider

rlg.instrument(side_effects={"notify"})

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"
SENT: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    return f"sunny in {city}"


@tool
def notify(text: str) -> str:
    """Send a notification (a side effect)."""
    SENT.append(text)
    return "sent"


def _model(base_url: str) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key=KEY, model="fake-1", temperature=0.2)  # type: ignore[arg-type]


def _react(base_url: str) -> Any:
    model = _model(base_url).bind_tools([get_weather])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else "report"  # type: ignore[attr-defined]

    def report(state: MessagesState) -> dict[str, Any]:
        notify.invoke({"text": str(state["messages"][-1].content)})
        return {}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([get_weather]))
    g.add_node("report", report)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", "report"])
    g.add_edge("tools", "agent")
    g.add_edge("report", END)
    return g.compile()


@replayable.workflow
def react_agent(base_url: str, prompt: str) -> str:
    out = _react(base_url).invoke({"messages": [("user", prompt)]})
    return str(out["messages"][-1].content)


def _record(store: MemoryStore, fn: Any, *args: Any) -> tuple[str, Any]:
    with replayable.recording(store) as rec:
        out = asyncio.run(fn(*args)) if asyncio.iscoroutinefunction(fn.__wrapped__) else fn(*args)
    SENT.clear()
    return rec.run_ids[0], out


def test_react_graph_replays_with_server_stopped(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """Model and tool calls are one event each and are substituted on replay."""
    run_id, out = _record(store, react_agent, provider.url + "/v1", "weather in Paris")
    assert out == "Answer: sunny in Paris"
    provider.stop()
    events = store.events(run_id)
    assert [(e.kind, e.name, e.side_effect) for e in events] == [
        ("llm", "langchain.ChatOpenAI", False),
        ("tool", "get_weather", False),
        ("llm", "langchain.ChatOpenAI", False),
        ("tool", "notify", True),
    ]
    assert events[0].metadata["model"] == "fake-1"
    assert events[0].metadata["temperature"] == 0.2
    # The conversation lives in the recorded request and response only: metadata is
    # stored in clear, beside payloads that may be encrypted and erased.
    assert "messages" not in events[0].metadata
    assert "output" not in events[0].metadata
    assert "weather in Paris" not in str(events[0].metadata)
    assert _wire.langchain_messages(events[0].request_value()) == [
        {"role": "human", "content": "weather in Paris"}
    ]
    answer = _wire.langchain_output(events[0].response_tree())
    assert answer is not None
    assert answer["tool_calls"][0]["name"] == "get_weather"
    # The web app still reads it as a conversation, from the payloads.
    shown = payload_view(events[0], 10_000)["conversation"]
    assert shown is not None
    first = shown["turns"][0]
    assert (first["role"], first["content"]["text"]) == ("human", "weather in Paris")
    assert "get_weather" in str(shown["turns"][-1]["tool_calls"])
    assert events[1].request_value() == {"input": {"city": "Paris"}, "tool_call_id": "call_1"}
    assert "__pregel_pull|agent" in str(events[0].key)
    result = replayable.replay(run_id, store=store, fn=react_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert SENT == []


def test_changed_prompt_diverges_at_the_model_call(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """Another prompt is a request_changed divergence at step 1 naming the message."""
    run_id, _ = _record(store, react_agent, provider.url + "/v1", "weather in Paris")
    provider.stop()

    @replayable.workflow(react_agent.__replayable_workflow__.name)  # type: ignore[attr-defined]
    def edited(base_url: str, prompt: str) -> str:
        return react_agent.__wrapped__(base_url, "weather in Rome")  # type: ignore[attr-defined,no-any-return]

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", 1)
    assert "weather in Rome" in div.message


def test_fork_at_the_tool_step_runs_the_model_live_and_guards_side_effects(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """An overridden tool result reaches the live model; the side-effecting notify is blocked."""
    run_id, _ = _record(store, react_agent, provider.url + "/v1", "weather in Paris")
    new = ToolMessage(content="raining in Paris", tool_call_id="call_1", name="get_weather")
    blocked = replayable.replay(run_id, store=store, fn=react_agent, fork_at=2, overrides={2: new})
    assert blocked.status == "diverged"
    assert blocked.divergence is not None
    assert blocked.divergence.reason == "side_effect_blocked"
    assert SENT == []
    forked = replayable.replay(
        run_id,
        store=store,
        fn=react_agent,
        fork_at=2,
        overrides={2: new},
        allow_live={"notify"},
    )
    assert forked.status == "completed", forked.divergence
    assert forked.output == "Answer: raining in Paris"
    assert SENT == ["Answer: raining in Paris"]
    SENT.clear()


class FanOut(TypedDict):
    cities: list[str]
    answers: Annotated[list[str], operator.add]


def _fan_out(base_url: str) -> Any:
    model = _model(base_url)

    def plan(state: FanOut) -> list[Send]:
        return [Send("worker", {"cities": [c], "answers": []}) for c in state["cities"]]

    def worker(state: FanOut) -> dict[str, Any]:
        city = state["cities"][0]
        time.sleep(random.random() / 50)  # scramble completion order
        answer = model.invoke(f"weather in {city}").content
        return {"answers": [f"{city}: {answer} / {get_weather.invoke({'city': city})}"]}

    async def aworker(state: FanOut) -> dict[str, Any]:
        city = state["cities"][0]
        await asyncio.sleep(random.random() / 50)
        answer = (await model.ainvoke(f"weather in {city}")).content
        weather = await get_weather.ainvoke({"city": city})
        return {"answers": [f"{city}: {answer} / {weather}"]}

    g = StateGraph(FanOut)
    g.add_node("worker", aworker if base_url.endswith("#async") else worker)
    g.add_conditional_edges(START, plan, ["worker"])
    g.add_edge("worker", END)
    return g.compile()


CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Doha"]


@replayable.workflow
def fan_out(base_url: str) -> list[str]:
    return list(_fan_out(base_url).invoke({"cities": CITIES, "answers": []})["answers"])


@replayable.workflow
async def afan_out(base_url: str) -> list[str]:
    out = await _fan_out(base_url + "#async").ainvoke({"cities": CITIES, "answers": []})
    return list(out["answers"])


@pytest.mark.parametrize("agent", [fan_out, afan_out], ids=["threads", "asyncio"])
def test_send_branches_are_keyed_by_task_path(
    agent: Any, provider: FakeProvider, store: MemoryStore
) -> None:
    """Parallel Send branches replay per branch, whatever order they finished in."""
    run_id, out = _record(store, agent, provider.url + "/v1")
    assert sorted(out) == sorted(f"{c}: Answer: weather in {c} / sunny in {c}" for c in CITIES)
    provider.stop()
    events = store.events(run_id)
    assert len(events) == 10
    for e in events:
        (city,) = [c for c in CITIES if c in str(e.request_value())]
        assert f"/1/__pregel_push|{CITIES.index(city)}|" in str(e.key), (e.key, city)
    for _ in range(2):
        result = replayable.replay(run_id, store=store, fn=agent)
        assert result.status == "identical", result.divergence
        assert result.output == out


class Draft(TypedDict):
    topic: str
    text: str
    verdict: str


def _approval(base_url: str) -> Any:
    model = _model(base_url)

    def draft(state: Draft) -> dict[str, Any]:
        text = str(model.invoke(f"draft about {state['topic']}").content)
        verdict = interrupt({"draft": text})
        return {"text": text, "verdict": verdict}

    g = StateGraph(Draft)
    g.add_node("draft", draft)
    g.add_edge(START, "draft")
    g.add_edge("draft", END)
    return g.compile(checkpointer=InMemorySaver())


@replayable.workflow
def approval(base_url: str, topic: str) -> dict[str, Any]:
    graph = _approval(base_url)
    config: Any = {"configurable": {"thread_id": "t1"}}
    first = graph.invoke({"topic": topic, "text": "", "verdict": ""}, config)
    asked = first["__interrupt__"][0].value
    final = graph.invoke(Command(resume=f"approved: {asked['draft']}"), config)
    return {"asked": asked, "text": final["text"], "verdict": final["verdict"]}


def test_interrupt_resume_with_a_checkpointer(provider: FakeProvider, store: MemoryStore) -> None:
    """A node re-run after resume is keyed by the resuming invocation and replays."""
    run_id, out = _record(store, approval, provider.url + "/v1", "tides")
    assert out["verdict"] == "approved: Answer: draft about tides"
    provider.stop()
    events = store.events(run_id)
    assert [e.kind for e in events] == ["llm", "llm"]
    assert events[0].key != events[1].key
    assert all("__pregel_pull|draft" in str(e.key) for e in events)
    result = replayable.replay(run_id, store=store, fn=approval)
    assert result.status == "identical", result.divergence
    assert result.output == out


class _Tokens(BaseCallbackHandler):
    """Collects every token a model streams to its callbacks."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


@replayable.workflow
def streamed_tokens(base_url: str) -> list[str]:
    handler = _Tokens()
    model = ChatOpenAI(base_url=base_url, api_key=KEY, model="fake-1", streaming=True)  # type: ignore[arg-type]
    model.invoke("tokens please", config={"callbacks": [handler]})
    return handler.tokens


@replayable.workflow
async def astreamed_tokens(base_url: str) -> list[str]:
    handler = _Tokens()
    model = ChatOpenAI(base_url=base_url, api_key=KEY, model="fake-1", streaming=True)  # type: ignore[arg-type]
    await model.ainvoke("tokens please", config={"callbacks": [handler]})
    return handler.tokens


@pytest.mark.parametrize("agent", [streamed_tokens, astreamed_tokens], ids=["sync", "async"])
def test_a_served_model_call_streams_its_recorded_tokens_to_the_callbacks(
    agent: Any, provider: FakeProvider, store: MemoryStore
) -> None:
    """A callback handler sees the same tokens on replay as live, with the server stopped."""
    run_id, out = _record(store, agent, provider.url + "/v1")
    assert "".join(out) == "Answer: tokens please"
    assert len([t for t in out if t]) == 3
    provider.stop()
    result = replayable.replay(run_id, store=store, fn=agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


class _Events(BaseCallbackHandler, _V2StreamingCallbackHandler):
    """A handler of LangChain's content-block (v2) stream events, as LangGraph's v2
    message streaming attaches one."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_stream_event(self, event: Any, **kwargs: Any) -> None:
        self.events.append(event)


@replayable.workflow
def stream_events(base_url: str) -> list[Any]:
    handler = _Events()
    model = ChatOpenAI(base_url=base_url, api_key=KEY, model="fake-1")  # type: ignore[arg-type]
    model.invoke("events please", config={"callbacks": [handler]})
    return handler.events


def test_a_served_model_call_replays_its_v2_stream_events(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """on_stream_event handlers see the recorded content-block events on replay."""
    run_id, out = _record(store, stream_events, provider.url + "/v1")
    assert out[0]["event"] == "message-start"
    assert len(out) > 3
    provider.stop()
    result = replayable.replay(run_id, store=store, fn=stream_events)
    assert result.status == "identical", result.divergence
    assert result.output == out
