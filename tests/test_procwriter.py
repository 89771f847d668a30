"""The writer process: same records as the in-process writer, without sharing its lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayable
from replayable.capture.config import settings
from replayable.capture.context import active_state
from replayable.capture.writer import ProcessWriter, writer_for
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
        # Every event's link holds; the run, cut short, is named unsealed.
        report = replayable.verify_run(store, run.run_id)
        assert (report.status, report.events_checked) == ("unsealed", 200)
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
        writer._channel.proc.kill()
        writer._channel.proc.wait()
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


def test_a_hand_off_already_under_way_when_the_child_dies_is_kept(
    process_writer: None, tmp_path: Path
) -> None:
    """A thread that entered the writer's hot path before the switch to the in-process
    writer still gets its record stored (it drains the buffer itself)."""
    store = replayable.open_store(f"sqlite:///{tmp_path}/g.db")
    try:
        with replayable.recording(store) as rec:
            agents.research("before")
        run_id = rec.run_ids[0]
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        on_its_way = writer.event  # bound before the child died, as a racing thread holds it
        last = store.events(run_id)[-1]
        writer._channel.proc.kill()
        writer._channel.proc.wait()
        deadline = time.monotonic() + 5
        while writer._fallback is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert writer._fallback is not None
        extra = (
            run_id, last.seq + 1, "tool", "late", "r:99", None, None,
            b'{"x":1}', b"1", False, None, False, time.time(), 5, None,
        )  # fmt: skip
        on_its_way(extra)
        writer.flush()
        assert [e.name for e in store.events(run_id)][-1] == "late"
        assert writer._buf == []
    finally:
        store.close()


def test_stores_share_one_writer_process_and_close_independently(
    process_writer: None, tmp_path: Path
) -> None:
    """Every store of a process goes through one child; closing one leaves the others."""
    first = replayable.open_store(f"sqlite:///{tmp_path}/a.db")
    second = replayable.open_store(f"sqlite:///{tmp_path}/b.db")
    try:
        a, b = writer_for(first), writer_for(second)
        assert isinstance(a, ProcessWriter)
        assert isinstance(b, ProcessWriter)
        assert a._channel is b._channel
        with replayable.recording(first) as rec_a:
            agents.research("alpacas")
        first.close()
        with replayable.recording(second) as rec_b:
            agents.research("vicunas")
        assert a._channel.proc.poll() is None, "the child outlives the first store"
        assert len(second.events(rec_b.run_ids[0])) == 6
        assert replayable.verify_run(second, rec_b.run_ids[0]).ok
    finally:
        second.close()
    reopened = replayable.open_store(f"sqlite:///{tmp_path}/a.db")
    try:
        assert reopened.get_run(rec_a.run_ids[0]).status == "completed"
        assert len(reopened.events(rec_a.run_ids[0])) == 6
    finally:
        reopened.close()


def test_a_relative_store_path_is_the_same_file_after_a_change_of_directory(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child opens the file the agent opened, whatever the agent's directory is later."""
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    store = replayable.open_store("sqlite:///runs.db")
    try:
        monkeypatch.chdir(tmp_path / "elsewhere")
        with replayable.recording(store) as rec:
            agents.research("guanacos")
        assert len(store.events(rec.run_ids[0])) == 6
    finally:
        store.close()
    assert (tmp_path / "here" / "runs.db").exists()
    assert not (tmp_path / "elsewhere" / "runs.db").exists()


