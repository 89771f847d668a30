"""Small workflows recorded by the CLI tests; importable by name so replay can find them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import replayable

#: Switch the agent's behaviour between recording and replay to force a divergence.
VARIANT = "original"


@replayable.tool
def search_web(query: str) -> list[str]:
    """Three canned hits for ``query``."""
    return [f"{query} result {i}" for i in range(1, 4)]


@replayable.tool(side_effect=True)
def send_email(to: str, body: str) -> str:
    """Pretend to send an email."""
    return f"sent to {to}"


@replayable.workflow("research")
def research(topic: str) -> dict[str, Any]:
    """Search, note the time, mail a summary."""
    query = topic if VARIANT == "original" else f"{topic} (revised)"
    hits = search_web(query)
    at = replayable.now()
    send_email("team@example.com", f"{len(hits)} hits for {topic}")
    return {"topic": topic, "hits": hits, "at": at}


@replayable.workflow("long_search")
def long_search(n: int, pause: float = 0.0) -> int:
    """``n`` searches one after another, ``pause`` seconds of the agent's own work after
    each (a long run whose replay takes a while); another VARIANT changes step 31."""
    for i in range(n):
        search_web(f"q{i}" if VARIANT == "original" or i != 30 else "q30 (revised)")
        if pause:
            time.sleep(pause)
    return n


@replayable.workflow("broken")
def broken(topic: str) -> None:
    """Search, then fail."""
    search_web(topic)
    raise ValueError(f"cannot summarise {topic}")


@replayable.workflow("fanout")
def fanout(topics: list[str]) -> list[dict[str, Any]]:
    """One child ``research`` run per topic."""
    return [research(t) for t in topics]


@replayable.tool
def fetch_filing(company: str) -> str:
    """Always fails: the registry is down."""
    raise LookupError(f"no filing for {company}")


@replayable.workflow("recovering")
def recovering(company: str) -> str:
    """Carry on after a failed tool call."""
    try:
        return fetch_filing(company)
    except LookupError:
        return "no data"


@dataclass
class Verdict:
    """A typed model answer (as an SDK's response type would be)."""

    risk: str
    score: float


def _model_api(**request: Any) -> dict[str, Any]:
    """A stand-in for an SDK's ``create()``: a completion with a status."""
    return {"status": "ok", "verdict": {"risk": "high", "score": 0.9}, "usage": [1, 2]}


def _typed_model_api(**request: Any) -> Verdict:
    return Verdict(risk="medium", score=0.5)


@replayable.workflow("graded")
def graded(text: str) -> str:
    """Ask a model twice: once for a JSON answer, once for a typed one."""
    answer = replayable.llm(_model_api, model="m", messages=[{"role": "user", "content": text}])
    typed = replayable.llm(
        _typed_model_api, model="m", messages=[{"role": "user", "content": text}]
    )
    return f"{answer['status']}:{answer['verdict']['risk']}:{typed.risk}"
