"""The decision context a replay needs beyond calls: retrievals, prompt templates,
snapshots of external state, and what an adapter made of a tool's arguments and result.

- ``retrieval(fn, query, ...)`` (or ``@tool(kind="retrieval")``) records a
  search: the query, and in the event's metadata the id, score and version of
  each document it returned, so a diff can say "document 17 changed from v2 to
  v3".
- ``prompt(name, version, template, **variables)`` renders a template and
  records the template's name and version beside the rendered text; a replay
  whose template or variables changed diverges at that step.
- ``snapshot(name, value)`` records external state the agent decided on (a
  database row, a permission set); a replay hands back the recorded value and
  never reads the world (pass a callable to read it only when live).
- ``@tool(validate=..., normalize=...)``: the arguments as given beside the
  validated ones the tool is called with, and the provider's raw response
  beside the normalized value the agent sees. The raw response is what is
  recorded and served; ``normalize`` is the agent's code and runs again on
  replay, so a changed adapter shows in the new run's metadata.

Feature flags, tenant configuration and permissions that hold for a whole run
go to ``recording(context={...})`` and are kept with each run's metadata.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from replayable.capture.context import _STATE, State
from replayable.capture.runtime import call_site
from replayable.events.codec import to_tree

__all__ = ["documents_of", "prompt", "retrieval", "run_described", "snapshot"]

R = TypeVar("R")

#: Where a document's id, score and version are found, in that order of preference.
_ID_KEYS = ("id", "doc_id", "document_id", "_id", "uuid", "key", "source")
_SCORE_KEYS = ("score", "similarity", "relevance_score", "relevance", "distance")
_VERSION_KEYS = ("version", "doc_version", "revision", "rev", "etag", "updated_at")
_LIST_KEYS = ("documents", "results", "matches", "hits", "items", "data")
_MAX_DOCUMENTS = 200


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _fields(doc: Any) -> Mapping[str, Any]:
    if isinstance(doc, Mapping):
        return doc
    fields = getattr(doc, "__dict__", None)
    if isinstance(fields, dict):
        return fields
    dump = getattr(doc, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump()
        except Exception:
            return {}
        return dumped if isinstance(dumped, dict) else {}
    return {}


def _first(keys: Sequence[str], *places: Mapping[str, Any]) -> Any:
    for place in places:
        for k in keys:
            if place.get(k) is not None:
                return place[k]
    return None


def documents_of(result: Any) -> list[dict[str, Any]]:
    """The id, score and version of each document in a retrieval result, where found.

    Understands lists of dicts, objects (a LangChain ``Document`` with its
    ``metadata``), ``(document, score)`` pairs, and a dict holding such a list
    under ``documents``, ``results``, ``matches``, ``hits``, ``items`` or ``data``.
    """
    items: Any = result
    if isinstance(result, Mapping):
        items = next((result[k] for k in _LIST_KEYS if isinstance(result.get(k), list)), [])
    if not isinstance(items, list | tuple):
        return []
    out: list[dict[str, Any]] = []
    for item in items[:_MAX_DOCUMENTS]:
        doc, score = item, None
        if (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[1], int | float)
            and not isinstance(item[1], bool)
        ):
            doc, score = item
        fields = _fields(doc)
        meta = fields.get("metadata")
        inner = meta if isinstance(meta, Mapping) else {}
        described = {
            "id": _plain(_first(_ID_KEYS, fields, inner)),
            "score": _plain(score if score is not None else _first(_SCORE_KEYS, fields, inner)),
            "version": _plain(_first(_VERSION_KEYS, fields, inner)),
        }
        out.append({k: v for k, v in described.items() if v is not None})
    return out


def _retrieval_meta(query: Any) -> Callable[[Any], dict[str, Any]]:
    def describe(result: Any) -> dict[str, Any]:
        return {"query": to_tree(query), "documents": documents_of(result)}

    return describe


def run_described(
    st: State,
    kind: str,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    request: Any,
    side_effect: bool,
    describe: Callable[[Any], dict[str, Any]],
    site: str | None,
    after: Callable[[Any], Any] | None = None,
) -> Any:
    """A boundary whose event metadata is drawn from its result (``describe``).

    ``after`` (an adapter) turns the recorded result into what the caller gets;
    it runs on replay too, over the served result.
    """
    run = st.run
    assert run is not None
    call = run.begin(st, kind, name, request, side_effect, None, site)
    if not call.live:
        value = call.value()
        return after(value) if after is not None else value
    # The calls made inside belong to this one: replay serves it without running it.
    token = _STATE.set(None)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        _STATE.reset(token)
    if inspect.isawaitable(result):
        return _finish_later(result, call, describe, after)
    return _finish(call, result, describe, after)


def _finish(call: Any, result: Any, describe: Callable[[Any], Any], after: Any) -> Any:
    shown = after(result) if after is not None else result
    call.finish(result, describe(result) if after is None else describe(result) | _shown(shown))
    return shown


async def _finish_later(
    awaitable: Awaitable[Any], call: Any, describe: Callable[[Any], Any], after: Any
) -> Any:
    token = _STATE.set(None)
    try:
        result = await awaitable
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        _STATE.reset(token)
    return _finish(call, result, describe, after)


async def arun_described(
    st: State,
    kind: str,
    name: str,
    fn: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    request: Any,
    side_effect: bool,
    describe: Callable[[Any], dict[str, Any]],
    site: str | None,
    after: Callable[[Any], Any] | None = None,
) -> Any:
    """:func:`run_described` for a coroutine function."""
    run = st.run
    assert run is not None
    call = run.begin(st, kind, name, request, side_effect, None, site)
    if not call.live:
        value = call.value()
        return after(value) if after is not None else value
    return await _finish_later(fn(*args, **kwargs), call, describe, after)


def _shown(value: Any) -> dict[str, Any]:
    return {"normalized": to_tree(value)}


def _name_of(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", type(fn).__name__))


def retrieval(fn: Callable[..., R], query: Any, /, *args: Any, **kwargs: Any) -> R:
    """Call a search ``fn(query, *args, **kwargs)`` as a ``retrieval`` boundary.

    The event's request holds the query and the other arguments; its metadata
    the query and each returned document's id, score and version (see
    :func:`documents_of`). Replay returns the recorded documents. Await the
    result of an async ``fn``.
    """
    st = _STATE.get()
    if st is None or st.run is None:
        return fn(query, *args, **kwargs)
    request: dict[str, Any] = {"query": query}
    if args:
        request["args"] = list(args)
    request.update(kwargs)
    run: Callable[..., Any] = arun_described if inspect.iscoroutinefunction(fn) else run_described
    return run(  # type: ignore[no-any-return]
        st,
        "retrieval",
        _name_of(fn),
        fn,
        (query, *args),
        kwargs,
        request,
        False,
        _retrieval_meta(query),
        call_site(1),
    )


def retrieval_query(request: Any) -> Any:
    """The query of a ``@tool(kind="retrieval")`` call: its ``query`` argument, else its first."""
    if isinstance(request, Mapping):
        if "query" in request:
            return request["query"]
        return next(iter(request.values()), None)
    return request


def retrieval_describer(request: Any) -> Callable[[Any], dict[str, Any]]:
    return _retrieval_meta(retrieval_query(request))


def prompt(name: str, version: str | int, template: str, /, **variables: Any) -> str:
    """Render ``template`` with ``str.format(**variables)`` and record it as a ``prompt``
    event: the template's name, version and text and the variables in the request, the
    rendered text as the response. A replay renders nothing: a changed template, version
    or variable is a divergence at this step, named by field."""
    st = _STATE.get()
    if st is None or st.run is None:
        return template.format(**variables)
    request = {"name": name, "version": version, "template": template, "variables": variables}
    return run_described(  # type: ignore[no-any-return]
        st,
        "prompt",
        name,
        template.format,
        (),
        variables,
        request,
        False,
        lambda text: {"template": name, "version": version, "chars": len(text)},
        call_site(1),
    )


def snapshot(name: str, value: Any, /) -> Any:
    """Record external state the agent decides on (a ``state_read`` event named ``name``)
    and return it; a replay returns the recorded value. When ``value`` is callable it is
    called only when live, so a replay never reads the world."""
    read: Callable[[], Any] = value if callable(value) else (lambda: value)
    st = _STATE.get()
    if st is None or st.run is None:
        return read()
    return run_described(
        st,
        "state_read",
        name,
        read,
        (),
        {},
        {"snapshot": name},
        False,
        lambda _: {"snapshot": True},
        call_site(1),
    )


def described_tool(
    f: Callable[..., Any],
    name: str,
    kind: str,
    side_effect: bool,
    build: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    normalize: Callable[[Any], Any] | None,
    validate: Callable[[dict[str, Any]], Mapping[str, Any]] | None,
) -> Callable[..., Any]:
    """The wrapper ``@tool`` gives a retrieval tool, or a tool with ``validate`` or
    ``normalize``: outside a run it validates and normalizes too, so it behaves the same."""

    def prepare(
        args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], Any, dict[str, Any]]:
        given = build(args, kwargs)
        if validate is None:
            return args, kwargs, given, {}
        checked = dict(validate(dict(given)))
        extra = {"arguments_given": to_tree(given)} if checked != given else {}
        return (), checked, checked, extra

    def describer(request: Any, extra: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
        base = retrieval_describer(request) if kind == "retrieval" else None

        def describe(result: Any) -> dict[str, Any]:
            return {**(base(result) if base is not None else {}), **extra}

        return describe

    if inspect.iscoroutinefunction(f):

        async def call_async(*args: Any, **kwargs: Any) -> Any:
            a, k, request, extra = prepare(args, kwargs)
            st = _STATE.get()
            if st is None or st.run is None:
                result = await f(*a, **k)
                return normalize(result) if normalize is not None else result
            return await arun_described(
                st, kind, name, f, a, k, request, side_effect,
                describer(request, extra), call_site(1), normalize,
            )  # fmt: skip

        return call_async

    def call_sync(*args: Any, **kwargs: Any) -> Any:
        a, k, request, extra = prepare(args, kwargs)
        st = _STATE.get()
        if st is None or st.run is None:
            result = f(*a, **k)
            return normalize(result) if normalize is not None else result
        return run_described(
            st, kind, name, f, a, k, request, side_effect,
            describer(request, extra), call_site(1), normalize,
        )  # fmt: skip

    return call_sync