def test_a_child_far_behind_makes_the_agent_wait_and_loses_nothing(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_QUEUED records waiting, the hot path waits for the forwarder."""
    from replayable.capture.writer import process as procwriter

    monkeypatch.setattr(procwriter, "MAX_QUEUED", 64)
    waits: list[int] = []
    original = ProcessWriter._backpressure

    def counting(self: ProcessWriter) -> None:
        waits.append(len(self._buf))
        original(self)

    monkeypatch.setattr(ProcessWriter, "_backpressure", counting)

    @replayable.workflow("flood")
    def flood(n: int) -> int:
        for i in range(n):
            agents.fetch(f"u{i}")
        return n

    store = replayable.open_store(f"sqlite:///{tmp_path}/q.db")
    try:
        with replayable.recording(store) as rec:
            flood(3000)
        assert waits, "the bound was reached"
        assert all(n >= 64 for n in waits)
        assert [e.seq for e in store.events(rec.run_ids[0])] == list(range(1, 3001))
        assert replayable.verify_run(store, rec.run_ids[0]).ok
    finally:
        store.close()


def test_a_store_with_many_records_waiting_wakes_the_forwarder_early(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WAKE_AT records waiting are sent at once, not at the forwarder's next round."""
    from replayable.capture.writer import channel
    from replayable.capture.writer import process as procwriter

    monkeypatch.setattr(channel, "INTERVAL", 60.0)
    monkeypatch.setattr(procwriter, "WAKE_AT", 16)
    store = replayable.open_store(f"sqlite:///{tmp_path}/w.db")
    seen: list[int] = []

    @replayable.workflow("early")
    def early(n: int) -> int:
        for i in range(n):
            agents.fetch(f"u{i}")
        st = active_state()
        assert st is not None
        assert st.run is not None
        # Buffered records, no flush: only an early wake can have sent them.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen.append(len(store.events(st.run.run_id)))
            if seen[-1] >= 16:
                break
            time.sleep(0.01)
        return n

    try:
        writer_for(store).flush()  # the forwarder now waits with the 60 s interval
        with replayable.recording(store):
            early(40)
        assert seen, "the workflow ran"
        assert seen[-1] >= 16, seen
    finally:
        store.close()
        # The forwarder now waits out a 60 s round: wake it under the usual interval.
        monkeypatch.setattr(channel, "INTERVAL", 0.05)
        channel.current_channel().wake.set()


def test_fail_closed_recordings_use_the_in_process_writer(
    process_writer: None, tmp_path: Path
) -> None:
    """on_store_failure='raise' needs to see an outage at once: it switches to a thread."""
    from replayable.capture.writer import Writer

    store = replayable.open_store(f"sqlite:///{tmp_path}/r.db")
    try:
        with replayable.recording(store) as first:
            agents.research("one")
        assert isinstance(writer_for(store), ProcessWriter)
        with replayable.recording(store, on_store_failure="raise") as second:
            agents.research("two")
        assert isinstance(writer_for(store), Writer)
        for run_id in (*first.run_ids, *second.run_ids):
            assert store.get_run(run_id).status == "completed"
            assert replayable.verify_run(store, run_id).ok
    finally:
        store.close()


def test_an_interpreter_that_cannot_start_python_keeps_the_writer_in_process(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded (uWSGI) or frozen interpreters cannot run ``-m``: the writer stays a thread."""
    from replayable.capture.writer import Writer

    monkeypatch.setattr(sys, "executable", "/usr/bin/uwsgi")
    store = replayable.open_store(f"sqlite:///{tmp_path}/u.db")
    try:
        assert isinstance(writer_for(store), Writer)
        with replayable.recording(store) as rec:
            agents.research("llamas")
        assert store.get_run(rec.run_ids[0]).status == "completed"
    finally:
        store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_records_through_writers_of_its_own(
    process_writer: None, tmp_path: Path
) -> None:
    """After fork the child has none of the parent's writer threads: it starts its own."""
    store = replayable.open_store(f"sqlite:///{tmp_path}/fork.db")
    try:
        with replayable.recording(store) as before:
            agents.research("parent")
        pid = os.fork()
        if pid == 0:  # the child: record with the same store object, then leave at once
            code = 1
            try:
                with replayable.recording(store) as rec:
                    agents.research("child")
                store.close()
                code = 0 if len(rec.run_ids) == 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        runs = {r.run_id: r for r in store.list_runs()}
        assert before.run_ids[0] in runs
        assert len(runs) == 2
        for run_id in runs:
            assert store.get_run(run_id).status == "completed"
            assert replayable.verify_run(store, run_id).ok
        with replayable.recording(store) as after:
            agents.research("parent again")
        assert store.get_run(after.run_ids[0]).status == "completed"
    finally:
        store.close()


def test_a_failing_forwarder_hands_its_records_to_the_in_process_writer(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the forwarding thread must not strand records: the store falls back."""
    from replayable.capture.writer import channel

    def broken(self: object) -> None:
        raise RuntimeError("forwarder bug")

    monkeypatch.setattr(channel.Channel, "_forward_loop", broken)
    monkeypatch.setattr(channel, "_channel", None)  # a new channel, with the bug
    store = replayable.open_store(f"sqlite:///{tmp_path}/b.db")
    try:
        with replayable.recording(store) as rec:
            # Once it is up, a run is the writer process's to store (a run ending
            # before would be stored in-process, not sent).
            assert isinstance(rec.writer, ProcessWriter)
            assert rec.writer._channel.ready.wait(30)
            agents.research("bug")
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        assert writer._fallback is not None
        assert isinstance(writer.last_error, RuntimeError)
        run_id = rec.run_ids[0]
        assert store.get_run(run_id).status == "completed"
        assert len(store.events(run_id)) == 6
        assert replayable.verify_run(store, run_id).ok
        # Told to end, the child exits and is collected.
        writer._channel._acks.join(timeout=10)
        assert writer._channel.proc.returncode == 0
    finally:
        store.close()


def test_runs_in_progress_keep_one_chain_across_the_fall_back(
    process_writer: None, tmp_path: Path
) -> None:
    """When the writer process goes mid-run, the in-process writer continues each run's
    hash chain from what the child committed: the run verifies end to end."""
    store = replayable.open_store(f"sqlite:///{tmp_path}/c.db")

    @replayable.workflow("across")
    def across() -> int:
        for i in range(3):
            agents.fetch(f"before{i}")
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        writer.flush()
        writer._channel._died(RuntimeError("the writer process went away"))
        for i in range(3):
            agents.fetch(f"after{i}")
        return 6

    try:
        with replayable.recording(store) as rec:
            across()
        run_id = rec.run_ids[0]
        assert writer_for(store)._fallback is not None  # type: ignore[union-attr]
        assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4, 5, 6]
        assert [e.chain_index for e in store.events(run_id)] == [0, 1, 2, 3, 4, 5]
        assert store.get_run(run_id).status == "completed"
        assert replayable.verify_run(store, run_id).ok
    finally:
        store.close()


@pytest.mark.parametrize("nice", [0, 7])
def test_the_writer_process_runs_at_lower_priority(tmp_path: Path, nice: int) -> None:
    """The writer process lowers its priority by ``writer_nice`` (default 10)."""
    script = textwrap.dedent(
        f"""
        import os, replayable
        from replayable.capture.writer import channel
        replayable.configure(writer="process", writer_nice={nice})
        store = replayable.open_store("sqlite:///{tmp_path}/n.db")
        with replayable.recording(store):
            pass
        # A recording that stored nothing through it does not wait for it to start.
        assert channel.current_channel().ready.wait(60)
        child = channel.current_channel().proc.pid
        print(os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, child))
        store.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    ours, child = map(int, out.stdout.split())
    assert child == min(19, ours + nice)


def test_writer_nice_is_checked() -> None:
    """A value out of range is refused, naming where it came from; nothing changes."""
    before = settings.writer_nice
    for bad in (25, -1, "high"):
        with pytest.raises(replayable.ConfigurationError, match="writer_nice must be"):
            replayable.configure(writer_nice=bad)  # type: ignore[arg-type]
    assert settings.writer_nice == before
    env = dict(os.environ, REPLAYABLE_WRITER_NICE="x")
    script = "import replayable\nwith replayable.recording('memory://'):\n    pass\n"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "$REPLAYABLE_WRITER_NICE must be a whole number from 0 to 19, not 'x'" in out.stderr


def test_a_niced_writer_runs_at_the_agents_priority_while_a_record_is_late(
    tmp_path: Path,
) -> None:
    """Past the deadline (200 ms) the writer process stops yielding the CPU, then yields again."""
    script = tmp_path / "deadline.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, threading, time
            from replayable.capture.writer._child import keep_deadline

            class W:
                waiting_since = None

            w = W()
            os.nice(10)
            seen = []
            def nice_now():
                return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            t = threading.Thread(target=keep_deadline, args=(lambda: [w], 10),
                                 kwargs={"deadline": 0.2, "tick": 0.02, "rounds": 60})
            t.start()
            time.sleep(0.1)
            seen.append(nice_now())          # nothing waits: still niced
            w.waiting_since = time.monotonic()
            time.sleep(0.1)
            seen.append(nice_now())          # waiting, not late yet
            time.sleep(0.3)
            seen.append(nice_now())          # late: the agent's priority
            w.waiting_since = None
            time.sleep(0.2)
            seen.append(nice_now())          # caught up: niced again
            t.join()
            print(json.dumps(seen))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip())
    if os.geteuid() != 0:
        pytest.skip("lowering a nice value needs root or CAP_SYS_NICE")
    assert seen == [10, 10, 0, 10]


def test_a_niced_writer_runs_at_the_agents_priority_while_the_agent_waits(
    tmp_path: Path,
) -> None:
    """An agent waiting for an answer (a flush, a recording's exit) has nothing else to
    run: the writer process takes the agent's priority until it answers, and yields
    again after, unless a record is late meanwhile (either reason holds it up)."""
    script = tmp_path / "asked.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os
            from replayable.capture.writer._child import Priority

            os.nice(10)
            p = Priority(10)
            seen = [os.getpriority(os.PRIO_PROCESS, 0)]
            p.want("asked", True)
            seen.append(os.getpriority(os.PRIO_PROCESS, 0))   # answering: the agent's
            p.want("late", True)
            p.want("asked", False)
            seen.append(os.getpriority(os.PRIO_PROCESS, 0))   # still late: stays up
            p.want("late", False)
            seen.append(os.getpriority(os.PRIO_PROCESS, 0))   # nothing holds: niced
            print(json.dumps(seen))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip())
    if os.geteuid() != 0:
        pytest.skip("lowering a nice value needs root or CAP_SYS_NICE")
    assert seen == [10, 0, 0, 10]


