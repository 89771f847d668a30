"""Replaying never re-runs a script's live code: the README tour, recorded with
``python tour.py`` (top-level code, no ``__main__`` guard), replayed from the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from typer.testing import CliRunner

import replayable
from replayable.cli import app
from replayable.errors import EntryImportError
from replayable.store.sqlite import SQLiteStore
from tests.integrations.servers import FakeProvider

ROOT = Path(__file__).resolve().parents[1]


def readme_tour() -> str:
    """The tour's code block, exactly as the README has it."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## A tour", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture
def tour(tmp_path: Path, provider: FakeProvider) -> tuple[Path, str]:
    """tour.py recorded by running it as a script, as the README says; its run id."""
    script = tmp_path / "tour.py"
    script.write_text(readme_tour())
    env = {
        **os.environ,
        "OPENAI_BASE_URL": provider.url + "/v1",
        "OPENAI_API_KEY": "sk-test-not-a-real-key",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    env.pop("REPLAYABLE_STORE", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    store = SQLiteStore(tmp_path / ".replayable" / "runs.db")
    try:
        (run,) = store.list_runs()
    finally:
        store.close()
    assert run.workflow == "research"
    assert run.start.entrypoint == "__main__:research"
    assert run.start.code["file"] == str(script.resolve())
    return script, run.run_id


def count_calls(file: Path, name: str) -> tuple[list[int], Any]:
    """A profile hook counting calls of the function ``name`` defined in ``file``."""
    calls: list[int] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_name == name and Path(code.co_filename) == file:
            calls.append(1)

    return calls, hook


def test_readme_tour_replayed_from_the_cli_runs_nothing_live(
    tour: tuple[Path, str], provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """send_email runs zero times, the model server gets zero requests, the message is
    one clear line, the exit code is 3, and no new run is recorded."""
    script, run_id = tour
    served = len(provider.requests)
    assert served == 1  # the recording's one chat completion
    monkeypatch.chdir(script.parent)
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    calls, hook = count_calls(script.resolve(), "send_email")
    sys.setprofile(hook)
    try:
        result = CliRunner().invoke(app, ["replay", run_id[:8]])
    finally:
        sys.setprofile(None)
    assert calls == []
    assert len(provider.requests) == served
    assert result.exit_code == 3, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    message = lines[0]
    assert "replayable.recording()" in message
    assert f"{script.name}:" in message  # the line of the script that asked
    assert 'if __name__ == "__main__":' in message
    assert "--entry" in message
    store = SQLiteStore(script.parent / ".replayable" / "runs.db")
    try:
        assert [r.run_id for r in store.list_runs()] == [run_id]
    finally:
        store.close()


def test_guarded_script_replays_from_the_cli(
    tour: tuple[Path, str], provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its main code under a __main__ guard, the same script replays identical."""
    script, run_id = tour
    code = script.read_text()
    head, _, tail = code.partition("with replayable.recording(")
    script.write_text(
        head
        + 'if __name__ == "__main__":\n'
        + textwrap.indent("with replayable.recording(" + tail, "    ")
    )
    served = len(provider.requests)
    provider.stop()
    monkeypatch.chdir(script.parent)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    result = CliRunner().invoke(app, ["replay", run_id])
    assert result.exit_code == 0, result.output
    assert "identical" in result.output
    assert len(provider.requests) == served


def test_entry_option_names_the_function(
    tour: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--entry module:function replays an unguarded script's workflow from a module."""
    script, run_id = tour
    code = script.read_text().split("with replayable.recording(", 1)[0]
    (tmp_path / "tour_agent.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    result = CliRunner().invoke(app, ["replay", run_id, "--entry", "tour_agent:research"])
    assert result.exit_code == 0, result.output
    sys.modules.pop("tour_agent", None)


def test_top_level_side_effect_tool_is_refused_even_when_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script whose top level calls a side-effect tool outside any recording, inside
    `try/except Exception`: the tool does not run when replay imports the script."""
    marker = tmp_path / "sent"
    script = tmp_path / "mailer.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import pathlib
            import replayable

            @replayable.tool(side_effect=True)
            def send(to):
                pathlib.Path({str(marker)!r}).write_text(to)

            @replayable.workflow("mailer")
            def mailer(to):
                send(to)
                return "sent"

            try:
                send("boss@example.com")
            except Exception:
                pass
            with replayable.recording():
                mailer("all@example.com")
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("REPLAYABLE_STORE", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    marker.unlink()
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore(tmp_path / ".replayable" / "runs.db")
    try:
        (run,) = store.list_runs()
        with pytest.raises(EntryImportError) as info:
            replayable.replay(run.run_id, store=store)
    finally:
        store.close()
    assert not marker.exists()
    assert "the side-effect tool 'send'" in str(info.value)
    assert f"{script.resolve()}:" in str(info.value)


def test_top_level_sdk_call_outside_a_recording_reaches_no_server(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that calls the model at its top level (no recording) sends nothing when
    replay loads it: the HTTP call meets the guard, not the network."""
    script = tmp_path / "warmup.py"
    script.write_text(
        textwrap.dedent(
            """
            import replayable
            from openai import OpenAI

            @replayable.workflow("warm")
            def warm() -> str:
                return "ok"

            try:
                OpenAI(max_retries=0).chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "warm up"}]
                )
            except Exception:
                pass
            with replayable.recording():
                warm()
            """
        )
    )
    env = {
        **os.environ,
        "OPENAI_BASE_URL": provider.url + "/v1",
        "OPENAI_API_KEY": "sk-test-not-a-real-key",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    env.pop("REPLAYABLE_STORE", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    served = len(provider.requests)
    assert served == 1  # the live warm-up call while recording the script
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    result = CliRunner().invoke(app, ["replay", "--entry", "warmup:warm", _only_run(tmp_path)])
    assert result.exit_code == 3, result.output
    assert len(provider.requests) == served
    assert "openai" in result.output.lower() or "llm" in result.output
    sys.modules.pop("warmup", None)


def _only_run(folder: Path) -> str:
    store = SQLiteStore(folder / ".replayable" / "runs.db")
    try:
        (run,) = store.list_runs()
        return run.run_id
    finally:
        store.close()


def test_entry_module_that_fails_to_import_is_one_line_exit_3(
    sqlite_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry module raising at import: one line naming the error, exit code 3."""
    (tmp_path / "broken_agent.py").write_text(
        "import replayable\n\n@replayable.workflow\ndef go():\n    return 1\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = SQLiteStore(sqlite_path)
    import broken_agent

    with replayable.recording(store) as rec:
        broken_agent.go()
    store.close()
    sys.modules.pop("broken_agent")
    (tmp_path / "broken_agent.py").write_text(
        "import replayable\nraise RuntimeError('config file missing')\n"
    )
    result = CliRunner().invoke(
        app, ["--store", f"sqlite:///{sqlite_path}", "replay", rec.run_ids[0]]
    )
    assert result.exit_code == 3, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "RuntimeError: config file missing" in lines[0]
    (tmp_path / "broken_agent.py").unlink()
    result = CliRunner().invoke(
        app, ["--store", f"sqlite:///{sqlite_path}", "replay", rec.run_ids[0]]
    )
    assert result.exit_code == 3, result.output
    assert "broken_agent" in result.output


def test_interactive_session_replays_its_own_workflow(tmp_path: Path) -> None:
    """Code fed on stdin (as in the REPL) records and replays its own workflow by name."""
    code = textwrap.dedent(
        """
        import replayable
        from replayable.store import MemoryStore

        @replayable.tool
        def fetch(x):
            return {"b": x, "a": 1}

        @replayable.workflow
        def agent(x):
            return fetch(x)

        store = MemoryStore()
        with replayable.recording(store) as rec:
            agent(2)
        result = replayable.replay(rec.run_ids[0], store=store)
        print(result.status, list(result.output))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-"], input=code, cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["identical", "['b',", "'a']"]
