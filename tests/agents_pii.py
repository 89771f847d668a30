"""A support agent whose runs carry personal data, for the fixture sanitizing tests.

Every planted value flows through several channels: the run's input, a tool's
result, a prompt that quotes it (also as a string of JSON), the final output
and the run's metadata.
"""

from __future__ import annotations

import json
from typing import Any, Final

import replayable

#: Every personal value planted, by the rule that must replace it.
PLANTED: Final = {
    "email": ["fiona.macleod@caledonia-freight.co.uk", "Billing@Northwind-Analytics.com"],
    "phone": ["+44 131 496 0123", "(0131) 496-0999", "+1-202-555-0147"],
    "iban": ["GB82 WEST 1234 5698 7654 32", "DE89370400440532013000"],
    "card": ["4111 1111 1111 1111", "5500-0000-0000-0004", "378282246310005"],
    "national_id": ["123-45-6789", "AB 12 34 56 C"],
    "name": ["Fiona MacLeod", "José García"],
    "customer_ref": ["CUST-77-ALPHA"],
    "ticket": ["TKT-990011"],
}
#: A card number written as a JSON number rather than text.
CARD_AS_NUMBER: Final = 4012888888881881


@replayable.tool
def lookup_customer(customer_ref: str) -> dict[str, Any]:
    """The customer record: contact details and payment data."""
    return {
        "ref": customer_ref,
        "name": "Fiona MacLeod",
        "contact": {"email": "fiona.macleod@caledonia-freight.co.uk", "phone": "+44 131 496 0123"},
        "billing": {
            "iban": "GB82 WEST 1234 5698 7654 32",
            "card": "4111 1111 1111 1111",
            "card_on_file": CARD_AS_NUMBER,
            "alt_contact": "Billing@Northwind-Analytics.com, (0131) 496-0999",
        },
        "ids": {"ssn": "123-45-6789", "nino": "AB 12 34 56 C"},
        "notes": "Spoke to José García on +1-202-555-0147; refund to DE89370400440532013000 "
        "or cards 5500-0000-0000-0004 / 378282246310005. Ticket TKT-990011.",
        "request_id": "a3f9c1e2-7b4d-4e8a-9c21-5f6e7d8c9b0a",
        "created": "2026-11-30T10:15:00+00:00",
    }


@replayable.tool
def draft_reply(prompt: str) -> str:
    """A canned model: echoes what it was asked about."""
    return f"Dear customer, regarding: {prompt}"


@replayable.tool(side_effect=True)
def send_email(to: str, body: str) -> dict[str, Any]:
    """Pretend to send."""
    return {"to": to, "status": "sent", "chars": len(body)}


@replayable.workflow("support")
def support(customer_ref: str, question: str) -> dict[str, Any]:
    """Look the customer up, draft a reply quoting their record, send it."""
    record = lookup_customer(customer_ref)
    prompt = f"Customer {record['name']} asks: {question}\nRECORD:\n{json.dumps(record)}"
    reply = draft_reply(prompt)
    at = replayable.now()
    receipt = send_email(record["contact"]["email"], reply)
    return {
        "to": record["contact"]["email"],
        "name": record["name"],
        "reply": reply,
        "receipt": receipt,
        "card_on_file": record["billing"]["card_on_file"],
        "at": at,
    }


@replayable.workflow("support_batch")
def support_batch(refs: list[str]) -> list[dict[str, Any]]:
    """One child support run per customer."""
    return [support(r, "Where is my refund?") for r in refs]