@pytest.mark.parametrize("ends_before_up", [False, True])
@pytest.mark.parametrize("keyed", [False, True])
def test_a_run_started_before_the_writer_process_is_up_is_stored_at_once(
    process_writer: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keyed: bool,
    ends_before_up: bool,
) -> None:
    """While the writer process has not said it is up, a run's start is stored from the
    agent's process before the first boundary returns; the writer process builds the
    events and the end on it, or, if the run ends before it is up, this process does:
    one start row, a chain (keyed, anchored) that verifies, and a replay that matches."""
    import base64

    from replayable.capture.writer.channel import current_channel

    if keyed:
        key = "k1:" + base64.b64encode(bytes(range(32))).decode()
        monkeypatch.setenv("REPLAYABLE_CHAIN_KEY", key)
        monkeypatch.setenv("REPLAYABLE_ANCHOR", f"file://{tmp_path}/anchor.log")
    store = replayable.open_store(f"sqlite:///{tmp_path}/early.db")
    seen: list[bool] = []

    @replayable.tool
    def early_step(i: int) -> int:
        return i + 1

    @replayable.workflow
    def early_agent(n: int) -> int:
        total = early_step(0)
        st = active_state()
        assert st is not None
        assert st.run is not None
        seen.append(st.run.run_id in {r.run_id for r in store.list_runs()})
        if not ends_before_up:
            channel.ready.set()  # up now (or as if): the run's end goes to it
        return total + sum(early_step(i) for i in range(1, n))

    try:
        with replayable.recording(store) as rec:
            channel = current_channel()
            writer = rec.writer
            assert isinstance(writer, ProcessWriter)
            ready = channel.ready.is_set()
            channel.ready.clear()  # as if the writer process were still starting
            handed = writer._child_runs
            try:
                out = early_agent(5)
            finally:
                if ready:
                    channel.ready.set()
            # Either it stored the run here or the writer process did, never both; here
            # only if none of its records had gone down the pipe (the forwarder's round
            # may come between the run's start and its end).
            assert writer._child_runs - handed in ((0, 1) if ends_before_up else (1,))
        assert seen == [True], "the run was not stored when its first boundary returned"
        run_id = rec.run_ids[0]
        run = store.get_run(run_id)
        assert run.status == "completed"
        assert [e.seq for e in store.events(run_id)] == [1, 2, 3, 4, 5]
        report = replayable.verify_run(store, run_id)
        assert report.ok, report.message
        if keyed:
            assert run.start.chain is not None
            assert ":k1:" in run.start.chain
        assert replayable.replay(run_id, store=store, fn=early_agent).output == out
    finally:
        store.close()


