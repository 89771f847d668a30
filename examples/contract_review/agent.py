"""A contract-review agent with a silent bug, recorded and replayed by replayable.

The agent reads a contract, asks a model to extract its key terms, looks up
the compliance rules for the contract's jurisdiction, asks the model for a
risk level, and files a report. The rules lookup matches the jurisdiction
exactly, so a Scottish contract (``GB-SCT``) finds none of the rules filed
under ``GB``; told to "proceed with available data", the model rates it low.

The model is any OpenAI-compatible server: ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` choose it (``model_server.py`` is a scripted one).
Reports go to ``$CONTRACT_REVIEW_REPORTS`` (default ``.replayable/reports.jsonl``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Final, Literal

from openai import OpenAI

import replayable

__all__ = [
    "MATCH_MODE",
    "file_report",
    "find_rules",
    "query_compliance_rules",
    "query_compliance_rules_fixed",
    "read_contract",
    "review_contract",
]

HERE: Final = Path(__file__).resolve().parent
CONTRACTS_DIR: Final = HERE / "contracts"
RULES_FILE: Final = HERE / "rules.json"
DEFAULT_BASE_URL: Final = "http://127.0.0.1:8765/v1"
MODEL: Final = "contract-analyst-1"

#: How the rules lookup matches jurisdictions. ``"exact"`` is the shipped bug;
#: ``"prefix"`` also finds the parent jurisdiction's rules (``GB`` for ``GB-SCT``).
MATCH_MODE: Literal["exact", "prefix"] = "exact"

EXTRACT_SYSTEM: Final = (
    "You extract key terms from commercial contracts. Reply with one JSON object with the "
    "keys counterparty, jurisdiction, governing_law, term_months, auto_renewal_months, "
    "liability_cap and data_transfer_outside_uk."
)
RISK_SYSTEM: Final = (
    "You are a contract risk analyst. Rate the contract's risk as low, medium or high "
    "against the compliance rules that apply to it. If no compliance rules are available, "
    "proceed with the available data. Reply with one JSON object with the keys risk and summary."
)


# -- tools ------------------------------------------------------------------------


@replayable.tool
def read_contract(contract_id: str) -> dict[str, Any]:
    """The uploaded contract: its id, title and full text."""
    path = CONTRACTS_DIR / f"{contract_id}.json"
    if not path.is_file():
        raise LookupError(f"no contract {contract_id!r} in {CONTRACTS_DIR}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _rules_db() -> sqlite3.Connection:
    """The compliance rules database, built from ``rules.json``."""
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE TABLE rules (rule_id TEXT PRIMARY KEY, jurisdiction TEXT NOT NULL, "
        "severity TEXT NOT NULL, title TEXT NOT NULL, field TEXT NOT NULL, op TEXT NOT NULL, "
        "value TEXT NOT NULL)"
    )
    rows = json.loads(RULES_FILE.read_text(encoding="utf-8"))
    db.executemany(
        "INSERT INTO rules VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                r["rule_id"],
                r["jurisdiction"],
                r["severity"],
                r["title"],
                r["field"],
                r["op"],
                json.dumps(r["value"]),
            )
            for r in rows
        ],
    )
    return db


def find_rules(jurisdiction: str, mode: Literal["exact", "prefix"]) -> list[dict[str, Any]]:
    """Rules filed under ``jurisdiction``.

    ``prefix`` also takes the parent jurisdiction's rules (``GB`` for ``GB-SCT``).
    """
    sql = "SELECT rule_id, jurisdiction, severity, title, field, op, value FROM rules "
    if mode == "exact":
        sql += "WHERE jurisdiction = ?1"
    else:
        sql += "WHERE jurisdiction = ?1 OR ?1 LIKE jurisdiction || '-%'"
    with closing(_rules_db()) as db:
        rows = db.execute(sql + " ORDER BY rule_id", (jurisdiction,)).fetchall()
    keys = ("rule_id", "jurisdiction", "severity", "title", "field", "op", "value")
    return [dict(zip(keys, (*row[:6], json.loads(row[6])), strict=True)) for row in rows]


@replayable.tool
def query_compliance_rules(jurisdiction: str) -> list[dict[str, Any]]:
    """The compliance rules for a jurisdiction code, matched as ``MATCH_MODE`` says."""
    return find_rules(jurisdiction, MATCH_MODE)


@replayable.tool(name="query_compliance_rules")
def query_compliance_rules_fixed(jurisdiction: str) -> list[dict[str, Any]]:
    """The corrected lookup: sub-jurisdictions also get their parent's rules."""
    return find_rules(jurisdiction, "prefix")


def reports_path() -> Path:
    """Where filed reports are appended."""
    return Path(os.environ.get("CONTRACT_REVIEW_REPORTS", ".replayable/reports.jsonl"))


@replayable.tool(side_effect=True)
def file_report(contract_id: str, risk: str, summary: str, report_id: str) -> dict[str, Any]:
    """File the review: append one JSON line to the reports file (a side effect)."""
    path = reports_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"report_id": report_id, "contract_id": contract_id, "risk": risk, "summary": summary}
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    return {"report_id": report_id, "status": "filed"}


# -- model calls --------------------------------------------------------------------


def _client() -> OpenAI:
    return OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL", DEFAULT_BASE_URL),
        api_key=os.environ.get("OPENAI_API_KEY", "demo-key"),
        max_retries=0,
        timeout=30.0,
    )


def _ask_json(client: OpenAI, system: str, prompt: str) -> dict[str, Any]:
    response = replayable.llm(
        client.chat.completions.create,
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        temperature=0.7,
        response_format={"type": "json_object"},
    )
    content = response.choices[0].message.content or "{}"
    answer: dict[str, Any] = json.loads(content)
    return answer


def extract_terms(client: OpenAI, contract: dict[str, Any]) -> dict[str, Any]:
    """The contract's key terms, as the model reads them."""
    prompt = f"TASK: extract terms\nCONTRACT {contract['contract_id']}:\n{contract['text']}"
    return _ask_json(client, EXTRACT_SYSTEM, prompt)


def assess_risk(
    client: OpenAI, terms: dict[str, Any], rules: list[dict[str, Any]]
) -> dict[str, Any]:
    """The model's risk rating for these terms under these rules."""
    prompt = (
        "TASK: assess risk\n"
        f"TERMS:\n{json.dumps(terms, sort_keys=True)}\n"
        f"RULES:\n{json.dumps(rules, sort_keys=True)}"
    )
    return _ask_json(client, RISK_SYSTEM, prompt)


# -- the workflow -------------------------------------------------------------------


@replayable.workflow("contract_review")
def review_contract(contract_id: str) -> dict[str, Any]:
    """Review one contract and file a risk report; returns the report."""
    contract = read_contract(contract_id)
    with _client() as client:
        terms = extract_terms(client, contract)
        rules = query_compliance_rules(terms["jurisdiction"])
        verdict = assess_risk(client, terms, rules)
    reviewed_at = dt.datetime.fromtimestamp(replayable.now(), dt.UTC).isoformat()
    report_id = f"RPT-{replayable.uuid4().hex[:12]}"
    risk = str(verdict.get("risk", "unknown"))
    summary = str(verdict.get("summary", ""))
    file_report(contract_id, risk, summary, report_id)
    return {
        "contract_id": contract_id,
        "counterparty": terms.get("counterparty"),
        "jurisdiction": terms.get("jurisdiction"),
        "risk": risk,
        "summary": summary,
        "rules_applied": [r["rule_id"] for r in rules],
        "report_id": report_id,
        "reviewed_at": reviewed_at,
    }
