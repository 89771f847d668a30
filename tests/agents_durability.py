"""An agent that the durability tests record in a child process and replay in the parent.

Run as a child: ``python -c "from tests.agents_durability import main; main()" DB MODE N``.
It prints ``ACK <seq>`` once each tool call has returned, ``DONE`` after the
last one, then waits to be killed.
"""

from __future__ import annotations

import sys
import time

import replayable


@replayable.tool
def step(i: int) -> dict[str, int]:
    time.sleep(0.001)
    return {"i": i, "square": i * i}


@replayable.workflow
def long_agent(n: int) -> int:
    total = 0
    for i in range(n):
        total += step(i)["square"]
        print(f"ACK {i + 1}", flush=True)  # step i is the run's seq i + 1
    print("DONE", flush=True)
    # Wait to be killed. A boundary call, so a replay stops here, at the end of the tape.
    replayable.sleep(3600)
    return total


def main() -> None:
    db, durability, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = replayable.open_store(f"sqlite:///{db}")
    with replayable.recording(store, durability=durability):  # type: ignore[arg-type]
        long_agent(n)
