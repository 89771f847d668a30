"""Decision policies: predicates over a run's decisions, versioned by their code.

A policy asks what an auditor asks of a run: did the agent choose an allowed
tool, did the arguments satisfy policy, did it ask for confirmation before a
destructive action, did it decide on an empty result? Mark one with
:func:`policy`::

    @replayable.policy("confirm_before_delete")
    def confirm_before_delete(run):
        for call in run.calls("delete_event"):
            if not run.before("ask_confirmation", call):
                return run.violation("deleted without asking", call)
        return True

The function receives a :class:`PolicyRun` (the run's calls in step order,
with helpers: :meth:`~PolicyRun.tools`, :meth:`~PolicyRun.calls`,
:meth:`~PolicyRun.before`, :attr:`~PolicyRun.final_output`) and returns
``True`` or ``None`` (pass), ``False`` (a violation without steps) or a
:class:`Violation` naming the steps. A policy that raises fails with the
error. Every :class:`PolicyResult` carries the policy's code fingerprint, so
a result always says which version of the rule judged the run.

Policies run on recorded runs (``replayable check``) and on replays, forks
and counterfactuals (``replay(..., policies=[...])``).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import marshal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from replayable.errors import ConfigurationError, UntrustedRecordError
from replayable.events.codec import decode_tree
from replayable.events.model import Event, Run
from replayable.store.base import EventStore

__all__ = [
    "Call",
    "Policy",
    "PolicyResult",
    "PolicyRun",
    "Violation",
    "check_run",
    "find_policy",
    "policy",
    "policy_registry",
]

#: The kinds a policy sees as calls (spans and gaps are structure, not decisions).
_CALL_KINDS: Final = frozenset(
    {"llm", "tool", "http", "retrieval", "state_read", "state_write", "subrun", "prompt"}
)


@dataclass(frozen=True)
class Call:
    """One recorded call as a policy reads it: its step, name and decoded values."""

    seq: int
    kind: str
    name: str
    args: Any
    result: Any
    error: dict[str, Any] | None
    side_effect: bool
    run_id: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether the call answered nothing: no error and an empty or missing result."""
        return self.error is None and self.result in (None, [], {}, "", ())

    def __repr__(self) -> str:
        return f"<Call #{self.seq} {self.kind}:{self.name}>"


def _decoded(text: str | None, tagged: bool) -> Any:
    if text is None:
        return None
    tree = orjson.loads(text)
    if not tagged:
        return tree
    try:
        return decode_tree(tree)
    except (UntrustedRecordError, TypeError, ValueError):
        return tree  # a type this process will not build: judge the stored tree


def _call(e: Event) -> Call:
    return Call(
        seq=e.seq,
        kind=e.kind,
        name=e.name,
        args=_decoded(e.request, True),
        result=_decoded(e.response, e.encoding == "tagged"),
        error=e.error_value(),
        side_effect=e.side_effect,
        run_id=e.run_id,
        metadata=dict(e.metadata),
    )


@dataclass(frozen=True)
class Violation:
    """A policy's finding: what is wrong, and the steps where."""

    message: str
    steps: tuple[int, ...] = ()


CallRef = str | Call | Callable[[Call], bool]


class PolicyRun:
    """A run as a policy sees it: its calls in step order (child runs' after their parent
    step's position is not mixed in; use :attr:`children`) and its outcome."""

    def __init__(self, run: Run, events: Iterable[Event], children: Iterable[PolicyRun] = ()):
        self.run = run
        self.events = [e for e in events if not e.problems]
        self.all_calls = [_call(e) for e in self.events if e.kind in _CALL_KINDS]
        self.children = list(children)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def status(self) -> str:
        return self.run.status

    @property
    def metadata(self) -> dict[str, Any]:
        return self.run.metadata

    @property
    def input(self) -> Any:
        """The run's input: ``{"args": [...], "kwargs": {...}}``."""
        return _decoded(self.run.start.input, True)

    @property
    def final_output(self) -> Any:
        """What the run returned (``None`` for a failed or unfinished run)."""
        end = self.run.end
        return None if end is None else _decoded(end.output, True)

    @property
    def final_error(self) -> dict[str, Any] | None:
        end = self.run.end
        return None if end is None or end.error is None else orjson.loads(end.error)

    def tools(self) -> list[Call]:
        """The tool calls, in step order."""
        return [c for c in self.all_calls if c.kind == "tool"]

    def llm_calls(self) -> list[Call]:
        return [c for c in self.all_calls if c.kind == "llm"]

    def calls(self, ref: CallRef | None = None) -> list[Call]:
        """The calls with this name (or matching this predicate), in step order."""
        if ref is None:
            return list(self.all_calls)
        match = _matcher(ref)
        return [c for c in self.all_calls if match(c)]

    def before(self, first: CallRef, then: CallRef) -> bool:
        """Whether every call matching ``then`` has a call matching ``first`` before it
        (``False`` when a ``then`` call comes first; ``True`` when there is none)."""
        is_first, is_then = _matcher(first), _matcher(then)
        seen = False
        for c in self.all_calls:
            if is_then(c) and not seen:
                return False
            if is_first(c):
                seen = True
        return True

    def ok(self) -> bool:
        return True

    def violation(self, message: str, *steps: int | Call) -> Violation:
        """A :class:`Violation` naming these steps (seqs or calls)."""
        return Violation(message, tuple(s.seq if isinstance(s, Call) else int(s) for s in steps))


