"""Stepping through a replay from Python and through a command stream."""

from __future__ import annotations

import io

import pytest

import replayable
from replayable.replay.stepper import Stepper, StepperShell
from tests import agents_replay as agents


@pytest.fixture
def recorded(tmp_path):
    store = replayable.open_store(f"sqlite:///{tmp_path}/s.db")
    with replayable.recording(store) as rec:
        agents.research("llamas")
    agents.CALLS.clear()
    yield store, rec.run_ids[0]
    store.close()


def test_stepper_serves_one_event_at_a_time(recorded):
    """next() moves one boundary; the paused frame's locals show what the agent holds."""
    store, run_id = recorded
    stepper = Stepper(run_id, store=store)
    first = stepper.start()
    assert first.event.seq == 1
    assert "hits" not in stepper.locals()
    second = stepper.next()
    assert second.event.seq == 2
    assert "llamas #0" in stepper.locals()["hits"]
    assert stepper.eval("len(hits)") == "3"
    assert stepper.eval("hits[0]['title'].upper()") == "'LLAMAS #0'"
    assert [f.function for f in stepper.where()] == ["research"]
    assert stepper.cont() is None
    assert stepper.result.status == "identical"
    assert agents.CALLS == []


def test_breakpoints_by_kind_name_and_step(recorded):
    """continue stops only at matching events."""
    store, run_id = recorded
    stepper = Stepper(run_id, store=store)
    stepper.break_on(kind="random")
    stepper.break_on(name="send_email")
    assert stepper.start(stop_at_start=False).event.name == "randint"
    assert stepper.cont().event.name == "send_email"
    assert stepper.cont() is None
    assert stepper.result.status == "identical"


def test_quit_stops_the_replay(recorded):
    """quit() ends the worker; the result is a paused replay."""
    store, run_id = recorded
    stepper = Stepper(run_id, store=store)
    stepper.start()
    stepper.next()
    result = stepper.quit()
    assert result.status == "paused"
    assert result.paused.event.seq == 2
    assert stepper.finished


def test_shell_driven_through_a_pipe(recorded):
    """The shell reads commands from a stream: next, print, locals, show, break, where, quit."""
    store, run_id = recorded
    commands = (
        "\n".join(
            [
                "next",
                "print hits[1]['title']",
                "locals",
                "show",
                "break name=send_email",
                "continue",
                "where",
                "print 1/0",
                "bogus",
                "quit",
            ]
        )
        + "\n"
    )
    out = io.StringIO()
    result = StepperShell(Stepper(run_id, store=store), io.StringIO(commands), out).run()
    text = out.getvalue()
    assert "step 1: tool search" in text
    assert "step 2: tool fetch" in text
    assert "'llamas #1'" in text
    assert "topic = 'llamas'" in text
    assert '"url": "https://example.test/llamas"' in text
    assert "breakpoint: name=send_email" in text
    assert "step 6: tool send_email" in text
    assert "#0 research at" in text
    assert "error: ZeroDivisionError" in text
    assert "unknown command 'bogus'" in text
    assert result.status == "paused"


def test_shell_runs_to_the_end_on_continue(recorded):
    """With no breakpoints, continue finishes and the shell reports the status."""
    store, run_id = recorded
    out = io.StringIO()
    result = StepperShell(Stepper(run_id, store=store), io.StringIO("continue\n"), out).run()
    assert result.status == "identical"
    assert "replay finished: identical (6 events served)" in out.getvalue()
