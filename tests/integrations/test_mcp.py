"""MCP client sessions recorded and replayed against a real MCP server over stdio."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import replayable
from replayable.integrations import mcp as rmcp
from replayable.store import MemoryStore

SERVER = Path(__file__).resolve().parents[2] / "examples" / "mcp_agent" / "server.py"

pytestmark = pytest.mark.slow


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A served directory and a private copy of the server script (deleted to 'stop' it)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("buy milk")
    (data / "old.txt").write_text("stale")
    script = tmp_path / "server.py"
    shutil.copy(SERVER, script)
    return {"script": str(script), "data": str(data)}


def _params(script: str, data: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[script, data])


def _text(result: Any) -> str:
    return str(result.content[0].text)


@replayable.workflow
async def tidy(script: str, data: str, name: str) -> dict[str, Any]:
    async with rmcp.connect(
        rmcp.stdio(_params(script, data)), side_effects={"delete_file"}, server="files"
    ) as session:
        listing = await session.list_tools()
        names = sorted(t.name for t in listing.tools)
        text = _text(await session.call_tool("read_file", {"name": name}))
        deleted = _text(await session.call_tool("delete_file", {"name": "old.txt"}))
        return {"tools": names, "text": text, "deleted": deleted}


def _record(store: MemoryStore, fn: Any, *args: Any) -> tuple[str, Any]:
    with replayable.recording(store) as rec:
        out = asyncio.run(fn(*args))
    return rec.run_ids[0], out


def test_record_then_replay_with_the_server_gone(files: dict[str, str], store: MemoryStore) -> None:
    """list_tools and call_tool are events; a replay needs no server and deletes nothing."""
    run_id, out = _record(store, tidy, files["script"], files["data"], "notes.txt")
    assert out == {
        "tools": ["delete_file", "list_files", "read_file"],
        "text": "buy milk",
        "deleted": "deleted old.txt",
    }
    events = store.events(run_id)
    assert [(e.kind, e.name, e.side_effect) for e in events] == [
        ("tool", "mcp.list_tools", False),
        ("tool", "read_file", False),
        ("tool", "delete_file", True),
    ]
    assert events[1].request_value() == {"arguments": {"name": "notes.txt"}}
    assert events[1].metadata["mcp_server"] == "files"
    assert not (Path(files["data"]) / "old.txt").exists()
    Path(files["script"]).unlink()  # no server can start any more
    (Path(files["data"]) / "old.txt").write_text("stale")
    result = replayable.replay(run_id, store=store, fn=tidy)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert (Path(files["data"]) / "old.txt").exists()


def test_changed_request_is_a_divergence(files: dict[str, str], store: MemoryStore) -> None:
    """Asking for another file diverges at that call, naming the changed argument."""
    run_id, _ = _record(store, tidy, files["script"], files["data"], "notes.txt")

    @replayable.workflow(tidy.__replayable_workflow__.name)  # type: ignore[attr-defined]
    async def edited(script: str, data: str, name: str) -> Any:
        return await tidy.__wrapped__(script, data, "todo.txt")  # type: ignore[attr-defined]

    result = replayable.replay(run_id, store=store, fn=edited)
    assert result.status == "diverged"
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", 2)
    assert [d.path for d in div.diff] == ["arguments.name"]


def test_fork_at_a_tool_step_runs_live_but_guards_the_side_effect(
    files: dict[str, str], store: MemoryStore
) -> None:
    """Forking at read_file reads live; delete_file, side-effecting, is served from the tape."""
    run_id, _ = _record(store, tidy, files["script"], files["data"], "notes.txt")
    data = Path(files["data"])
    (data / "old.txt").write_text("stale")
    (data / "notes.txt").write_text("buy oat milk")
    forked = replayable.replay(run_id, store=store, fn=tidy, fork_at=2)
    assert forked.status == "completed", forked.divergence
    assert forked.output["text"] == "buy oat milk"
    assert forked.output["deleted"] == "deleted old.txt"
    assert (data / "old.txt").exists()
    override = replayable.replay(
        run_id, store=store, fn=tidy, fork_at=2, overrides={2: _fake_result("edited")}
    )
    assert override.status == "completed", override.divergence
    assert override.output["text"] == "edited"
    with pytest.raises(replayable.ConfigurationError, match="side-effect tool 'delete_file'"):
        replayable.replay(run_id, store=store, fn=tidy, fork_at=3)


def _fake_result(text: str) -> Any:
    from mcp.types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=text)])


@replayable.workflow
async def with_own_session(script: str, data: str) -> list[Any]:
    params = _params(script, data)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as raw:
        await raw.initialize()
        session = rmcp.instrument(raw)
        missing = await session.call_tool("read_file", {"name": "nope.txt"})
        listed = await session.call_tool("list_files")
        return [missing.is_error, _text(missing), listed.structured_content]


def test_instrumented_session_and_tool_errors(files: dict[str, str], store: MemoryStore) -> None:
    """instrument() wraps a session the agent opened; an is_error result replays as recorded."""
    run_id, out = _record(store, with_own_session, files["script"], files["data"])
    assert out[0] is True
    assert "nope.txt" in out[1]
    assert out[2] == {"result": ["notes.txt", "old.txt"]}
    assert [e.name for e in store.events(run_id)] == ["read_file", "list_files"]
    result = replayable.replay(run_id, store=store, fn=with_own_session)
    assert result.status == "identical", result.divergence
    assert result.output == out


def test_outside_a_run_calls_pass_through(files: dict[str, str]) -> None:
    """Without a recording the wrapper is a plain session."""

    async def main() -> str:
        factory = rmcp.stdio(_params(files["script"], files["data"]))
        async with rmcp.connect(factory) as session:
            assert session.connected
            return _text(await session.call_tool("read_file", {"name": "notes.txt"}))

    assert asyncio.run(main()) == "buy milk"
