"""The writer process behind :class:`~replayable.capture.procwriter.ProcessWriter`.

Reads length-prefixed msgpack frames (each an array of records) from stdin and
hands them to an ordinary in-process ``Writer``; after each frame holding
acknowledgement requests it flushes and writes one line per request to stdout:
the ticket, then an error message if the flush failed. On end of input (the
agent's process closed the pipe or died) it flushes what it has and exits.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from replayable.capture.procwriter import _apply
from replayable.capture.writer import Writer
from replayable.errors import StoreError
from replayable.events.canonical import Redactor
from replayable.store import open_store


def _read_exactly(stream: Any, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main(argv: list[str]) -> int:
    config = msgspec.json.decode(argv[0])
    store = open_store(config["url"])
    writer = Writer(
        store,
        redactor=Redactor(extra_keys=config["redact_keys"]),
        max_block_s=config["max_block_s"],
        on_store_failure=config["on_store_failure"],
        spool_dir=config["spool_dir"],
    )
    decoder = msgspec.msgpack.Decoder()
    stdin, stdout = sys.stdin.buffer, sys.stdout
    try:
        while True:
            head = _read_exactly(stdin, 4)
            if head is None:
                break
            payload = _read_exactly(stdin, int.from_bytes(head, "little"))
            if payload is None:
                break
            tickets: list[int] = []
            for kind, item in decoder.decode(payload):
                if kind == "m":
                    tickets.append(item)
                else:
                    _apply(writer, kind, item)
            if tickets:
                error = ""
                try:
                    writer.flush(timeout=writer.max_block_s)
                except StoreError as exc:
                    error = " " + str(exc).replace("\n", " ")
                stdout.write("".join(f"{t}{error}\n" for t in tickets))
                stdout.flush()
    finally:
        writer.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
