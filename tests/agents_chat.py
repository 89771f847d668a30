"""A chat agent whose every model call re-sends the conversation (the blob-tier tests)."""

from __future__ import annotations

import random

import replayable
from tests.llm_corpus import text

SYSTEM = "You are a careful contract reviewer. " * 60  # about 2 KB


@replayable.tool(name="chat.completions.create")
def complete(model: str, messages: list[dict[str, str]]) -> dict[str, object]:
    rng = random.Random(messages[-1]["content"])
    answer = text(rng, 400)
    return {"choices": [{"message": {"content": answer, "role": "assistant"}}], "model": model}


@replayable.workflow("chat_agent")
def chat_agent(turns: int, topic: str = "") -> int:
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages.append(
            {"role": "user", "content": f"Question {i}{topic}: " + text(random.Random(i), 150)}
        )
        reply = complete(model="gpt-4o", messages=list(messages))
        message = reply["choices"][0]["message"]  # type: ignore[index]
        messages.append({"role": "assistant", "content": message["content"]})
    return len(messages)
