"""The contract-review incident, end to end: record, re-run live, replay, verify, fork, diff.

``run_demo`` is what ``replayable demo`` runs. It starts the scripted model,
records one review of contract ``C-1042`` (the Scottish contract rated "low"),
shows its timeline, re-runs the agent live to show the answer is not stable,
replays the recording to show it is, and checks the run's hash chain. Then it
switches the agent to the fixed rules lookup, forks the recording at the
compliance step (the fixed tool and the risk model call run live, the report
filing is held back), and diffs the fork against the original.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table
from rich.text import Text

import replayable
from contract_review import agent
from contract_review.agent import review_contract
from contract_review.model_server import ModelServer, serve
from replayable.cli.render import event_mark, event_parts, event_summary, status_text, timeline
from replayable.diff import RunDiff
from replayable.events.model import Event
from replayable.store import EventStore, verify_run

__all__ = ["CONTRACT_ID", "DemoResult", "run_demo"]

CONTRACT_ID: Final = "C-1042"


@dataclass
class DemoResult:
    """What the demo observed, for callers that check it rather than read it."""

    run_id: str
    recorded_output: dict[str, Any]
    live_outputs: list[dict[str, Any]] = field(default_factory=list)
    replay_status: str = ""
    replay_output: Any = None
    model_requests_during_replay: int = -1
    reports_filed_during_replay: int = -1
    chain_ok: bool = False
    fork_step: int | None = None
    fork_run_id: str | None = None
    fork_status: str = ""
    fork_output: Any = None
    fork_blocked: tuple[int, ...] = ()
    model_requests_during_fork: int = -1
    reports_filed_during_fork: int = -1
    diff: RunDiff | None = None
    audit_days: int = 0
    audit_flagged: tuple[str, ...] = ()
    auditor_refused: bool = False

    @property
    def ok(self) -> bool:
        """Replay matched the recording exactly, touched nothing live, and the chain holds;
        the fork with the fixed tool rated the contract high without filing a report."""
        return (
            self.replay_status == "identical"
            and self.replay_output == self.recorded_output
            and self.model_requests_during_replay == 0
            and self.reports_filed_during_replay == 0
            and self.chain_ok
            and self.fork_status == "completed"
            and isinstance(self.fork_output, dict)
            and self.fork_output.get("risk") == "high"
            and bool(self.fork_blocked)
            and self.reports_filed_during_fork == 0
            and self.diff is not None
            and self.diff.first is not None
            and self.diff.first.left_step == self.fork_step
            and (self.audit_days == 0 or self._audit_ok)
        )

    @property
    def _audit_ok(self) -> bool:
        # The month holds 13 more runs of GB sub-jurisdictions: 14 with the incident.
        return (
            len(self.audit_flagged) == AFFECTED_IN_MONTH + 1
            and self.run_id in self.audit_flagged
            and self.auditor_refused
        )


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(encoding="utf-8") as fh:
        return sum(1 for _ in fh)


def run_demo(
    store_url: str | None,
    console: Console,
    *,
    seed: int | None = 7,
    reruns: int = 3,
    reports_path: Path | None = None,
    audit_days: int = 30,
) -> DemoResult:
    """Run the demo against ``store_url`` (default ``$REPLAYABLE_STORE`` or the default store).

    ``seed`` fixes the scripted model's sampling noise; ``reruns`` is how many
    live re-runs to show; reports are appended to ``reports_path`` (default
    ``.replayable/demo-reports.jsonl``). ``audit_days`` (0 to skip) is how many
    days of earlier reviews the impact audit records and scans.
    """
    store = replayable.open_store(store_url)
    try:
        return _run(
            store,
            console,
            seed=seed,
            reruns=reruns,
            reports=reports_path or Path(".replayable/demo-reports.jsonl"),
            audit_days=audit_days,
        )
    finally:
        store.close()


def _run(
    store: EventStore,
    console: Console,
    *,
    seed: int | None,
    reruns: int,
    reports: Path,
    audit_days: int = 0,
) -> DemoResult:
    console.print(
        Text('replayable demo: the contract rated "low" that should have been "high"', style="bold")
    )
    console.print(f"store {store.url}   reports {reports}")
    with (
        serve(seed=seed) as model,
        _environ(
            OPENAI_BASE_URL=model.base_url,
            OPENAI_API_KEY="demo-key",
            CONTRACT_REVIEW_REPORTS=str(reports),
        ),
    ):
        console.print(f"model: scripted, OpenAI wire format at {model.base_url} (seed {seed})")

        console.rule("1. Record the production run")
        with replayable.recording(store, metadata={"contract_id": CONTRACT_ID}) as rec:
            output = review_contract(CONTRACT_ID)
        run_id = rec.run_ids[0]
        result = DemoResult(run_id=run_id, recorded_output=output)
        console.print(
            Text.assemble(
                f"review_contract({CONTRACT_ID!r}) → risk ",
                (output["risk"], "bold"),
                "   run ",
                (run_id, "cyan"),
            )
        )
        events = store.events(run_id)
        console.print(timeline(events))
        for event in events:
            if event.name == "query_compliance_rules":
                summary, _ = event_summary(event)
                console.print(
                    Text.assemble(
                        (f"step {event.seq}: ", "bold"),
                        summary,
                        "\n",
                        "the rules are filed under 'GB' and the lookup matches the jurisdiction "
                        "exactly, so the model was told to proceed with available data.",
                    )
                )

        console.rule("2. Re-run it live: the model samples, so the answer moves")
        table = Table(show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("run", no_wrap=True)
        table.add_column("risk", no_wrap=True)
        table.add_column("summary", overflow="fold")
        table.add_row("recorded", output["risk"], output["summary"], style="cyan")
        for i in range(reruns):
            live = review_contract(CONTRACT_ID)
            result.live_outputs.append(live)
            table.add_row(f"live {i + 1}", live["risk"], live["summary"])
        console.print(table)
        risks = sorted({output["risk"], *(o["risk"] for o in result.live_outputs)})
        console.print(
            f"answers seen: {', '.join(risks)}; re-running cannot reproduce the incident reliably."
        )

        console.rule("3. Replay the recording")
        requests_before, reports_before = model.requests, _lines(reports)
        replayed = replayable.replay(run_id, store=store)
        result.replay_status = replayed.status
        result.replay_output = replayed.output
        result.model_requests_during_replay = model.requests - requests_before
        result.reports_filed_during_replay = _lines(reports) - reports_before
    same = replayed.output == output
    console.print(
        Text.assemble(
            "status ", status_text(replayed.status), f"   events served {replayed.events_served}"
        )
    )
    console.print(
        Text.assemble(
            "output ",
            ("identical to the recording" if same else "DIFFERENT", "green" if same else "red"),
            f": risk {replayed.output['risk'] if same else '?'}",
        )
    )
    console.print(
        f"model requests during replay: {result.model_requests_during_replay}   "
        f"reports filed during replay: {result.reports_filed_during_replay}"
    )
    if replayed.divergence is not None:
        console.print(replayed.divergence.message)

    console.rule("4. Verify the hash chain")
    report = verify_run(store, run_id)
    result.chain_ok = report.ok
    console.print(
        Text(("✓ " if report.ok else "✗ ") + report.message, style="green" if report.ok else "red")
    )

    with (
        serve(seed=seed) as model,
        _environ(
            OPENAI_BASE_URL=model.base_url,
            OPENAI_API_KEY="demo-key",
            CONTRACT_REVIEW_REPORTS=str(reports),
        ),
    ):
        _fork_and_diff(store, console, result, model, reports)

    if audit_days:
        _audit_impact(store, console, result, audit_days, reports)

    console.rule()
    console.print(
        Text(
            "demo ok" if result.ok else "demo FAILED",
            style="bold green" if result.ok else "bold red",
        )
    )
    cli = f"{cli_command()} --store {shlex.quote(store.url)}"
    console.print(f"explore it: {cli} show {run_id}", markup=False, soft_wrap=True)
    if result.fork_run_id:
        console.print(
            f"            {cli} diff {run_id} {result.fork_run_id}", markup=False, soft_wrap=True
        )
    return result


AFFECTED_IN_MONTH: Final = 13


def _audit_impact(
    store: EventStore, console: Console, result: DemoResult, days: int, reports: Path
) -> None:
    """The seed's step 5: a month of earlier reviews, the anomaly scan, an analyst's
    verdict, the auditor's report, and the access log of both reads."""
    import time

    from contract_review.history import record_history
    from replayable.audit import Actor, AuditReader, Scanner
    from replayable.audit.report import build_report
    from replayable.errors import AccessDeniedError

    console.rule(f"6. Audit the impact: {days} days of reviews, the anomaly scan, a report")
    result.audit_days = days
    history = record_history(
        store,
        days=days,
        per_day=1,
        affected=AFFECTED_IN_MONTH,
        reports_path=reports.with_name("history-reports.jsonl"),
    )
    scan = Scanner(store).scan(since=time.time() - (days + 1) * 86400)
    empty = [f for f in scan.flags if f.rule == "empty_data_decision"]
    result.audit_flagged = tuple(f.run_id for f in empty)
    console.print(
        f"recorded {len(history.run_ids)} earlier reviews; scanned {scan.runs} runs: "
        f"{len(empty)} decided on an empty compliance lookup (rule 5), "
        f"{len(scan.flags) - len(empty)} other flag(s)"
    )
    analyst = AuditReader(store, Actor("dana", "analyst", store.login_name()), purpose="INC-204")
    analyst.events(result.run_id, steps=[3])
    flag = next((f for f in empty if f.run_id == result.run_id), None)
    note = analyst.annotate(
        result.run_id,
        step=3,
        verdict="violation",
        policy="CR-7",
        note="The compliance lookup returned no rules for GB-SCT; the contract was rated "
        "low without them.",
        closes=[flag.flag_id] if flag else (),
    )
    console.print(
        Text.assemble("analyst dana: ", ("violation", "bold red"), f" on step 3 ({note.note})")
    )
    auditor = AuditReader(store, Actor("olu", "auditor", store.login_name()), purpose="audit")
    report = build_report(auditor, result.run_id)
    try:
        auditor.annotate(result.run_id, verdict="ok", note="looks fine")
    except AccessDeniedError as exc:
        result.auditor_refused = True
        console.print(f"auditor olu tries to annotate: refused ({exc})", markup=False)
    readers = report["access_log"]["readers"]
    console.print(
        "access log of the run: " + ", ".join(f"{who} ×{n}" for who, n in readers.items()),
        markup=False,
    )


