"""``requests`` (through urllib3) recorded and replayed by the urllib3 seam."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import requests

import replayable
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"


@replayable.workflow
def requests_agent(base_url: str, prompt: str) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "fake-1", "messages": [{"role": "user", "content": prompt}]}
    with requests.Session() as http:
        plain = http.post(base_url + "/chat/completions", json=body, headers=headers, timeout=5)
        streamed = http.post(
            base_url + "/chat/completions",
            json={**body, "stream": True},
            headers=headers,
            stream=True,
            timeout=5,
        )
        pieces = []
        for line in streamed.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                delta = orjson.loads(line[6:])["choices"][0]["delta"]
                pieces.append(delta.get("content") or "")
        models = http.get(base_url + "/models", params={"limit": "1"}, timeout=5)
    return {
        "plain": plain.json()["choices"][0]["message"]["content"],
        "status": plain.status_code,
        "streamed": "".join(pieces),
        "models": models.json()["data"][0]["id"],
    }


def test_requests_calls_are_events_that_replay(provider: FakeProvider, store: MemoryStore) -> None:
    """A chat completion (plain and streamed) is an llm event, a GET an http event;
    the replay needs no server and the key is not stored."""
    with replayable.recording(store) as rec:
        out = requests_agent(provider.url + "/v1", "hello")
    assert out == {
        "plain": "Answer: hello",
        "status": 200,
        "streamed": "Answer: hello",
        "models": "fake-1",
    }
    run_id = rec.run_ids[0]
    events = store.events(run_id)
    assert [(e.kind, e.name) for e in events] == [
        ("llm", "openai.chat.completions"),
        ("llm", "openai.chat.completions"),
        ("http", "GET /v1/models"),
    ]
    assert events[0].metadata["transport"] == "urllib3"
    assert events[1].metadata["stream"] is True
    assert events[1].metadata["complete"] is True
    assert events[2].request_value()["query"] == [["limit", "1"]]
    assert KEY not in str([e.request for e in events])
    assert not any(e.kind == "gap" for e in events)
    provider.stop()
    result = replayable.replay(run_id, store=store, fn=requests_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_changed_requests_body_diverges(provider: FakeProvider, store: MemoryStore) -> None:
    """The request is matched like any HTTP call: a changed prompt is request_changed."""
    with replayable.recording(store) as rec:
        requests_agent(provider.url + "/v1", "hello")

    @replayable.workflow("requests_agent")
    def changed(base_url: str, prompt: str) -> dict[str, Any]:
        return requests_agent.__wrapped__(base_url, prompt + "!")  # type: ignore[attr-defined,no-any-return]

    result = replayable.replay(rec.run_ids[0], store=store, fn=changed)
    assert result.status == "diverged"
    assert result.divergence is not None
    assert result.divergence.reason == "request_changed"
    assert result.divergence.step == 1


@pytest.mark.parametrize("status", [500])
def test_a_failed_status_is_recorded_and_served(
    provider: FakeProvider, store: MemoryStore, status: int
) -> None:
    """urllib3 does not retry a POST by default: the 500 is the recorded outcome."""
    provider.fail_next = [status]

    @replayable.workflow("failing_requests")
    def failing(base_url: str) -> int:
        r = requests.post(base_url + "/chat/completions", json={"model": "m"}, timeout=5)
        return r.status_code

    with replayable.recording(store) as rec:
        assert failing(provider.url + "/v1") == status
    provider.stop()
    result = replayable.replay(rec.run_ids[0], store=store, fn=failing)
    assert result.status == "identical", result.divergence
    assert result.output == status
