"""The workflow the golden runs record: every boundary kind and many value types.

Do not change what it does: the checked-in runs were recorded from this code,
and the suite replays them against it on every change.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import Any

import replayable


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


@dataclasses.dataclass(frozen=True)
class Quote:
    sku: str
    price: decimal.Decimal
    valid_until: dt.datetime


@replayable.tool
def price(sku: str, qty: int) -> Quote:
    """A quote with a Decimal price and a zoned expiry."""
    return Quote(
        sku, decimal.Decimal("19.99") * qty, dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC)
    )


@replayable.tool
def inventory(skus: tuple[str, ...]) -> dict[str, Any]:
    """Stock per sku, in an order that is not sorted, with a set, bytes and a tuple."""
    return {
        "zeta": 3,
        "alpha": {"skus": skus, "tags": frozenset({"b", "a"}), "blob": b"\x00\xffraw"},
        "tier": Tier.GOLD,
        "id": uuid.UUID("8a3c3f6e-1d2b-4c5a-9e7f-0b1c2d3e4f50"),
        "when": dt.date(2026, 1, 2),
        "ratio": 0.1 + 0.2,
        "big": 2**70,
        "text": "naïve café ✓",
    }


@replayable.tool
def flaky(sku: str) -> str:
    """Always fails; the workflow recovers."""
    raise LookupError(f"no supplier for {sku}")


@replayable.tool(side_effect=True)
def place_order(sku: str, qty: int, total: str) -> dict[str, Any]:
    return {"order": "ORD-1", "sku": sku, "qty": qty, "total": total}


@replayable.workflow("golden_line")
def line(sku: str, qty: int) -> dict[str, Any]:
    """One order line: a quote, stock, a failed supplier lookup, time and randomness."""
    quote = price(sku, qty)
    stock = inventory((sku, "extra"))
    try:
        flaky(sku)
    except LookupError as exc:
        note = str(exc)
    at = replayable.now()
    pick = replayable.randint(1, 6)
    ref = replayable.uuid4()
    with replayable.span("ordering"):
        order = place_order(sku, qty, str(quote.price))
    return {
        "quote": quote,
        "stock": stock,
        "note": note,
        "at": at,
        "pick": pick,
        "ref": ref,
        "order": order,
    }


@replayable.workflow("golden_basket")
def basket(skus: list[str]) -> list[dict[str, Any]]:
    """Child runs, one per line."""
    return [line(s, i + 1) for i, s in enumerate(skus)]


@replayable.tool
def converse(messages: list[dict[str, str]]) -> dict[str, Any]:
    """A chat turn whose history is long (its payload leaves the event row for a blob)."""
    return {"role": "assistant", "content": "Noted: " + messages[-1]["content"][:40]}


@replayable.workflow("golden_session")
def session(skus: list[str]) -> dict[str, Any]:
    """A basket as a child run tree, then a conversation of growing, kilobyte-long turns.

    Recorded from event schema 2 on; the runs of schema 1 are baskets alone.
    """
    lines = basket(skus)
    history: list[dict[str, str]] = []
    replies = []
    for turn in range(3):
        history.append({"role": "user", "content": f"turn {turn}: " + "details " * 200})
        reply = converse(history)
        history.append(reply)
        replies.append(reply["content"])
    return {"lines": lines, "replies": replies}