def cli_command() -> str:
    """``replayable`` as a new shell can run it: inside a virtual environment (which a
    new shell has not activated) the full path of its ``replayable`` script."""
    script = Path(sys.executable).with_name("replayable")
    in_venv = sys.prefix != sys.base_prefix
    if not in_venv and shutil.which("replayable") is not None:
        return "replayable"
    if script.is_file():
        return shlex.quote(str(script.absolute()))
    return f"{shlex.quote(sys.executable)} -m replayable.cli"


def _fork_and_diff(
    store: EventStore, console: Console, result: DemoResult, model: ModelServer, reports: Path
) -> None:
    """Fork the recording at the compliance step with the fixed lookup, then diff the two runs."""
    console.rule("5. Fix the lookup, fork at the compliance step, diff")
    run_id = result.run_id
    step = next(e.seq for e in store.events(run_id) if e.name == "query_compliance_rules")
    result.fork_step = step
    requests_before, reports_before = model.requests, _lines(reports)
    saved, agent.MATCH_MODE = agent.MATCH_MODE, "prefix"
    try:
        # The fork runs the current code: the fixed lookup and the risk model call run live;
        # the report filing is guarded and gets the recorded receipt instead of running.
        forked = replayable.replay(run_id, store=store, fork_at=step, on_side_effect="recorded")
    finally:
        agent.MATCH_MODE = saved
    result.fork_run_id = forked.new_run_id
    result.fork_status = forked.status
    result.fork_output = forked.output
    result.fork_blocked = forked.blocked
    result.model_requests_during_fork = model.requests - requests_before
    result.reports_filed_during_fork = _lines(reports) - reports_before
    if forked.new_run_id is None or forked.status != "completed":
        console.print(Text(f"fork {forked.status}", style="red"))
        if forked.divergence is not None:
            console.print(forked.divergence.message)
        return
    fork_events = store.events(forked.new_run_id)
    console.print(Text("fork steps: " + _step_groups(fork_events), style="dim"))
    result.diff = replayable.diff(run_id, forked.new_run_id, store=store)
    risk = forked.output.get("risk") if isinstance(forked.output, dict) else None
    blocked = "report filing blocked (not executed)" if forked.blocked else "nothing blocked"
    console.print(
        Text.assemble(
            f"fork at step {step} with the fixed tool → risk ",
            (str(risk), "bold red" if risk == "high" else "bold"),
            f"; {blocked}; reports filed during the fork: {result.reports_filed_during_fork}",
        )
    )
    first = result.diff.first
    if first is not None:
        console.print(Text.assemble(("diff: ", "bold"), _divergence_line(result.diff)))
    for change in result.diff.output_changes:
        if change.path == "risk":
            console.print(f"diff: output risk {change.old!r} → {change.new!r} ({change.rank})")
    console.print(Text.assemble("fork run ", (forked.new_run_id, "cyan")))


