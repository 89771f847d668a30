"""A small MCP server over stdio: files in one directory, read and deleted by tools.

``python server.py <directory>`` serves ``list_files``, ``read_file`` and
``delete_file`` (which really deletes, so a replay that ran it would show).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
app = MCPServer("files")


def _path(name: str) -> Path:
    path = (ROOT / name).resolve()
    if path.parent != ROOT or not path.is_file():
        raise ToolError(f"no file {name!r} in the served directory")
    return path


@app.tool()
def list_files() -> list[str]:
    """The names of the files in the directory."""
    return sorted(p.name for p in ROOT.iterdir() if p.is_file())


@app.tool()
def read_file(name: str) -> str:
    """The text of one file."""
    return _path(name).read_text()


@app.tool()
def delete_file(name: str) -> str:
    """Delete one file (a side effect)."""
    _path(name).unlink()
    return f"deleted {name}"


if __name__ == "__main__":
    app.run("stdio")
