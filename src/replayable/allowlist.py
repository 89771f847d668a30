"""Which code a stored record may name: replay's entrypoints and the classes decoding builds.

A run record names its entry function as ``module:qualname`` and a tagged
value names its class the same way. Whoever could write to the store chose
those names, so they are checked here before anything is imported:

- **Entry modules** (what ``replay`` imports and calls): the modules matched by
  ``[tool.replayable] entrypoints`` in the nearest pyproject.toml (or
  ``$REPLAYABLE_ENTRYPOINTS``, or :func:`configure`), e.g.
  ``["myagents.*", "tour"]``. Without that setting, the packages of the current
  project: modules whose file lies under the project's folder (the nearest
  pyproject.toml's, else the current directory), never the standard library or
  an installed package (site-packages) unless named.
- **Classes** (what decoding builds: enums, named tuples, dataclasses, pydantic
  models, exceptions): classes from the entry modules above, from replayable
  itself and from the integrated SDKs (:data:`SDK_PACKAGES`); standard-library
  classes only from modules already imported (nothing is imported for them).
  Types taught with ``register_codec`` are found by their registered name.

Where a module would be found is checked with :func:`importlib.util.find_spec`
on its top-level package, which locates it without executing it. A name that
fails any check raises :class:`~replayable.errors.UntrustedRecordError`
before any import.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import importlib.util
import os
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from replayable.errors import UntrustedRecordError

__all__ = [
    "SDK_PACKAGES",
    "configure",
    "entry_allowed",
    "file_allowed",
    "module_allowed",
    "patterns",
    "resolve",
    "trust_folder",
]

#: Packages whose classes the integrations record (SDK responses, events, errors);
#: ``name_*`` companions (``langchain_openai``, ``mcp_types``) count as theirs.
SDK_PACKAGES: Final = frozenset(
    {
        "ag2",
        "agents",
        "anthropic",
        "autogen",
        "httpcore",
        "httpx",
        "httpx2",
        "langchain",
        "langgraph",
        "litellm",
        "mcp",
        "openai",
        "pydantic_ai",
    }
)

_configured: tuple[str, ...] | None = None
_folders: list[Path] = []


def configure(entrypoints: Iterable[str] | None) -> None:
    """Set the entry-module patterns (``None``: back to the pyproject/environment default)."""
    global _configured
    _configured = None if entrypoints is None else tuple(entrypoints)
    _decide.cache_clear()


def trust_folder(folder: str | os.PathLike[str]) -> None:
    """Treat modules under ``folder`` as part of the project (the CLI's bundled examples)."""
    path = Path(folder).resolve()
    if path not in _folders:
        _folders.append(path)
        _decide.cache_clear()


def patterns() -> tuple[str, ...] | None:
    """The entry-module patterns in force, or ``None`` for the project default."""
    if _configured is not None:
        return _configured
    env = os.environ.get("REPLAYABLE_ENTRYPOINTS")
    if env:
        return tuple(p.strip() for p in env.split(",") if p.strip())
    found = _pyproject_entrypoints(os.getcwd())
    return found


@functools.lru_cache(maxsize=16)
def _pyproject_entrypoints(cwd: str) -> tuple[str, ...] | None:
    root = _project_root(cwd)
    file = root / "pyproject.toml"
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    value = data.get("tool", {}).get("replayable", {}).get("entrypoints")
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


@functools.lru_cache(maxsize=16)
def _project_root(cwd: str) -> Path:
    here = Path(cwd).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return here


def _sdk(top: str) -> bool:
    return top in SDK_PACKAGES or top.split("_", 1)[0] in SDK_PACKAGES


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*") and module == pattern[:-2]:
        return True
    if fnmatch.fnmatchcase(module, pattern):
        return True
    # A bare package name admits its submodules too.
    return "*" not in pattern and module.startswith(pattern + ".")


def _valid(module: str) -> bool:
    return bool(module) and all(part.isidentifier() for part in module.split("."))


def _stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top == "__main__"


def _installed(path: Path) -> bool:
    """Whether ``path`` is inside the interpreter's own folders or an installed package."""
    parts = set(path.parts)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        if path.is_relative_to(Path(prefix).resolve()):
            return True
    return False


def _locations(top: str) -> list[Path] | None:
    """Where the top-level module ``top`` lives, found without executing it."""
    loaded = sys.modules.get(top)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        paths = list(getattr(loaded, "__path__", None) or ())
        found = [Path(file)] if file else [Path(p) for p in paths]
        return [p.resolve() for p in found] or None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return [Path(spec.origin).resolve()]
    locations = list(spec.submodule_search_locations or ())
    return [Path(p).resolve() for p in locations] or None


def file_allowed(path: str | os.PathLike[str]) -> bool:
    """Whether a script file lies in the project (or a trusted folder), not in an install."""
    file = Path(path).resolve()
    if _installed(file):
        return False
    roots = [_project_root(os.getcwd()), Path.cwd().resolve(), *_folders]
    return any(file.is_relative_to(root) for root in roots)


def entry_allowed(module: str) -> str | None:
    """``None`` when ``module`` may be imported as a replay's entry module, else why not."""
    return (
        _main_allowed() if module == "__main__" else _decide(module, True, os.getcwd(), patterns())
    )


def module_allowed(module: str) -> str | None:
    """``None`` when decoding may import classes from ``module``, else why not."""
    if module == "__main__":
        return _main_allowed()
    if module in sys.modules and _stdlib(module.split(".", 1)[0]):
        return None  # nothing is imported; the class itself is checked by its kind
    return _decide(module, False, os.getcwd(), patterns())


def _main_allowed() -> str | None:
    """The running script (already executed, so nothing runs again) if it is the project's."""
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if file and file_allowed(file):
        return None
    return "module '__main__' is not a script of this project"


@functools.lru_cache(maxsize=1024)
def _decide(module: str, entry: bool, cwd: str, pats: tuple[str, ...] | None) -> str | None:
    if not _valid(module):
        return f"{module!r} is not a module name"
    top = module.split(".", 1)[0]
    if not entry and (top == "replayable" or _sdk(top)):
        return None
    if pats is not None:
        if any(_matches(module, p) for p in pats):
            return None
        return f"module {module!r} is not in [tool.replayable] entrypoints ({', '.join(pats)})"
    if _stdlib(top):
        return f"module {module!r} is in the standard library"
    found = _locations(top)
    if found is None:
        return f"no module named {top!r} is importable from here"
    if any(_installed(p) for p in found):
        return f"module {module!r} is an installed package, not part of this project"
    if not any(file_allowed(p) for p in found):
        return f"module {module!r} is outside this project ({_project_root(cwd)})"
    return None


def _how_to_allow(module: str) -> str:
    top = module.split(".", 1)[0]
    return f'to trust it, name it in pyproject.toml: [tool.replayable] entrypoints = ["{top}.*"]'


def resolve(name: str, *, entry: bool = False, what: str = "type", loaded: bool = False) -> Any:
    """The object ``module:qualname`` names, imported only from an allowed module.

    With ``loaded`` (exception types), any module already imported is accepted as
    well: nothing is imported for it, and the caller checks what the name is.

    Raises :class:`~replayable.errors.UntrustedRecordError` (nothing imported) when
    the name or its module is refused; ImportError or AttributeError when it is
    allowed but missing.
    """
    module_name, sep, qualname = name.partition(":")
    if not sep or not qualname:
        raise UntrustedRecordError(name, what, f"{name!r} is not a module:qualname name")
    parts = qualname.split(".")
    if not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise UntrustedRecordError(name, what, f"{qualname!r} is not a plain qualified name")
    if entry:
        why = entry_allowed(module_name)
    elif loaded and module_name in sys.modules:
        why = None
    else:
        why = module_allowed(module_name)
    if why is not None:
        raise UntrustedRecordError(name, what, f"{why}; {_how_to_allow(module_name)}")
    obj: Any = sys.modules.get(module_name) or importlib.import_module(module_name)
    for part in parts:
        obj = getattr(obj, part)
    return obj