def _divergence_line(diff: RunDiff) -> str:
    """The first divergence in a few words: the step, and what came back on each side."""
    first = diff.first
    assert first is not None
    pair = next(p for p in diff.pairs if (p.left.seq if p.left else None) == first.left_step)
    side = (first.field or "").split(".")[0].split("[")[0] or "step"
    if pair.left is None or pair.right is None or side != "response":
        return f"first divergence at {first.describe()}"
    before, after = event_parts(pair.left)[1], event_parts(pair.right)[1]
    rows = pair.right.response_tree()
    ids = (
        [r["rule_id"] for r in rows if isinstance(r, dict) and "rule_id" in r]
        if isinstance(rows, list)
        else []
    )
    named = f" ({', '.join(ids)})" if ids else ""
    return (
        f"first divergence at step {first.left_step}: {first.name} response "
        f"{before} → {after}{named}"
    )


def _step_groups(events: list[Event]) -> str:
    """``1-2 replayed · 3-6 live · 7 blocked (file_report)``: how the fork got each step."""
    groups: list[tuple[str, list[Event]]] = []
    for event in events:
        mark = event_mark(event)
        label = mark.plain if mark is not None else "recorded"
        if groups and groups[-1][0] == label:
            groups[-1][1].append(event)
        else:
            groups.append((label, [event]))
    parts = []
    for label, group in groups:
        span = f"{group[0].seq}" if len(group) == 1 else f"{group[0].seq}-{group[-1].seq}"
        named = f" ({group[0].name})" if label == "blocked" and len(group) == 1 else ""
        parts.append(f"{span} {label}{named}")
    return " · ".join(parts)
