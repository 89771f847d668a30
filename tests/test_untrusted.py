"""A stored record is data, never a command: forged entrypoints and forged class names
are refused before anything is imported or run (a marker file proves nothing ran)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from typer.testing import CliRunner

import replayable
from replayable import allowlist
from replayable.cli import app
from replayable.errors import UntrustedRecordError
from replayable.events.codec import decode_error, decode_value
from replayable.events.ids import uuid7
from replayable.events.model import Event
from replayable.store import EventStore
from replayable.store.sqlite import SQLiteStore


@replayable.tool
def lookup(item: str) -> Any:
    return {"item": item}


@replayable.workflow
def honest(item: str) -> Any:
    return lookup(item)


def plain_function(item: str) -> str:
    """Importable, in an allowed module, but not a workflow."""
    return item


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder outside the project on sys.path, holding modules with import-time side
    effects: importing one writes its marker file."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    marker = tmp_path / "pwned"
    for name in ("evil_entry", "evil_types"):
        (folder / f"{name}.py").write_text(
            textwrap.dedent(
                f"""
                import dataclasses, enum, pathlib
                pathlib.Path({str(marker)!r}).write_text("imported")
                import replayable

                @replayable.workflow("honest")
                def main(*args, **kwargs):
                    pathlib.Path({str(marker)!r}).write_text("ran")

                @dataclasses.dataclass
                class Thing:
                    x: int

                class Color(enum.Enum):
                    RED = 1

                class Boom(Exception):
                    pass
                """
            )
        )
    monkeypatch.syspath_prepend(str(folder))
    yield marker
    for name in ("evil_entry", "evil_types"):
        sys.modules.pop(name, None)


def record(store: EventStore) -> str:
    with replayable.recording(store) as rec:
        honest("book")
    return rec.run_ids[0]


def forge(
    store: EventStore,
    source: str,
    *,
    entrypoint: str | None = None,
    workflow: str | None = None,
    args: list[Any] | None = None,
    response: Any = None,
    error: Any = None,
) -> str:
    """A copy of run ``source`` with the fields an attacker with write access chose."""
    run = store.get_run(source)
    run_id = uuid7(1_700_000_000_000, os.urandom(10))
    start = msgspec.structs.replace(
        run.start,
        run_id=run_id,
        root_run_id=run_id,
        entrypoint=entrypoint or run.start.entrypoint,
        workflow=workflow or run.start.workflow,
        input=run.start.input
        if args is None
        else orjson.dumps({"args": args, "kwargs": {}}).decode(),
    )
    events: list[Event] = []
    for ev in store.events(source):
        changes: dict[str, Any] = {"run_id": run_id}
        if response is not None:
            changes.update(response=orjson.dumps(response).decode(), encoding="tagged")
        if error is not None:
            changes.update(response=None, error=orjson.dumps(error).decode())
        events.append(msgspec.structs.replace(ev, **changes))
    store.append([start], events, [])
    return run_id


@pytest.mark.parametrize(
    "entrypoint", ["os:system", "subprocess:run", "builtins:eval", "pickle:loads", "posix:system"]
)
def test_forged_stdlib_entrypoint_is_refused(
    sqlite_store: SQLiteStore, tmp_path: Path, entrypoint: str
) -> None:
    """A run whose entrypoint names a stdlib function is refused; nothing runs."""
    marker = tmp_path / "pwned-by-command"
    forged = forge(
        sqlite_store, record(sqlite_store), entrypoint=entrypoint, args=[f"touch {marker}"]
    )
    with pytest.raises(UntrustedRecordError) as info:
        replayable.replay(forged, store=sqlite_store)
    assert not marker.exists()
    assert info.value.run_id == forged
    assert entrypoint in str(info.value)
    assert "standard library" in str(info.value) or "not a function decorated" in str(info.value)


def test_forged_entrypoint_outside_the_project_is_not_imported(
    sqlite_store: SQLiteStore, outside: Path
) -> None:
    """An entrypoint in a module outside the project (with import-time side effects, and
    even a matching @workflow name) is refused before it is imported."""
    forged = forge(sqlite_store, record(sqlite_store), entrypoint="evil_entry:main")
    with pytest.raises(UntrustedRecordError) as info:
        replayable.replay(forged, store=sqlite_store)
    assert not outside.exists()
    assert "evil_entry" not in sys.modules
    assert "outside this project" in str(info.value)


def test_entrypoint_must_be_the_recorded_workflow(sqlite_store: SQLiteStore) -> None:
    """An allowed module's plain function, or another workflow, is not called."""
    source = record(sqlite_store)
    not_workflow = forge(sqlite_store, source, entrypoint=f"{__name__}:plain_function")
    with pytest.raises(UntrustedRecordError, match="not a function decorated"):
        replayable.replay(not_workflow, store=sqlite_store)
    other = forge(
        sqlite_store,
        source,
        entrypoint=f"{__name__}:honest",
        workflow="transfer_funds",
    )
    with pytest.raises(UntrustedRecordError, match="recorded workflow 'transfer_funds'"):
        replayable.replay(other, store=sqlite_store)
    dunder = forge(sqlite_store, source, entrypoint=f"{__name__}:honest.__globals__")
    with pytest.raises(UntrustedRecordError, match="not a module:function"):
        replayable.replay(dunder, store=sqlite_store)


