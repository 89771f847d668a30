"""Anomaly rules: small callables in a registry, one run at a time.

A rule receives a :class:`RuleContext` (the run, its events, its workflow's
statistics and the rule's thresholds for that workflow) and returns
:class:`Finding` objects (or one, or ``None``). Register your own with::

    @replayable.audit.rule("slow_tool", description="a tool took over 30 s", max_s=30)
    def slow_tool(ctx):
        for e in ctx.events:
            if e.kind == "tool" and e.duration_ns > ctx.params["max_s"] * 1e9:
                yield Finding(steps=(e.seq,), evidence={"tool": e.name}, score=1.0)

Keyword arguments of :func:`rule` are the rule's default thresholds; the
``[tool.replayable.anomalies]`` table of pyproject.toml (see
:class:`AnomalyConfig`) overrides them for all workflows or per workflow.
The built-in rules are the seed's four and three more (numbered 1-7). Each
built-in also has a screen that reads only the run's record, statistics and
:class:`~replayable.store.audit_base.RunSummary`, so the scan reads the events of
the runs a rule may flag; a rule registered here has none and sees every run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from replayable.errors import ConfigurationError
from replayable.events.audit import WorkflowStats
from replayable.events.model import Event, Run
from replayable.store.audit_base import (
    BLOCKED_KEY,
    COUNT_KEYS,
    DATA_KINDS,
    REPEAT_KINDS,
    ROW_KEYS,
    RunSummary,
    may_be_empty,
    may_be_error,
    may_refuse,
)

__all__ = [
    "AnomalyConfig",
    "Finding",
    "Rule",
    "RuleContext",
    "find_rule",
    "registry",
    "rule",
]


@dataclass(frozen=True, slots=True)
class Finding:
    """What a rule found: the steps, the evidence (plain JSON) and a score (higher is worse)."""

    steps: tuple[int, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    score: float = 1.0


RuleResult = Iterable[Finding] | Finding | None


#: ``screen(ctx, summary) -> bool``: whether a rule can find anything in a run, from the
#: run's record, statistics, thresholds and :class:`RunSummary` (``ctx.events`` is empty).
Screen = Callable[["RuleContext", RunSummary], bool]


@dataclass(frozen=True, slots=True)
class Rule:
    """A registered rule: its name, number (for the built-ins), description and defaults.

    ``screen``, where a rule has one, answers ``False`` only for runs in which the
    rule cannot find anything; the scan reads the events of a run only when some
    enabled rule without a screen, or whose screen says ``True``, is left to look.
    A rule registered with :func:`rule` has none, so it sees every run's events.
    """

    name: str
    check: Callable[[RuleContext], RuleResult]
    description: str
    defaults: Mapping[str, Any]
    number: int | None = None
    screen: Screen | None = None

    def run(self, ctx: RuleContext) -> list[Finding]:
        """The rule's findings for one run, as a list."""
        found = self.check(ctx)
        if found is None:
            return []
        if isinstance(found, Finding):
            return [found]
        return list(found)


#: Every registered rule by name, in registration order.
registry: dict[str, Rule] = {}