@replayable.tool
def odd_tool(payload: dict[str, object]) -> dict[str, object]:
    return {"echo": payload, "keys": sorted(payload), "size": len(str(payload))}


@replayable.tool
def odd_fails(n: int) -> int:
    raise KeyError(f"no such item: {n} \u2603")


@replayable.workflow("odd_child")
def odd_child(q: str) -> str:
    return str(odd_tool({"q": q})["size"])


@replayable.workflow("odd_agent")
def odd_agent(n: int) -> list[object]:
    out: list[object] = []
    with replayable.span("odd", n=n):
        out.append(odd_tool({"z": 1, "a": [1.5, None, True], "\u00e9t\u00e9": "\U0001f600" * 3}))
        out.append(odd_tool({"big": "x" * 200_000, "nested": {"b": {"c": [{}]}}}))
        try:
            odd_fails(n)
        except KeyError as exc:
            out.append(str(exc))
        out.append(odd_child("sub"))
    if n < 0:
        raise RuntimeError("the agent failed \u2603")
    return out


def _stored(store: replayable.EventStore, run_ids: list[str]) -> list[object]:
    """What was stored for runs (their children too), without what differs by nature
    between two recordings (ids, times, hashes)."""
    ids: dict[str, str] = {}

    def named(text: object) -> object:
        if not isinstance(text, str):
            return text
        for run_id, name in ids.items():
            text = text.replace(run_id, name)
        return text

    found: list[object] = []
    todo = list(run_ids)
    while todo:
        run = store.get_run(todo.pop(0))
        ids.setdefault(run.run_id, f"run{len(ids)}")
        children = [r.run_id for r in store.list_runs() if r.parent_run_id == run.run_id]
        todo += sorted(children, key=lambda c: store.get_run(c).start.parent_seq or 0)
        for c in children:
            ids.setdefault(c, f"run{len(ids)}")
        found.append(
            (
                named(run.run_id),
                run.workflow,
                run.status,
                run.start.input,
                run.end.output if run.end else None,
                named(run.end.error) if run.end else None,
                run.end.event_count if run.end else None,
            )
        )
        for e in store.events(run.run_id):
            found.append(
                (
                    e.seq,
                    e.kind,
                    e.name,
                    e.key,
                    e.parent,
                    e.call_site,
                    named(e.request),
                    e.fingerprint if e.kind != "subrun" else None,
                    named(e.response),
                    e.encoding,
                    named(e.error),
                    e.side_effect,
                    e.chain_index,
                    e.problems,
                )
            )
        assert replayable.verify_run(store, run.run_id).ok
    return found


