"""``replayable.deterministic()``: the clock, ``uuid4`` and ``random`` served from the tape.

Inside ``with replayable.deterministic():`` (or on a function decorated with
it), calls the agent's own code makes to ``time.time()``,
``datetime.datetime.now()`` / ``utcnow()`` / ``today()``,
``datetime.date.today()``, ``uuid.uuid4()`` and the module-level functions
of ``random`` are recorded as ``clock``, ``uuid`` and ``random`` events,
and a replay returns the recorded values.

How it stays out of everyone else's way:

- The functions are replaced once, on first use (or by :func:`install`), by
  wrappers that call straight through unless the caller runs inside a
  recorded run *and* inside ``deterministic()``. Both are context variables,
  so other threads and asyncio tasks of the process are untouched, and code
  started from inside the block (tasks, ``replayable.carry``) inherits it.
- Only the agent's code is served: a call whose immediate caller is the
  standard library, replayable itself or a known SDK or framework package
  (openai, anthropic, httpx, langchain, langgraph, autogen, mcp, pydantic …)
  reaches the real function, so retry jitter, idempotency keys and logging
  timestamps stay live. Add packages with ``deterministic(skip=("mylib",))``.
- A call made inside another boundary (a ``@tool``, an ``llm`` call) belongs
  to that boundary, which replay serves whole; it is not recorded.
- ``time.monotonic``, ``time.perf_counter`` and ``asyncio``'s clock are never
  touched.

What it cannot reach:

- Names bound before the wrappers were installed: ``from time import time``,
  ``from random import random`` or ``from uuid import uuid4`` executed
  earlier keep the real function. Call :func:`install` at program start
  (before importing the agent's modules) or use module attributes
  (``time.time()``, ``random.random()``). ``datetime`` is the exception: its
  ``now``, ``utcnow`` and ``date.today`` (which ``datetime.today`` inherits)
  are replaced on the classes themselves (CPython), so ``from datetime import datetime`` works
  whenever it ran.
- ``time.time_ns()``, ``time.localtime()``/``time.gmtime()`` without an
  argument, ``os.urandom``, ``secrets``, ``random.Random``/``SystemRandom``
  instances of the agent's own, and ``numpy.random``.
- C extensions and native libraries that read the clock or entropy
  themselves.
- ``random.sample(..., counts=...)`` stays live.
"""

from __future__ import annotations

import contextvars
import ctypes
import datetime as _dt
import functools
import gc
import inspect
import random as _random
import sys
import sysconfig
import threading
import time as _time
import uuid as _uuid
from collections.abc import Callable, Iterable, MutableSequence, Sequence
from types import FrameType, TracebackType
from typing import Any, TypeVar

from replayable.capture.context import active_state
from replayable.capture.runtime import Call

__all__ = ["deterministic", "install", "installed"]

F = TypeVar("F", bound=Callable[..., Any])

_ENABLED: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "replayable_deterministic", default=None
)

#: Top-level packages whose calls always reach the real functions.
LIBRARY_PACKAGES: frozenset[str] = frozenset(
    {
        "replayable",
        "openai",
        "anthropic",
        "httpx",
        "httpx2",
        "httpcore",
        "h11",
        "h2",
        "anyio",
        "sniffio",
        "litellm",
        "langchain",
        "langchain_core",
        "langchain_openai",
        "langgraph",
        "langsmith",
        "autogen",
        "mcp",
        "mcp_types",
        "pydantic",
        "pydantic_core",
        "requests",
        "urllib3",
        "tenacity",
        "backoff",
        "opentelemetry",
        "starlette",
        "uvicorn",
        "sse_starlette",
        "tiktoken",
        "msgspec",
        "orjson",
        "_pytest",
        "pytest",
        "pluggy",
    }
)

_STDLIB = tuple(
    {p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}
)
_SITE = ("site-packages", "dist-packages")

_real_time = _time.time
_real_datetime = _dt.datetime
_real_uuid4 = _uuid.uuid4
_real_random: dict[str, Callable[..., Any]] = {}

_lock = threading.Lock()
_installed = False
_library_cache: dict[str, bool] = {}


def _is_library(frame: FrameType, extra: frozenset[str]) -> bool:
    module = frame.f_globals.get("__name__") or ""
    top = module.partition(".")[0]
    if top in LIBRARY_PACKAGES or top in extra:
        return True
    filename = frame.f_code.co_filename
    known = _library_cache.get(filename)
    if known is None:
        known = filename.startswith(_STDLIB) and not any(s in filename for s in _SITE)
        _library_cache[filename] = known
    return known


