"""Names a package imports on first use (PEP 562)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["import_module", "lazy"]


def import_module(name: str) -> Any:
    """``importlib.import_module(name)`` for an absolute name, without importing the
    ``importlib`` package (and ``warnings``) on the way: ``import replayable`` loads
    only what it cannot do without."""
    module = sys.modules.get(name)
    if module is None:
        __import__(name)
        module = sys.modules[name]
    return module


def lazy(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names listed in ``where``
    (name -> module) are imported when first used, then kept as ordinary globals."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
