"""Where the time goes (``run.py --profile``).

Two kinds of figures, because neither alone is right:

* component costs: each step of a hot path timed on its own, many calls per
  sample, median of samples. No profiler overhead, so the microseconds are
  real; the steps are the ones the library's code performs, called the same
  way.
* cProfile listings of the real path (the writer thread included, by
  profiling its batch function from inside that thread), to show which
  functions the time lands in. Profiling inflates short functions, so read
  their shares, not their absolute times.

Some probes use the library's internal functions; a probe whose internals
have moved prints ``n/a`` instead of failing the run.
"""

from __future__ import annotations

import collections
import cProfile
import gc
import pstats
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

import replayable
from harness import Config, payload_1kb, temp_dir
from replayable.events.model import Event
from replayable.store import MemoryStore
from replayable.store.sqlite import SQLiteStore

PAYLOAD = payload_1kb()


def micro(fn: Callable[[], Any], number: int = 2000, repeat: int = 7) -> float:
    """Median µs per call of ``fn()`` over ``repeat`` samples of ``number`` calls."""
    clock = time.perf_counter_ns
    loop = range(number)
    fn()
    out = []
    for _ in range(repeat):
        t0 = clock()
        for _ in loop:
            fn()
        out.append((clock() - t0) / number / 1000)
    return statistics.median(out)


