"""The public API is what the README promises."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

import replayable

PROMISED = {
    "workflow",
    "tool",
    "llm",
    "now",
    "utcnow",
    "random",
    "randint",
    "uuid4",
    "sleep",
    "span",
    "open_store",
    "recording",
    "replay",
    "ReplayResult",
    "ReplayDivergenceError",
    "SerializationError",
    "register_codec",
    "verify_run",
    "carry",
    "ContextThreadPoolExecutor",
    "deterministic",
    "retrieval",
    "prompt",
    "snapshot",
}


def test_all_is_sorted_and_importable():
    """__all__ is sorted and every name in it exists."""
    assert list(replayable.__all__) == sorted(replayable.__all__)
    for name in replayable.__all__:
        assert hasattr(replayable, name), name


def test_promised_names_are_exported():
    """Every name the issue and README promise is exported."""
    assert set(replayable.__all__) >= PROMISED


def test_readme_mentions_only_exported_names():
    """Every `replayable.X` in the README is a real export."""
    text = (Path(__file__).parents[1] / "README.md").read_text()
    used = set(re.findall(r"replayable\.([A-Za-z_][A-Za-z0-9_]*)\(", text))
    missing = {n for n in used if not hasattr(replayable, n)}
    assert not missing, missing


def test_import_loads_only_what_is_used() -> None:
    """``import replayable`` is cheap: the engine loads on first use of a name, and
    ``replay``/``diff`` stay the functions once their subpackages are imported."""
    import subprocess
    import sys

    script = (
        "import sys, replayable\n"
        "heavy = ('asyncio', 'replayable.replay', 'replayable.diff',\n"
        "         'replayable.capture.boundaries')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "import replayable.replay.api, replayable.diff.align\n"
        "print(callable(replayable.replay), callable(replayable.diff))\n"
        "from replayable import replay, diff, workflow\n"
        "print(replay is replayable.replay, diff is replayable.diff, callable(workflow))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split("\n")[:3] == ["[]", "True True", "True True True"]
    assert sorted(dir(replayable)) == dir(replayable)
    assert set(replayable.__all__) <= set(dir(replayable))


def test_import_loads_nothing_it_can_do_without() -> None:
    """``import replayable`` loads three modules of its own and none of the standard
    library's heavier ones (typing with collections, re and enum cost most of its
    start-up), nor the packages only some commands need; the names still resolve."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import replayable\n"
        "print(sorted(set(sys.modules) - before))\n"
        "print(callable(replayable.recording), callable(replayable.tool))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    loaded_line, names_line = out.stdout.splitlines()[:2]
    loaded = set(ast.literal_eval(loaded_line))
    ours = {m for m in loaded if m.split(".")[0] == "replayable"}
    assert ours == {"replayable", "replayable._lazy", "replayable.errors"}
    for heavy in (
        "typing",
        "re",
        "enum",
        "collections",
        "importlib",
        "asyncio",
        "pyarrow",
        "cryptography",
        "psycopg",
        "zstandard",
        "orjson",
        "msgspec",
    ):
        assert heavy not in loaded, heavy
    assert names_line == "True True"


def test_recording_refuses_a_context_that_is_not_a_mapping() -> None:
    with pytest.raises(TypeError, match="takes a mapping"):
        replayable.recording("memory://", context=["flag"])  # type: ignore[arg-type]


def test_a_synchronous_recording_loads_no_asyncio_and_no_cipher(tmp_path: Path) -> None:
    """A script that records one synchronous tool call into SQLite in clear loads neither
    asyncio, nor concurrent.futures, nor cryptography in the agent's process (they cost a
    start-up a third of its imports); the run is stored all the same, and an async
    workflow and ``ContextThreadPoolExecutor`` still work once asked for."""
    import subprocess
    import sys

    script = (
        "import sys, replayable\n"
        "@replayable.tool\n"
        "def add(a, b):\n"
        "    return a + b\n"
        "@replayable.workflow\n"
        "def flow():\n"
        "    return add(1, 2)\n"
        "with replayable.recording('sqlite:///runs.db') as rec:\n"
        "    flow()\n"
        "heavy = ('asyncio', 'concurrent.futures', 'cryptography')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "print(len(replayable.open_store('sqlite:///runs.db').events(rec.run_ids[0])))\n"
        "import asyncio\n"
        "@replayable.workflow\n"
        "async def aflow():\n"
        "    with replayable.ContextThreadPoolExecutor(1) as pool:\n"
        "        return pool.submit(add, 2, 3).result() + await asyncio.to_thread(add, 1, 1)\n"
        "with replayable.recording('sqlite:///runs.db') as rec:\n"
        "    print(asyncio.run(aflow()))\n"
        "print(len(replayable.open_store('sqlite:///runs.db').events(rec.run_ids[0])))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAYABLE_DATA")}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert out.stdout.splitlines() == ["[]", "1", "7", "2"], out.stderr[-2000:]
