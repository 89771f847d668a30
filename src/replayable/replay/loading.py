"""Finding the function a replay calls: only a registered workflow, from an allowed module,
imported under the guard.

The run record names its entrypoint (``module:qualname``) and, for a script
run as ``python tour.py``, the script's file. Both were written by whoever
could write to the store, so before anything is imported the module is checked
against :mod:`replayable.allowlist`, and after import the object must be a
``@replayable.workflow`` whose name is the recorded workflow's. The import
itself runs under :func:`~replayable.capture.guard.guarded`: a script whose
top level records, calls a model or runs a tool is stopped there.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from replayable import allowlist
from replayable.capture.boundaries import workflow_info
from replayable.capture.guard import Guard, GuardStop, guarded
from replayable.capture.runtime import intercept_http
from replayable.errors import (
    EntryImportError,
    EntrypointNotFoundError,
    ReplayError,
    UntrustedRecordError,
)
from replayable.events.model import Event, Run

__all__ = ["check_records", "load_entrypoint"]

_HOW = (
    'put the script\'s main code under `if __name__ == "__main__":`, or pass fn= to '
    "replay() (`--entry module:function` on the command line)"
)


def load_entrypoint(run: Run, entry: str | None = None) -> Callable[..., Any]:
    """The ``@workflow`` function that recorded ``run``, imported safely.

    ``entry`` (``module:function``) overrides the recorded entrypoint: the caller
    names the module, so the allowlist is not consulted for it, but the import is
    still guarded. Raises :class:`~replayable.errors.UntrustedRecordError` for an
    entrypoint replay will not import or call, :class:`EntrypointNotFoundError`
    when it cannot be found and :class:`~replayable.errors.EntryImportError` when
    importing it failed or its top level tried to run live code.
    """
    name = entry or run.start.entrypoint
    module_name, sep, qualname = name.partition(":")
    parts = qualname.split(".")
    if not sep or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise UntrustedRecordError(
            name, "an entrypoint", "it is not a module:function name", run_id=run.run_id
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    file = run.start.code.get("file")
    file = file if isinstance(file, str) else None
    module = _main_module(file) if module_name == "__main__" else None
    if module is None and module_name == "__main__":
        module = _script(run, name, file, trusted=entry is not None)
    elif module is None:
        module = _module(run, name, module_name, file, trusted=entry is not None)
    target: Any = module
    for part in parts:
        target = getattr(target, part, None)
        if target is None:
            raise EntrypointNotFoundError(
                f"module {module.__name__!r} has no {qualname!r}, the entrypoint of run "
                f"{run.run_id}; pass fn= to replay() or --entry module:function"
            )
    if not callable(target):
        raise EntrypointNotFoundError(f"entrypoint {name!r} is not callable")
    if entry is None:
        _check_workflow(run, name, target)
    return target  # type: ignore[no-any-return]


def _check_workflow(run: Run, name: str, target: Any) -> None:
    wf = workflow_info(target)
    if wf is None:
        raise UntrustedRecordError(
            name,
            "an entrypoint",
            "it is not a function decorated with @replayable.workflow",
            run_id=run.run_id,
        )
    if wf.name != run.workflow:
        raise UntrustedRecordError(
            name,
            "an entrypoint",
            f"it is workflow {wf.name!r}, but the run recorded workflow {run.workflow!r}",
            run_id=run.run_id,
        )


def _main_module(file: str | None) -> ModuleType | None:
    """The running ``__main__``, when it is the recorded script (it already ran)."""
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main is not None and main_file is None and file is None:
        # An interactive session (a notebook, the REPL) replaying its own run: its
        # namespace is already there, and only its registered workflow is called.
        return main
    if main is None or not main_file or file is None:
        return None
    if Path(main_file).resolve() != Path(file).resolve():
        return None
    return main if allowlist.entry_allowed("__main__") is None else None


def _module(
    run: Run, name: str, module_name: str, file: str | None, *, trusted: bool
) -> ModuleType:
    loaded = sys.modules.get(module_name)
    if not trusted:
        why = allowlist.entry_allowed(module_name)
        if why is not None:
            raise UntrustedRecordError(name, "an entrypoint", why, run_id=run.run_id)
    if loaded is not None:
        return loaded
    top = module_name.split(".", 1)[0]
    try:
        # The top-level package is located without running it (a dotted name's
        # parents would be imported, so that lookup happens under the guard).
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        if file is not None and Path(file).is_file():
            return _script(run, name, file, trusted=trusted)
        raise EntrypointNotFoundError(
            f"cannot import the entrypoint {name!r} of run {run.run_id}: no module named "
            f"{top!r}; run from the project's directory or pass fn= to replay()"
        )
    spec = importlib.util.find_spec(top)
    origin = (spec.origin if spec is not None else None) or module_name
    return _guarded_import(run, module_name, origin, lambda: importlib.import_module(module_name))


def _script(run: Run, name: str, file: str | None, *, trusted: bool) -> ModuleType:
    if file is None or not Path(file).is_file():
        raise EntrypointNotFoundError(
            f"cannot find the script of entrypoint {name!r} of run {run.run_id}"
            + (f" ({file} is gone)" if file else "")
            + "; pass fn= to replay() or --entry module:function"
        )
    if not trusted and not allowlist.file_allowed(file):
        raise UntrustedRecordError(
            name,
            "an entrypoint",
            f"the script {file} is outside this project ({Path.cwd()})",
            run_id=run.run_id,
        )
    path = Path(file).resolve()
    spec = importlib.util.spec_from_file_location(f"_replayable_entry_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise EntrypointNotFoundError(f"cannot load the script {path} of run {run.run_id}")
    loader = spec.loader

    def load() -> ModuleType:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            loader.exec_module(module)
        except BaseException:
            sys.modules.pop(spec.name, None)
            raise
        return module

    return _guarded_import(run, str(path), str(path), load)


def _seam_first() -> None:
    """Put the HTTP clients under the seam before the module's top level can use them, so
    an SDK call there meets the guard instead of the network."""
    for library in ("httpx2", "httpx"):
        try:
            if library not in sys.modules and importlib.util.find_spec(library) is None:
                continue
            importlib.import_module(library)
        except ImportError:
            continue
    intercept_http()


def _guarded_import(run: Run, label: str, file: str, load: Callable[[], ModuleType]) -> ModuleType:
    _seam_first()
    guard: Guard
    with guarded(label, file) as guard:
        try:
            module = load()
        except GuardStop:
            module = None
        except ReplayError:
            raise
        except ModuleNotFoundError as exc:
            if guard.refused:
                module = None
            else:
                raise EntrypointNotFoundError(
                    f"cannot import the entrypoint module {label} of run {run.run_id}: {exc}; "
                    "run from the project's directory or pass fn= to replay()"
                ) from None
        except (Exception, SystemExit) as exc:
            if guard.refused:
                module = None
            else:
                raise EntryImportError(
                    f"cannot replay run {run.run_id}: importing its entry module {label} "
                    f"raised {type(exc).__name__}: {exc}"
                ) from exc
    if guard.refused or module is None:
        sys.modules.pop(getattr(module, "__name__", ""), None)
        raise EntryImportError(
            f"replay of run {run.run_id} stopped: importing {label} ran its top-level "
            f"code, which tried {guard.refused[0]}; nothing was run live. To replay, " + _HOW
        )
    return module


_CLASS_TAGS = frozenset({"enum", "namedtuple", "dataclass", "pydantic"})


def check_records(run: Run, events: list[Event]) -> None:
    """Refuse, before anything runs, a run whose input or events name a class decoding
    would not build (:class:`~replayable.errors.UntrustedRecordError`, with run and step),
    or whose recorded values were erased (:class:`~replayable.errors.ReplayError`)."""
    check_not_erased(run)
    _check_text(run.start.input, run.run_id, None)
    for ev in events:
        if ev.encoding == "tagged" and ev.response is not None:
            _check_text(ev.response, run.run_id, ev.seq)


def check_not_erased(run: Run) -> None:
    """Refuse a run whose input, output or error was erased by crypto-shredding: there is
    nothing left to call the workflow with, or to compare its outcome against."""
    if run.erased is None:
        return
    what = "input" if run.start.input_digest is not None else "recorded outcome"
    raise ReplayError(
        f"run {run.run_id} cannot be replayed: its {what} was {run.erased} (its data key "
        "was destroyed); its events' metadata and hashes remain for audit"
    )


def _check_text(text: str, run_id: str, step: int | None) -> None:
    if '"cls"' not in text:
        return
    try:
        tree = orjson.loads(text)
    except orjson.JSONDecodeError:
        return  # the reader reports the bad row when it decodes it
    stack = [tree]
    while stack:
        node = stack.pop()
        if type(node) is list:
            stack.extend(node)
        elif type(node) is dict:
            tag = node.get("$t")
            name = node.get("cls")
            if tag in _CLASS_TAGS and isinstance(name, str):
                module = name.partition(":")[0]
                why = allowlist.module_allowed(module)
                if why is not None:
                    raise UntrustedRecordError(
                        name, f"a {tag} class", why, run_id=run_id, step=step
                    )
            stack.extend(node.values())
