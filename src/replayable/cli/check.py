"""``replayable check``: decision policies over recorded runs.

::

    replayable check 01a2b3 --policy policies:no_low_risk_without_rules
    replayable check --name query_compliance_rules --where 'response empty' --since 30d \\
        --policy policies:no_low_risk_without_rules --json

Exit 0 when every policy passes on every run, 1 when one does not (a violation
or a policy that raised), 2 for a usage error.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import orjson
import typer

from replayable.cli._context import fail, whole_stdout
from replayable.cli.audit import AsUser, Purpose, RoleOpt, reader
from replayable.cli.query import Kind, Meta, Name, Since, Until, Where, Workflow, build_query

__all__ = ["check", "register"]


def check(
    ctx: typer.Context,
    run: Annotated[
        str | None, typer.Argument(help="Run id or prefix (or use the filters).")
    ] = None,
    policies: Annotated[
        list[str] | None,
        typer.Option("--policy", help="module:name of a policy (repeatable).", metavar="SPEC"),
    ] = None,
    workflow: Workflow = None,
    kind: Kind = None,
    name: Name = None,
    since: Since = None,
    until: Until = None,
    meta: Meta = None,
    where: Where = None,
    limit: Annotated[int, typer.Option(help="At most this many runs from the filters.")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
    user: AsUser = None,
    role: RoleOpt = None,
    purpose: Purpose = None,
) -> None:
    """Judge recorded runs by decision policies; each verdict names the policy's version.
    Each run judged is written to the access log (policies read its payloads)."""
    from replayable.audit.policies import find_policy

    if not policies:
        raise fail("check needs at least one --policy module:name")
    filtered = any(v is not None for v in (workflow, kind, name, since, until, meta, where))
    if (run is None) == (not filtered):
        raise fail("check takes a RUN or filters (--where/--query, --name, --since …), not both")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # policies live in the project, as with python -m
    chosen = [find_policy(p) for p in policies]
    audit = reader(ctx, user, role, purpose)
    if run is not None:
        run_ids = [audit.store.resolve(run)]
    else:
        q = build_query(
            workflow=workflow,
            kind=kind,
            name=name,
            since=since,
            until=until,
            meta=meta,
            where=where,
            limit=limit,
        )
        run_ids = [hit.run_id for hit in audit.search(q).hits]
    out = whole_stdout()
    failed = 0
    for run_id in run_ids:
        for result in audit.check(run_id, chosen):
            failed += not result.passed
            if as_json:
                typer.echo(orjson.dumps(result.to_json()).decode())
            else:
                out.print(f"{run_id}  {result}", markup=False)
    if not as_json:
        out.print(
            f"{len(run_ids)} run(s), {len(chosen)} polic{'y' if len(chosen) == 1 else 'ies'}: "
            f"{failed} failed",
            markup=False,
        )
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