@pytest.mark.parametrize("n", [3, -1])
def test_a_run_stored_before_the_writer_process_is_up_matches_one_it_stores(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """A run that ends before the writer process is up is stored by the agent's process
    (its start, events and end); the same run stored by the writer process, or by the
    in-process writer, holds the same records: odd payloads, an error, a child run, a
    failed run."""
    from replayable.capture.writer import channel as channel_module
    from replayable.capture.writer.channel import current_channel

    channel = current_channel()
    was_ready = channel.ready.wait(30)
    # No forwarding round between a run's start and its end: only an end, a flush or a
    # full buffer sends records, so the run is taken back whole.
    monkeypatch.setattr(channel_module, "INTERVAL", 3600.0)
    time.sleep(2 * 0.05)  # a round already waiting at the old interval ends

    def record(name: str, how: str) -> list[object]:
        store = replayable.open_store(f"sqlite:///{tmp_path}/{name}.db")
        try:
            if how == "thread":
                replayable.configure(writer="thread")
            try:
                rec = replayable.recording(store)
            finally:
                replayable.configure(writer="process")
            with rec:
                writer = rec.writer
                if how == "early":
                    time.sleep(0.1)  # its settings have gone down the pipe
                    channel.ready.clear()  # as if the writer process were still starting
                try:
                    handed = getattr(writer, "_child_runs", 0)
                    try:
                        odd_agent(n)
                    except RuntimeError:
                        assert n < 0
                    if how == "early":
                        assert writer._child_runs == handed, "the run went down the pipe"
                    elif how == "up":
                        assert writer._child_runs == handed + 2  # the run and its child
                finally:
                    if was_ready:
                        channel.ready.set()
            assert isinstance(writer, ProcessWriter) == (how != "thread")
            return _stored(store, rec.run_ids)
        finally:
            store.close()

    try:
        up = record("up", "up")
        assert len(up) == 2 + 5 + 1  # two runs; a span, three tools, a child run; its tool
        assert record("early", "early") == up
        assert record("thread", "thread") == up
    finally:
        monkeypatch.undo()
        channel.wake.set()  # back to forwarding rounds at the usual interval


@pytest.mark.parametrize("handed", [0, 1])
def test_a_writer_process_given_no_run_is_not_waited_for_at_exit(handed: int) -> None:
    """At exit, a writer process still starting that was given no run to store (each
    was stored here) is stopped, not waited for; one that was given a run is waited for
    until it has committed it and ended by itself."""
    from replayable.capture.writer.channel import Channel

    channel = Channel()
    try:
        channel.runs = handed
        channel.shutdown(timeout=60)
        assert channel.proc.returncode == (-signal.SIGKILL if not handed else 0)
    finally:
        if channel.proc.poll() is None:
            channel.proc.kill()
            channel.proc.wait()


def test_a_script_whose_run_ends_at_once_stores_it_once_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    """A script recording one short run exits with the run stored, complete, once, and
    its writer process ended, whether the run ended before it was up or not."""
    db = tmp_path / "short.db"
    script = textwrap.dedent(f"""
        import os, sys
        os.environ["REPLAYABLE_WRITER"] = "process"
        import replayable
        from replayable.capture.writer import channel

        @replayable.tool
        def add(a: int, b: int) -> int:
            return a + b

        @replayable.workflow("short")
        def short() -> int:
            return add(1, 2)

        for _ in range(2):
            with replayable.recording("sqlite:///{db}"):
                short()
        print(channel.current_channel().proc.pid, flush=True)
    """)
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        with pytest.raises(ProcessLookupError):
            os.kill(int(done.stdout), 0)  # ended and collected
    store = replayable.open_store(f"sqlite:///{db}")
    try:
        runs = store.list_runs()
        assert len(runs) == 6
        assert {r.status for r in runs} == {"completed"}
        for run in runs:
            assert [e.name for e in store.events(run.run_id)] == ["add"]
            assert replayable.verify_run(store, run.run_id).ok
    finally:
        store.close()


def test_the_writer_process_ends_as_the_interpreter_would(tmp_path: Path) -> None:
    """The writer process's quick exit still waits for threads that are not daemons,
    runs the exit handlers (a sink's, a logging handler's) and flushes its output."""
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from replayable.capture.writer import _child

        out = Path({str(tmp_path)!r})

        def late() -> None:
            time.sleep(0.2)
            (out / "thread").write_text("joined")

        atexit.register(lambda: (out / "atexit").write_text("ran"))
        threading.Thread(target=late).start()
        # An idle pool (a KMS plugin's, say): its workers stop only when told at exit.
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(1)
        pool.submit(lambda: (out / "pool").write_text("done")).result()
        sys.stdout.write("buffered, not yet written")
        _child._exit(3)
        (out / "after").write_text("never")
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, not yet written"
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "pool").read_text() == "done"
    assert not (tmp_path / "after").exists()


