"""A pure replay needs no SDK key: unset key variables hold a placeholder meanwhile."""

from __future__ import annotations

import os

import openai
import pytest

import replayable
from replayable.replay.keys import PLACEHOLDER
from replayable.store import MemoryStore
from tests.integrations.servers import FakeProvider

KEY = "sk-test-abcdefghijklmnopqrstuvwxyz012345"
BASE = {"url": ""}


@replayable.workflow
def keyless_agent(prompt: str) -> str:
    # As an agent that builds its client at import does: the key comes from the environment.
    client = openai.OpenAI(base_url=BASE["url"])
    r = client.chat.completions.create(
        model="fake-1", messages=[{"role": "user", "content": prompt}]
    )
    return r.choices[0].message.content or ""


def test_pure_replay_without_openai_api_key(
    provider: FakeProvider, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded with a key, replayed without one: identical, and the variable is unset after."""
    BASE["url"] = provider.url + "/v1"
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with replayable.recording(store) as rec:
        assert keyless_agent("hi") == "Answer: hi"
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(openai.OpenAIError):
        keyless_agent("hi")  # without the placeholder the SDK refuses to start
    result = replayable.replay(rec.run_ids[0], store=store, fn=keyless_agent)
    assert result.status == "identical", result.divergence
    assert "OPENAI_API_KEY" not in os.environ


def test_a_set_key_is_left_alone_and_forks_get_no_placeholder(
    provider: FakeProvider, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The placeholder fills only unset variables, and only for pure replays."""
    BASE["url"] = provider.url + "/v1"
    seen: list[str | None] = []

    @replayable.workflow("keyless_agent")
    def watching(prompt: str) -> str:
        seen.append(os.environ.get("ANTHROPIC_API_KEY"))
        seen.append(os.environ.get("OPENAI_API_KEY"))
        return keyless_agent.__wrapped__(prompt)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with replayable.recording(store) as rec:
        watching("hi")
    assert replayable.replay(rec.run_ids[0], store=store, fn=watching).status == "identical"
    forked = replayable.replay(rec.run_ids[0], store=store, fn=watching, live={"llm"})
    assert forked.status == "completed", forked.divergence
    assert seen == [None, KEY, PLACEHOLDER, KEY, None, KEY]
