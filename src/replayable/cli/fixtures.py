"""``replayable export`` and ``replayable import``: runs to fixture files and back.

::

    replayable export 01a2b3 --sanitize default -o tests/incidents/gb-sct.replay
    replayable export 01a2b3 --tree --sanitize rules.toml -o incident.replay
    replayable import tests/incidents/gb-sct.replay --store sqlite:///runs.db
    replayable export --otlp http://127.0.0.1:4318 --since 1h
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from replayable.cli._context import fail, state, stdout

__all__ = ["export", "import_", "register"]


def export(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Run id or unique prefix.")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="The fixture file to write.")
    ] = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="The whole run tree, from its root run.")
    ] = False,
    sanitize: Annotated[
        str | None,
        typer.Option(
            "--sanitize",
            metavar="RULES",
            help="Replace personal data first: 'default' (emails, phones, IBANs, cards, "
            "national ids) or a rules file (.json/.toml).",
        ),
    ] = None,
    otlp: Annotated[
        str | None,
        typer.Option(
            "--otlp",
            metavar="URL",
            help="Send as OpenTelemetry traces to this OTLP/HTTP receiver "
            "(e.g. http://127.0.0.1:4318) instead of writing a file.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="With --otlp: every run started since (1h, 30d, a date)."),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", help="With --otlp: keep sending runs as they are recorded."),
    ] = False,
    service: Annotated[
        str, typer.Option(help="With --otlp: the traces' service.name.")
    ] = "replayable",
) -> None:
    """Write a run (and its child runs) to one self-contained fixture file, or send runs
    to an OpenTelemetry receiver with --otlp."""
    if otlp is not None:
        if output is not None or sanitize is not None or tree:
            raise fail(
                "--otlp sends what the store holds (redacted); -o, --sanitize and "
                "--tree are for fixture files"
            )
        _export_otlp(ctx, run, otlp, since, follow, service)
        return
    if since is not None or follow:
        raise fail("--since and --follow go with --otlp; a fixture holds one run tree")
    if run is None or output is None:
        raise fail("export needs a RUN and -o FILE (or --otlp URL)")
    from replayable.testing.fixture import export_fixture
    from replayable.testing.sanitize import SanitizeRules

    rules = SanitizeRules.load(sanitize) if sanitize is not None else None
    fx = export_fixture(state(ctx).store(), run, output, tree=tree, sanitize=rules)
    out = stdout()
    out.print(
        f"wrote {output}: {len(fx.starts)} run(s), {len(fx.events)} events, root {fx.root}",
        markup=False,
    )
    if fx.manifest is not None:
        by_rule = fx.manifest["by_rule"]
        summary = ", ".join(f"{r} {v['replaced']}" for r, v in by_rule.items()) or "nothing found"
        out.print(f"sanitized: {fx.manifest['replaced']} replacement(s) ({summary})", markup=False)


def _export_otlp(
    ctx: typer.Context, run: str | None, url: str, since: str | None, follow: bool, service: str
) -> None:
    from replayable.cli.query import parse_time
    from replayable.store.base import RunFilter

    try:
        from replayable.integrations.otel import Follower, export_runs
    except ImportError as exc:
        raise fail(
            f"--otlp needs OpenTelemetry ({exc.name} is missing): pip install 'replayable[otel]'"
        ) from None
    store = state(ctx).store()
    now = time.time()
    if follow:
        if run is not None:
            raise fail("--follow sends runs as they are recorded; it takes --since, not a RUN")
        start = parse_time(since, "--since", now) if since is not None else now
        follower = Follower(store, url, since=start, service=service).start()
        stdout().print(f"sending runs to {url} as they are recorded; Ctrl-C to stop", markup=False)
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            follower.stop()
        stdout().print(f"sent {follower.spans_sent} spans", markup=False)
        return
    if (run is None) == (since is None):
        raise fail("--otlp takes a RUN or --since, one of the two")
    if run is not None:
        runs = [store.run(run)]
    else:
        assert since is not None
        runs = store.list_runs(RunFilter(since=parse_time(since, "--since", now), limit=None))
    sent = export_runs(store, runs, url, service=service)
    stdout().print(f"sent {sent.runs} run(s), {sent.spans} spans to {url}", markup=False)


def import_(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A fixture file written by export.")],
) -> None:
    """Load a fixture's runs into the store (runs already there identically are skipped)."""
    from replayable.store import open_store
    from replayable.testing.fixture import import_fixture

    store = open_store(state(ctx).store_url)
    try:
        fx = import_fixture(file, store)
    finally:
        store.close()
    stdout().print(
        f"imported {len(fx.starts)} run(s), {len(fx.events)} events from {file}; root {fx.root}",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.command("export")(export)
    app.command("import")(import_)
