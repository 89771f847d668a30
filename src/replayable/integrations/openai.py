"""OpenAI SDK clients whose HTTP calls are recorded and replayed.

``client(**kw)`` is ``openai.OpenAI(**kw)`` with a recording transport;
``async_client(**kw)`` the same for ``openai.AsyncOpenAI``. Chat
completions, the responses API, streaming (``stream=True``, the
``.stream()`` helpers, ``with_streaming_response``) and tool calls all go
through :mod:`replayable.integrations.http`. Inside ``replayable.recording()``
a plain ``openai.OpenAI()`` is recorded too; these factories make the
choice explicit and work without the process-wide patches.

Events are ``llm`` events named ``openai.chat.completions`` or
``openai.responses``; their metadata holds the model, the sampling
parameters, the normalized messages, usage and output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayable.integrations import http

if TYPE_CHECKING:
    import openai

__all__ = ["async_client", "client"]


def client(**kwargs: Any) -> openai.OpenAI:
    """``openai.OpenAI(**kwargs)`` whose requests are recorded and replayed."""
    import openai

    http.install()
    kwargs.setdefault("http_client", http.client(**_http_options(kwargs)))
    return openai.OpenAI(**kwargs)


def async_client(**kwargs: Any) -> openai.AsyncOpenAI:
    """``openai.AsyncOpenAI(**kwargs)`` whose requests are recorded and replayed."""
    import openai

    http.install()
    kwargs.setdefault("http_client", http.async_client(**_http_options(kwargs)))
    return openai.AsyncOpenAI(**kwargs)


def _http_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    # The SDK's own defaults for its HTTP client: its timeout, redirects on.
    import openai

    return {"timeout": kwargs.get("timeout", openai.DEFAULT_TIMEOUT), "follow_redirects": True}