def test_a_store_removed_after_its_recording_returns_stays_removed(tmp_path: Path) -> None:
    """Once ``recording()`` has returned with every run stored from the agent's process,
    the writer process (still starting, given no run) never opens the store: a script
    that removes the store's folder right after finds it still gone, not recreated
    around the environment snapshot the recording made."""
    folder = tmp_path / ".replayable"
    script = textwrap.dedent(f"""
        import os, shutil, time
        os.environ["REPLAYABLE_WRITER"] = "process"
        import replayable
        from replayable.capture.writer import channel

        @replayable.tool
        def add(a: int, b: int) -> int:
            return a + b

        @replayable.workflow("short")
        def short() -> int:
            return add(1, 2)

        os.makedirs({str(folder)!r})
        with replayable.recording("sqlite:///{folder}/runs.db"):
            short()
        print("taken back" if channel.current_channel().runs == 0 else "sent", flush=True)
        shutil.rmtree({str(folder)!r})
        channel.current_channel().ready.wait(30)  # the writer process is up and has read it all
        time.sleep(0.5)
        print(sorted(os.listdir({str(tmp_path)!r})), flush=True)
    """)
    seen = set()
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        how, listing = done.stdout.splitlines()
        seen.add(how)
        if how == "taken back":
            assert listing == "[]", f"the store was recreated: {listing}"
    assert "taken back" in seen  # the case this test is about happened