class Table:
    """Rows of (step, µs) with a running total."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, float | None, str]] = []

    def add(self, label: str, probe: Callable[[], float], note: str = "") -> float:
        try:
            value: float | None = probe()
        except Exception as exc:  # internals moved: say so, keep going
            value, note = None, f"n/a ({type(exc).__name__}: {exc})"[:70]
        self.rows.append((label, value, note))
        return value or 0.0

    def show(self, total_label: str | None = "sum") -> float:
        total = sum(v for _, v, _ in self.rows if v is not None)
        print(f"-- {self.title}")
        for label, value, note in self.rows:
            shown = "n/a" if value is None else f"{value:8.2f} µs"
            print(f"   {label:<46} {shown:>11}  {note}".rstrip())
        if total_label:
            print(f"   {total_label:<46} {total:8.2f} µs")
        return total


def show_profile(
    profs: cProfile.Profile | list[cProfile.Profile], title: str, per: int, top: int = 12
) -> None:
    """The ``top`` functions by own time, as µs per event (``per`` events)."""
    profs = profs if isinstance(profs, list) else [profs]
    st: pstats.Stats | None = None
    for prof in profs:
        try:
            if st is None:
                st = pstats.Stats(prof)
            else:
                st.add(prof)
        except TypeError:  # a profiler that never ran
            continue
    if st is None:
        print(f"-- {title}: no profile data")
        return
    entries = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(v[2] for _, v in entries)
    print(
        f"-- {title}: cProfile, top {top} by own time ({total / per * 1e6:.1f} µs/event profiled)"
    )
    print(f"   {'function':<58} {'calls':>9} {'own µs/ev':>10} {'cum µs/ev':>10}")
    for (file, line, name), (_cc, nc, tt, ct, _callers) in entries[:top]:
        where = name if file == "~" else f"{_short(file)}:{line}({name})"
        print(f"   {where[:58]:<58} {nc:>9} {tt / per * 1e6:>10.2f} {ct / per * 1e6:>10.2f}")


def _short(file: str) -> str:
    parts = Path(file).parts
    if "replayable" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("replayable") :])
    return parts[-1]


# -- capture ----------------------------------------------------------------------


@replayable.tool
def lookup(request: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": 3}


@replayable.tool
def search(query: str, k: int) -> dict[str, Any]:
    return {"ok": True, "n": 3}


@replayable.workflow("bench.profile")
def agent(n: int, big: bool) -> int:
    for i in range(n):
        if big:
            lookup(PAYLOAD)
        else:
            search("weather in paris tomorrow", i)
    return n


def hot_path(fn: Callable[..., Any], args: tuple[Any, ...], result: Any, name: str) -> float:
    """Component costs of one recorded sync tool call, in the order the code runs them."""
    from replayable.capture.boundaries import _request_builder
    from replayable.capture.context import _STATE, Lineage
    from replayable.capture.runtime import call_site
    from replayable.events.codec import encode_request, encode_value

    t = Table(f"capture hot path, {name}: main thread, per call")
    build = _request_builder(fn)
    req = build(args, {})
    lineage = Lineage()
    enc = encode_request(req)
    queue: collections.deque[Any] = collections.deque()

    # fmt: off
    def handoff() -> None:
        pending = ("run", 1, "tool", "lookup", "r:1", None, "site", enc, b"{}", False, None,
                   False, 1.0, 1, None)
        queue.append((0, pending, None))
        if len(queue) > 4096:
            queue.clear()
    # fmt: on

    t.add("context lookup + wrapper", lambda: micro(_STATE.get, 20000))
    t.add("name arguments (request dict)", lambda: micro(lambda: build(args, {})))
    t.add("call_site() frame lookup", lambda: micro(lambda: call_site(0)))
    t.add("lineage key", lambda: micro(lineage.next_key))
    t.add(
        "encode_request (orjson, sorted keys)",
        lambda: micro(lambda: encode_request(req)),
        f"{len(enc)} B",
    )
    t.add(
        "clock reads (time, perf_counter_ns x2)",
        lambda: micro(lambda: (time.time(), time.perf_counter_ns(), time.perf_counter_ns())),
    )
    t.add("encode_value(result) (dumps + loads + ==)", lambda: micro(lambda: encode_value(result)))
    t.add("hand-off (15-tuple, deque append)", lambda: micro(handoff))
    return t.show("sum of steps")


def writer_costs(request: Any, result: Any, name: str) -> float:
    """Component costs of what the writer thread does per event (``request``: the tree)."""
    from replayable.capture.config import settings
    from replayable.events.canonical import chain_hash, fingerprint, genesis_hash
    from replayable.events.codec import encode_request, encode_value

    req = encode_request(request)
    resp, _ = encode_value(result)
    red = settings.redactor
    prev = genesis_hash("run")
    site = "bench/profiling.py:120 in agent"
    # fmt: off
    fields = ("run", 7, 6, "tool", "lookup", "r:6", None, site, req.decode(), "f" * 64,
              resp.decode(), "json", None, False, 1.0, 1000, {}, 1)
    # fmt: on
    t = Table(f"writer thread, {name}: per event")
    t.add(
        "redact request (scan)", lambda: micro(lambda: red.redact_bytes(req), 500), f"{len(req)} B"
    )
    t.add(
        "redact response (scan)",
        lambda: micro(lambda: red.redact_bytes(resp), 500),
        f"{len(resp)} B",
    )
    t.add("fingerprint (sha256)", lambda: micro(lambda: fingerprint("tool", "lookup", req)))
    t.add("chain_hash (orjson 18-tuple + sha256)", lambda: micro(lambda: chain_hash(prev, fields)))
    t.add("Event(...) struct", lambda: micro(lambda: _event(fields, prev)))
    per_event_append = _append_cost(fields, prev)
    t.add("SQLiteStore.append (per event, batch 2048)", lambda: per_event_append)
    total = t.show("sum (writer CPU per event)")
    return total


def _event(f: tuple[Any, ...], prev: str) -> Event:
    return Event(
        run_id=f[0],
        seq=f[1],
        kind=f[3],
        name=f[4],
        key=f[5],
        parent=f[6],
        call_site=f[7],
        request=f[8],
        fingerprint=f[9],
        response=f[10],
        encoding=f[11],
        error=f[12],
        side_effect=f[13],
        started_at=f[14],
        duration_ns=f[15],
        metadata=f[16],
        chain_index=f[2],
        prev_hash=prev,
        hash=prev,
    )


def _append_cost(fields: tuple[Any, ...], prev: str) -> float:
    base = _event(fields, prev)
    import msgspec

    with temp_dir("profile-append") as tmp:
        store = SQLiteStore(tmp / "a.db")
        try:
            per = []
            for b in range(5):
                batch = [msgspec.structs.replace(base, seq=b * 2048 + i) for i in range(2048)]
                t0 = time.perf_counter_ns()
                store.append([], batch, [])
                per.append((time.perf_counter_ns() - t0) / 2048 / 1000)
            return statistics.median(per)
        finally:
            store.close()


#: The writer's per-batch functions, by layout: one function doing the whole batch on
#: the writer thread, or building there and committing on a committer thread. Each
#: gets its own profiler, enabled from inside the thread that runs it.
_WRITER_BATCH_FUNCTIONS = (("_write",), ("_build", "_store_write"))


def profile_writer(n: int, big: bool) -> None:
    """cProfile of the writer's batch work (whatever thread runs it) while recording."""
    from replayable.capture.writer import Writer

    names = next((ns for ns in _WRITER_BATCH_FUNCTIONS if all(hasattr(Writer, m) for m in ns)), ())
    if not names:
        print("-- writer: n/a (its batch functions have moved)")
        return
    originals = {m: getattr(Writer, m) for m in names}
    profs = [cProfile.Profile() for _ in names]

    def wrap(original: Callable[..., Any], prof: cProfile.Profile) -> Callable[..., Any]:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            prof.enable()
            try:
                return original(*args, **kwargs)
            finally:
                prof.disable()

        return profiled

    with temp_dir("profile-writer") as tmp:
        store = SQLiteStore(tmp / "w.db")
        for (m, original), prof in zip(originals.items(), profs, strict=True):
            setattr(Writer, m, wrap(original, prof))
        try:
            with replayable.recording(store):
                agent(n, big)
        finally:
            for m, original in originals.items():
                setattr(Writer, m, original)
            store.close()
    what = "1 KB argument" if big else "small call"
    show_profile(profs, f"writer ({' + '.join(names)}), {what}", n, top=10)


