"""Capture: what a recording stores about runs and boundaries."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from pathlib import Path

import pytest

import replayable


@pytest.fixture
def store():
    s = replayable.open_store("memory://")
    yield s
    s.close()


class FakeCompletions:
    """Stands in for an SDK resource: a plain method the llm() boundary wraps."""

    def __init__(self) -> None:
        self.calls = 0

    def create(
        self,
        *,
        model: str,
        messages: list[dict[str, str]],
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> dict[str, object]:
        self.calls += 1
        return {"model": model, "content": f"answer {self.calls}"}

    async def acreate(self, *, model: str, messages: list[dict[str, str]]) -> dict[str, str]:
        self.calls += 1
        await asyncio.sleep(0)
        return {"model": model, "content": f"async answer {self.calls}"}

    def create_awaitable(self, *, model: str) -> asyncio.Future[str]:
        """Not a coroutine function, but returns an awaitable (as some SDK wrappers do)."""
        self.calls += 1
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        fut.set_result(f"future {self.calls}")
        return fut


def test_run_records_input_output_metadata_tenant_and_code(store):
    """A run's start and end records hold what the issue names."""

    @replayable.workflow("meta_wf")
    def meta_wf(x: int, *, label: str) -> dict[str, int]:
        return {"x": x}

    with replayable.recording(store, metadata={"customer": "acme", "tier": 2}, tenant="t1") as rec:
        meta_wf(5, label="five")
    run = store.get_run(rec.run_ids[0])
    assert run.status == "completed"
    assert run.start.tenant == "t1"
    assert run.metadata == {"customer": "acme", "tier": 2}
    assert run.start.entrypoint.endswith(
        ":test_run_records_input_output_metadata_tenant_and_code.<locals>.meta_wf"
    )
    assert run.start.code["sha256"]
    assert len(run.start.code["sha256"]) == 64
    assert run.start.code["file"].endswith("test_capture.py")
    env = store.get_blob(run.start.env_hash)
    assert env is not None
    assert b'"packages"' in env
    assert b"msgspec" in env
    assert '"label":"five"' in run.start.input
    assert run.end.output == '{"x":5}'
    assert rec.run_ids == rec.all_run_ids
    found = store.list_runs(replayable.RunFilter(metadata={"customer": "acme"}))
    assert [r.run_id for r in found] == rec.run_ids


def test_llm_boundary_records_model_and_sampling_parameters(store):
    """llm() records the request and the model parameters, and replay serves the response."""
    client = FakeCompletions()

    @replayable.workflow("chat")
    def chat(q: str) -> str:
        reply = replayable.llm(
            client.create,
            model="m-1",
            temperature=0.2,
            seed=7,
            messages=[{"role": "user", "content": q}],
        )
        return reply["content"]  # type: ignore[index]

    with replayable.recording(store) as rec:
        assert chat("hi") == "answer 1"
    (event,) = store.events(rec.run_ids[0])
    assert event.kind == "llm"
    assert event.name.endswith("FakeCompletions.create")
    assert event.metadata == {"model": "m-1", "temperature": 0.2, "seed": 7}
    assert event.request_value()["messages"][0]["content"] == "hi"
    result = replayable.replay(rec.run_ids[0], store=store, fn=chat)
    assert result.status == "identical"
    assert result.output == "answer 1"
    assert client.calls == 1


@pytest.mark.parametrize("method", ["acreate", "create_awaitable"])
def test_async_llm_calls_record_and_replay(store, method):
    """Coroutine functions and functions returning awaitables both work through llm()."""
    client = FakeCompletions()

    @replayable.workflow("achat")
    async def achat() -> str:
        fn = getattr(client, method)
        kwargs = {"model": "m"} if method == "create_awaitable" else {"model": "m", "messages": []}
        reply = await replayable.llm(fn, **kwargs)
        return reply if isinstance(reply, str) else reply["content"]

    async def main() -> str:
        async with replayable.recording(store) as rec:
            out = await achat()
        main.run_id = rec.run_ids[0]  # type: ignore[attr-defined]
        return out

    out = asyncio.run(main())
    result = replayable.replay(main.run_id, store=store, fn=achat)  # type: ignore[attr-defined]
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert client.calls == 1


