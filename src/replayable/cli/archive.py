"""``replayable archive``: move old runs' payloads to Parquet (local directory, S3, …);
``replayable archive purge``: delete archived payloads past retention."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from replayable.cli._context import state, stdout
from replayable.errors import ConfigurationError

__all__ = ["register"]


archive_app = typer.Typer(invoke_without_command=True)


def _destination(to: str | None) -> str:
    from replayable._pyproject import project_config

    section = project_config().get("retention", {})
    dest = to or os.environ.get("REPLAYABLE_ARCHIVE") or section.get("archive")
    if not isinstance(dest, str) or not dest:
        raise ConfigurationError(
            "name the archive: --to DIR or --to s3://bucket/prefix (or set $REPLAYABLE_ARCHIVE, "
            "or archive = '...' under [tool.replayable.retention])"
        )
    return dest if "://" in dest else os.path.abspath(dest)


@archive_app.callback()
def archive(
    ctx: typer.Context,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Archive runs started longer ago than this (30d, 12h); default: the "
            "retention policy's hot_days per tenant and workflow.",
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
        bool,
        typer.Option(
            "--keep-hot", help="Archive, but keep the hot copies of the payloads (no drop)."
        ),
    ] = False,
) -> None:
    """Write finished runs' events and blobs to Parquet, then drop their hot payloads.

    Each part's files are read back before its runs are indexed; only then are its
    hot payloads dropped (maintenance: on PostgreSQL the maintenance login), and the
    drop is written to the audit trail. Archived runs still list, show, replay, diff
    and verify: their payloads are fetched from the archive on demand. Safe to
    interrupt and run again. `replayable archive purge` ends retention.
    """
    if ctx.invoked_subcommand is not None:
        return
    from replayable._pyproject import project_config
    from replayable.archive.parquet import RetentionPolicy, parse_age
    from replayable.archive.parquet import archive as run_archive

    policy = RetentionPolicy.from_config(project_config())
    dest = _destination(to)
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
    hot = (
        "hot payloads kept (--keep-hot)"
        if keep_hot
        else f"hot payloads dropped for {report.dropped} event(s)"
        + ("" if report.blobs_kept else f", {report.blobs_dropped} blob(s) deleted")
    )
    out.print(
        f"archived {report.runs} run(s), {report.events} event(s) in {report.parts} part(s) "
        f"({report.resumed} resumed) to {dest} in {report.seconds:.2f}s; {hot}",
        highlight=False,
    )


@archive_app.command("purge")
def purge(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be undone.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say what would be purged.")
    ] = False,
) -> None:
    """Delete archived payloads kept longer than the retention policy's archive_years.

    Removes the archive files of the parts whose every run is past its limit (per
    tenant and workflow, [tool.replayable.retention]); runs, events' metadata and
    hash chains stay and verify, and the payloads read as "purged on DATE by WHO".
    Maintenance only (on PostgreSQL the maintenance login); written to the audit trail.
    """
    from replayable._pyproject import project_config
    from replayable.archive.parquet import RetentionPolicy
    from replayable.archive.purge import purge as run_purge

    if not yes and not dry_run:
        raise ConfigurationError(
            "purging deletes archived payloads past retention and cannot be undone; add --yes "
            "(or --dry-run to see what it would delete)"
        )
    policy = RetentionPolicy.from_config(project_config())
    out = stdout()
    report = run_purge(
        state(ctx).store(),
        policy=policy,
        dry_run=dry_run,
        progress=lambda line: out.print(line, highlight=False),
    )
    verb = "would purge" if dry_run else "purged"
    out.print(
        f"{verb} {report.parts} archive part(s): {report.runs} run(s), {report.events} "
        f"event(s), by {report.by}; {report.waiting} part(s) wait for a run kept longer"
        + (f"; finished {report.finished} interrupted purge(s)" if report.finished else ""),
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(archive_app, name="archive")
