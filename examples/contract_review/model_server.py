"""A scripted model behind the OpenAI chat-completions wire format.

It reads the prompts the contract-review agent sends and answers like a
model would, sampling included: the wording, ids and confidence scores vary
from call to call, and with no compliance rules to go on it rates a contract
"low" most of the time but "medium" now and then. A seed makes the noise
repeatable. ``requests`` counts the completions it has served.

Run it on its own with ``python -m contract_review.model_server --port 8765``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

__all__ = ["ModelServer", "assess", "extract", "serve"]

_NO_RULES_WORDING: Final = (
    "No compliance rules apply to this jurisdiction; proceeding with the available data, "
    "the terms look standard.",
    "No applicable rules were found, and nothing in the extracted terms stands out.",
    "Proceeding with available data: no rule is triggered, so the contract is routine.",
    "With no jurisdiction rules on file the contract raises no specific concerns.",
)
_RULES_WORDING: Final = (
    "Triggered: {hits}.",
    "The terms breach {hits}; escalate before signature.",
    "Review needed: {hits} apply to these terms.",
)
_CLEAN_WORDING: Final = (
    "The applicable rules ({ids}) are all satisfied.",
    "Checked against {ids}; no rule is triggered.",
)


def _search(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text, re.IGNORECASE)
    return match.group(1).strip() if match else None


def extract(contract_text: str, rng: random.Random) -> dict[str, Any]:
    """Key terms read off the contract text, as the extraction prompt asks."""
    liability = _search(r"Liability:\s*(.+)", contract_text) or ""
    cap = (
        "unlimited"
        if "unlimited" in liability.lower()
        else (_search(r"capped at ([A-Z]{3} [\d,]+)", liability) or "not stated")
    )
    renewal = _search(r"successive (\d+)-month", contract_text)
    data_line = _search(r"Data protection:\s*(.+)", contract_text) or ""
    outside = "outside the united kingdom" in data_line.lower()
    term = _search(r"Term:\s*(\d+) months", contract_text)
    return {
        "counterparty": _search(r"between (.+?) \(\"Supplier\"\)", contract_text),
        "jurisdiction": _search(r"Jurisdiction:\s*([A-Z]{2}(?:-[A-Z0-9]+)?)", contract_text),
        "governing_law": (_search(r"Governing law:\s*([^;.\n]+)", contract_text) or "").rstrip(),
        "term_months": int(term) if term else None,
        "auto_renewal_months": int(renewal) if renewal else 0,
        "liability_cap": cap,
        "data_transfer_outside_uk": outside,
        "extraction_confidence": round(rng.uniform(0.86, 0.98), 2),
    }


def _triggered(rule: dict[str, Any], terms: dict[str, Any]) -> bool:
    actual = terms.get(rule.get("field", ""))
    expected = rule.get("value")
    if rule.get("op") == "gt":
        return (
            isinstance(actual, int | float)
            and isinstance(expected, int | float)
            and actual > expected
        )
    return bool(actual == expected)


def assess(
    terms: dict[str, Any], rules: list[dict[str, Any]], rng: random.Random
) -> dict[str, Any]:
    """A risk rating: the worst triggered rule decides; with no rules, mostly "low"."""
    confidence = round(rng.uniform(0.7, 0.95), 2)
    if not rules:
        risk = "low" if rng.random() < 0.7 else "medium"
        return {"risk": risk, "summary": rng.choice(_NO_RULES_WORDING), "confidence": confidence}
    hits = [r for r in rules if _triggered(r, terms)]
    if not hits:
        ids = ", ".join(r["rule_id"] for r in rules)
        return {
            "risk": "low",
            "summary": rng.choice(_CLEAN_WORDING).format(ids=ids),
            "confidence": confidence,
        }
    risk = "high" if any(r.get("severity") == "high" for r in hits) else "medium"
    named = ", ".join(f"{r['rule_id']} ({r['title']})" for r in hits)
    return {
        "risk": risk,
        "summary": rng.choice(_RULES_WORDING).format(hits=named),
        "confidence": confidence,
    }


def _block(prompt: str, label: str) -> Any:
    match = re.search(rf"^{label}:\n(.*?)(?:\n[A-Z]+:\n|\Z)", prompt, re.MULTILINE | re.DOTALL)
    return json.loads(match.group(1)) if match else None


class ModelServer:
    """The scripted model on ``127.0.0.1``; ``base_url`` is its OpenAI-style ``/v1`` root."""

    def __init__(self, *, seed: int | None = None, port: int = 0) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._requests = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        host, bound = self._httpd.server_address[:2]
        self.base_url = f"http://{host!s}:{bound}/v1"

    @property
    def requests(self) -> int:
        """Chat completions served so far."""
        with self._lock:
            return self._requests

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``chat.completion`` object for one request body."""
        messages = body.get("messages") or []
        prompt = str(messages[-1].get("content", "")) if messages else ""
        with self._lock:
            self._requests += 1
            if prompt.startswith("TASK: extract terms"):
                content = extract(prompt, self._rng)
            elif prompt.startswith("TASK: assess risk"):
                content = assess(
                    _block(prompt, "TERMS") or {}, _block(prompt, "RULES") or [], self._rng
                )
            else:
                content = {"error": "this scripted model only knows the contract-review prompts"}
            completion_id = f"chatcmpl-{self._rng.getrandbits(64):016x}"
        text = json.dumps(content)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        completion_tokens = len(text.split())
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "system_fingerprint": "fp_scripted",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(
                        404,
                        {
                            "error": {
                                "message": f"no route {self.path}",
                                "type": "invalid_request_error",
                            }
                        },
                    )
                    return
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(
                        400,
                        {"error": {"message": "body is not JSON", "type": "invalid_request_error"}},
                    )
                    return
                self._send(200, server.answer(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a demo server stays quiet

        return Handler

    def start(self) -> ModelServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="scripted-model",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def serve(seed: int | None = None, port: int = 0) -> Iterator[ModelServer]:
    """Run the scripted model for the block; point a client at the server's ``base_url``."""
    with ModelServer(seed=seed, port=port) as server:
        yield server


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    with serve(args.seed, args.port) as server:
        print(f"scripted model at {server.base_url} (Ctrl-C to stop)")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    _main()