def test_clock_random_uuid_sleep_are_served_on_replay(store, monkeypatch):
    """now/utcnow/random/randint/uuid4/sleep are recorded; replay returns them without sleeping."""

    @replayable.workflow("nondet")
    def nondet() -> tuple[object, ...]:
        replayable.sleep(0.2)
        return (
            replayable.now(),
            replayable.utcnow(),
            replayable.random(),
            replayable.randint(1, 10**6),
            replayable.uuid4(),
        )

    with replayable.recording(store) as rec:
        out = nondet()
    assert isinstance(out[1], dt.datetime)
    assert isinstance(out[4], uuid.UUID)
    # Watched, not timed: a replay's wall time on a loaded machine says nothing.
    slept: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: slept.append(s) or real_sleep(min(s, 0.01)))
    result = replayable.replay(rec.run_ids[0], store=store, fn=nondet)
    monkeypatch.undo()
    assert result.status == "identical"
    assert result.output == out
    assert type(result.output[1]) is dt.datetime
    assert type(result.output[4]) is uuid.UUID
    assert 0.2 not in slept  # the recorded 0.2 s sleep is not repeated


def test_decorators_are_transparent_outside_a_recording():
    """Outside a recording tools and workflows return exactly what the function returns."""
    calls = []

    @replayable.tool
    def t(x: int) -> int:
        calls.append(x)
        return x * 2

    @replayable.workflow
    def w(x: int) -> int:
        return t(x) + 1

    assert w(4) == 9
    assert calls == [4]
    assert w.__name__ == "w"
    assert t.__name__ == "t"


def test_positional_and_keyword_calls_record_the_same_request(store):
    """f(1, 2) and f(a=1, b=2) produce one request shape, so replay tolerates the style."""

    @replayable.tool
    def pair(a: int, b: int) -> int:
        return a + b

    @replayable.workflow("calls")
    def calls() -> int:
        return pair(1, 2) + pair(a=1, b=2)

    with replayable.recording(store) as rec:
        calls()
    first, second = store.events(rec.run_ids[0])
    assert first.request == second.request == '{"a":1,"b":2}'
    assert first.fingerprint == second.fingerprint


def test_methods_as_tools_do_not_record_self(store):
    """A tool defined as a method records its arguments, not the instance."""

    class Db:
        @replayable.tool(name="db.get")
        def get(self, key: str) -> str:
            return key.upper()

    @replayable.workflow("m")
    def m() -> str:
        return Db().get("k")

    with replayable.recording(store) as rec:
        m()
    (event,) = store.events(rec.run_ids[0])
    assert event.name == "db.get"
    assert event.request == '{"key":"k"}'


def test_bad_durability_is_a_configuration_error():
    """An unknown durability mode is refused before anything is recorded."""
    with pytest.raises(replayable.ConfigurationError, match="durability"):
        replayable.recording("memory://", durability="sometimes")  # type: ignore[arg-type]


def test_durable_mode_commits_before_returning(tmp_path):
    """In durable mode an event is readable from another connection as soon as the call returns."""
    url = f"sqlite:///{tmp_path}/d.db"
    seen = []

    @replayable.tool
    def step(i: int) -> int:
        return i

    @replayable.workflow("durable")
    def durable() -> None:
        reader = replayable.open_store(url)
        for i in range(3):
            step(i)
            rid = reader.list_runs()[0].run_id
            seen.append(len(reader.events(rid)))
        reader.close()

    store = replayable.open_store(url)
    with replayable.recording(store, durability="durable"):
        durable()
    store.close()
    assert seen == [1, 2, 3]


def test_sequential_durable_boundaries_commit_on_their_own_thread(tmp_path, monkeypatch):
    """A durable boundary with nothing queued commits on the caller's thread, even while
    the writer thread wakes all the time: an idle round must not take the work from it
    (the boundary would then wait for the writer and committer threads in turn)."""
    from replayable.capture.config import settings
    from replayable.capture.writer import writer_for
    from replayable.capture.writer.batches import Committer

    handed: list[str] = []
    submit = Committer.submit

    def counted(self, fn, what):  # type: ignore[no-untyped-def]
        handed.append(what)
        return submit(self, fn, what)

    monkeypatch.setattr(Committer, "submit", counted)
    monkeypatch.setattr(settings, "writer", "thread")

    @replayable.tool
    def step(i: int) -> int:
        return i

    @replayable.workflow("durable_seq")
    def durable_seq(n: int) -> None:
        for i in range(n):
            step(i)

    store = replayable.open_store(f"sqlite:///{tmp_path}/d.db")
    try:
        with replayable.recording(store, durability="durable") as rec:
            writer = writer_for(store)
            writer.interval = 0.0001  # a round every 0.1 ms
            durable_seq(5)
            handed.clear()
            durable_seq(300)
            assert handed == [], f"{len(handed)} of 300 boundaries waited for the writer thread"
        assert len(store.events(rec.run_ids[-1])) == 300
    finally:
        store.close()


