"""Anthropic SDK clients whose HTTP calls are recorded and replayed.

``client(**kw)`` is ``anthropic.Anthropic(**kw)`` with a recording
transport; ``async_client(**kw)`` the same for ``anthropic.AsyncAnthropic``.
Messages, streaming (``stream=True`` and the ``messages.stream()`` helper)
and tool use all go through :mod:`replayable.integrations.http`. Inside
``replayable.recording()`` a plain ``anthropic.Anthropic()`` is recorded
too; these factories make the choice explicit.

Events are ``llm`` events named ``anthropic.messages``; their metadata holds
the model, the sampling parameters, the normalized messages (the system
prompt first), usage and output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayable.integrations import http

if TYPE_CHECKING:
    import anthropic

__all__ = ["async_client", "client"]


def client(**kwargs: Any) -> anthropic.Anthropic:
    """``anthropic.Anthropic(**kwargs)`` whose requests are recorded and replayed."""
    import anthropic

    http.install()
    kwargs.setdefault("http_client", http.client(**_http_options(kwargs)))
    return anthropic.Anthropic(**kwargs)


def async_client(**kwargs: Any) -> anthropic.AsyncAnthropic:
    """``anthropic.AsyncAnthropic(**kwargs)`` whose requests are recorded and replayed."""
    import anthropic

    http.install()
    kwargs.setdefault("http_client", http.async_client(**_http_options(kwargs)))
    return anthropic.AsyncAnthropic(**kwargs)


def _http_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    # The SDK's own defaults for its HTTP client: its timeout, redirects on.
    import anthropic

    return {"timeout": kwargs.get("timeout", anthropic.DEFAULT_TIMEOUT), "follow_redirects": True}