def rule(
    name: str, *, description: str = "", number: int | None = None, **defaults: Any
) -> Callable[[Callable[[RuleContext], RuleResult]], Callable[[RuleContext], RuleResult]]:
    """Register ``fn(ctx) -> findings`` as the anomaly rule ``name`` (replacing one of that
    name). Keyword arguments are its default thresholds."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ConfigurationError(f"rule name {name!r} must be lower_case_with_underscores")

    def register(fn: Callable[[RuleContext], RuleResult]) -> Callable[[RuleContext], RuleResult]:
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        registry[name] = Rule(name, fn, doc, dict(defaults), number)
        return fn

    return register


def _screened_by(name: str) -> Callable[[Screen], Screen]:
    """Attach ``screen`` to the registered rule ``name`` (the built-ins' screens)."""

    def attach(screen: Screen) -> Screen:
        r = registry[name]
        registry[name] = Rule(r.name, r.check, r.description, r.defaults, r.number, screen)
        return screen

    return attach


def find_rule(ref: str) -> Rule:
    """A rule by name or by number (``5``)."""
    if ref in registry:
        return registry[ref]
    for r in registry.values():
        if r.number is not None and ref == str(r.number):
            return r
    known = ", ".join(f"{r.number}={r.name}" if r.number else r.name for r in registry.values())
    raise ConfigurationError(f"no anomaly rule {ref!r}; known: {known}")


class AnomalyConfig:
    """Thresholds per rule and per workflow, e.g. from pyproject.toml::

    [tool.replayable.anomalies.llm_loop]
    sigmas = 3.0                       # every workflow
    [tool.replayable.anomalies.workflows.contract_review.premature_exit]
    fraction = 0.05                    # this workflow only
    enabled = false                    # or switch a rule off

    """

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        data = dict(settings or {})
        workflows = data.pop("workflows", {})
        for key, value in [*data.items(), *workflows.items()]:
            if not isinstance(value, Mapping):
                raise ConfigurationError(
                    f"[tool.replayable.anomalies] {key} must be a table of thresholds"
                )
        self.rules: dict[str, dict[str, Any]] = {k: dict(v) for k, v in data.items()}
        self.workflows: dict[str, dict[str, dict[str, Any]]] = {
            w: {r: dict(t) for r, t in per.items()} for w, per in workflows.items()
        }

    @classmethod
    def from_project(cls) -> AnomalyConfig:
        """``[tool.replayable.anomalies]`` of the nearest pyproject.toml."""
        from replayable.capture.config import project_config

        section = project_config().get("anomalies", {})
        return cls(section if isinstance(section, Mapping) else {})

    def params(self, r: Rule, workflow: str) -> dict[str, Any]:
        """The rule's thresholds for ``workflow``: defaults, then global, then per workflow."""
        out = {"enabled": True, **r.defaults}
        out.update(self.rules.get(r.name, {}))
        out.update(self.workflows.get(workflow, {}).get(r.name, {}))
        return out


# -- what rules look at ----------------------------------------------------------------

_TAG: Final = "$t"


def plain(tree: Any) -> Any:
    """A stored JSON tree without its type tags (``{"$t": "tuple", "v": [...]}`` → list)."""
    if isinstance(tree, list):
        return [plain(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if _TAG in tree:
        inner = tree.get("v")
        if tree[_TAG] == "map" and isinstance(inner, list):
            return {str(plain(p[0])): plain(p[1]) for p in inner if len(p) == 2}
        return plain(inner)
    return {k: plain(v) for k, v in tree.items()}


class RuleContext:
    """One run as the rules see it: its record, events, workflow statistics and thresholds.

    Payloads are decoded on first use and kept, so rules sharing a step pay once.
    """

    __slots__ = ("_output", "_responses", "events", "params", "run", "stats")

    def __init__(
        self,
        run: Run,
        events: list[Event],
        stats: WorkflowStats | None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.run = run
        self.events = events
        self.stats = stats
        self.params: Mapping[str, Any] = params or {}
        self._responses: dict[int, Any] = {}
        self._output: Any = _UNSET

    def response(self, event: Event) -> Any:
        """The event's response as a plain value (``None`` when it has none)."""
        if event.seq not in self._responses:
            self._responses[event.seq] = (
                None if event.response is None else plain(orjson.loads(event.response))
            )
        return self._responses[event.seq]

    def request(self, event: Event) -> Any:
        """The event's request as a plain value."""
        return plain(orjson.loads(event.request))

    @property
    def output(self) -> Any:
        """The run's output as a plain value (``None`` while it has none)."""
        if self._output is _UNSET:
            end = self.run.end
            text = None if end is None else end.output
            self._output = None if text is None else plain(orjson.loads(text))
        return self._output

    @property
    def completed(self) -> bool:
        return self.run.status == "completed"

    @property
    def duration(self) -> float | None:
        end = self.run.ended_at
        return None if end is None else end - self.run.started_at

    def is_fallback(self, event: Event) -> bool:
        """Whether ``event`` is an error-handling branch: its name matches one of the
        ``fallbacks`` threshold's substrings, or its metadata says ``fallback``."""
        names = self.params.get("fallbacks", ("fallback",))
        if event.metadata.get("fallback"):
            return True
        return any(str(n).lower() in event.name.lower() for n in names)


_UNSET: Final = object()


def short(value: Any, limit: int = 400) -> Any:
    """``value`` for evidence: as is when small, else its JSON text cut to ``limit``."""
    text = orjson.dumps(value, default=str).decode()
    return value if len(text) <= limit else text[: limit - 1] + "…"


def texts(value: Any) -> Iterator[str]:
    """Every string inside a plain value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from texts(v)


def is_empty(value: Any) -> bool:
    """Empty data: ``null``, ``[]``, ``{}``, ``""``, or a result object whose rows are an
    empty list or whose count is zero (``{"rows": [], "count": 0}``)."""
    if value is None or value == [] or value == {} or value == "":
        return True
    if isinstance(value, dict):
        rows = [value[k] for k in ROW_KEYS if k in value]
        counts = [value[k] for k in COUNT_KEYS if k in value]
        if rows and all(r in ([], None) for r in rows):
            return True
        if counts and all(c == 0 and not isinstance(c, bool) for c in counts) and not rows:
            return True
    return False


def error_shape(event: Event, value: Any) -> str | None:
    """Why a response reads as an error (``error`` field, ``status: error``, HTTP >= 400)."""
    if event.error is not None:
        return "raised"
    if isinstance(value, dict):
        status = value.get("status")
        if event.kind == "http" and isinstance(status, int) and status >= 400:
            return f"HTTP {status}"
        if value.get("error") not in (None, False, "", [], {}):
            return "error field"
        if isinstance(status, str) and status.lower() in ("error", "failed", "failure"):
            return f"status {status}"
    return None


# -- the built-in rules ----------------------------------------------------------------


@rule("llm_loop", number=1, sigmas=2.0, min_runs=10)
def llm_loop(ctx: RuleContext) -> RuleResult:
    """More LLM calls than the workflow's mean plus ``sigmas`` standard deviations (a loop?)."""
    stats, limit = ctx.stats, _llm_limit(ctx)
    if stats is None or limit is None:
        return None
    calls = [e.seq for e in ctx.events if e.kind == "llm"]
    if len(calls) <= limit:
        return None
    return Finding(
        steps=tuple(calls[:50]),
        evidence={
            "llm_calls": len(calls),
            "workflow_mean": round(stats.llm_mean, 3),
            "workflow_std": round(stats.llm_std, 3),
            "threshold": round(limit, 3),
            "runs_compared": stats.runs,
        },
        score=round((len(calls) - stats.llm_mean) / stats.llm_std, 3),
    )


def _llm_limit(ctx: RuleContext) -> float | None:
    """Rule 1's threshold of LLM calls for this run's workflow (``None``: too few runs)."""
    stats = ctx.stats
    if stats is None or stats.runs < ctx.params["min_runs"] or stats.llm_std <= 0:
        return None
    return stats.llm_mean + float(ctx.params["sigmas"]) * stats.llm_std


@_screened_by("llm_loop")
def _llm_loop_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    limit = _llm_limit(ctx)
    return limit is not None and summary.llm_calls > limit


@rule("unhandled_tool_error", number=2, fallbacks=("fallback",))
def unhandled_tool_error(ctx: RuleContext) -> Iterator[Finding]:
    """A tool returned an error and the run completed without retrying it or a fallback."""
    if not ctx.completed:
        return
    for i, e in enumerate(ctx.events):
        if e.kind not in ("tool", "http"):
            continue
        if e.error is None and not may_be_error(e.response):
            continue
        why = error_shape(e, ctx.response(e) if e.error is None else None)
        if why is None:
            continue
        later = ctx.events[i + 1 :]
        if any(x.name == e.name or ctx.is_fallback(x) for x in later):
            continue
        yield Finding(
            steps=(e.seq,),
            evidence={
                "tool": e.name,
                "why": why,
                "request": short(ctx.request(e)),
                "response": short(e.error_value() if e.error else ctx.response(e)),
            },
        )


@rule("premature_exit", number=3, fraction=0.1, min_runs=10)
def premature_exit(ctx: RuleContext) -> RuleResult:
    """The run completed in under ``fraction`` of its workflow's median duration."""
    stats, duration = ctx.stats, ctx.duration
    if not ctx.completed or stats is None or duration is None:
        return None
    median = stats.median_duration
    if stats.runs < ctx.params["min_runs"] or not median or median <= 0:
        return None
    if duration >= float(ctx.params["fraction"]) * median:
        return None
    return Finding(
        evidence={
            "duration_s": round(duration, 6),
            "workflow_median_s": round(median, 6),
            "fraction": ctx.params["fraction"],
            "runs_compared": stats.runs,
        },
        score=round(1 - duration / median, 3),
    )


_REFUSALS: Final = (
    r"\bI(?:['’]m| am) sorry,? but I (?:can(?:no|['’])t|won['’]t|am unable to)\b",
    r"\bI (?:can(?:no|['’])t|am (?:not able|unable) to|won['’]t) "
    r"(?:help|assist|comply|provide|do that|answer)\b",
    r"\bI(?:['’]m| am) (?:not able|unable) to (?:help|assist|comply)\b",
)


@rule("unrouted_refusal", number=4, patterns=_REFUSALS, fallbacks=("fallback",))
def unrouted_refusal(ctx: RuleContext) -> Iterator[Finding]:
    """An LLM answer refused ("I cannot help with that") and no fallback handled it."""
    if not ctx.completed:
        return
    patterns = tuple(ctx.params["patterns"])
    found = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)
    # With the built-in patterns, an answer holding none of their words cannot match.
    quick = patterns == _REFUSALS
    for i, e in enumerate(ctx.events):
        if e.kind != "llm" or e.response is None:
            continue
        if quick and not may_refuse(e.response):
            continue
        value = ctx.response(e)
        refusal = _refusal_field(value)
        hit = refusal or next((t for t in texts(value) if found.search(t)), None)
        if hit is None:
            continue
        if any(ctx.is_fallback(x) for x in ctx.events[i + 1 :]):
            continue
        match = found.search(hit)
        yield Finding(
            steps=(e.seq,),
            evidence={"model_call": e.name, "refusal": (match.group(0) if match else hit)[:200]},
        )


def _refusal_field(value: Any) -> str | None:
    # The OpenAI wire format names a refusal outright: choices[].message.refusal.
    body = value.get("body", value) if isinstance(value, dict) else None
    choices = body.get("choices") if isinstance(body, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, dict) else None
        refusal = message.get("refusal") if isinstance(message, dict) else None
        if isinstance(refusal, str) and refusal.strip():
            return refusal
    return None


@rule("empty_data_decision", number=5)
def empty_data_decision(ctx: RuleContext) -> Iterator[Finding]:
    """A tool returned no data (empty list, zero rows, null) and the run still completed
    with a decision: a later model call or an output, and no retry that found data."""
    if not ctx.completed:
        return
    for i, e in enumerate(ctx.events):
        if e.kind not in DATA_KINDS or e.side_effect or e.error is not None:
            continue
        if not may_be_empty(e.response):
            continue
        value = ctx.response(e)
        if not is_empty(value):
            continue
        later = ctx.events[i + 1 :]
        if any(
            x.name == e.name
            and x.error is None
            and not (may_be_empty(x.response) and is_empty(ctx.response(x)))
            for x in later
        ):
            continue  # asked again and got data: handled
        decision = next((x for x in later if x.kind == "llm"), None)
        if decision is None and ctx.output is None:
            continue
        evidence: dict[str, Any] = {
            "tool": e.name,
            "request": short(ctx.request(e)),
            "response": short(value),
        }
        steps: tuple[int, ...] = (e.seq,)
        if decision is not None:
            evidence["decided_at"] = decision.seq
            steps = (e.seq, decision.seq)
        if ctx.output is not None:
            evidence["output"] = short(ctx.output, 300)
        yield Finding(steps=steps, evidence=evidence)


@rule("repeated_call", number=6, min_repeats=3)
def repeated_call(ctx: RuleContext) -> Iterator[Finding]:
    """The same tool called with the same arguments ``min_repeats`` or more times in a row."""
    least = int(ctx.params["min_repeats"])
    calls = [e for e in ctx.events if e.kind in REPEAT_KINDS]
    start = 0
    for i in range(1, len(calls) + 1):
        same = (
            i < len(calls)
            and calls[i].name == calls[start].name
            and calls[i].fingerprint == calls[start].fingerprint
        )
        if same:
            continue
        streak = calls[start:i]
        if len(streak) >= least:
            yield Finding(
                steps=tuple(e.seq for e in streak),
                evidence={
                    "tool": streak[0].name,
                    "times": len(streak),
                    "request": short(ctx.request(streak[0])),
                },
                score=round(len(streak) / least, 3),
            )
        start = i


@rule("guard_blocked", number=7)
def guard_blocked(ctx: RuleContext) -> RuleResult:
    """A fork or counterfactual replay whose side-effect guard blocked a call."""
    blocked = [e for e in ctx.events if e.metadata.get(BLOCKED_KEY)]
    if not blocked:
        return None
    lineage = ctx.run.start.lineage
    return Finding(
        steps=tuple(e.seq for e in blocked),
        evidence={
            "blocked": [e.name for e in blocked],
            "lineage": short({k: v for k, v in lineage.items() if v is not None}),
        },
    )


# -- what each built-in rule needs to see a run's events for ------------------------------


@_screened_by("unhandled_tool_error")
def _tool_error_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    return ctx.completed and summary.tool_errors > 0


@_screened_by("premature_exit")
def _premature_exit_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    return premature_exit(ctx) is not None  # it reads no events: its own answer


@_screened_by("unrouted_refusal")
def _refusal_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    custom = tuple(ctx.params["patterns"]) != _REFUSALS  # other words: read every answer
    return ctx.completed and (custom or summary.refusals > 0)


@_screened_by("empty_data_decision")
def _empty_data_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    return ctx.completed and summary.empty_results > 0


@_screened_by("repeated_call")
def _repeated_call_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    # A streak of n identical calls holds n - 1 calls repeating the one before.
    return summary.repeats >= int(ctx.params["min_repeats"]) - 1


@_screened_by("guard_blocked")
def _guard_blocked_screen(ctx: RuleContext, summary: RunSummary) -> bool:
    return summary.blocked > 0
