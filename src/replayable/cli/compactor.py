"""``replayable compactor``: move records from a NATS JetStream stream into the sink store."""

from __future__ import annotations

import logging
import os
import signal
from typing import Annotated, Any

import typer

from replayable.cli._context import stdout
from replayable.errors import ConfigurationError

__all__ = ["register"]


def compactor(
    source: Annotated[
        str,
        typer.Option(
            "--source",
            metavar="URL",
            help="The stream: nats://host:port?stream=NAME (a sink= in it is used when "
            "--sink is not given).",
        ),
    ],
    sink: Annotated[
        str | None,
        typer.Option(
            "--sink", metavar="URL", help="Where records go: postgresql://… or sqlite:///…"
        ),
    ] = None,
    archive: Annotated[
        str | None,
        typer.Option(
            "--archive",
            metavar="URL",
            help="Also archive finished runs to Parquet here (a directory or s3://bucket/prefix), "
            "with `replayable archive`'s writer, once the stream is idle or every --archive-every.",
        ),
    ] = None,
    archive_every: Annotated[
        float, typer.Option(help="Seconds between archive passes while busy.", min=1)
    ] = 60.0,
    archive_after: Annotated[
        str, typer.Option(help="Archive runs started longer ago than this (0s, 12h, 30d).")
    ] = "0s",
    consumer: Annotated[
        str, typer.Option(help="The durable consumer every compactor of the stream shares.")
    ] = "compactor",
    batch: Annotated[
        int,
        typer.Option(
            help="Most messages per fetch (and so per sink write); a message is a frame of "
            "one run's records, or one record in a stream written before frames.",
            min=1,
        ),
    ] = 2048,
    fetch_bytes: Annotated[
        int,
        typer.Option(
            help="Message bytes a fetch aims at: it asks for as many messages as that makes "
            "at the size of the latest ones (at most --batch); the server holds it to 16 "
            "times this.",
            min=1,
        ),
    ] = 4 << 20,
    ack_wait: Annotated[
        float,
        typer.Option(
            help="Seconds a fetched batch may stay unacknowledged before it is delivered to "
            "another compactor (set when the consumer is made).",
            min=0.1,
        ),
    ] = 30.0,
    name: Annotated[
        str | None, typer.Option(help="This compactor's name in `replayable status`.")
    ] = None,
    until_idle: Annotated[
        float | None,
        typer.Option(help="Stop once the stream was empty this many seconds (default: never)."),
    ] = None,
) -> None:
    """Write the records published to a stream into the sink, and acknowledge them once
    committed. Run several on one stream to share the work; stop with Ctrl-C or SIGTERM."""
    from replayable.archive.parquet import parse_age
    from replayable.archive.stream import Compactor

    if sink is None and "sink=" not in source:
        raise ConfigurationError("name the sink: --sink postgresql://… (or &sink= in --source)")
    if sink is not None and "sink=" in source:
        source = source.split("sink=", 1)[0].rstrip("&?")
    if archive is not None and "://" not in archive:
        archive = os.path.abspath(archive)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    work = Compactor(
        source if sink is None else f"{source}{'&' if '?' in source else '?'}sink={sink}",
        consumer=consumer,
        batch=batch,
        fetch_bytes=fetch_bytes,
        ack_wait=ack_wait,
        name=name,
        archive=archive,
        archive_every=archive_every,
        archive_after=parse_age(archive_after),
    )
    stopping: list[int] = []

    def _stop(signum: int, _frame: Any) -> None:
        stopping.append(signum)

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        report = work.run(until_idle=until_idle, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        report = work.report
    finally:
        signal.signal(signal.SIGTERM, previous)
    stdout().print(
        f"compacted {report.records:,} record(s) in {report.batches:,} batch(es); "
        f"{report.skipped:,} already stored, {report.deferred:,} deferred, "
        f"{report.rejected:,} refused"
        + (
            f"; {report.sealed:,} left in the stream: {report.sealed_error}"
            if report.sealed
            else ""
        )
    )


def register(app: typer.Typer) -> None:
    app.command("compactor")(compactor)