def sqlite_layout(size: int, rows: int = 20480) -> None:
    """Insert cost of the events table's layout (WITHOUT ROWID, key run_id+seq) against a
    rowid table with the same primary key, for rows whose request is ``size`` bytes."""
    cols = ", ".join(
        f"{c} {'INTEGER' if c in ('seq', 'chain_index') else 'TEXT'}"
        for c in ("run_id", "seq", "kind", "name", "request", "fingerprint", "hash", "chain_index")
    )
    req = "x" * size
    data = [
        ("0190f000-0000-7000-8000-000000000000", i, "tool", "lookup", req, "f" * 64, "h" * 64, i)
        for i in range(rows)
    ]
    out = {}
    with temp_dir("profile-layout") as tmp:
        for layout, suffix in (("WITHOUT ROWID", ") WITHOUT ROWID"), ("rowid table", ")")):
            conn = sqlite3.connect(str(tmp / f"{len(out)}.db"), isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"CREATE TABLE t ({cols}, PRIMARY KEY (run_id, seq){suffix}")
            conn.execute("CREATE INDEX t_kind_name ON t (kind, name)")
            t0 = time.perf_counter()
            for i in range(0, rows, 2048):
                conn.execute("BEGIN")
                conn.executemany(
                    "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)", data[i : i + 2048]
                )
                conn.execute("COMMIT")
            out[layout] = (time.perf_counter() - t0) / rows * 1e6
            conn.close()
    print(
        f"-- SQLite layout, {size} B request, key (run_id, seq) + index (kind, name): "
        + ", ".join(f"{k} {v:.2f} µs/row" for k, v in out.items())
    )


# -- replay -------------------------------------------------------------------------