def test_a_record_the_writer_process_cannot_build_is_refused_not_fatal(
    process_writer: None, tmp_path: Path
) -> None:
    """A hand-off the writer process cannot turn into a record (a run start whose
    metadata holds a key that is not text, here given past ``recording()``'s check) is
    kept in the rejects file with a warning; the writer process stays up and stores the
    next run. It died on it, and every store it served fell back to writing in-process."""
    import msgspec

    from replayable.capture.writer.spool import rejects_path
    from replayable.events.model import RunStart

    store = replayable.open_store(f"sqlite:///{tmp_path}/r.db")
    spool = tmp_path / "spool"
    try:
        writer = writer_for(store, spool_dir=spool)
        assert isinstance(writer, ProcessWriter)
        writer._channel.ready.wait(30)
        with replayable.recording(store) as rec:
            agents.research("before")
        good = store.get_run(rec.run_ids[0])
        bad = msgspec.structs.replace(good.start, run_id=str(uuid.uuid4()), metadata={1: "a"})
        assert isinstance(bad, RunStart)
        writer.start(bad)
        writer.flush(30)
        # Kept, with the warning the same call gives (on the writer process's stderr,
        # which is whatever the agent's stderr was when it started).
        rejects = rejects_path(spool, store.url)
        deadline = time.monotonic() + 10
        while not rejects.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        kept = rejects.read_text()
        assert bad.run_id in kept
        assert '"1":"a"' in kept
        assert writer._channel.dead is None
        assert writer._fallback is None
        with replayable.recording(store) as rec:
            agents.research("after")
        assert store.get_run(rec.run_ids[0]).status == "completed"
        assert writer._fallback is None
    finally:
        store.close()


