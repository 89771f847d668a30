"""No silent gaps: connections outside every boundary are noted while recording and
refused in a pure replay.

The agents here talk HTTP with ``http.client``, which no seam intercepts, to a
local server that counts what reaches it.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from typer.testing import CliRunner

import replayable
from replayable.capture.network import CaptureGapWarning
from replayable.cli import app
from replayable.store import MemoryStore, verify_run


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.hits += 1  # type: ignore[attr-defined]
        body = b"42"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[Any]:
    """A counting HTTP server on 127.0.0.1."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.hits = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def _get(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/value")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


@replayable.tool
def fetch_in_tool(port: int) -> str:
    return _get(port)


@replayable.workflow
def raw_agent(port: int) -> str:
    first = _get(port)
    second = _get(port)  # the same call site: warned once
    return first + second


@replayable.workflow
def tool_agent(port: int) -> str:
    return fetch_in_tool(port)


@replayable.workflow
def fork_agent(port: int) -> str:
    head = fetch_in_tool(port)
    return head + _get(port)


@replayable.workflow
async def async_raw_agent(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    return data.rsplit(b"\r\n", 1)[-1].decode()


def _record(store: MemoryStore, fn: Any, *args: Any) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with replayable.recording(store) as rec:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                asyncio.run(result)
    _record.caught = [w for w in caught if issubclass(w.category, CaptureGapWarning)]  # type: ignore[attr-defined]
    return rec.run_ids[0]


def test_connection_outside_boundaries_is_recorded_as_a_gap(server: Any) -> None:
    """Host, port and the agent's call site are kept; one warning per call site."""
    store = MemoryStore()
    run_id = _record(store, raw_agent, server.server_port)
    gaps = [e for e in store.events(run_id) if e.kind == "gap"]
    assert [g.name for g in gaps] == [f"127.0.0.1:{server.server_port}"] * 2
    assert gaps[0].key is None
    assert gaps[0].request_value() == {
        "host": "127.0.0.1",
        "port": server.server_port,
        "via": "http.client",
    }
    assert gaps[0].call_site is not None
    assert "test_network_guard.py" in gaps[0].call_site
    assert "in _get" in gaps[0].call_site
    warned = _record.caught  # type: ignore[attr-defined]
    assert len(warned) == 1
    assert f"127.0.0.1:{server.server_port}" in str(warned[0].message)
    assert verify_run(store, run_id).ok


def test_pure_replay_refuses_the_connection(server: Any) -> None:
    """Diverged with unrecorded_io naming host, port and site; no hit reaches the server."""
    store = MemoryStore()
    run_id = _record(store, raw_agent, server.server_port)
    hits = server.hits
    result = replayable.replay(run_id, store=store, fn=raw_agent)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert div.reason == "unrecorded_io"
    assert div.actual is not None
    assert div.actual.name == f"127.0.0.1:{server.server_port}"
    assert div.call_site is not None
    assert "in _get" in div.call_site
    assert "allow_network=True" in div.message
    assert server.hits == hits


def test_allow_network_lets_a_pure_replay_connect(server: Any) -> None:
    """The explicit opt-out: the connection goes through and the replay completes."""
    store = MemoryStore()
    run_id = _record(store, raw_agent, server.server_port)
    hits = server.hits
    result = replayable.replay(run_id, store=store, fn=raw_agent, allow_network=True)
    assert result.status == "identical", result.divergence
    assert server.hits == hits + 2


def test_async_loop_connection_is_a_gap_and_refused_on_replay(server: Any) -> None:
    """asyncio.open_connection goes through the same guard."""
    store = MemoryStore()
    run_id = _record(store, async_raw_agent, server.server_port)
    assert [e.kind for e in store.events(run_id)] == ["gap"]
    hits = server.hits
    result = replayable.replay(run_id, store=store, fn=async_raw_agent)
    assert result.status == "diverged"
    assert result.divergence is not None
    assert result.divergence.reason == "unrecorded_io"
    assert server.hits == hits


def test_connections_inside_a_tool_are_the_tools() -> None:
    """A boundary's own connections are neither gaps nor refused (it is served on replay)."""
    store = MemoryStore()
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as srv:
        srv.hits = 0  # type: ignore[attr-defined]
        t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
        t.start()
        try:
            run_id = _record(store, tool_agent, srv.server_port)
        finally:
            srv.shutdown()
            t.join()
    assert [e.kind for e in store.events(run_id)] == ["tool"]
    assert _record.caught == []  # type: ignore[attr-defined]
    assert replayable.replay(run_id, store=store, fn=tool_agent).status == "identical"


def test_no_run_no_guard(server: Any) -> None:
    """Outside a run nothing is looked at, during a recording or not."""
    with replayable.recording(MemoryStore()):
        assert _get(server.server_port) == "42"
    assert _get(server.server_port) == "42"


def test_fork_allows_the_network_only_where_it_runs_live(server: Any) -> None:
    """Forked at the tool step, the raw call after it runs live and is a gap of the new run."""
    store = MemoryStore()
    run_id = _record(store, fork_agent, server.server_port)
    hits = server.hits
    forked = replayable.replay(run_id, store=store, fn=fork_agent, fork_at=1, overrides={1: "7"})
    assert forked.status == "completed", forked.divergence
    assert forked.output == "742"
    assert server.hits == hits + 1
    assert forked.new_run_id is not None
    assert [e.kind for e in store.events(forked.new_run_id)] == ["tool", "gap"]
    # Counterfactual with nothing named live: the raw call sits in the frozen part.
    frozen = replayable.replay(run_id, store=store, fn=fork_agent, live={"llm"})
    assert frozen.status == "diverged"
    assert frozen.divergence is not None
    assert frozen.divergence.reason == "unrecorded_io"
    assert server.hits == hits + 1


def test_show_says_not_fully_captured(server: Any, tmp_path: Any) -> None:
    """The run header names the gaps; the JSON says whether the run is fully captured."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = replayable.open_store(url)
    run_id = _record(store, raw_agent, server.server_port)
    store.close()
    runner = CliRunner()
    out = runner.invoke(app, ["--store", url, "show", run_id])
    assert out.exit_code == 0, out.output
    assert "not fully captured" in out.output
    assert f"127.0.0.1:{server.server_port}" in out.output
    as_json = runner.invoke(app, ["--store", url, "show", run_id, "--json"])
    assert '"fully_captured": false' in as_json.output


def test_unix_and_udp_sockets_are_not_network_gaps(tmp_path: Any) -> None:
    """Only TCP connections count: a UDP or Unix-domain connect inside a run is left alone."""
    store = MemoryStore()
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    @replayable.workflow
    def pair_agent() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect(("127.0.0.1", 9))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as local:
            local.connect(path)
        return 1

    with replayable.recording(store) as rec:
        pair_agent()
    try:
        assert store.events(rec.run_ids[0]) == []
        assert replayable.replay(rec.run_ids[0], store=store, fn=pair_agent).status == "identical"
    finally:
        listener.close()


def test_cli_replay_refuses_then_allows_the_network(server: Any, tmp_path: Any) -> None:
    """`replayable replay` exits 1 on unrecorded_io; --allow-network lets the call through."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = replayable.open_store(url)
    run_id = _record(store, raw_agent, server.server_port)
    store.close()
    runner = CliRunner()
    hits = server.hits
    refused = runner.invoke(app, ["--store", url, "replay", run_id, "--json"])
    assert refused.exit_code == 1, refused.output
    assert '"unrecorded_io"' in refused.output
    assert server.hits == hits
    allowed = runner.invoke(app, ["--store", url, "replay", run_id, "--allow-network"])
    assert allowed.exit_code == 0, allowed.output
    assert server.hits == hits + 2


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_the_stores_own_connections_are_not_gaps(
    writer: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's NATS anchor connects from its own thread or process: no gap, no warning."""
    try:
        socket.create_connection(("127.0.0.1", 4222), timeout=2).close()
    except OSError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"NATS at 127.0.0.1:4222 is not reachable: {exc}")
        pytest.skip(f"NATS at 127.0.0.1:4222 is not reachable: {exc}")
    monkeypatch.setenv("REPLAYABLE_ANCHOR", f"nats://127.0.0.1:4222/gaps_{os.getpid()}_{writer}")
    from replayable.capture.config import settings

    previous = settings.writer
    settings.writer = writer
    try:
        store = replayable.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        run_id = _record(store, tool_agent_offline)
    finally:
        settings.writer = previous
    assert [e.kind for e in store.events(run_id)] == ["tool"]
    assert _record.caught == []  # type: ignore[attr-defined]
    store.close()


@replayable.tool
def offline_tool() -> int:
    return 1


@replayable.workflow
def tool_agent_offline() -> int:
    return offline_tool()