def test_configured_entrypoints_replace_the_project_default(
    sqlite_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[tool.replayable] entrypoints names the modules replay may import."""
    run_id = record(sqlite_store)
    allowlist.configure(["myagents.*"])
    try:
        with pytest.raises(UntrustedRecordError, match=r"not in \[tool\.replayable\] entrypoints"):
            replayable.replay(run_id, store=sqlite_store)
        allowlist.configure(["tests.*"])
        assert replayable.replay(run_id, store=sqlite_store).status == "identical"
    finally:
        allowlist.configure(None)
    monkeypatch.setenv("REPLAYABLE_ENTRYPOINTS", "other.*")
    with pytest.raises(UntrustedRecordError):
        replayable.replay(run_id, store=sqlite_store)


@pytest.mark.parametrize(
    ("tree", "what"),
    [
        ({"$t": "dataclass", "cls": "evil_types:Thing", "v": {"x": 1}}, "outside this project"),
        ({"$t": "enum", "cls": "evil_types:Color", "name": "RED"}, "outside this project"),
        ({"$t": "enum", "cls": "os:system", "name": "x"}, "is not an enum"),
        ({"$t": "namedtuple", "cls": "builtins:eval", "v": ["1"]}, "is not a named tuple"),
        ({"$t": "pydantic", "cls": "pickle:loads", "v": {}}, "pickle"),
        ({"$t": "dataclass", "cls": "subprocess:run", "v": {}}, "subprocess"),
        ({"$t": "enum", "cls": "tests.test_untrusted:honest.__globals__", "name": "x"}, "plain"),
    ],
    ids=[
        "outside-dataclass",
        "outside-enum",
        "os-system",
        "eval",
        "pickle",
        "subprocess",
        "dunder",
    ],
)
def test_forged_class_names_are_refused(outside: Path, tree: Any, what: str) -> None:
    """Decoding refuses classes outside the allowlist, or of the wrong kind, unimported."""
    with pytest.raises(UntrustedRecordError) as info:
        decode_value(orjson.dumps({"ok": [tree]}), "tagged")
    assert what in str(info.value)
    assert not outside.exists()
    assert "evil_types" not in sys.modules


def test_forged_value_in_a_tape_is_refused_before_the_agent_runs(
    sqlite_store: SQLiteStore, outside: Path
) -> None:
    """A tape naming a forbidden class stops the replay up front, naming run, step, type."""
    ran: list[str] = []

    @replayable.workflow("honest")
    def agent(item: str) -> Any:
        ran.append(item)
        return lookup(item)

    forged = forge(
        sqlite_store,
        record(sqlite_store),
        response={"$t": "dataclass", "cls": "evil_types:Thing", "v": {"x": 1}},
    )
    with pytest.raises(UntrustedRecordError) as info:
        replayable.replay(forged, store=sqlite_store, fn=agent)
    assert (info.value.run_id, info.value.step) == (forged, 1)
    assert "evil_types:Thing" in str(info.value)
    assert ran == []
    assert not outside.exists()


def test_forged_exception_type_is_not_imported(outside: Path) -> None:
    """A recorded error naming a class in an unallowed module becomes RecordedError."""
    err = decode_error(orjson.dumps({"type": "evil_types:Boom", "message": "x", "args": None}))
    assert type(err) is replayable.RecordedError
    assert not outside.exists()
    err = decode_error(orjson.dumps({"type": "builtins:eval", "message": "1", "args": ["1"]}))
    assert type(err) is replayable.RecordedError


def test_forged_run_from_the_cli_exits_3_with_one_line(sqlite_path: Path, tmp_path: Path) -> None:
    """`replayable replay` of an os:system run: one line, exit 3, nothing executed."""
    marker = tmp_path / "pwned-from-cli"
    store = SQLiteStore(sqlite_path)
    forged = forge(store, record(store), entrypoint="os:system", args=[f"touch {marker}"])
    store.close()
    result = CliRunner().invoke(app, ["--store", f"sqlite:///{sqlite_path}", "replay", forged])
    assert result.exit_code == 3, result.output
    assert not marker.exists()
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "os:system" in lines[0]