@pytest.mark.parametrize("stopped_first", [False, True])
def test_a_writer_process_killed_while_behind_loses_nothing_the_agent_sent(
    process_writer: None, tmp_path: Path, stopped_first: bool
) -> None:
    """Records sent to the writer process stay held in the agent's process until it says
    they are kept; killed while behind (records in the pipe and in its queue), those
    go to the in-process writer, which skips what it had stored: the run holds every
    event, its chain intact. It lost them (a gap of thousands of events in a run read
    "completed", said only by ``verify``)."""
    import signal

    store = replayable.open_store(f"sqlite:///{tmp_path}/k.db")

    @replayable.tool
    def step(i: int) -> dict[str, object]:
        return {"i": i, "body": "y" * 300}

    @replayable.workflow("killed.behind")
    def run(n: int, kill_at: int) -> int:
        for i in range(n):
            step(i)
            if i == kill_at:
                proc = writer._channel.proc
                if stopped_first:
                    os.kill(proc.pid, signal.SIGSTOP)  # it takes nothing more in
                    for j in range(3000):
                        step(-j)
                os.kill(proc.pid, signal.SIGKILL)
        return n

    try:
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        assert writer._channel.ready.wait(30)
        with replayable.recording(store) as rec:
            run(20_000, 12_000)
        assert writer._fallback is not None  # it did die, and the rest went in-process
        run_id = rec.run_ids[0]
        stored = store.events(run_id)
        expected = 20_000 + (3000 if stopped_first else 0)
        assert [e.seq for e in stored] == list(range(1, expected + 1))
        assert store.get_run(run_id).end.event_count == expected  # type: ignore[union-attr]
        assert replayable.verify_run(store, run_id).ok
    finally:
        store.close()


def test_records_the_writer_process_has_kept_are_let_go(
    process_writer: None, tmp_path: Path
) -> None:
    """The agent's process holds sent records only until the writer process says they
    are kept: after a long recording, next to nothing is held."""
    store = replayable.open_store(f"sqlite:///{tmp_path}/h.db")
    try:
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        assert writer._channel.ready.wait(30)
        with replayable.recording(store):
            agents.research("long")
            for _ in range(30):
                agents.research("again")
        assert writer._sent > 30
        deadline = time.monotonic() + 10
        while writer._unkept and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not writer._unkept
    finally:
        store.close()


def test_the_records_held_for_the_writer_process_are_bounded(
    process_writer: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``MAX_UNKEPT_BYTES`` sent and not yet kept, the forwarder sends no more until
    the writer process catches up: the agent's process holds a bounded amount, and the
    recording still stores everything."""
    from replayable.capture.writer import process

    monkeypatch.setattr(process, "MAX_UNKEPT_BYTES", 1)
    store = replayable.open_store(f"sqlite:///{tmp_path}/b.db")
    held: list[int] = []

    @replayable.tool
    def step(i: int) -> int:
        if i % 250 == 0:
            held.append(len(writer._unkept))
        return i

    @replayable.workflow("bounded")
    def run(n: int) -> int:
        for i in range(n):
            step(i)
        return n

    try:
        writer = writer_for(store)
        assert isinstance(writer, ProcessWriter)
        assert writer._channel.ready.wait(30)
        with replayable.recording(store) as rec:
            run(5000)
        assert max(held) <= 1, held  # one frame out at a time
        assert [e.seq for e in store.events(rec.run_ids[0])] == list(range(1, 5001))
        assert replayable.verify_run(store, rec.run_ids[0]).ok
    finally:
        store.close()