def _matcher(ref: CallRef) -> Callable[[Call], bool]:
    if isinstance(ref, str):
        return lambda c: c.name == ref
    if isinstance(ref, Call):
        return lambda c: c.seq == ref.seq and c.run_id == ref.run_id
    return ref


@dataclass(frozen=True)
class PolicyResult:
    """One policy's verdict on one run, with the policy's code fingerprint."""

    policy: str
    fingerprint: str
    run_id: str
    passed: bool
    message: str = ""
    steps: tuple[int, ...] = ()
    error: str | None = None

    @property
    def status(self) -> str:
        return "error" if self.error is not None else ("pass" if self.passed else "violation")

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "fingerprint": self.fingerprint,
            "run_id": self.run_id,
            "status": self.status,
            "message": self.message,
            "steps": list(self.steps),
            "error": self.error,
        }

    def __str__(self) -> str:
        where = f" at step {', '.join(map(str, self.steps))}" if self.steps else ""
        what = self.error or self.message
        tail = f": {what}" if what else ""
        return f"{self.policy} [{self.fingerprint[:12]}] {self.status}{where}{tail}"


class Policy:
    """A named predicate over a run, identified by its code fingerprint."""

    def __init__(
        self,
        name: str,
        fn: Callable[[PolicyRun], Any],
        *,
        description: str = "",
        params: dict[str, Any] | None = None,
    ) -> None:
        if not name or not isinstance(name, str):
            raise ConfigurationError("a policy needs a name")
        self.name = name
        self.fn = fn
        self.description = description or (inspect.getdoc(fn) or "").split("\n")[0]
        self.params = dict(params or {})
        self.fingerprint = code_fingerprint(fn, self.params)

    def __call__(self, run: PolicyRun) -> Any:
        return self.fn(run)

    def __repr__(self) -> str:
        return f"<Policy {self.name} {self.fingerprint[:12]}>"

    def judge(self, run: PolicyRun) -> PolicyResult:
        """Run the predicate; its answer (or its exception) as a :class:`PolicyResult`."""
        base: dict[str, Any] = {
            "policy": self.name,
            "fingerprint": self.fingerprint,
            "run_id": run.run_id,
        }
        try:
            answer = self.fn(run)
        except Exception as exc:
            return PolicyResult(passed=False, error=f"{type(exc).__name__}: {exc}", **base)
        if answer is None or answer is True:
            return PolicyResult(passed=True, **base)
        if answer is False:
            return PolicyResult(passed=False, message="the policy does not hold", **base)
        if isinstance(answer, Violation):
            return PolicyResult(passed=False, message=answer.message, steps=answer.steps, **base)
        return PolicyResult(
            passed=False,
            error=f"returned {type(answer).__name__}; a policy returns True, False, None "
            "or run.violation(...)",
            **base,
        )

    def evaluate(self, store: EventStore, run_id: str) -> PolicyResult:
        """Judge the run ``run_id`` of ``store`` (what ``replay(..., policies=…)`` calls)."""
        return self.judge(policy_run(store, run_id))


def code_fingerprint(fn: Callable[..., Any], params: dict[str, Any]) -> str:
    """sha256 of the predicate's source (its bytecode when the source is not available)
    and its parameters: a new version of a policy has a new fingerprint."""
    try:
        code = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        raw = getattr(fn, "__code__", None)
        code = marshal.dumps(raw) if raw is not None else repr(fn).encode()
    h = hashlib.sha256(code)
    h.update(orjson.dumps(params, option=orjson.OPT_SORT_KEYS, default=repr))
    return h.hexdigest()


_REGISTRY: dict[str, Policy] = {}


def policy(name: str, *, description: str = "") -> Callable[[Callable[[PolicyRun], Any]], Policy]:
    """Decorator: mark ``fn(run)`` as the policy ``name`` (see the module docstring)."""

    def mark(fn: Callable[[PolicyRun], Any]) -> Policy:
        made = Policy(name, fn, description=description)
        _REGISTRY[name] = made
        return made

    return mark


def policy_registry() -> dict[str, Policy]:
    """Every policy defined with :func:`policy` so far, by name."""
    return dict(_REGISTRY)


def find_policy(spec: str) -> Policy:
    """The policy named by ``module:name`` (an attribute, or a policy registered by that
    module under that name); ``module`` alone gives its only policy."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ConfigurationError(f"--policy {spec!r} must be module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--policy {spec!r}: cannot import {module_name}: {exc}") from None
    if not attr:
        found = [v for v in vars(module).values() if isinstance(v, Policy)]
        if len(found) != 1:
            raise ConfigurationError(
                f"--policy {spec!r}: module {module_name} defines {len(found)} policies; "
                "name one as module:name"
            )
        return found[0]
    value = getattr(module, attr, None)
    if isinstance(value, Policy):
        return value
    if attr in _REGISTRY:
        return _REGISTRY[attr]
    known = sorted(k for k, v in vars(module).items() if isinstance(v, Policy))
    raise ConfigurationError(
        f"--policy {spec!r}: {module_name} has no policy {attr!r}"
        + (f"; it has {', '.join(known)}" if known else "")
    )


def policy_run(store: EventStore, run_id: str) -> PolicyRun:
    """The run ``run_id`` (and its child runs) of ``store`` as policies read it."""
    run = store.run(run_id)
    kids = [policy_run(store, c.run_id) for c in store.children(run.run_id)]
    return PolicyRun(run, store.events(run.run_id), kids)


def check_run(store: EventStore, run_id: str, policies: Iterable[Policy]) -> list[PolicyResult]:
    """Every policy's verdict on one recorded run."""
    view = policy_run(store, run_id)
    return [p.judge(view) for p in policies]
