"""litellm against an OpenAI-compatible local server, recorded through the HTTP seam.

litellm sends OpenAI-compatible requests with the openai SDK over a legacy
``httpx`` client, so the ``httpx`` transport patch records them.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import replayable
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
litellm = pytest.importorskip("litellm")

# litellm builds pydantic models from ReadOnly TypedDicts; pydantic warns about that.
pytestmark = pytest.mark.filterwarnings("ignore:.*`ReadOnly` qualifier:UserWarning")

KEY = "sk-test-litellm-abcdefghijklmnopqrstuvwxyz"


@replayable.workflow
def litellm_agent(base_url: str, prompt: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    one = litellm.completion(
        model="openai/fake-1", api_base=base_url, api_key=KEY, messages=messages, temperature=0.5
    )
    stream = litellm.completion(
        model="openai/fake-1", api_base=base_url, api_key=KEY, messages=messages, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    return {"one": one.choices[0].message.content, "streamed": "".join(pieces)}


def test_litellm_records_and_replays_with_server_stopped(
    provider: FakeProvider, store: MemoryStore
) -> None:
    """litellm.completion (plain and streamed) replays identically with the server stopped."""
    with replayable.recording(store) as rec:
        out = litellm_agent(provider.url + "/v1", "hello there")
    assert out == {"one": "Answer: hello there", "streamed": "Answer: hello there"}
    provider.stop()
    events = store.events(rec.run_ids[0])
    assert [(e.kind, e.name) for e in events] == [("llm", "openai.chat.completions")] * 2
    assert events[0].metadata["transport"] == "httpx"
    assert events[0].metadata["temperature"] == 0.5
    assert events[1].metadata["complete"] is True
    result = replayable.replay(rec.run_ids[0], store=store, fn=litellm_agent)
    assert result.status == "identical", result.divergence
    assert result.output == out
