"""Placeholder API keys for a pure replay.

An agent that builds ``OpenAI()`` or ``Anthropic()`` at import (or in its
workflow) fails at once when its key variable is unset, though a pure replay
sends no request. While a pure replay runs, each SDK key variable in
:data:`KEY_VARIABLES` that is unset holds :data:`PLACEHOLDER`; variables
already set are left alone, and the placeholders are removed when the last
pure replay in the process ends. Fork and counterfactual replays call
providers for real, so they get no placeholders.

No request leaves a pure replay, and authorization headers are never part
of a recorded request, so the placeholder changes nothing that is matched.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["KEY_VARIABLES", "PLACEHOLDER", "placeholder_keys"]

#: The environment variables the model SDKs read their key from.
KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "MISTRAL_API_KEY",
    "COHERE_API_KEY",
    "CO_API_KEY",
    "GROQ_API_KEY",
    "TOGETHER_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "XAI_API_KEY",
    "FIREWORKS_API_KEY",
)

#: The value a placeholder holds (recognisable in a log line, useless to a provider).
PLACEHOLDER = "replayable-pure-replay-placeholder"

_lock = threading.Lock()
_depth = 0
_set: list[str] = []


@contextmanager
def placeholder_keys() -> Iterator[list[str]]:
    """Fill the unset SDK key variables for the duration; yields the names filled."""
    global _depth
    with _lock:
        if _depth == 0:
            for name in KEY_VARIABLES:
                if not os.environ.get(name):
                    os.environ[name] = PLACEHOLDER
                    _set.append(name)
        _depth += 1
        filled = list(_set)
    try:
        yield filled
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                while _set:
                    name = _set.pop()
                    if os.environ.get(name) == PLACEHOLDER:
                        del os.environ[name]