def _caller(depth: int) -> tuple[Any, str] | None:
    """The run state and call site if the call ``depth`` frames up should be served."""
    skip = _ENABLED.get()
    if skip is None:
        return None
    st = active_state()
    if st is None:
        return None
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return None
    if _is_library(frame, skip):
        return None
    return st, f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _record(st: Any, site: str, kind: str, name: str, fn: Callable[[], Any], request: Any) -> Any:
    return st.run.call(st, Call(kind, name, fn, (), {}, request, False, None, site))


# -- time and datetime ---------------------------------------------------------


def _time_time() -> float:
    hit = _caller(1)
    if hit is None:
        return _real_time()
    return _record(hit[0], hit[1], "clock", "time.time", _real_time, {})  # type: ignore[no-any-return]


def _now_us() -> int:
    return _time.time_ns() // 1000


_EPOCH = _real_datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _from_us(us: int, tz: _dt.tzinfo | None) -> _dt.datetime:
    aware = _EPOCH + _dt.timedelta(microseconds=us)
    if tz is None:
        return aware.astimezone().replace(tzinfo=None)
    return aware.astimezone(tz)


def _recorded_now(depth: int) -> int | None:
    hit = _caller(depth + 1)
    if hit is None:
        return None
    return _record(hit[0], hit[1], "clock", "datetime.now", _now_us, {})  # type: ignore[no-any-return]


def _same_class(cls: type[Any], value: _dt.datetime) -> Any:
    if cls is _real_datetime:
        return value
    return cls(
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
        value.tzinfo,
        fold=value.fold,
    )


def _patch_datetime() -> None:
    """Replace ``now``, ``utcnow`` and ``today`` on ``datetime.datetime`` and ``today`` on
    ``datetime.date`` in the C types themselves, so every name bound to the classes (also
    ``from datetime import datetime`` made earlier) sees them and type identity stays."""
    dt_dict = _type_dict(_real_datetime)
    date_dict = _type_dict(_dt.date)
    real_now, real_utcnow = dt_dict["now"], dt_dict["utcnow"]
    real_today = date_dict["today"]

    def now(cls: type[Any], tz: _dt.tzinfo | None = None) -> Any:
        us = _recorded_now(1)
        if us is None:
            return real_now.__get__(None, cls)(tz)
        return _same_class(cls, _from_us(us, tz))

    def utcnow(cls: type[Any]) -> Any:
        us = _recorded_now(1)
        if us is None:
            return real_utcnow.__get__(None, cls)()
        return _same_class(cls, _from_us(us, _dt.UTC).replace(tzinfo=None))

    def today(cls: type[Any]) -> Any:
        # date.today, inherited by datetime.today
        us = _recorded_now(1)
        if us is None:
            return real_today.__get__(None, cls)()
        local = _from_us(us, None)
        if issubclass(cls, _real_datetime):
            return _same_class(cls, local)
        return cls(local.year, local.month, local.day)

    for name, fn in (("now", now), ("utcnow", utcnow)):
        fn.__name__ = fn.__qualname__ = name
        dt_dict[name] = classmethod(fn)
    today.__name__ = today.__qualname__ = "today"
    date_dict["today"] = classmethod(today)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(_real_datetime))
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(_dt.date))


def _type_dict(cls: type[Any]) -> dict[str, Any]:
    (namespace,) = gc.get_referents(cls.__dict__)
    if not isinstance(namespace, dict):
        raise TypeError(f"cannot reach the namespace of {cls!r}")
    return namespace


# -- uuid -------------------------------------------------------------------------


def _uuid4() -> _uuid.UUID:
    hit = _caller(1)
    if hit is None:
        return _real_uuid4()
    return _record(hit[0], hit[1], "uuid", "uuid.uuid4", _real_uuid4, {})  # type: ignore[no-any-return]


# -- random -----------------------------------------------------------------------


def _scalar(name: str) -> Callable[..., Any]:
    real = getattr(_random, name)
    _real_random[name] = real

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        hit = _caller(1)
        if hit is None:
            return real(*args, **kwargs)
        request: dict[str, Any] = {}
        if args:
            request["args"] = list(args)
        if kwargs:
            request["kwargs"] = kwargs
        return _record(
            hit[0], hit[1], "random", f"random.{name}", lambda: real(*args, **kwargs), request
        )

    return wrapper


