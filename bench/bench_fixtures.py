"""Exporting a 10,000-event run: to a fixture file, sanitized, and to OTLP.

One run of 10,000 recorded calls (tool calls with a few hundred bytes each way,
every tenth an LLM call with messages and usage) is recorded into SQLite. Then,
round-robin so noise is shared out:

- *baseline*: ``store.events()`` and one orjson dump of the records to a file,
  the floor any export pays (read the rows, write their bytes);
- *fixture*: ``export_fixture`` (read, verify the chain, write the file);
- *sanitized*: the same with the default detectors and a names list;
- *OTLP*: ``export_runs`` to a local OTLP/HTTP receiver that reads each request
  and answers 200 (span building, protobuf encoding, HTTP).

Targets: fixture <= 1 s, OTLP <= 2 s for the 10,000 events.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

import replayable
from harness import Config, Section, Target, temp_dir
from replayable.store.sqlite import SQLiteStore

TARGET_FIXTURE_S = 1.0
TARGET_OTLP_S = 2.0
EVENTS = 10_000


@replayable.tool
def lookup_order(order_id: str, fields: list[str]) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "status": "shipped",
        "customer": "customer-4711",
        "lines": [{"sku": f"SKU-{i}", "qty": i, "price": 9.99 * i} for i in range(1, 5)],
        "notes": "left at the front desk; signed by reception " * 3,
    }


@replayable.tool
def chat(model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "The order shipped. " * 8}}],
        "usage": {"prompt_tokens": 182, "completion_tokens": 41},
    }  # fmt: skip


@replayable.workflow("bench.fixtures")
def agent(n: int) -> int:
    for i in range(n):
        if i % 10 == 9:
            chat("gpt-bench", [{"role": "user", "content": f"Where is order {i}? " * 6}])
        else:
            lookup_order(f"ORD-{i:06d}", ["status", "lines", "notes"])
    return n


class _Receiver(BaseHTTPRequestHandler):
    spans_bytes = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).spans_bytes += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run(cfg: Config) -> Section:
    from replayable.integrations.otel import export_runs
    from replayable.testing import SanitizeRules, export_fixture

    sec = Section("fixtures", "fixtures: export a 10,000-event run to a file and to OTLP")
    reps = cfg.pick(7, 3)
    times: dict[str, list[float]] = {"baseline": [], "fixture": [], "sanitized": [], "otlp": []}
    sizes: dict[str, int] = {}
    encoder = msgspec.json.Encoder()
    rules = SanitizeRules(names=("Fiona MacLeod", "José García"), salt=b"bench")
    with temp_dir("fixtures") as tmp, receiver() as url:
        store = SQLiteStore(tmp / "runs.db")
        try:
            with replayable.recording(store) as rec:
                agent(EVENTS)
            run_id = rec.run_ids[0]
            run = store.get_run(run_id)
            for _ in range(reps):
                for name in times:
                    gc.collect()
                    out = tmp / f"{name}.replay"
                    t0 = time.perf_counter()
                    if name == "baseline":
                        out.write_bytes(encoder.encode(store.events(run_id)))
                    elif name == "fixture":
                        export_fixture(store, run_id, out)
                    elif name == "sanitized":
                        export_fixture(store, run_id, out, sanitize=rules)
                    else:
                        sent = export_runs(store, [run], url)
                        if sent.spans != EVENTS + 1:
                            raise RuntimeError(f"OTLP export sent {sent.spans} spans")
                    times[name].append(time.perf_counter() - t0)
                    if name != "otlp":
                        sizes[name] = out.stat().st_size
        finally:
            store.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["baseline"]
    sec.row("baseline: read + dump", f"{base * 1000:,.0f} ms", f"{sizes['baseline']:,} bytes")
    sec.row(
        "fixture file",
        f"{med['fixture'] * 1000:,.0f} ms",
        f"{med['fixture'] / base:.1f}x baseline; {sizes['fixture']:,} bytes (median of {reps})",
    )
    sec.row(
        "sanitized fixture",
        f"{med['sanitized'] * 1000:,.0f} ms",
        f"{med['sanitized'] / base:.1f}x baseline; default detectors + 2 names",
    )
    sec.row(
        "OTLP/HTTP export",
        f"{med['otlp'] * 1000:,.0f} ms",
        f"{med['otlp'] / base:.1f}x baseline; {EVENTS + 1:,} spans, "
        f"{_Receiver.spans_bytes // reps:,} bytes of protobuf per export",
    )
    sec.targets.append(Target("10k-event run to a fixture", med["fixture"], TARGET_FIXTURE_S, "s"))
    sec.targets.append(Target("10k-event run to OTLP", med["otlp"], TARGET_OTLP_S, "s"))
    sec.data = {"seconds": times, "median_s": med, "bytes": sizes, "events": EVENTS}
    return sec


if __name__ == "__main__":
    from harness import format_section

    print(format_section(run(Config())))
