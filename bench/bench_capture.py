"""Capture overhead of one tool boundary in buffered mode, and its replay cost.

The figure that is checked: the median per-call time of a ``@replayable.tool``
function called inside a ``@replayable.workflow`` inside
``replayable.recording(store, durability="buffered")`` with a ~1 KB argument,
minus the median of the same function undecorated and called directly. It is
taken in the steady state: the calls run long enough that the background
writer (the default writer process, and for reference the in-process writer
thread) is redacting, hashing and committing concurrently the whole time.
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

import replayable
from harness import (
    Config,
    Section,
    Stats,
    Target,
    ns_per_call,
    payload_1kb,
    rate,
    spread,
    stats,
    temp_dir,
    us,
    warm_writer,
)
from replayable.capture.config import settings
from replayable.store.sqlite import SQLiteStore

PAYLOAD = payload_1kb()
SMALL = {"ok": True, "n": 3}


# -- the functions under test ---------------------------------------------------


def lookup_plain(request: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": 3}


@replayable.tool
def lookup(request: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": 3}


def fetch_plain(key: str) -> dict[str, Any]:
    return PAYLOAD


@replayable.tool
def fetch(key: str) -> dict[str, Any]:
    return PAYLOAD


def ping_plain(x: int) -> dict[str, Any]:
    return SMALL


@replayable.tool
def ping(x: int) -> dict[str, Any]:
    return SMALL


def clock_now(_: Any) -> float:
    return replayable.now()


def clock_plain(_: Any) -> float:
    return time.time()


def floor(payload: Any) -> bytes:
    """What any recorder must do at least: canonical bytes and a digest of the payload."""
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).digest()


@dataclass
class Plan:
    call: Callable[[Any], Any]
    arg: Any
    batch: int
    samples: int
    between: Callable[[], None] | None = None


#: What the workflow runs, by name (the workflow's recorded input), and what it measured.
PLANS: dict[str, Plan] = {}
MEASURED: dict[str, list[float]] = {}


@replayable.workflow("bench.capture")
def capture_loop(name: str) -> int:
    """Time batches of boundary calls; the same code runs when recording and replaying."""
    plan = PLANS[name]
    if plan.between is None:
        MEASURED[name] = ns_per_call(plan.call, plan.arg, plan.batch, plan.samples)
    else:
        clock = time.perf_counter_ns
        loop = range(plan.batch)
        out: list[float] = []
        for _ in range(plan.samples):
            plan.between()
            t0 = clock()
            for _ in loop:
                plan.call(plan.arg)
            out.append((clock() - t0) / plan.batch)
        MEASURED[name] = out
    return plan.batch * plan.samples


# -- measuring ------------------------------------------------------------------


@dataclass
class Recorded:
    per_call: Stats
    calls: int
    calls_s: float
    flush_s: float
    run_id: str

    @property
    def total_s(self) -> float:
        return self.calls_s + self.flush_s


def _direct(call: Callable[[Any], Any], arg: Any, batch: int, samples: int) -> list[float]:
    """Per-call samples of ``call(arg)`` called directly, outside any recording."""
    gc.collect()
    ns_per_call(call, arg, batch, max(3, samples // 10))  # warm-up
    return ns_per_call(call, arg, batch, samples)


def _record(store: SQLiteStore, name: str, plan: Plan) -> Recorded:
    PLANS[name] = plan
    gc.collect()
    rec = replayable.recording(store, durability="buffered")
    t0 = time.perf_counter()
    with rec:
        calls = capture_loop(name)
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    # The first tenth of the samples runs while the writer is still starting up.
    return Recorded(
        stats(MEASURED.pop(name), warmup=max(1, plan.samples // 10)),
        calls,
        t1 - t0,
        t2 - t1,
        rec.run_ids[0],
    )


def _replay(store: SQLiteStore, name: str, rec: Recorded) -> tuple[Stats, float]:
    plan = PLANS[name]
    PLANS[name] = Plan(plan.call, plan.arg, plan.batch, plan.samples)  # no flushes in replay
    gc.collect()
    t0 = time.perf_counter()
    result = replayable.replay(rec.run_id, store=store, fn=capture_loop)
    total = time.perf_counter() - t0
    if result.status != "identical":
        raise RuntimeError(f"replay of {name} was {result.status}: {result.divergence}")
    return stats(MEASURED.pop(name), warmup=1), total


def run(cfg: Config) -> Section:
    sec = Section("capture", "capture: one tool boundary, buffered mode, SQLite")
    size = len(orjson.dumps(PAYLOAD))
    # Recorded batches span several GIL switch intervals (5 ms), so each sees
    # the same mix of agent-thread and writer-thread time.
    batch = 1000
    samples = cfg.pick(36, 10)
    dbatch = 500
    dsamples = cfg.pick(100, 20)

    # Baselines are measured half before and half after the recordings.
    plain_s = _direct(lookup_plain, PAYLOAD, dbatch, dsamples)
    floor_s = _direct(floor, PAYLOAD, dbatch, dsamples)
    outside = stats(_direct(lookup, PAYLOAD, dbatch, dsamples))

    with temp_dir("capture") as tmp:
        warm_writer(tmp)
        store = SQLiteStore(tmp / "capture.db")
        try:
            arg = _record(store, "arg_1kb", Plan(lookup, PAYLOAD, batch, samples))
            flush = store_flush(store)
            idle = cfg.pick(40, 12)
            iso = _record(store, "arg_1kb_idle", Plan(lookup, PAYLOAD, 200, idle, flush))
            # Replay the shorter of the two 1 KB runs (same calls, same payload).
            replay_arg, _ = _replay(store, "arg_1kb_idle", iso)

            few = max(samples // 2, 8)
            ret = _record(store, "ret_1kb", Plan(fetch, "invoices", batch, few))
            ret_plain = stats(_direct(fetch_plain, "invoices", dbatch, dsamples))

            clock = _record(store, "now", Plan(clock_now, None, batch, few))
            clock_idle = _record(store, "now_idle", Plan(clock_now, None, 200, idle, flush))
            clock_base = stats(_direct(clock_plain, None, dbatch, dsamples))

            triv = _record(store, "trivial", Plan(ping, 7, batch, few))
            triv_idle = _record(store, "trivial_idle", Plan(ping, 7, 200, idle, flush))
            triv_plain = stats(_direct(ping_plain, 7, dbatch, dsamples))
            replay_triv, _ = _replay(store, "trivial", triv)
        finally:
            store.close()
        # The same steady-state measurement with the writer as a thread of this process.
        before = settings.writer
        replayable.configure(writer="thread")
        try:
            tstore = SQLiteStore(tmp / "capture-thread.db")
            try:
                thread = _record(tstore, "arg_1kb", Plan(lookup, PAYLOAD, batch, samples))
            finally:
                tstore.close()
        finally:
            settings.writer = before
    plain = stats(plain_s + _direct(lookup_plain, PAYLOAD, dbatch, dsamples))
    fl = stats(floor_s + _direct(floor, PAYLOAD, dbatch, dsamples))

    overhead = arg.per_call.median - plain.median
    ratio = overhead / fl.median
    sec.row(f"plain function, {size} B argument", us(plain.median), spread(plain))
    sec.row("floor: orjson sorted dumps + sha256", us(fl.median), spread(fl))
    sec.row(
        "recorded call, 1 KB argument (steady)",
        us(arg.per_call.median),
        f"{spread(arg.per_call)}; mean {us(arg.per_call.mean)}",
    )
    sec.row("  overhead = recorded - plain", us(overhead), f"{ratio:.1f}x floor")
    sec.row(
        "  end-to-end incl. persistence",
        rate(arg.calls / arg.total_s),
        f"{arg.calls} calls: {arg.calls_s:.2f} s calling + {arg.flush_s:.2f} s final flush",
    )
    sec.row(
        "recorded call, writer idle (drained)",
        us(iso.per_call.median - plain.median),
        f"overhead; {spread(iso.per_call)}",
    )
    sec.row("replayed call, 1 KB argument", us(replay_arg.median), spread(replay_arg))
    ret_over = ret.per_call.median - ret_plain.median
    sec.row(
        "recorded call, 1 KB return value",
        us(ret_over),
        f"overhead; recorded {us(ret.per_call.median)}, plain {us(ret_plain.median)}; "
        f"end-to-end {rate(ret.calls / ret.total_s)}",
    )
    clock_over = clock.per_call.median - clock_base.median
    sec.row(
        "replayable.now() vs time.time()",
        us(clock_over),
        f"overhead (steady); writer idle {us(clock_idle.per_call.median - clock_base.median)}; "
        f"plain {us(clock_base.median)}",
    )
    sec.row(
        "decorator outside any recording",
        f"{outside.median - plain.median:.0f} ns",
        f"overhead; decorated {outside.median:.0f} ns, plain {plain.median:.0f} ns",
    )
    sec.row(
        "trivial tool call, recorded",
        us(triv.per_call.median),
        f"steady; writer idle {us(triv_idle.per_call.median)}",
    )
    sec.row(
        "trivial tool call, replayed",
        us(replay_triv.median),
        spread(replay_triv),
    )

    t_overhead = thread.per_call.median - plain.median
    sec.row(
        "recorded call, 1 KB argument, writer thread (steady)",
        us(thread.per_call.median),
        f"overhead {us(t_overhead)}, {t_overhead / fl.median:.1f}x floor; "
        f"{spread(thread.per_call)}; end-to-end {rate(thread.calls / thread.total_s)}",
    )
    sec.targets.append(Target("tool overhead, 1 KB arg (µs)", overhead / 1000, 10.0, "µs"))
    sec.targets.append(Target("tool overhead / floor", ratio, 3.0, "x"))
    sec.data = {
        "writer": settings.writer,
        "recorded_arg_1kb_writer_thread": thread.per_call.as_dict(),
        "overhead_arg_1kb_writer_thread_ns": t_overhead,
        "payload_bytes": size,
        "batch_recorded": batch,
        "batch_direct": dbatch,
        "plain": plain.as_dict(),
        "floor": fl.as_dict(),
        "decorated_outside_recording": outside.as_dict(),
        "recorded_arg_1kb": arg.per_call.as_dict(),
        "overhead_arg_1kb_ns": overhead,
        "overhead_over_floor": ratio,
        "arg_1kb_calls": arg.calls,
        "arg_1kb_calls_s": arg.calls_s,
        "arg_1kb_flush_s": arg.flush_s,
        "arg_1kb_calls_per_s_incl_persistence": arg.calls / arg.total_s,
        "recorded_arg_1kb_writer_idle": iso.per_call.as_dict(),
        "replayed_arg_1kb": replay_arg.as_dict(),
        "recorded_ret_1kb": ret.per_call.as_dict(),
        "plain_ret_1kb": ret_plain.as_dict(),
        "ret_1kb_calls_per_s_incl_persistence": ret.calls / ret.total_s,
        "recorded_now": clock.per_call.as_dict(),
        "recorded_now_writer_idle": clock_idle.per_call.as_dict(),
        "plain_time_time": clock_base.as_dict(),
        "recorded_trivial": triv.per_call.as_dict(),
        "recorded_trivial_writer_idle": triv_idle.per_call.as_dict(),
        "plain_trivial": triv_plain.as_dict(),
        "replayed_trivial": replay_triv.as_dict(),
    }
    sec.notes.append(
        f"per-call figures are medians of batch averages; 'steady' means the writer "
        f"({settings.writer}, the default) was persisting concurrently for the whole "
        "measurement; 'end-to-end' counts from the first call until all are committed"
    )
    return sec


def store_flush(store: SQLiteStore) -> Callable[[], None]:
    """Wait until the store's writer has committed everything handed off so far."""
    from replayable.capture.writer import writer_for

    writer = writer_for(store)
    return lambda: writer.flush()
