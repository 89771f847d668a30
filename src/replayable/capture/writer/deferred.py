"""Events the writer builds: the agent hands off raw parts, a builder makes the event.

An HTTP call through the seam is the case in point: its request body must be
parsed, an LLM call described (model, messages, usage, output) and a stream
assembled before the event exists. None of that decides what the agent does
next, so a recording run hands the raw parts to the writer (in the writer
process, off the agent's interpreter) and the :class:`~replayable.capture.writer.linker.Linker`
calls the builder the hand-off names. A builder is a function
``(kind, name, raw request, raw response | None, metadata | None) ->
(request bytes, response bytes | None, tagged, metadata)``, imported where it
first runs.

If a builder fails, the event is still recorded, with its raw parts as the
request and response and the error in its metadata: nothing handed off is
lost to a bug in a builder.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from replayable.events.codec import encode_request, encode_value

__all__ = ["Builder", "expand", "register_builder"]

log = logging.getLogger("replayable.writer")

Builder = Callable[
    [str, str, Any, Any, "dict[str, Any] | None"],
    tuple[bytes, "bytes | None", bool, "dict[str, Any]"],
]

#: Builder name -> "module:function", imported on first use.
_PATHS: dict[str, str] = {"http": "replayable.integrations._build:expand"}
_LOADED: dict[str, Builder] = {}


def register_builder(name: str, path: str) -> None:
    """Name the builder at ``path`` (``"package.module:function"``)."""
    _PATHS[name] = path
    _LOADED.pop(name, None)


def _load(name: str) -> Builder:
    found = _LOADED.get(name)
    if found is None:
        path = _PATHS.get(name)
        if path is None:
            raise LookupError(f"no event builder is named {name!r}")
        module, _, attr = path.partition(":")
        found = _LOADED[name] = getattr(importlib.import_module(module), attr)
    return found


def expand(
    builder: str, kind: str, name: str, req: Any, resp: Any, meta: dict[str, Any] | None
) -> tuple[bytes, bytes | None, bool, dict[str, Any] | None]:
    """The request bytes, response bytes, encoding flag and metadata of a deferred event."""
    try:
        return _load(builder)(kind, name, req, resp, meta)
    except Exception as exc:
        log.exception("replayable: building a %s event (%s) failed", kind, name)
        note = {"build_error": f"{builder}: {type(exc).__name__}: {exc}"}
        response, tagged = (None, False) if resp is None else encode_value({"raw": resp})
        return encode_request({"raw": req}), response, tagged, {**(meta or {}), **note}
