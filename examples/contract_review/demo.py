"""The contract-review incident, end to end: record, re-run live, replay, verify.

``run_demo`` is what ``replayable demo`` runs. It starts the scripted model,
records one review of contract ``C-1042`` (the Scottish contract rated "low"),
shows its timeline, re-runs the agent live to show the answer is not stable,
replays the recording to show it is, and checks the run's hash chain.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table
from rich.text import Text

import replayable
from contract_review.agent import review_contract
from contract_review.model_server import serve
from replayable.cli.render import event_summary, status_text, timeline
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

    @property
    def ok(self) -> bool:
        """Replay matched the recording exactly, touched nothing live, and the chain holds."""
        return (
            self.replay_status == "identical"
            and self.replay_output == self.recorded_output
            and self.model_requests_during_replay == 0
            and self.reports_filed_during_replay == 0
            and self.chain_ok
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
) -> DemoResult:
    """Run the demo against ``store_url`` (default ``$REPLAYABLE_STORE`` or the default store).

    ``seed`` fixes the scripted model's sampling noise; ``reruns`` is how many
    live re-runs to show; reports are appended to ``reports_path`` (default
    ``.replayable/demo-reports.jsonl``).
    """
    store = replayable.open_store(store_url)
    try:
        return _run(
            store,
            console,
            seed=seed,
            reruns=reruns,
            reports=reports_path or Path(".replayable/demo-reports.jsonl"),
        )
    finally:
        store.close()


def _run(
    store: EventStore, console: Console, *, seed: int | None, reruns: int, reports: Path
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

    console.rule()
    console.print(
        Text(
            "demo ok" if result.ok else "demo FAILED",
            style="bold green" if result.ok else "bold red",
        )
    )
    console.print(f"explore it: replayable --store {store.url} show {run_id}", markup=False)
    return result