def replay_costs(n: int) -> None:
    from replayable.capture.config import settings
    from replayable.capture.context import Lineage
    from replayable.events.canonical import fingerprint
    from replayable.events.codec import decode_value, encode_request
    from replayable.replay.tape import Tape

    with temp_dir("profile-replay") as tmp:
        store = SQLiteStore(tmp / "r.db")
        try:
            rec = replayable.recording(store)
            with rec:
                agent(n, False)
            rid = rec.run_ids[0]
            events = store.events(rid)

            t = Table(f"replay load, {n:,} small events: per event")
            conn = sqlite3.connect(str(tmp / "r.db"))
            sql = "SELECT * FROM events WHERE run_id = ? ORDER BY seq"
            t.add(
                "SQLite SELECT + fetchall (raw rows)",
                lambda: micro(lambda: conn.execute(sql, (rid,)).fetchall(), 1, 5) / n,
            )
            rows = conn.execute(sql, (rid,)).fetchall()
            conn.close()
            t.add(
                "orjson.loads(metadata) per row",
                lambda: micro(lambda: [orjson.loads(r[15]) for r in rows], 1, 5) / n,
            )
            t.add(
                "store.events() total",
                lambda: micro(lambda: store.events(rid), 1, 5) / n,
                "includes the two lines above",
            )
            t.show(None)

            ev = events[n // 2]
            req_tree = {"query": "weather in paris tomorrow", "k": 7}
            req = encode_request(req_tree)
            lineage = Lineage()
            t = Table("replay execution: per tool call served")
            t.add("lineage key", lambda: micro(lineage.next_key))
            t.add("encode_request", lambda: micro(lambda: encode_request(req_tree)))
            t.add(
                "redact request (scan)", lambda: micro(lambda: settings.redactor.redact_bytes(req))
            )
            t.add("fingerprint (sha256)", lambda: micro(lambda: fingerprint("tool", "search", req)))
            tape = Tape(events)
            t.add("tape lookup (dict get)", lambda: micro(lambda: tape.at(ev.key or "")))
            t.add(
                "decode_value(response)",
                lambda: micro(lambda: decode_value(ev.response, ev.encoding)),
            )
            t.add("Tape(events) build, per event", lambda: micro(lambda: Tape(events), 1, 5) / n)
            t.show("sum of steps")

            def one_replay() -> None:
                replayable.replay(rid, store=store, fn=agent)

            gc.collect()
            prof = cProfile.Profile()
            prof.enable()
            one_replay()
            prof.disable()
            show_profile(prof, f"replay of {n:,} events, loading included", n, top=14)
        finally:
            store.close()

    mem = MemoryStore()
    rec = replayable.recording(mem)
    m = min(n, 2000)
    with rec:
        agent(m, True)
    prof = cProfile.Profile()
    prof.enable()
    replayable.replay(rec.run_ids[0], store=mem, fn=agent)
    prof.disable()
    show_profile(prof, f"replay of {m:,} 1 KB-argument calls (memory store)", m, top=6)
    mem.close()


# -- entry ---------------------------------------------------------------------------


def run(cfg: Config, names: list[str]) -> None:
    print("== profile: where the time goes ==")
    small = ("weather in paris tomorrow", 7)
    result = {"ok": True, "n": 3}
    if "capture" in names:
        hot_path(lookup.__wrapped__, (PAYLOAD,), result, "1 KB argument")  # type: ignore[attr-defined]
        writer_costs({"request": PAYLOAD}, result, "1 KB argument")
        sqlite_layout(len(orjson.dumps(PAYLOAD)))
        profile_writer(cfg.pick(20_000, 4_000), big=True)
    if "ingest" in names:
        main = hot_path(search.__wrapped__, small, result, "small call")  # type: ignore[attr-defined]
        writer = writer_costs({"k": small[1], "query": small[0]}, result, "small call")
        print(
            f"   one interpreter lock: main {main:.1f} + writer {writer:.1f} µs per event; run "
            f"one after the other: {1e6 / (main + writer):,.0f} events/s (SQLite's own C work "
            "releases the lock and may overlap)"
        )
        profile_writer(cfg.pick(50_000, 10_000), big=False)
    if "replay" in names:
        replay_costs(cfg.pick(10_000, 5_000))
    sys.stdout.flush()
