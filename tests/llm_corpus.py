"""Synthetic LLM traffic: chats that re-send their history, in canonical JSON.

Used by the blob-tier tests and by ``bench/bench_tiers.py``. Deterministic
(seeded), English-like text from a fixed vocabulary, so figures repeat.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson

_WORDS = [
    "the",
    "contract",
    "clause",
    "jurisdiction",
    "compliance",
    "review",
    "agent",
    "tool",
    "result",
    "customer",
    "account",
    "invoice",
    "policy",
    "refund",
    "shipping",
    "order",
    "status",
    "database",
    "query",
    "returned",
    "empty",
    "rows",
    "please",
    "check",
    "whether",
    "applies",
    "to",
    "region",
    "country",
    "code",
    "report",
    "summary",
    "analysis",
    "risk",
    "score",
    "model",
    "answer",
    "question",
    "context",
    "document",
    "section",
    "page",
    "table",
    "value",
    "field",
    "record",
    "update",
    "request",
    "response",
    "error",
    "retry",
    "timeout",
    "latency",
    "budget",
    "limit",
    "approval",
    "manager",
    "escalation",
    "ticket",
    "priority",
    "high",
    "low",
    "medium",
    "because",
    "therefore",
    "however",
    "although",
    "unless",
    "while",
    "before",
    "after",
    "during",
    "within",
    "between",
    "against",
    "under",
    "over",
    "about",
    "into",
    "onto",
    "from",
    "with",
    "without",
    "for",
    "and",
    "or",
    "not",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "have",
    "has",
    "had",
    "do",
    "does",
    "did",
    "will",
    "would",
    "should",
    "could",
    "may",
    "might",
    "must",
    "can",
    "this",
    "that",
    "these",
    "those",
    "it",
    "its",
    "we",
    "our",
    "you",
    "your",
    "they",
    "their",
    "he",
    "she",
    "his",
    "her",
]


def text(rng: random.Random, chars: int) -> str:
    """About ``chars`` characters of sentences."""
    out: list[str] = []
    n = 0
    while n < chars:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 16)))
        sentence = sentence[0].upper() + sentence[1:] + ". "
        out.append(sentence)
        n += len(sentence)
    return "".join(out)[:chars]


def canonical(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(frozen=True)
class Chat:
    """A chat's calls as (request, response) canonical JSON, and its unique content."""

    calls: list[tuple[str, str]]
    unique_chars: int


def chat(
    turns: int,
    *,
    answer_chars: int = 400,
    question_chars: int = 160,
    system_chars: int = 2048,
    seed: int = 7,
    model: str = "gpt-4o",
) -> Chat:
    """A chat of ``turns`` calls; call n sends the system prompt and the whole history."""
    rng = random.Random(seed)
    system = text(rng, system_chars)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    unique = len(system)
    calls: list[tuple[str, str]] = []
    for i in range(turns):
        question = f"Turn {i}: " + text(rng, question_chars)
        messages.append({"role": "user", "content": question})
        answer = text(rng, answer_chars)
        unique += len(question) + len(answer)
        request = canonical({"messages": messages, "model": model, "temperature": 0})
        response = canonical(
            {
                "choices": [
                    {
                        "finish_reason": "stop",
                        "index": 0,
                        "message": {"content": answer, "role": "assistant"},
                    }
                ],
                "id": f"chatcmpl-{seed}-{i}",
                "model": model,
                "usage": {"completion_tokens": answer_chars // 4, "prompt_tokens": 100 + 50 * i},
            }
        )
        calls.append((request, response))
        messages.append({"role": "assistant", "content": answer})
    return Chat(calls, unique)


def llm_payloads(count: int, *, size: int = 40_000, seed: int = 11) -> list[tuple[str, str]]:
    """``count`` single LLM calls of about ``size`` characters of context each."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        doc = text(rng, size)
        request = canonical(
            {
                "messages": [
                    {"role": "system", "content": f"You review contracts. Case {i}."},
                    {"role": "user", "content": doc},
                ],
                "model": "gpt-4o",
            }
        )
        response = canonical({"choices": [{"message": {"content": text(rng, 600)}}]})
        out.append((request, response))
    return out
