"""The conversation of a recorded HTTP-seam LLM event, read from its request and response.

Metadata carries no message or answer text (it is stored in clear); these read
them the way the web pages and the OpenTelemetry export do.
"""

from __future__ import annotations

from typing import Any

from replayable.events.model import Event
from replayable.integrations import _wire

__all__ = ["answered", "said"]


def said(event: Event) -> list[Any]:
    """The normalized messages the event's request sent; its metadata holds none."""
    assert "messages" not in event.metadata, event.metadata
    messages = _wire.recorded_messages(event.name, event.request_value())
    assert messages is not None, event.name
    return messages


def answered(event: Event) -> dict[str, Any]:
    """The normalized answer of the event's response (a stream's assembled one)."""
    assert "output" not in event.metadata, event.metadata
    output = _wire.recorded_output(event.name, event.response_tree())
    assert output is not None, event.name
    return output
