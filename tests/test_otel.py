"""OpenTelemetry export: span names, attributes and parents, and a real Phoenix receiving them.

Phoenix (``arize-phoenix``) runs from its own virtual environment (``make test``
builds ``.venv-phoenix``; ``$REPLAYABLE_PHOENIX`` names another ``phoenix`` executable),
started once per session on free ports with its working directory in a temporary
folder, and is queried through its REST API. Under ``CI=true`` a Phoenix that is missing
or does not start fails the tests that need it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from typer.testing import CliRunner

import replayable
from replayable.cli import app
from replayable.integrations.otel import Follower, export_runs, run_spans, run_tree, span_id
from replayable.store.memory import MemoryStore
from replayable.testing import load_fixture
from tests import agents_policies

ROOT = Path(__file__).resolve().parents[1]
INCIDENT = ROOT / "tests" / "fixtures" / "gb-sct.replay"
GOLDEN = ROOT / "tests" / "golden" / "events1-chain1.replay"


def _phoenix_executable() -> str | None:
    named = os.environ.get("REPLAYABLE_PHOENIX")
    if named:
        return named
    local = ROOT / ".venv-phoenix" / "bin" / "phoenix"
    return str(local) if local.exists() else shutil.which("phoenix")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"Phoenix is needed under CI: {reason}")
    pytest.skip(f"{reason} (make .venv-phoenix/.installed, or set REPLAYABLE_PHOENIX)")


class Phoenix:
    """A running Phoenix: its OTLP/HTTP endpoint and its REST API."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=10) as resp:
            return json.loads(resp.read())

    def spans(self, project: str, want: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The project's spans, waiting until at least ``want`` have arrived."""
        deadline = time.monotonic() + timeout
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                found = self.get(f"/v1/projects/{project}/spans?limit=1000")["data"]
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # the project appears with its first span
                    raise
            if len(found) >= want:
                return found
            time.sleep(0.3)
        raise AssertionError(f"Phoenix holds {len(found)} spans of {project}, expected {want}")


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    exe = _phoenix_executable()
    if exe is None:
        _missing("no Phoenix installed")
    assert exe is not None
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))},
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (work / "phoenix.log").open("wb")
    proc = subprocess.Popen([exe, "serve"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                _missing(f"Phoenix exited with {proc.returncode}; see {work / 'phoenix.log'}")
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                _missing(f"Phoenix did not answer on {base} within 180 s")
            time.sleep(0.25)
        yield Phoenix(base)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _flat(attrs: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Phoenix returns attributes nested by their dots; flatten them back."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


# -- the mapping, without a receiver --------------------------------------------------------


def test_the_incident_maps_to_gen_ai_spans_under_their_causal_parents():
    """Run → invoke_agent root span; LLM events → chat spans with model and usage and
    their messages as events; tools → execute_tool spans; recorded times kept."""
    fx, store = load_fixture(INCIDENT)
    runs, events = run_tree(store, store.get_run(fx.root))
    spans = run_spans(runs, events, Resource.create({"service.name": "t"}))
    root = spans[0]
    assert root.name == "invoke_agent contract_review"
    assert root.parent is None
    assert root.start_time == int(runs[0].started_at * 1e9)
    names = [s.name for s in spans[1:]]
    assert names == [
        "execute_tool read_contract",
        "chat contract-analyst-1",
        "execute_tool query_compliance_rules",
        "chat contract-analyst-1",
        "clock time",
        "uuid uuid4",
        "execute_tool file_report",
    ]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in spans[1:])
    assert len({s.context.trace_id for s in spans}) == 1
    chat = spans[2]
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "contract-analyst-1"
    assert attrs["gen_ai.request.temperature"] == 0.7
    assert attrs["gen_ai.usage.input_tokens"] > 0
    assert attrs["gen_ai.usage.output_tokens"] > 0
    assert [e.name for e in chat.events] == [
        "gen_ai.system.message",
        "gen_ai.user.message",
        "gen_ai.choice",
    ]
    tool = dict(spans[3].attributes or {})
    assert tool["gen_ai.tool.name"] == "query_compliance_rules"
    assert tool["replayable.seq"] == 3
    event = events[fx.root][0]
    assert spans[1].start_time == int(event.started_at * 1e9)
    assert spans[1].end_time == spans[1].start_time + event.duration_ns


def test_child_runs_hang_under_the_event_that_started_them_and_spans_nest():
    """A golden basket's two child runs are spans under the parent's subrun steps, and
    the events inside a span event are its children."""
    fx, store = load_fixture(GOLDEN)
    runs, events = run_tree(store, store.get_run(fx.root))
    spans = run_spans(runs, events, Resource.create({}))
    by_id = {s.context.span_id: s for s in spans}
    kids = [s for s in spans if s.name == "invoke_agent golden_line"]
    assert len(kids) == 2
    for kid in kids:
        assert kid.parent is not None
        parent = by_id[kid.parent.span_id]
        assert parent.attributes is not None
        assert parent.attributes["replayable.run_id"] == fx.root
    order = next(s for s in spans if s.name == "execute_tool place_order")
    assert order.parent is not None
    assert by_id[order.parent.span_id].name == "span ordering"
    failed = next(s for s in spans if s.name == "execute_tool flaky")
    assert failed.status.status_code.name == "ERROR"
    assert "no supplier" in (failed.status.description or "")


def test_secrets_are_not_exported_because_the_store_never_held_them():
    """A key in a tool argument is redacted at capture; its span carries [REDACTED] only."""
    store = MemoryStore()

    @replayable.tool
    def call_api(url: str, api_key: str) -> str:
        return "ok"

    @replayable.workflow("otel_secret")
    def flow() -> str:
        return call_api("https://example.com", api_key="sk-proj-" + "A" * 40)

    with replayable.recording(store) as rec:
        flow()
    runs, events = run_tree(store, store.get_run(rec.run_ids[0]))
    text = repr(
        [
            (s.attributes, [e.attributes for e in s.events])
            for s in run_spans(runs, events, Resource.create({}))
        ]
    )
    assert "AAAAAAAAAA" not in text
    assert "sk-proj" not in text


def test_export_to_nothing_listening_fails_with_the_endpoint():
    """No receiver: an error naming the endpoint, within the timeout, no traceback."""
    fx, store = load_fixture(INCIDENT)
    port = _free_port()
    res = CliRunner().invoke(
        app, ["--store", "memory://none", "export", "--otlp", f"http://127.0.0.1:{port}"]
    )
    assert res.exit_code == 2
    assert "takes a RUN or --since" in res.output
    with pytest.raises(replayable.ReplayableError, match=f"127.0.0.1:{port}/v1/traces"):
        export_runs(store, [store.get_run(fx.root)], f"http://127.0.0.1:{port}", timeout=1.0)


# -- a real Phoenix ----------------------------------------------------------------------------


@pytest.mark.slow
def test_phoenix_receives_the_incident_with_names_attributes_and_parents(phoenix, monkeypatch):
    """``replayable export --otlp`` of the GB-SCT run and the golden basket: Phoenix shows
    every span with its name, gen_ai attributes, parent and recorded start time."""
    project = f"replayable-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={project}")
    fx, _ = load_fixture(INCIDENT)
    gold, _ = load_fixture(GOLDEN)
    named = MemoryStore.named(f"otel-{project}")
    for f in (fx, gold):
        for digest, data in f.blobs.items():
            named.put_blob(digest, data)
        named.append(f.starts, f.events, f.ends)
    runner = CliRunner()
    for run_id in (fx.root, gold.root):
        res = runner.invoke(app, ["--store", named.url, "export", "--otlp", phoenix.base, run_id])
        assert res.exit_code == 0, res.output
    expected = 1 + len(fx.events) + len(gold.starts) + len(gold.events)
    spans = phoenix.spans(project, expected)
    assert len(spans) == expected
    by_id = {s["context"]["span_id"]: s for s in spans}
    root = next(s for s in spans if s["name"] == "invoke_agent contract_review")
    assert root["parent_id"] is None
    assert root["context"]["span_id"] == f"{span_id(fx.root):016x}"
    chats = [s for s in spans if s["name"] == "chat contract-analyst-1"]
    assert len(chats) == 2
    for chat in chats:
        attrs = _flat(chat["attributes"])
        assert attrs["gen_ai.request.model"] == "contract-analyst-1"
        assert attrs["gen_ai.usage.input_tokens"] > 0
        assert attrs["gen_ai.operation.name"] == "chat"
        assert chat["parent_id"] == root["context"]["span_id"]
        assert {e["name"] for e in chat["events"]} >= {"gen_ai.user.message", "gen_ai.choice"}
    tool = next(s for s in spans if s["name"] == "execute_tool query_compliance_rules")
    assert _flat(tool["attributes"])["gen_ai.tool.name"] == "query_compliance_rules"
    assert tool["parent_id"] == root["context"]["span_id"]
    recorded = next(e for e in fx.events if e.name == "query_compliance_rules")
    started = tool["start_time"].replace("Z", "+00:00")
    import datetime as dt

    assert abs(dt.datetime.fromisoformat(started).timestamp() - recorded.started_at) < 1e-3
    kids = [s for s in spans if s["name"] == "invoke_agent golden_line"]
    assert len(kids) == 2
    for kid in kids:
        assert _flat(by_id[kid["parent_id"]]["attributes"])["replayable.run_id"] == gold.root


@pytest.mark.slow
def test_follower_ships_runs_while_they_are_recorded(phoenix, tmp_path, monkeypatch):
    """With the follower running, a recorded run's spans reach Phoenix without any export
    call; the run's own span follows its end."""
    monkeypatch.setattr(agents_policies, "ASK_FIRST", False)
    project = f"replayable-live-{uuid.uuid4().hex[:8]}"
    store = replayable.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    follower = Follower(
        store,
        phoenix.base,
        interval=0.2,
        resource_attributes={"openinference.project.name": project},
    ).start()
    try:
        with replayable.recording(store) as rec:
            agents_policies.tidy_calendar("ops")
        spans = phoenix.spans(project, 3)
    finally:
        follower.stop()
    assert follower.last_error is None
    assert sorted(s["name"] for s in spans) == [
        "execute_tool delete_event",
        "execute_tool list_events",
        "invoke_agent tidy_calendar",
    ]
    root = next(s for s in spans if s["name"] == "invoke_agent tidy_calendar")
    assert _flat(root["attributes"])["replayable.run_id"] == rec.run_ids[0]
    assert all(s["parent_id"] == root["context"]["span_id"] for s in spans if s is not root)


class _Collector:
    """A local OTLP/HTTP receiver that decodes what it gets."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        received: list[tuple[str, str]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            received.append((sp.name, sp.span_id.hex()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        import threading

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_follower_sends_each_span_once_and_a_run_span_after_its_end(tmp_path, monkeypatch):
    """Polls send only what is new: the events of a run, then its own span once it has
    ended, never twice; a run recorded later is picked up by the next poll."""
    monkeypatch.setattr(agents_policies, "ASK_FIRST", False)
    store = replayable.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    collector = _Collector()
    try:
        follower = Follower(store, collector.url, since=time.time() - 1)
        with replayable.recording(store) as rec:
            agents_policies.tidy_calendar("ops")
        assert follower.poll() == 3
        assert follower.poll() == 0
        with replayable.recording(store) as rec2:
            agents_policies.refunds(10.0, "2026-06-01")
        assert follower.poll() == 2
        follower.stop()
    finally:
        collector.close()
    names = [n for n, _ in collector.received]
    assert sorted(names) == sorted(
        [
            "invoke_agent tidy_calendar",
            "execute_tool list_events",
            "execute_tool delete_event",
            "invoke_agent refunds",
            "execute_tool refund",
        ]
    )
    ids = [i for _, i in collector.received]
    assert len(ids) == len(set(ids))
    assert f"{span_id(rec.run_ids[0]):016x}" in ids
    assert f"{span_id(rec2.run_ids[0]):016x}" in ids


RECORD_SCRIPT = """
import sys
import replayable
from tests import agents_policies
with replayable.recording(sys.argv[1]):
    agents_policies.tidy_calendar("ops")
"""


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["process", "thread"])
def test_the_writer_ships_spans_live_when_an_endpoint_is_set(tmp_path, writer):
    """With REPLAYABLE_OTLP_ENDPOINT set, an agent process that only records sends its
    run's spans through its writer (the writer process, or the in-process writer): the
    events' spans and, after its end, the run's."""
    collector = _Collector()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REPLAYABLE_", "OTEL_"))}
        env.update(
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]),
            REPLAYABLE_OTLP_ENDPOINT=collector.url,
            REPLAYABLE_OTLP_INTERVAL="0.1",
            REPLAYABLE_WRITER=writer,
        )
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        done = subprocess.run(
            [sys.executable, "-c", RECORD_SCRIPT, store],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 15
        while len(collector.received) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        collector.close()
    assert sorted(n for n, _ in collector.received) == [
        "execute_tool delete_event",
        "execute_tool list_events",
        "invoke_agent tidy_calendar",
    ]
    recorded = replayable.open_store(store)
    [run] = recorded.list_runs()
    assert f"{span_id(run.run_id):016x}" in {i for _, i in collector.received}