def test_begin_finish_records_a_deferred_call_and_replay_serves_it(store):
    """RunContext.begin() lets a transport record a call that completes later."""
    from replayable.capture.context import active_state

    def streamed(prompt: str) -> str:
        st = active_state()
        assert st is not None
        call = st.run.begin(st, "llm", "stream", {"prompt": prompt}, meta={"stream": True})
        if not call.live:
            return call.value()  # type: ignore[no-any-return]
        chunks = [prompt, "-", "done"]
        call.finish("".join(chunks), meta={"chunks": len(chunks)})
        return "".join(chunks)

    @replayable.workflow("deferred")
    def deferred() -> str:
        return streamed("p")

    with replayable.recording(store) as rec:
        assert deferred() == "p-done"
    (event,) = store.events(rec.run_ids[0])
    assert event.metadata == {"stream": True, "chunks": 3}
    result = replayable.replay(rec.run_ids[0], store=store, fn=deferred)
    assert result.status == "identical"
    assert result.output == "p-done"


def test_boundaries_inside_a_boundary_are_not_recorded(store):
    """A tool that calls another tool is one event: replay serves the outer call whole."""

    @replayable.tool
    def inner(x: int) -> int:
        return x + 1

    @replayable.tool
    def outer(x: int) -> int:
        return inner(x) * 2

    @replayable.workflow("nested")
    def nested() -> int:
        return outer(1)

    with replayable.recording(store) as rec:
        assert nested() == 4
    assert [e.name for e in store.events(rec.run_ids[0])] == ["outer"]
    assert replayable.replay(rec.run_ids[0], store=store, fn=nested).status == "identical"


def test_package_versions_read_as_importlib_reads_them(tmp_path: Path) -> None:
    """The quick read of each METADATA file gives the names and versions of every
    installed distribution exactly as ``importlib.metadata`` does, and defers to it for
    a header it does not read plainly."""
    import importlib.metadata

    from replayable.capture import environment

    for dist in importlib.metadata.distributions():
        assert environment._name_version(dist) == (dist.name, dist.version)
    for i, text in enumerate(
        (
            "Metadata-Version: 2.1\nName: long\n  name\nVersion: 1.0\n\nbody",
            "Metadata-Version: 2.1\nSummary: no name here\n",
            "",
            # Where the headers end, and what follows them, read as importlib reads them.
            "Name: crlf\r\nVersion: 2.0\r\n\r\nName: body\r\nVersion: 9\r\n",
            "Name: mixed\r\n\nVersion: 3.0\n",
            "Name: last\nVersion: 4.0\n\n",
            "Name: fold\nVersion: 5.0\n\tfolded\n\nVersion: 6\n",
            "Metadata-Version: 2.1\n\nName: body-only\nVersion: 7\n",
            "Name: ff\x0cVersion: 8.0\n\n",
            "Name: ls\u2028x\nVersion: 8.1\n\nbody\x0c\n",
            "Name: body-ff\nVersion: 8.2\n\nbody\x0c\n",
            "Name: nl\nVersion: 9.0",
        )
    ):
        info = tmp_path / f"d{i}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(text)
        dist = importlib.metadata.PathDistribution(info)
        assert environment._name_version(dist) == (dist.name, dist.version)


def test_a_recording_never_entered_says_so_when_it_is_dropped() -> None:
    """``rec = replayable.recording(...)`` without ``with`` records nothing (workflows
    called then just run): the recording says so with a warning once it is dropped,
    instead of leaving a script that believes it recorded. An entered one says nothing."""
    import gc
    import warnings

    def forgotten() -> None:
        replayable.recording("memory://")  # created, never entered, dropped

    with pytest.warns(RuntimeWarning, match="never entered, so nothing was recorded"):
        forgotten()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with replayable.recording("memory://") as used:
            pass
        del used
        gc.collect()
