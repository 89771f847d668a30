"""AG2 agents recorded and replayed through ag2 middleware against the local fake OpenAI server."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx2
import orjson
import pytest
from ag2 import Agent, MemoryStream, tool
from ag2.config.openai import OpenAIConfig
from ag2.events import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextInput,
    ToolCallEvent,
    ToolCallsEvent,
    ToolErrorEvent,
    ToolResultEvent,
    ToolResultsEvent,
)
from ag2.middleware import BaseMiddleware, Middleware, approval_required

import replayable
from replayable.events.codec import decode_value, encode_value
from replayable.integrations import _wire
from replayable.integrations import ag2 as rag2
from replayable.replay.session import served_value
from replayable.store import MemoryStore
from replayable.web.views import payload_view
from tests.integrations.servers import FakeProvider

pytestmark = pytest.mark.slow

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"
SENT: list[str] = []
ASKED: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    return f"sunny in {city}"


@tool
def send_report(city: str) -> str:
    """Send the weather report for a city (a side effect)."""
    SENT.append(city)
    return f"report sent for {city}"


@tool
def get_tides(city: str) -> str:
    """Tides in a city (always fails)."""
    raise ValueError(f"no tide data for {city}")


async def _human(request: Any) -> str:
    ASKED.append(str(request.content))
    return "yes"


@tool(middleware=[approval_required()])
def open_gate(city: str) -> str:
    """Open the flood gate of a city (asks a human first)."""
    return f"gate open in {city}"


class Gatekeeper(BaseMiddleware):
    """Agent-level approval: asks a human before any tool runs."""

    async def on_tool_execution(self, call_next: Any, event: Any, context: Any) -> Any:
        answer = await context.input(f"may {event.name} run?")
        if answer != "yes":
            raise PermissionError(event.name)
        return await call_next(event, context)


def _config(base_url: str, http: httpx2.AsyncClient) -> OpenAIConfig:
    return OpenAIConfig(
        model="fake-1",
        base_url=base_url,
        api_key=KEY,
        temperature=0.2,
        http_client=http,
        max_retries=0,
    )


@replayable.workflow
async def forecast(base_url: str, prompt: str) -> dict[str, Any]:
    async with httpx2.AsyncClient() as http:
        config = _config(base_url, http)
        weather = Agent(
            "weather",
            "You report the weather.",
            config=config,
            tools=[get_weather],
            middleware=[rag2.middleware()],
        )
        reporter = rag2.instrument(
            Agent("reporter", "You send reports.", config=config, tools=[send_report]),
            side_effects={"send_report"},
        )
        answer = (await weather.ask(prompt)).body
        sent = (await reporter.ask(f"report: {answer}")).body
        return {"answer": answer, "sent": sent}


@replayable.workflow
def forecast_sync(base_url: str, prompt: str) -> dict[str, Any]:
    return asyncio.run(forecast.__wrapped__(base_url, prompt))  # type: ignore[attr-defined,no-any-return]


def _record(store: MemoryStore, fn: Any, *args: Any) -> tuple[str, Any]:
    with replayable.recording(store) as rec:
        out = asyncio.run(fn(*args)) if asyncio.iscoroutinefunction(fn.__wrapped__) else fn(*args)
    SENT.clear()
    ASKED.clear()
    return rec.run_ids[0], out


@pytest.mark.parametrize("agent", [forecast, forecast_sync], ids=["async", "sync"])
def test_record_then_replay_with_the_server_stopped(
    agent: Any, provider: FakeProvider, store: MemoryStore
) -> None:
    """Model turns and tool executions are events; a replay substitutes them with no server."""
    run_id, out = _record(store, agent, provider.url + "/v1", "weather in Paris")
    assert out == {"answer": "Answer: sunny in Paris", "sent": "Answer: report sent for Paris"}
    assert len(provider.requests) == 4
    provider.stop()
    events = store.events(run_id)
    assert [(e.kind, e.name, e.side_effect) for e in events] == [
        ("llm", "ag2.OpenAIClient", False),
        ("tool", "get_weather", False),
        ("llm", "ag2.OpenAIClient", False),
        ("llm", "ag2.OpenAIClient", False),
        ("tool", "send_report", True),
        ("llm", "ag2.OpenAIClient", False),
    ]
    first = events[0].request_value()
    assert first["system"] == ["You report the weather."]
    assert first["messages"] == [{"role": "user", "content": "weather in Paris"}]
    assert first["options"]["model"] == "fake-1"
    assert first["tools"][0]["function"]["name"] == "get_weather"
    assert events[0].metadata["model"] == "fake-1"
    assert events[0].metadata["temperature"] == 0.2
    assert events[0].metadata["provider"] == "openai"
    # The answer lives in the recorded response only: metadata is stored in clear.
    assert "output" not in events[0].metadata
    assert "Paris" not in str(events[0].metadata)  # no tool-call arguments
    answer = _wire.ag2_output(orjson.loads(events[0].response or "null"))
    assert answer is not None
    assert answer["tool_calls"][0]["name"] == "get_weather"
    assert answer["tool_calls"][0]["arguments"] == '{"city":"Paris"}'
    shown = payload_view(events[2], 10_000)["conversation"]
    assert shown is not None
    assert "Answer: sunny in Paris" in str(shown["turns"][-1]["content"])
    assert events[0].metadata["usage"]["output_tokens"] > 0
    assert events[1].request_value() == {"arguments": {"city": "Paris"}}
    assert events[1].metadata["tool_call_id"] == "call_1"
    assert events[2].request_value()["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "#1", "name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "tool_call_id": "#1", "name": "get_weather", "content": "sunny in Paris"},
    ]
    response = served_value(events[0])
    assert isinstance(response, ModelResponse)
    assert response.tool_calls.calls[0].serialized_arguments == {"city": "Paris"}
    assert isinstance(served_value(events[1]), ToolResultEvent)
    result = replayable.replay(run_id, store=store, fn=agent)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert SENT == []
    assert all(KEY not in e.request + str(e.metadata) for e in events)


def test_changed_prompt_diverges_at_the_first_model_call(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """Another prompt is request_changed at step 1, the diff naming the user message."""
    run_id, _ = _record(store, forecast, provider.url + "/v1", "weather in Paris")
    provider.stop()

    @replayable.workflow(forecast.__replayable_workflow__.name)  # type: ignore[attr-defined]
    async def edited(base_url: str, prompt: str) -> Any:
        return await forecast.__wrapped__(base_url, "weather in Rome")  # type: ignore[attr-defined]

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", 1)
    assert [d.path for d in div.diff] == ["messages[0].content"]
    assert "weather in Rome" in div.message


def test_fork_at_the_tool_step_guards_the_side_effect_tool(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """An overridden tool result reaches the live model; send_report runs only if allowed live."""
    run_id, _ = _record(store, forecast, provider.url + "/v1", "weather in Paris")
    blocked = replayable.replay(
        run_id, store=store, fn=forecast, fork_at=2, overrides={2: "raining in Rome"}
    )
    assert blocked.status == "diverged"
    assert blocked.divergence is not None
    assert blocked.divergence.reason == "side_effect_blocked"
    assert blocked.divergence.step == 5
    assert SENT == []
    forked = replayable.replay(
        run_id,
        store=store,
        fn=forecast,
        fork_at=2,
        overrides={2: "raining in Rome"},
        allow_live={"send_report"},
    )
    assert forked.status == "completed", forked.divergence
    assert forked.output == {
        "answer": "Answer: raining in Rome",
        "sent": "Answer: report sent for Rome",
    }
    assert SENT == ["Rome"]
    SENT.clear()
    same = replayable.replay(run_id, store=store, fn=forecast, fork_at=2)
    assert same.status == "completed", same.divergence
    assert same.output["sent"] == "Answer: report sent for Paris"
    assert SENT == []
    foggy = replayable.replay(
        run_id, store=store, fn=forecast, fork_at=3, overrides={3: "Answer: foggy in Paris"}
    )
    assert foggy.status == "completed", foggy.divergence
    assert foggy.output == {
        "answer": "Answer: foggy in Paris",
        "sent": "Answer: report sent for Paris",
    }
    assert SENT == []  # the same send_report request: served from the tape
    with pytest.raises(replayable.ConfigurationError, match="side-effect tool 'send_report'"):
        replayable.replay(run_id, store=store, fn=forecast, fork_at=5)


@replayable.workflow
async def follow_up(base_url: str, city: str) -> str:
    # An earlier exchange rebuilt from ag2 events: its tool call gets a fresh uuid4 id
    # from ToolCallEvent's default on every run.
    call = ToolCallEvent("get_weather", arguments='{"city": "Oslo"}')
    stream = MemoryStream()
    await stream.history.replace(
        [
            ModelRequest([TextInput("weather in Oslo")]),
            ModelResponse(tool_calls=ToolCallsEvent([call])),
            ToolResultsEvent([ToolResultEvent.from_call(call, "cold in Oslo")]),
            ModelResponse(ModelMessage("Answer: cold in Oslo")),
        ]
    )
    async with httpx2.AsyncClient() as http:
        agent = Agent("weather", config=_config(base_url, http), tools=[get_weather])
        rag2.instrument(agent)
        rag2.instrument(agent)
        reply = await agent.ask(f"weather in {city}", stream=stream)
        return str(reply.body)


def test_random_tool_call_ids_do_not_change_the_request(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """uuid4 tool-call ids in the history are recorded by position, so replay matches."""
    run_id, out = _record(store, follow_up, provider.url + "/v1", "Lima")
    assert out == "Answer: sunny in Lima"
    provider.stop()
    events = store.events(run_id)
    assert [e.name for e in events] == ["ag2.OpenAIClient", "get_weather", "ag2.OpenAIClient"]
    messages = events[0].request_value()["messages"]
    assert messages[1]["tool_calls"][0]["id"] == "#1"
    assert messages[2]["tool_call_id"] == "#1"
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert not uuid.search(events[0].request + events[2].request)
    result = replayable.replay(run_id, store=store, fn=follow_up)
    assert result.status == "identical", result.divergence
    assert result.output == out


@replayable.workflow
async def tides_and_gate(base_url: str, city: str) -> list[str]:
    async with httpx2.AsyncClient() as http:
        config = _config(base_url, http)
        tides = Agent("tides", config=config, tools=[get_tides], middleware=[rag2.middleware()])
        gate = Agent(
            "gate",
            config=config,
            tools=[open_gate],
            hitl_hook=_human,
            middleware=[Middleware(Gatekeeper), rag2.middleware(side_effects={"open_gate"})],
        )
        failed = str((await tides.ask(f"tides in {city}")).body)
        opened = str((await gate.ask(f"open the gate in {city}")).body)
        return [failed.splitlines()[-1], opened]


def test_tool_errors_and_human_input_replay_without_the_tool_or_the_human(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """A failing tool replays as its ToolErrorEvent; no human is asked again on replay."""
    with replayable.recording(store) as rec:
        out = asyncio.run(tides_and_gate(provider.url + "/v1", "Doha"))
    run_id = rec.run_ids[0]
    assert out == ["ValueError: no tide data for Doha", "Answer: gate open in Doha"]
    assert ASKED[0] == "may open_gate run?"
    assert "open_gate" in ASKED[1]  # approval_required, inside the tool's own boundary
    assert len(ASKED) == 2
    ASKED.clear()
    provider.stop()
    events = store.events(run_id)
    assert [e.name for e in events][3:] == [
        "ag2.OpenAIClient",
        "ag2.human_input",
        "open_gate",
        "ag2.OpenAIClient",
    ]
    assert events[1].name == "get_tides"
    assert events[1].metadata["error"] is True
    error = served_value(events[1])
    assert isinstance(error, ToolErrorEvent)
    assert isinstance(error.error, ValueError)
    assert str(error.error) == "no tide data for Doha"
    assert events[4].request_value() == {"content": "may open_gate run?"}
    assert served_value(events[4]).content == "yes"
    assert events[5].side_effect is True
    result = replayable.replay(run_id, store=store, fn=tides_and_gate)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert ASKED == []


def test_model_response_round_trips_through_the_codec() -> None:
    """A ModelResponse with tool calls and usage comes back as an equal ModelResponse."""
    from ag2.events import Usage

    call = ToolCallEvent("get_weather", arguments='{"city": "Pune"}')
    response = ModelResponse(
        ModelMessage("checking", metadata={"k": [1, 2]}),
        tool_calls=ToolCallsEvent([call]),
        usage=Usage(prompt_tokens=3, completion_tokens=4),
        model="fake-1",
        provider="openai",
    )
    data, tagged = encode_value(response)
    assert tagged
    back = decode_value(data, "tagged")
    assert type(back) is ModelResponse
    assert back == response
    assert back.tool_calls.calls[0].id == call.id
    assert back.usage == Usage(prompt_tokens=3, completion_tokens=4)
    assert back.created_at == response.created_at


def test_instrument_is_idempotent_and_merges_side_effects() -> None:
    """instrument() twice leaves one recording middleware holding both declarations."""
    agent = Agent("a", tools=[get_weather, send_report])
    assert rag2.instrument(agent, side_effects={"send_report"}) is agent
    rag2.instrument(agent, side_effects={"get_weather"})
    (entry,) = agent.middleware
    assert isinstance(entry.middleware, Middleware)
    assert entry.middleware.cls is rag2.ReplayableMiddleware
    assert entry.middleware.options["side_effects"] == {"send_report", "get_weather"}


def test_outside_a_run_the_middleware_passes_through(provider: FakeProvider) -> None:
    """Without a recording the agent talks to the model and runs its tools as usual."""
    out = asyncio.run(forecast(provider.url + "/v1", "weather in Kyiv"))
    assert out == {"answer": "Answer: sunny in Kyiv", "sent": "Answer: report sent for Kyiv"}
    assert SENT == ["Kyiv"]
    SENT.clear()
    assert len(provider.requests) == 4
