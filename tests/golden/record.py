"""Record golden runs into ``tests/golden/``: ``python -m tests.golden.record NAME``.

``NAME`` is ``events<N>-chain<M>``: event records of schema N as this version
writes them (the current one only: older files were recorded by older versions
and stay as they are), chained without a key (chain format 1) or with the test
key below (format 2). Run it for a new schema or format only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The chain key of the keyed golden run. A test key: it protects nothing.
GOLDEN_KEY = "golden-test:Z29sZGVuLXJ1bi10ZXN0LWtleS1ub3QtYS1zZWNyZXQtMDEyMzQ1Njc4OQ"


def record(name: str) -> Path:
    import replayable
    from replayable.store.memory import MemoryStore
    from replayable.testing import export_fixture
    from tests.golden import agent

    store = MemoryStore()
    with replayable.recording(store, metadata={"golden": name}) as rec:
        agent.session(["SKU-1", "SKU-2"])
    return export_fixture(store, rec.run_ids[0], HERE / f"{name}.replay").path or HERE


if __name__ == "__main__":
    which = sys.argv[1]
    if which.endswith("-chain2"):
        os.environ["REPLAYABLE_CHAIN_KEY"] = GOLDEN_KEY
    else:
        os.environ.pop("REPLAYABLE_CHAIN_KEY", None)
    print(record(which))
