"""The writer's bulk path: many hand-offs at once (what the writer process gives its
writer) build the same events as one hand-off at a time, split into batches where a
batch ends, and a bad one among them is refused alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from replayable.capture.writer import Writer
from replayable.capture.writer.linker import Linker
from replayable.events.chain import ChainKey
from replayable.events.model import RunStart
from replayable.events.redaction import Redactor
from replayable.store import MemoryStore
from replayable.store.integrity import Integrity
from replayable.store.keys import StaticKeys
from replayable.store.sqlite import SQLiteStore, _insert, _statement
from replayable.store.verify import verify_run

RUN = "01a23310-abda-7933-8ab2-78ee449052c7"
OTHER = "01a23310-abda-7933-8ab2-78ee449052c8"


def _start(run_id: str = RUN) -> RunStart:
    return RunStart(
        run_id=run_id,
        workflow="w",
        entrypoint="tests.m:f",
        parent_run_id=None,
        parent_seq=None,
        root_run_id=run_id,
        tenant=None,
        input='{"args":[],"kwargs":{}}',
        metadata={},
        code={},
        env_hash=None,
        lineage={},
        started_at=1.0,
    )


def _pending(run_id: str, seq: int, **changes: Any) -> list[Any]:
    """A hand-off as the writer process decodes it (a list, bytes payloads)."""
    p: list[Any] = [
        run_id,
        seq,
        "tool",
        "search",
        f"r:{seq}",
        None,
        "tests/test_writer_bulk.py:1 in f",
        b'{"k":%d,"query":"weather in paris tomorrow"}' % seq,
        b'{"n":3,"ok":true}',
        False,
        None,
        False,
        1796153060.25 + seq,
        18898 + seq,
        None,
    ]
    names = ("req", "resp", "tagged", "err", "meta", "kind", "name", "parent", "side_effect")
    index = {"req": 7, "resp": 8, "tagged": 9, "err": 10, "meta": 14, "kind": 2, "name": 3}
    index.update(parent=5, side_effect=11)
    for name, value in changes.items():
        assert name in names
        p[index[name]] = value
    return p


def _odd_mix() -> list[list[Any]]:
    """Two runs interleaved, with every kind of hand-off the fast loop hands back."""
    out: list[list[Any]] = []
    for seq in range(1, 41):
        out.append(_pending(RUN, seq))
        out.append(_pending(OTHER, seq, parent=seq - 1 if seq > 1 else None))
    out[3] = _pending(RUN, 2, resp=None, err=b'{"message":"boom","type":"ValueError"}')
    out[5] = _pending(RUN, 3, meta={"model": "m", "tokens": 3})
    out[7] = _pending(RUN, 4, tagged=True, resp=b'{"__t":"set","v":[1]}')
    out[9] = _pending(RUN, 5, req=b'{"api_key":"sk-abcdefghijklmnopqrstuvwxyz012345"}')
    out[11] = _pending(RUN, 6, req=b'{"q":"\xc3\xa9t\xc3\xa9 \xe2\x82\xac"}', side_effect=True)
    out[13] = _pending(RUN, 7, req=b'{"q":"' + b"x" * 300 + b'"}', resp=b'"' + b"y" * 200 + b'"')
    out[15] = _pending(RUN, 8, kind="llm", name="openai.chat")
    return out


def _linker(integrity: Integrity | None = None) -> Linker:
    linker = Linker(MemoryStore(), Redactor(), integrity or Integrity())
    for run_id in (RUN, OTHER):
        linker.starts[run_id] = _start(run_id)
    return linker


def _refuse(p: Any, exc: Exception) -> None:
    raise exc


@pytest.mark.parametrize("keyed", [False, True])
def test_the_bulk_loop_builds_what_one_hand_off_at_a_time_builds(keyed: bool) -> None:
    integrity = Integrity(StaticKeys([ChainKey("k1", b"s" * 32)])) if keyed else None
    one, many = _linker(integrity), _linker(integrity)
    items = _odd_mix()
    chains_one: dict[str, Any] = {}
    chains_many: dict[str, Any] = {}
    expected = [one.event(p, chains_one) for p in items]
    # Clean or not as the writer's scan found them: all but the secret-bearing one.
    clean_ids = {id(p) for i, p in enumerate(items) if i != 9}
    built = many.events(items, chains_many, False, clean_ids, _refuse)
    assert built == expected
    assert {r: c.head for r, c in chains_many.items()} == {r: c.head for r, c in chains_one.items()}
    assert "sk-abc" not in built[9].request
    # Told they are all clean (the scan found no secret in any): the same events.
    plain = [p for i, p in enumerate(items) if i != 9]
    chains: dict[str, Any] = {}
    alone = _linker(integrity)
    assert _linker(integrity).events(plain, {}, True, set(), _refuse) == [
        alone.event(p, chains, True) for p in plain
    ]


def test_a_hand_off_that_cannot_be_built_is_refused_alone() -> None:
    linker = _linker()
    items = [_pending(RUN, s) for s in range(1, 6)]
    items[2] = _pending(RUN, 3, req="not bytes")  # a hand-off no boundary makes
    refused: list[tuple[Any, Exception]] = []
    built = linker.events(items, {}, True, set(), lambda p, e: refused.append((p, e)))
    assert [p[1] for p, _ in refused] == [3]
    assert [e.seq for e in built] == [1, 2, 4, 5]
    assert [e.chain_index for e in built] == [0, 1, 2, 3]
    assert [e.prev_hash for e in built[1:]] == [e.hash for e in built[:-1]]


def test_many_hand_offs_at_once_are_split_into_batches_and_chained(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "bulk.db")
    writer = Writer(store, batch_size=7)
    try:
        writer.start(_start())
        writer.events([_pending(RUN, s) for s in range(1, 31)])
        writer.events([_pending(RUN, s) for s in range(31, 33)])
        writer.end((RUN, "completed", b"1", None, 2.0), False)
        writer.flush()
        events = store.events(RUN)
        assert [e.seq for e in events] == list(range(1, 33))
        assert [e.chain_index for e in events] == list(range(32))
        assert verify_run(store, RUN).ok
    finally:
        writer.close()
        store.close()


class _Recorder:
    """A connection that records the statements it is asked to run."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def execute(self, sql: str, params: list[Any]) -> None:
        self.sizes.append(sql.count("(?"))
        assert len(params) == 2 * self.sizes[-1]


@pytest.mark.parametrize(
    ("n", "variables", "sizes"),
    [
        (1, 32_766, [1]),
        (2048, 32_766, [2048]),
        (2047, 32_766, [1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1]),
        (5000, 32_766, [2048, 2048, 512, 256, 128, 8]),
        (700, 999, [256, 256, 128, 32, 16, 8, 4]),  # a library bound of 999 parameters
    ],
)
def test_inserts_go_in_statements_of_a_power_of_two_of_rows(
    n: int, variables: int, sizes: list[int]
) -> None:
    c = _Recorder()
    _insert(c, "INSERT INTO t (a, b)", 2, [(i, i) for i in range(n)], variables=variables)  # type: ignore[arg-type]
    assert c.sizes == sizes
    assert sum(c.sizes) == n


def test_every_row_of_an_odd_sized_batch_is_stored_once(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
    rows = [(i, f"v{i}") for i in range(3001)]
    _insert(conn, "INSERT INTO t (a, b)", 2, rows, variables=2000)
    assert conn.execute("SELECT count(*), sum(a) FROM t").fetchone() == (3001, sum(range(3001)))
    assert _statement("INSERT INTO t (a, b)", 2, 2) == "INSERT INTO t (a, b) VALUES (?,?),(?,?)"
    conn.close()
