"""A calendar assistant for the policy tests: it lists events and deletes one.

``ASK_FIRST`` switches on the corrected behaviour (ask for confirmation before
deleting); recorded runs are made with it off, the incident's behaviour.
"""

from __future__ import annotations

from typing import Any

import replayable

ASK_FIRST = False
CALENDAR: dict[str, list[dict[str, Any]]] = {
    "ops": [{"id": "ev-1", "title": "Board meeting", "date": "2026-12-03"}],
    "empty": [],
}


@replayable.tool
def list_events(calendar: str) -> list[dict[str, Any]]:
    """The calendar's events."""
    return list(CALENDAR.get(calendar, []))


@replayable.tool
def ask_confirmation(question: str) -> dict[str, Any]:
    """A human's answer; the test's human says no."""
    return {"approved": False, "question": question}


@replayable.tool(side_effect=True)
def delete_event(event_id: str) -> dict[str, Any]:
    """Delete an event (a side effect)."""
    return {"deleted": event_id}


@replayable.tool(side_effect=True)
def refund(order: str, amount: float, date: str) -> dict[str, Any]:
    """Refund an order (a side effect)."""
    return {"order": order, "refunded": amount, "date": date}


@replayable.workflow("tidy_calendar")
def tidy_calendar(calendar: str) -> dict[str, Any]:
    """Delete the first event; with ASK_FIRST, only if a human approves."""
    events = list_events(calendar)
    target = events[0]["id"] if events else "ev-unknown"
    if ASK_FIRST:
        answer = ask_confirmation(f"Delete {target}?")
        if not answer["approved"]:
            return {"deleted": None, "asked": True}
    return {"deleted": delete_event(target)["deleted"], "asked": ASK_FIRST}


@replayable.workflow("refunds")
def refunds(amount: float, date: str) -> dict[str, Any]:
    """One refund."""
    return refund("ORD-1", amount, date)
