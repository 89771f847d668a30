"""An LLM call's prompt and answer are kept out of its event's metadata.

Metadata is stored inline and in clear, even with a data key that encrypts every
payload, and ``erase --subject`` leaves it alone. So the HTTP seam records the
conversation only in the request and response (encrypted, shredded with the
subject's key) and describes the call in metadata with small fields: provider,
model, sampling parameters, usage, status. The web page still shows the
conversation, read from the recorded request and response; after the erasure no
byte of it is left anywhere in the SQLite file.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from argon2 import PasswordHasher
from typer.testing import CliRunner

import replayable
from replayable.cli import app
from replayable.store.crypto import ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER
from replayable.store.sqlite import SQLiteStore
from replayable.web import UserDB, WebConfig, create_app
from tests.integrations.servers import FakeProvider
from tests.test_erasure_fields import _sqlite_hits

SAID = "Quokka-P4-Secret"
KEY = "sk-ant-test-abcdefghijklmnopqrstuvwxyz0123"
#: The fake model answers "Answer: <the last user text>".
ANSWER = f"Answer: tell {SAID}"
CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
NAMES = [
    "openai.chat.completions",
    "openai.chat.completions",
    "openai.responses",
    "anthropic.messages",
    "anthropic.messages",
]


@replayable.workflow("llm.private")
def chat(base_url: str) -> list[str]:
    prompt = [{"role": "user", "content": f"tell {SAID}"}]
    out = []
    with openai.OpenAI(base_url=base_url + "/v1", api_key=KEY) as client:
        r = client.chat.completions.create(model="fake-1", messages=prompt, temperature=0.2)  # type: ignore[arg-type]
        out.append(r.choices[0].message.content or "")
        stream = client.chat.completions.create(model="fake-1", messages=prompt, stream=True)  # type: ignore[arg-type]
        out.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        with client.responses.stream(model="fake-1", input=f"tell {SAID}") as s:
            out.append(s.get_final_response().output_text)
    with anthropic.Anthropic(base_url=base_url, api_key=KEY) as claude:
        m = claude.messages.create(model="claude-fake", max_tokens=64, messages=prompt)  # type: ignore[arg-type]
        out.append("".join(b.text for b in m.content if b.type == "text"))
        events = claude.messages.create(
            model="claude-fake",
            max_tokens=64,
            messages=prompt,  # type: ignore[arg-type]
            stream=True,
        )
        out.append(
            "".join(
                e.delta.text
                for e in events
                if e.type == "content_block_delta" and e.delta.type == "text_delta"
            )
        )
    return out


@pytest.fixture
def kek(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # the writer's spool directory
    for name in (ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, "kek1:" + base64.b64encode(b"\x09" * 32).decode())


@pytest.fixture
def recorded(provider: FakeProvider, tmp_path: Path, kek: None) -> tuple[Path, str]:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store, replayable.recording(store, subject="cust-9") as rec:
        assert chat(provider.url) == [ANSWER] * 5
    return path, rec.run_ids[0]


def _turns(path: Path, run_id: str, tmp_path: Path) -> list[Any]:
    """Each LLM step's conversation turns as the web page's JSON gives them (``None``:
    no conversation to show, its payloads erased)."""
    tmp_path.mkdir()
    users = UserDB(tmp_path / "users.json", hasher=CHEAP)
    users.add("ana", "analyst", password="analyst-password")
    token = users.new_token("ana")[1]
    web = create_app(WebConfig(store_url=f"sqlite:///{path}", users=users, secret=b"s" * 32))

    async def fetch() -> list[Any]:
        out = []
        async with web.router.lifespan_context(web):
            transport = httpx.ASGITransport(app=web)
            async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as c:
                for seq in range(1, len(NAMES) + 1):
                    r = await c.get(
                        f"/api/runs/{run_id}/events/{seq}",
                        headers={"authorization": f"Bearer {token}"},
                    )
                    assert r.status_code == 200, r.text
                    conversation = r.json()["conversation"]
                    out.append(None if conversation is None else conversation["turns"])
        return out

    return asyncio.run(fetch())


def test_metadata_holds_no_message_or_answer_text(recorded: tuple[Path, str]) -> None:
    path, run_id = recorded
    with SQLiteStore(path) as store:
        events = store.events(run_id)
    assert [e.name for e in events] == NAMES
    for e in events:
        meta = orjson.dumps(e.metadata).decode()
        assert SAID not in meta, (e.name, meta)
        assert "messages" not in e.metadata
        assert "output" not in e.metadata
    # The small descriptive fields stay.
    first = events[0].metadata
    assert (first["provider"], first["model"], first["temperature"]) == ("openai", "fake-1", 0.2)
    assert first["usage"]["output_tokens"] > 0
    assert events[1].metadata["stream"] is True
    assert events[4].metadata["provider"] == "anthropic"
    assert events[4].metadata["complete"] is True
    # Encrypted at rest: the prompt and answer are nowhere in clear.
    assert _sqlite_hits(path, SAID) == []


def test_the_web_page_shows_the_conversation_then_erasure_leaves_no_trace(
    recorded: tuple[Path, str], tmp_path: Path
) -> None:
    path, run_id = recorded
    before = _turns(path, run_id, tmp_path / "before")
    for name, turns in zip(NAMES, before, strict=True):
        assert turns is not None, name
        said = [t["content"]["text"] for t in turns if t["role"] == "user"]
        answers = [t for t in turns if t["role"].endswith("(response)")]
        assert said == [f"tell {SAID}"], (name, turns)
        assert len(answers) == 1, (name, turns)
        assert answers[0]["content"]["text"] == ANSWER, (name, turns)
    streamed = [t[-1]["role"] for t in before]
    assert streamed == [
        "assistant (response)",
        "assistant (streamed) (response)",
        "assistant (streamed) (response)",
        "assistant (response)",
        "assistant (streamed) (response)",
    ]
    url = f"sqlite:///{path}"
    shown = CliRunner().invoke(app, ["show", run_id, "--store", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert SAID in shown.output
    erased = CliRunner().invoke(app, ["erase", "--subject", "cust-9", "--store", url, "--yes"])
    assert erased.exit_code == 0, erased.output
    assert _sqlite_hits(path, SAID) == []
    shown = CliRunner().invoke(app, ["show", run_id, "--store", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert SAID not in shown.output
    for turns in _turns(path, run_id, tmp_path / "after"):
        assert SAID not in orjson.dumps(turns).decode()
