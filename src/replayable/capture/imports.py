"""Patch a library when it is first imported, whenever that happens.

Interception must not depend on import order: an agent that imports
``openai`` inside its workflow, in a thread, or long after the recording
started is recorded like one that imported it first. :func:`when_imported`
registers a callback for a module name; if the module is already loaded the
callback runs at once, otherwise a finder on ``sys.meta_path`` wraps the
module's loader and runs the callback right after the module's own code
(before the importer sees it). Each callback runs once per module object.

The finder costs one dictionary lookup per import of a module not loaded
yet, and nothing at all once a library is loaded; the patches it installs
act only while a run is active.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["pending", "when_imported"]

Callback = Callable[[types.ModuleType], None]

_lock = threading.RLock()
_hooks: dict[str, list[Callback]] = {}
#: Set on a module: the callbacks already applied to it (a module imported
#: afresh, after being removed from ``sys.modules``, gets them again).
_DONE = "__replayable_patched__"


def when_imported(name: str, callback: Callback) -> None:
    """Run ``callback(module)`` once ``name`` is imported (now, if it already is).

    A callback that raises is reported as a warning naming the module; the
    import itself still succeeds, since a failed patch must never break the
    agent (the run then records less, which the gap detector reports).
    """
    with _lock:
        _install()
        callbacks = _hooks.setdefault(name, [])
        if callback in callbacks:
            module = sys.modules.get(name)
        else:
            callbacks.append(callback)
            module = sys.modules.get(name)
    if module is not None and _initialised(module):
        _apply(name, module)


def pending() -> list[str]:
    """Module names with a callback registered that are not imported yet."""
    with _lock:
        return sorted(n for n in _hooks if n not in sys.modules)


def _initialised(module: types.ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def _apply(name: str, module: types.ModuleType) -> None:
    with _lock:
        done: set[int] | None = module.__dict__.get(_DONE)
        if done is None:
            done = set()
            module.__dict__[_DONE] = done
        todo = [cb for cb in _hooks.get(name, ()) if id(cb) not in done]
        done.update(id(cb) for cb in todo)
    for cb in todo:
        try:
            cb(module)
        except Exception as exc:  # a broken patch must not break the agent's import
            import warnings

            warnings.warn(
                f"replayable could not intercept {name}: {type(exc).__name__}: {exc}; "
                "calls made through it are not recorded",
                RuntimeWarning,
                stacklevel=2,
            )


class _Loader(importlib.abc.Loader):
    """The module's own loader, followed by the callbacks registered for it."""

    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module sees its own loader, as if no one had been in between.
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._inner
        module.__loader__ = self._inner
        self._inner.exec_module(module)
        _apply(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds watched modules with the finders after it and wraps their loader."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks:
            return None
        meta_path = sys.meta_path
        try:
            after = meta_path[meta_path.index(self) + 1 :]
        except ValueError:
            return None
        for finder in after:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader, fullname)
            return spec  # type: ignore[no-any-return]
        return None


_finder = _Finder()


def _install() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
