"""An agent that tidies a directory through an MCP server, recorded and replayed.

Run it from the repository root: ``python examples/mcp_agent/agent.py``.
It starts ``server.py`` over stdio, records one run (which really deletes a
stale file), then replays the run from the tape with no server at all, and
forks it at the read step: the read runs live again, while ``delete_file``,
marked side-effecting, is answered from the tape instead of deleting twice.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from mcp.client.stdio import StdioServerParameters

import replayable
from replayable.integrations import mcp as rmcp

SERVER = str(Path(__file__).with_name("server.py"))


@replayable.workflow("examples.mcp_agent")
async def tidy(directory: str) -> dict[str, Any]:
    """Read every note; delete the ones marked stale."""
    params = StdioServerParameters(command=sys.executable, args=[SERVER, directory])
    async with rmcp.connect(
        rmcp.stdio(params), side_effects={"delete_file"}, server="files"
    ) as files:
        listing = await files.call_tool("list_files")
        kept, deleted = [], []
        for name in listing.structured_content["result"]:
            text = (await files.call_tool("read_file", {"name": name})).content[0].text
            if "stale" in text:
                await files.call_tool("delete_file", {"name": name})
                deleted.append(name)
            else:
                kept.append(name)
        return {"kept": kept, "deleted": deleted}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "files"
        data.mkdir()
        (data / "plan.txt").write_text("ship the release")
        (data / "old.txt").write_text("stale: last year's plan")
        store = replayable.open_store(f"sqlite:///{Path(tmp) / 'runs.db'}")
        with replayable.recording(store) as rec:
            out = asyncio.run(tidy(str(data)))
        run_id = rec.run_ids[0]
        print("recorded", run_id, out)
        for event in store.events(run_id):
            flag = "  (side effect)" if event.side_effect else ""
            print(f"  {event.seq}. {event.kind} {event.name} {event.request_value()}{flag}")

        result = replayable.replay(run_id, store=store, fn=tidy)
        print("replay:", result.status, result.output)

        (data / "old.txt").write_text("stale: restored")
        forked = replayable.replay(run_id, store=store, fn=tidy, fork_at=2)
        print("fork at step 2:", forked.status, forked.output)
        print("old.txt still there after the fork:", (data / "old.txt").exists())
        store.close()


if __name__ == "__main__":
    main()
