"""``replayable status``: whether each store's writer can store, and what waits for it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from replayable.cli._context import piped, whole_stdout

__all__ = ["register", "status"]


def _ago(at: float | None) -> str:
    if at is None:
        return "never"
    seconds = max(0.0, time.time() - at)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def status(
    spool_dir: Annotated[
        Path | None,
        typer.Option(
            "--spool-dir",
            help="The writers' spool directory (default $REPLAYABLE_SPOOL_DIR or "
            "./.replayable/spool).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Each store's writer: up or down, records waiting in its spool, last error, last commit.

    Exits 1 when a store cannot take records now or records wait for it.
    """
    from replayable.capture.writer.core import default_spool_dir
    from replayable.capture.writer.status import read_statuses

    directory = (spool_dir or default_spool_dir()).absolute()
    rows: list[dict[str, Any]] = []
    for found, spool in read_statuses(directory):
        rows.append(
            {
                "store": found.url if found else f"(unknown store {spool['key']})",
                "state": ("up" if found.up else "down") if found else "unknown",
                "pending_spool_files": spool["files"],
                "pending_spool_bytes": spool["bytes"],
                "rejected_bytes": spool["rejected"],
                "last_error": found.last_error if found else None,
                "last_error_at": found.last_error_at if found else None,
                "last_commit_at": found.last_commit_at if found else None,
                "writer_pid": found.pid if found else None,
            }
        )
    trouble = any(r["state"] != "up" or r["pending_spool_files"] for r in rows)
    out = whole_stdout()
    if as_json:
        out.print(json.dumps({"spool_dir": str(directory), "stores": rows}, indent=2))
    elif not rows:
        out.print(f"no writer has reported in {directory}")
    else:
        table = Table(title=None if piped() else f"writers ({directory})", box=None)
        for column in ("store", "state", "pending spool", "last error", "last commit"):
            table.add_column(column, overflow="fold")
        for r in rows:
            pending = (
                f"{r['pending_spool_files']} file(s), {r['pending_spool_bytes']:,} bytes"
                if r["pending_spool_files"]
                else "none"
            )
            error = r["last_error"] or ""
            if error:
                error = f"{error} ({_ago(r['last_error_at'])})"
            table.add_row(r["store"], r["state"], pending, error, _ago(r["last_commit_at"]))
        out.print(table)
    if trouble:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
