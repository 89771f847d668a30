"""The writer process: same records as the in-process writer, without sharing its lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayable
from replayable.capture.config import settings
from replayable.capture.procwriter import ProcessWriter
from replayable.capture.writer import writer_for
from tests import agents_replay as agents


@pytest.fixture
def process_writer() -> Iterator[None]:
    before = settings.writer
    replayable.configure(writer="process")
    yield
    settings.writer = before


def test_records_replays_and_verifies_through_the_writer_process(
    process_writer: None, tmp_path: Path
) -> None:
    """A run recorded through the child process is complete, chained and replays."""
    store = replayable.open_store(f"sqlite:///{tmp_path}/p.db")
    try:
        assert isinstance(writer_for(store), ProcessWriter)
        with replayable.recording(store) as rec:
            out = agents.research("llamas")
        run_id = rec.run_ids[0]
        assert store.get_run(run_id).status == "completed"
        assert [e.name for e in store.events(run_id)] == [
            "search",
            "fetch",
            "time",
            "uuid4",
            "randint",
            "send_email",
        ]
        assert replayable.verify_run(store, run_id).ok
        result = replayable.replay(run_id, store=store)
        assert result.status == "identical"
        assert result.output == out
    finally:
        store.close()


def test_durable_events_are_committed_before_the_boundary_returns(
    process_writer: None, tmp_path: Path
) -> None:
    """In durable mode another connection sees each event as soon as the call returns."""
    url = f"sqlite:///{tmp_path}/d.db"
    store = replayable.open_store(url)
    reader = replayable.open_store(url)
    seen: list[int] = []

    @replayable.workflow("durable_pw")
    def durable_pw() -> None:
        for i in range(3):
            agents.fetch(f"u{i}")
            seen.append(len(reader.events(reader.list_runs()[0].run_id)))

    try:
        with replayable.recording(store, durability="durable"):
            durable_pw()
        assert seen == [1, 2, 3]
    finally:
        reader.close()
        store.close()


def test_settings_reject_an_unknown_writer() -> None:
    """configure(writer=...) accepts only 'thread' or 'process'."""
    with pytest.raises(replayable.ConfigurationError, match="writer"):
        replayable.configure(writer="fork")


def test_buffered_events_survive_sigkill_of_the_agent(tmp_path: Path) -> None:
    """Killing the agent's process leaves the child to commit what it had received."""
    db = tmp_path / "k.db"
    script = textwrap.dedent(f"""
        import os, sys, time
        os.environ["REPLAYABLE_WRITER"] = "process"
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        import replayable
        from tests import agents_replay as agents

        @replayable.workflow("killed")
        def killed():
            for i in range(200):
                agents.fetch(f"u{{i}}")
            print("DONE", flush=True)
            time.sleep(60)

        with replayable.recording("sqlite:///{db}"):
            killed()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "DONE"
    time.sleep(0.3)  # the forwarder hands the last batch to the child
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    store = replayable.open_store(f"sqlite:///{db}")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            runs = store.list_runs()
            if runs and len(store.events(runs[0].run_id)) == 200:
                break
            time.sleep(0.1)
        (run,) = store.list_runs()
        assert run.status == "incomplete"
        assert len(store.events(run.run_id)) == 200
        assert replayable.verify_run(store, run.run_id).ok
    finally:
        store.close()


def test_a_dead_writer_process_falls_back_to_writing_in_process(
    process_writer: None, tmp_path: Path
) -> None:
    """If the child dies, later records are written in-process and nothing after is lost."""
    store = replayable.open_store(f"sqlite:///{tmp_path}/f.db")
    try:
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        writer._proc.kill()
        writer._proc.wait()
        deadline = time.monotonic() + 5
        while writer._fallback is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert writer._fallback is not None, "the acknowledgement reader saw the child end"
        with replayable.recording(store) as rec:
            agents.research("after")
        run_id = rec.run_ids[0]
        assert store.get_run(run_id).status == "completed"
        assert replayable.verify_run(store, run_id).ok
    finally:
        store.close()
