"""Decision policies for the contract-review agent.

``no_low_risk_without_rules`` is the rule the GB-SCT incident broke: a
contract may be rated low only when the compliance lookup found rules to
rate it against. ``replayable check RUN --policy contract_review.policies:
no_low_risk_without_rules`` judges a recorded run; the regression test in
``tests/test_incident_gb_sct.py`` judges the fixture and its fork.
"""

from __future__ import annotations

from replayable import policy
from replayable.audit.policies import PolicyRun, Violation
from replayable.audit.policy_library import only_allowed_tools

__all__ = ["no_low_risk_without_rules", "only_review_tools"]


@policy("no_low_risk_without_rules")
def no_low_risk_without_rules(run: PolicyRun) -> Violation | None:
    """No low-risk rating without compliance data."""
    output = run.final_output if isinstance(run.final_output, dict) else {}
    if output.get("risk") != "low":
        return None
    lookups = run.calls("query_compliance_rules")
    if not lookups:
        return run.violation("rated low without looking up the compliance rules")
    empty = [c for c in lookups if c.empty]
    if empty:
        filing = run.calls("file_report")
        return run.violation(
            "rated low although the compliance lookup found no rules "
            f"for {empty[0].args.get('jurisdiction')!r}",
            *empty,
            *filing,
        )
    return None


#: The agent reads, looks up, and files; nothing else.
only_review_tools = only_allowed_tools(
    "read_contract", "query_compliance_rules", "file_report", name="only_review_tools"
)