def _randbelow(n: int) -> int:
    return _real_random["randrange"](n)  # type: ignore[no-any-return]


def _choice(seq: Sequence[Any]) -> Any:
    hit = _caller(1)
    if hit is None or not seq:
        return _real_random["choice"](seq)
    n = len(seq)
    index = _record(hit[0], hit[1], "random", "random.choice", lambda: _randbelow(n), {"n": n})
    return seq[index]


def _choices(
    population: Sequence[Any],
    weights: Sequence[float] | None = None,
    *,
    cum_weights: Sequence[float] | None = None,
    k: int = 1,
) -> list[Any]:
    hit = _caller(1)
    real = _real_random["choices"]
    if hit is None:
        return real(population, weights, cum_weights=cum_weights, k=k)  # type: ignore[no-any-return]
    n = len(population)
    w = None if weights is None else list(weights)
    cw = None if cum_weights is None else list(cum_weights)
    indices = _record(
        hit[0],
        hit[1],
        "random",
        "random.choices",
        lambda: real(range(n), w, cum_weights=cw, k=k),
        {"n": n, "weights": w, "cum_weights": cw, "k": k},
    )
    return [population[i] for i in indices]


def _sample(population: Sequence[Any], k: int, *, counts: Iterable[int] | None = None) -> list[Any]:
    hit = _caller(1)
    real = _real_random["sample"]
    if hit is None or counts is not None:
        return real(population, k, counts=counts)  # type: ignore[no-any-return]
    n = len(population)
    indices = _record(
        hit[0], hit[1], "random", "random.sample", lambda: real(range(n), k), {"n": n, "k": k}
    )
    return [population[i] for i in indices]


def _shuffle(x: MutableSequence[Any]) -> None:
    hit = _caller(1)
    real = _real_random["shuffle"]
    if hit is None:
        real(x)
        return
    n = len(x)

    def permutation() -> list[int]:
        order = list(range(n))
        real(order)
        return order

    order = _record(hit[0], hit[1], "random", "random.shuffle", permutation, {"n": n})
    x[:] = [x[i] for i in order]


_SCALARS = (
    "random",
    "uniform",
    "randint",
    "randrange",
    "getrandbits",
    "randbytes",
    "gauss",
    "normalvariate",
    "lognormvariate",
    "triangular",
    "expovariate",
    "betavariate",
    "gammavariate",
    "paretovariate",
    "vonmisesvariate",
    "weibullvariate",
)


def install() -> None:
    """Put the wrappers in place (idempotent). :func:`deterministic` does this on first
    use; call it at program start so ``from time import time``-style imports made
    afterwards get the wrappers too. The wrappers do nothing outside ``deterministic()``."""
    global _installed
    with _lock:
        if _installed:
            return
        for name in ("choice", "choices", "sample", "shuffle"):
            _real_random[name] = getattr(_random, name)
        for name in _SCALARS:
            setattr(_random, name, _scalar(name))
        for name, fn in (
            ("choice", _choice),
            ("choices", _choices),
            ("sample", _sample),
            ("shuffle", _shuffle),
        ):
            setattr(_random, name, fn)
        _time.time = _time_time
        _uuid.uuid4 = _uuid4
        _patch_datetime()
        _installed = True


def installed() -> bool:
    """Whether the wrappers are in place."""
    return _installed


class deterministic:
    """Serve the clock, ``uuid4`` and ``random`` from the tape for the agent's code.

    Use it inside the workflow (``with replayable.deterministic():``) or as a
    decorator on the workflow or a helper, so a replay, which calls the
    workflow again, asks for the same values. ``skip`` names more top-level
    packages whose calls stay live.
    """

    __slots__ = ("_skip", "_tokens")

    def __init__(self, *, skip: Iterable[str] = ()) -> None:
        self._skip = frozenset(skip)
        self._tokens: list[contextvars.Token[frozenset[str] | None]] = []
        install()

    def __enter__(self) -> deterministic:
        self._tokens.append(_ENABLED.set(self._skip))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _ENABLED.reset(self._tokens.pop())

    async def __aenter__(self) -> deterministic:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: F) -> F:
        skip = self._skip
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                token = _ENABLED.set(skip)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    _ENABLED.reset(token)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            token = _ENABLED.set(skip)
            try:
                return fn(*args, **kwargs)
            finally:
                _ENABLED.reset(token)

        return run_sync  # type: ignore[return-value]
