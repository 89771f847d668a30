"""The storage tiers end to end: recorded through the writer, read back by every reader."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import replayable
from replayable.cli import app
from replayable.store import open_store, verify_run
from replayable.store.payloads import PayloadTier, parse_codec
from replayable.store.sqlite import SQLiteStore
from tests import agents_chat


def _record(store, turns: int) -> str:
    with replayable.recording(store) as rec:
        agents_chat.chat_agent(turns)
    return rec.run_ids[0]


def test_recorded_chat_is_tiered_and_replays(tmp_path: Path) -> None:
    """A chat recorded through the writer lands in the blob tier, once per message; replay,
    show, diff and verify see whole payloads."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = open_store(url)
    try:
        run_id = _record(store, 12)
        second = _record(store, 12)
        stats = store.tier_stats()
        assert stats.blobs > 0
        events = store.events(run_id)
        assert events[-1].request_value()["messages"][0]["content"] == agents_chat.SYSTEM
        # The second identical chat adds no blob and no node.
        assert store.events(second)[-1].request == events[-1].request
        result = replayable.replay(run_id, store=store)
        assert result.status == "identical", result.divergence
        assert verify_run(store, run_id).ok
    finally:
        store.close()
    shown = CliRunner().invoke(app, ["show", run_id, "--store", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert "careful contract reviewer" in shown.output
    diff = CliRunner().invoke(app, ["diff", run_id, second, "--store", url])
    assert diff.exit_code == 0, diff.output
    verified = CliRunner().invoke(app, ["verify", run_id, "--store", url])
    assert verified.exit_code == 0, verified.output


def test_the_agent_thread_never_splits_or_compresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Capture hands payloads off; the blob tier's work happens in the writer."""
    threads: list[threading.Thread] = []
    original = PayloadTier.split_events

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PayloadTier, "split_events", spy)
    store = open_store("memory://")
    try:
        run_id = _record(store, 3)
        assert store.tier_stats().blobs > 0
        assert len(store.events(run_id)) == 3
    finally:
        store.close()
    assert threads
    assert threading.main_thread() not in threads


def test_train_dictionary_then_old_and_new_blobs_read(tmp_path: Path) -> None:
    """`db train-dictionary` trains on the stored blobs; new blobs use it, old ones keep
    theirs, and both read back (also from a new store object)."""
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    store = SQLiteStore(path)
    try:
        first = _record(store, 10)
    finally:
        store.close()
    result = CliRunner().invoke(app, ["db", "train-dictionary", "--store", url, "--size", "4096"])
    assert result.exit_code == 0, result.output
    assert "with dictionary" in result.output
    store = SQLiteStore(path)
    try:
        dict_id = store.tier_dictionary("", None)
        assert dict_id is not None
        with replayable.recording(store) as rec:
            agents_chat.chat_agent(2, topic=" on a new topic")
        codecs = {parse_codec(r.codec)[0] for r in store.tier_sample("", 10_000)}
        assert None in codecs
        assert dict_id[0] in codecs
    finally:
        store.close()
    again = SQLiteStore(path)
    try:
        assert verify_run(again, first).ok
        assert verify_run(again, rec.run_ids[0]).ok
        assert len(again.events(rec.run_ids[0])) == 2
    finally:
        again.close()


def test_train_dictionary_needs_blobs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    SQLiteStore(tmp_path / "runs.db").close()
    result = CliRunner().invoke(app, ["db", "train-dictionary", "--store", url])
    assert result.exit_code != 0
    assert "holds no payload blobs" in result.output
