"""Patching at first import: callbacks run whenever the watched module loads."""

from __future__ import annotations

import importlib
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayable.capture import imports


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for throwaway modules; they are unloaded afterwards."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_callback_runs_when_the_module_is_imported_later(modules: Path) -> None:
    """Registered before the import: run right after the module's code, before the importer."""
    (modules / "hooked_late.py").write_text("VALUE = 1\n")
    seen: list[int] = []
    imports.when_imported("hooked_late", lambda m: seen.append(m.VALUE))
    assert seen == []
    assert "hooked_late" in imports.pending()
    module = importlib.import_module("hooked_late")
    assert seen == [1]
    # The module sees its own loader afterwards, as if nothing had been in between.
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert module.__spec__ is not None
    assert module.__spec__.loader is module.__loader__


def test_callback_runs_at_once_for_a_loaded_module(modules: Path) -> None:
    """Already imported: the callback runs on registration, and only once."""
    (modules / "hooked_early.py").write_text("VALUE = 2\n")
    module = importlib.import_module("hooked_early")
    seen: list[types.ModuleType] = []

    def cb(m: types.ModuleType) -> None:
        seen.append(m)

    imports.when_imported("hooked_early", cb)
    imports.when_imported("hooked_early", cb)
    assert seen == [module]


def test_submodule_and_thread_import(modules: Path) -> None:
    """A watched submodule imported by its package, from another thread."""
    pkg = modules / "hooked_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from hooked_pkg import inner\n")
    (pkg / "inner.py").write_text("class Client:\n    def send(self):\n        return 'real'\n")
    imports.when_imported("hooked_pkg.inner", lambda m: setattr(m.Client, "send", lambda s: "x"))
    t = threading.Thread(target=importlib.import_module, args=("hooked_pkg",))
    t.start()
    t.join()
    assert sys.modules["hooked_pkg.inner"].Client().send() == "x"


def test_reimported_module_is_patched_again(modules: Path) -> None:
    """A module removed from sys.modules and imported afresh gets the callbacks again."""
    (modules / "hooked_again.py").write_text("VALUE = 3\n")
    seen: list[int] = []
    imports.when_imported("hooked_again", lambda m: seen.append(id(m)))
    first = importlib.import_module("hooked_again")
    del sys.modules["hooked_again"]
    second = importlib.import_module("hooked_again")
    assert first is not second
    assert seen == [id(first), id(second)]


def test_a_failing_patch_warns_and_the_import_still_works(modules: Path) -> None:
    """A broken callback never breaks the agent's import; it says what is not recorded."""
    (modules / "hooked_broken.py").write_text("VALUE = 4\n")

    def broken(m: types.ModuleType) -> None:
        raise AttributeError("no such class")

    imports.when_imported("hooked_broken", broken)
    with pytest.warns(RuntimeWarning, match="could not intercept hooked_broken"):
        module = importlib.import_module("hooked_broken")
    assert module.VALUE == 4
