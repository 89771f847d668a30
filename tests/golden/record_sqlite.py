"""Write ``tests/golden/sqlite-v<N>.sql``: a basket recorded by this version's SQLite
store (schema N), dumped to SQL. ``python -m tests.golden.record_sqlite``, once per new
store schema; the dumps of older schemas were written by the code of their versions.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def record() -> Path:
    import replayable
    from replayable.store.sqlite import _DB_VERSION
    from tests.golden import agent

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.db"
        with replayable.recording(
            f"sqlite:///{path}", metadata={"golden": f"sqlite-v{_DB_VERSION}"}
        ):
            agent.basket(["SKU-1", "SKU-2"])
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            lines = list(db.iterdump())
    out = HERE / f"sqlite-v{_DB_VERSION}.sql"
    out.write_text("\n".join(lines) + "\n")
    return out


if __name__ == "__main__":
    print(record())
