"""``replayable status``: whether each store's writer can store, and what waits for it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from replayable.cli._context import piped, state, whole_stdout

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
    ctx: typer.Context,
    spool_dir: Annotated[
        Path | None,
        typer.Option(
            "--spool-dir",
            help="The writers' spool directory (default $REPLAYABLE_SPOOL_DIR or "
            "./.replayable/spool).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    streams: Annotated[
        list[str] | None,
        typer.Option(
            "--stream",
            metavar="URL",
            help="A JetStream ingest stream (nats://host:port?stream=NAME) to report: its "
            "depth, its compactors' lag and oldest unacknowledged record. The store, when "
            "it is a nats:// one, is reported without it.",
        ),
    ] = None,
) -> None:
    """Each store's writer: up or down, records waiting in its spool, last error, last commit;
    and each ingest stream: records not compacted yet, lag, and each compactor's work.

    Exits 1 when a store or stream cannot take records now or records wait in a spool.
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
    urls = list(streams or [])
    named = state(ctx).store_url or os.environ.get("REPLAYABLE_STORE") or ""
    if named.startswith("nats://") and not urls:
        urls.append(named)
    found_streams = [_stream_row(url) for url in urls]
    trouble = trouble or any(s.get("error") for s in found_streams)
    out = whole_stdout()
    if as_json:
        body: dict[str, Any] = {"spool_dir": str(directory), "stores": rows}
        if urls:
            body["streams"] = found_streams
        out.print(json.dumps(body, indent=2))
        if trouble:
            raise typer.Exit(1)
        return
    if not rows:
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
    for one in found_streams:
        _print_stream(out, one)
    if trouble:
        raise typer.Exit(1)


def _stream_row(url: str) -> dict[str, Any]:
    from replayable.archive.stream import stream_state
    from replayable.errors import ReplayableError
    from replayable.store.lazy import shown_url

    try:
        return stream_state(url)
    except (ReplayableError, OSError, TimeoutError) as exc:
        return {"stream": shown_url(url), "error": str(exc) or repr(exc)}
    except Exception as exc:  # the client's own errors (no server, no route)
        return {"stream": shown_url(url), "error": f"{type(exc).__name__}: {exc}"}


def _age(at: float | None) -> str:
    if at is None:
        return "-"
    seconds = max(0.0, time.time() - at)
    return f"{seconds:.1f}s" if seconds < 90 else _ago(at).removesuffix(" ago")


def _print_stream(out: Any, found: dict[str, Any]) -> None:
    if found.get("error"):
        out.print(f"stream {found['stream']}: cannot be read: {found['error']}")
        return
    lag = "no compactor has run" if found["lag"] is None else f"{found['lag']:,} not delivered"
    unacked = found["unacknowledged"]
    out.print(
        f"stream {found['stream']} on {found['server']}: {found['depth']:,} message(s) "
        f"({found['bytes']:,} bytes) not compacted, oldest {_age(found['oldest_at'])}; "
        f"consumer {found['consumer']}: {lag}"
        + ("" if unacked is None else f", {unacked:,} delivered and not acknowledged")
    )
    compactors = found["compactors"]
    if not compactors:
        out.print("  no compactor is reporting")
        return
    table = Table(box=None)
    for column in ("compactor", "pid", "records", "in flight", "oldest in flight", "last commit",
                   "last error"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for c in compactors:
        table.add_row(
            str(c.get("name")),
            str(c.get("pid")),
            f"{c.get('records', 0):,}",
            f"{c.get('in_flight', 0):,}",
            _age(c.get("oldest_in_flight")),
            _ago(c.get("last_commit_at")),
            str(c.get("last_error") or c.get("sealed_error") or ""),
        )
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
