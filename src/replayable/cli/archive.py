"""``replayable archive``: move old runs' payloads to Parquet (local directory, S3, …)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from replayable.cli._context import state, stdout
from replayable.errors import ConfigurationError

__all__ = ["register"]


def archive(
    ctx: typer.Context,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Archive runs started longer ago than this (30d, 12h); default: the "
            "retention policy's hot_days per workflow.",
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Where: a directory or fsspec URL (s3://bucket/prefix). Default: "
            "$REPLAYABLE_ARCHIVE or [tool.replayable.retention] archive.",
        ),
    ] = None,
    part_runs: Annotated[int, typer.Option(help="Most runs per Parquet file.", min=1)] = 2000,
    keep_hot: Annotated[
        bool, typer.Option("--keep-hot", help="Archive but keep the hot copies of payloads.")
    ] = False,
) -> None:
    """Write finished runs' events and blobs to Parquet, then drop their hot payloads.

    Archived runs still list, show, replay, diff and verify: their payloads are
    fetched from the archive on demand. Safe to interrupt and run again.
    """
    from replayable._pyproject import project_config
    from replayable.archive.parquet import RetentionPolicy, parse_age
    from replayable.archive.parquet import archive as run_archive

    config = project_config()
    policy = RetentionPolicy.from_config(config)
    section = config.get("retention", {})
    dest = to or os.environ.get("REPLAYABLE_ARCHIVE") or section.get("archive")
    if not isinstance(dest, str) or not dest:
        raise ConfigurationError(
            "name the archive: --to DIR or --to s3://bucket/prefix (or set $REPLAYABLE_ARCHIVE, "
            "or archive = '...' under [tool.replayable.retention])"
        )
    if "://" not in dest:
        dest = os.path.abspath(dest)
    age = parse_age(older_than) if older_than is not None else None
    out = stdout()
    report = run_archive(
        state(ctx).store(),
        dest,
        older_than=age,
        policy=policy,
        part_runs=part_runs,
        drop=not keep_hot,
        progress=lambda line: out.print(line, highlight=False),
    )
    out.print(
        f"archived {report.runs} run(s), {report.events} event(s) in {report.parts} part(s) "
        f"({report.resumed} resumed) to {dest} in {report.seconds:.2f}s; "
        f"hot payloads dropped for {report.dropped} event(s)",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("archive")(archive)
