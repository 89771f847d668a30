"""Human and machine views of runs and events: one-line summaries, timelines, JSON.

Everything here reads records and returns Rich renderables or plain dicts;
nothing prints, so the CLI and the demo compose the same pieces.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from replayable.events.model import Event, Run

__all__ = [
    "RUNS_COLUMNS",
    "STATUS_STYLES",
    "call_args",
    "decoded",
    "event_mark",
    "event_parts",
    "event_summary",
    "format_duration",
    "format_time",
    "plain",
    "run_duration",
    "runs_rows",
    "runs_table",
    "short_ids",
    "short_value",
    "status_text",
    "timeline",
    "type_name",
]

STATUS_STYLES: Final = {
    "completed": "green",
    "identical": "green",
    "failed": "red",
    "diverged": "yellow",
    "incomplete": "yellow",
}

_TAG: Final = "$t"
_SUMMARY_WIDTH: Final = 96
_ARGS_WIDTH: Final = 44


# -- values -------------------------------------------------------------------


def plain(tree: Any) -> Any:
    """A stored JSON tree with its type tags removed: what a person wants to read."""
    if isinstance(tree, list):
        return [plain(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    tag = tree.get(_TAG)
    if tag is None:
        return {k: plain(v) for k, v in tree.items()}
    inner = tree.get("v")
    if tag == "map":
        return {str(plain(k)): plain(v) for k, v in inner or []}
    if tag == "enum":
        return tree.get("name")
    if tag == "timedelta" and isinstance(inner, list) and len(inner) == 3:
        return f"{inner[0]}d {inner[1]}s {inner[2]}us"
    return plain(inner)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


def short_value(value: Any, width: int = 40) -> str:
    """A one-line rendering of a plain value, at most ``width`` characters."""
    if isinstance(value, str):
        return repr(_clip(value, max(width - 2, 4)))
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, list) and len(value) > 3:
        return f"[{len(value)} items]"
    text = orjson.dumps(value, default=str).decode()
    if isinstance(value, dict) and len(text) > width:
        # Too long to show whole: name every key with a taste of its value.
        inner = ", ".join(f"{k}: {short_value(v, 18)}" for k, v in value.items())
        text = "{" + inner + "}"
    return _clip(text, width)


def call_args(request: Any) -> str:
    """A call's arguments as ``a, b, key=value``, each value shortened."""
    if isinstance(request, dict) and set(request) <= {"args", "kwargs"}:
        args = request.get("args") or []
        kwargs = request.get("kwargs") or {}
        parts = [short_value(a, 32) for a in (args if isinstance(args, list) else [args])]
        if isinstance(kwargs, dict):
            parts += [f"{k}={short_value(v, 32)}" for k, v in kwargs.items()]
        return ", ".join(parts)
    if request in (None, {}, []):
        return ""
    if isinstance(request, dict):
        return ", ".join(f"{k}={short_value(v, 32)}" for k, v in request.items())
    return short_value(request, 48)


def _llm_args(request: Any) -> str | None:
    kwargs = request.get("kwargs", request) if isinstance(request, dict) else None
    if not isinstance(kwargs, dict) or not isinstance(kwargs.get("messages"), list):
        return None
    messages = kwargs["messages"]
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    # The model and the earlier messages are in the event's JSON; the last
    # message is what tells one call from the next.
    text = short_value(content, 36) if isinstance(content, str) else ""
    return f"{len(messages)} msg {text}".rstrip()


def _completion_text(value: Any) -> str | None:
    if not isinstance(value, dict) or not isinstance(value.get("choices"), list):
        return None
    choices = value["choices"]
    if not choices or not isinstance(choices[0], dict):
        return "no choices"
    message = choices[0].get("message") or {}
    content = message.get("content") if isinstance(message, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if calls:
        return f"{len(calls)} tool call{'s' if len(calls) != 1 else ''}"
    if isinstance(content, str) and content.lstrip().startswith("{"):
        try:
            return short_value(orjson.loads(content), 48)
        except orjson.JSONDecodeError:
            pass
    return short_value(content, 48) if content is not None else "empty message"


def type_name(error: Mapping[str, Any]) -> str:
    """``ValueError`` for a builtin, ``module:Name`` for anything else."""
    name = str(error.get("type", "?"))
    return name.removeprefix("builtins:")


def _result(event: Event) -> tuple[str, bool]:
    err = event.error_value()
    if err is not None:
        return f"raised {type_name(err)}: {err.get('message', '')}", True
    if event.response is None:
        return "(no response)", False
    value = plain(event.response_tree())
    if event.kind == "clock" and isinstance(value, int | float) and not isinstance(value, bool):
        return format_time(value, date=True) + format_time(value, date=False)[8:], False
    text = _completion_text(value)
    if text is not None:
        return text, False
    if isinstance(value, list):
        n = len(value)
        return (f"{n} result{'s' if n != 1 else ''}" + (" (empty)" if n == 0 else "")), False
    return short_value(value, 48), False


def event_parts(event: Event) -> tuple[str, str, bool]:
    """The request's arguments and the result as short text, and whether it was an error."""
    request = event.request_value()
    args = _llm_args(request) if event.kind == "llm" else None
    if args is None:
        args = call_args(request)
    result, failed = _result(event)
    return args, result, failed


def event_summary(event: Event, width: int = _SUMMARY_WIDTH) -> tuple[str, bool]:
    """``name(args) → result`` on one line, and whether the event recorded an error."""
    args, result, failed = event_parts(event)
    return _clip(f"{event.name}({_clip(args, _ARGS_WIDTH)}) → {result}", width), failed


class _Call:
    """``args → result`` fitted to its cell: when space is short both sides are clipped,
    so the result stays visible however long the request is."""

    def __init__(self, args: str, result: str, style: str) -> None:
        self.args = args or "()"
        self.result = result
        self.style = style

    def _fit(self, width: int) -> str:
        full = f"{self.args} → {self.result}"
        if cell_len(full) <= width:
            return full
        room = max(width - 3, 2)
        left = min(cell_len(self.args), max(room - cell_len(self.result), room * 4 // 10))
        return f"{_clip(self.args, max(left, 1))} → {_clip(self.result, max(room - left, 1))}"

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        full = cell_len(f"{self.args} → {self.result}")
        return Measurement(min(full, 24), full)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(
            self._fit(options.max_width), style=self.style, no_wrap=True, overflow="ellipsis"
        )


# -- times --------------------------------------------------------------------


def format_time(epoch: float | None, *, date: bool = True) -> str:
    """Local wall-clock time of an epoch, to the second (or millisecond without the date)."""
    if epoch is None:
        return "—"
    moment = dt.datetime.fromtimestamp(epoch)
    if date:
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def format_duration(seconds: float | None) -> str:
    """``850µs``, ``12ms``, ``3.40s``, ``2m05s``; ``—`` when unknown."""
    if seconds is None or seconds < 0:
        return "—"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def run_duration(run: Run) -> float | None:
    """Seconds from start to end; ``None`` while the run has no end record."""
    return None if run.ended_at is None else run.ended_at - run.started_at


# -- runs ---------------------------------------------------------------------


def status_text(status: str) -> Text:
    """The status word in its colour."""
    return Text(status, style=STATUS_STYLES.get(status, ""))


def short_ids(run_ids: Sequence[str], minimum: int = 8) -> dict[str, str]:
    """The shortest prefix length (at least ``minimum``) that tells these ids apart, per id.

    Run ids made in the same second share their leading characters, so a
    fixed-width prefix would not be unique; like ``git log --abbrev`` the
    width grows until it is.
    """
    width = minimum
    longest = max((len(r) for r in run_ids), default=minimum)
    while width < longest and len({r[:width] for r in run_ids}) < len(set(run_ids)):
        width += 1
    return {r: r[:width] for r in run_ids}


def runs_table(runs: Sequence[Run], counts: Mapping[str, int | None], *, full: bool) -> Table:
    """The ``runs`` listing: newest first, one row per run."""
    every = [r.run_id for r in runs] + [r.parent_run_id for r in runs if r.parent_run_id]
    ids = {r: r for r in every} if full else short_ids(every)
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    # On a narrow terminal the workflow name gives way; an id or a status never does.
    id_width = max((len(v) for v in ids.values()), default=8)
    table.add_column("run", no_wrap=True, style="cyan", min_width=id_width)
    table.add_column("workflow", overflow="ellipsis")
    table.add_column("status", no_wrap=True, min_width=len("incomplete"))
    table.add_column("started", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("events", justify="right", no_wrap=True)
    table.add_column("parent", no_wrap=True, style="dim")
    for run in runs:
        count = counts.get(run.run_id)
        parent = run.parent_run_id
        table.add_row(
            ids[run.run_id],
            run.workflow,
            status_text(run.status),
            format_time(run.started_at),
            format_duration(run_duration(run)),
            "—" if count is None else str(count),
            f"↳ {ids[parent]}" if parent else "",
        )
    return table


RUNS_COLUMNS: Final = ("run", "workflow", "status", "started", "duration", "events", "parent")


def runs_rows(runs: Sequence[Run], counts: Mapping[str, int | None]) -> list[tuple[str, ...]]:
    """The ``runs`` listing as plain rows, header first, every value whole (for pipes)."""
    rows: list[tuple[str, ...]] = [RUNS_COLUMNS]
    for run in runs:
        count = counts.get(run.run_id)
        rows.append(
            (
                run.run_id,
                run.workflow,
                run.status,
                format_time(run.started_at),
                format_duration(run_duration(run)),
                "" if count is None else str(count),
                run.parent_run_id or "",
            )
        )
    return [tuple(" ".join(v.split()) for v in row) for row in rows]


def decoded(text: str | None) -> Any:
    """A stored JSON text as a plain value, type tags removed."""
    return None if text is None else plain(orjson.loads(text))


# -- timeline -----------------------------------------------------------------


def _depths(events: Sequence[Event]) -> dict[int, int]:
    depth: dict[int, int] = {}
    for e in events:
        depth[e.seq] = depth.get(e.parent, -1) + 1 if e.parent is not None else 0
    return depth


#: How a replay that ran something live obtained each event, from the event's metadata.
_MARKS: Final = (
    ("side_effect_blocked", "blocked", "bold magenta"),
    ("override", "override", "bold cyan"),
    ("live", "live", "bold green"),
    ("replayed_from", "replayed", "dim"),
)


def event_mark(event: Event) -> Text | None:
    """``blocked``, ``override``, ``live`` or ``replayed`` for an event of a fork or
    counterfactual run; ``None`` for an event recorded in production."""
    for key, label, style in _MARKS:
        if event.metadata.get(key):
            return Text(label, style=style)
    return None


def timeline(
    events: Sequence[Event],
    *,
    title: str | None = None,
    whole: bool = False,
    notes: Mapping[int, Sequence[RenderableType]] | None = None,
) -> RenderableType:
    """The run's events in seq order with summaries, timings and the gap to the next event.

    Events of a fork or counterfactual run carry a ``via`` column: replayed
    from the tape, overridden, live, or a blocked side effect. ``whole``
    keeps names at full length (for output that is not a terminal). ``notes``
    (seq -> renderables, e.g. annotations) are shown in rows under their event.
    """
    table = Table(title=title, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("seq", justify="right", no_wrap=True)
    marks = [event_mark(e) for e in events]
    if any(marks):
        table.add_column("via", no_wrap=True)
    table.add_column("kind", no_wrap=True, style="blue")
    # Long names give way before the summary does on a narrow terminal.
    if whole:
        table.add_column("name", no_wrap=True)
    else:
        table.add_column("name", no_wrap=True, overflow="ellipsis", max_width=20)
    # Its cells clip themselves to one line; it keeps room to say something.
    table.add_column("summary", min_width=16, ratio=1)
    # Time since the run's first event: shorter than a clock time, and what a
    # reader compares (the header gives the run's start).
    table.add_column("at", justify="right", no_wrap=True, style="dim")
    table.add_column("took", justify="right", no_wrap=True)
    table.add_column("→ next", justify="right", no_wrap=True, style="dim")
    depth = _depths(events)
    origin = events[0].started_at if events else 0.0
    side_effects = False
    for i, event in enumerate(events):
        args, result, failed = event_parts(event)
        name = Text("  " * depth.get(event.seq, 0) + event.name)
        if event.side_effect:
            name.append(" *", style="bold magenta")
            side_effects = True
        gap = None
        if i + 1 < len(events):
            gap = events[i + 1].started_at - (event.started_at + event.duration_ns / 1e9)
        via = [marks[i] or ""] if any(marks) else []
        table.add_row(
            str(event.seq),
            *via,
            event.kind,
            name,
            _Call(args, result, "red" if failed else ""),
            "+" + format_duration(max(0.0, event.started_at - origin)),
            format_duration(event.duration_ns / 1e9),
            format_duration(gap) if gap is not None and gap >= 0 else "",
            style="red" if failed else None,
        )
        for note in (notes or {}).get(event.seq, ()):
            blank = [""] * (1 + len(via) + 2)
            table.add_row(*blank, note, "", "", "")
    if not events:
        return Text("(no events recorded)", style="dim")
    if side_effects:
        note = Text("* side-effect tool: faked from the tape on replay", style="dim magenta")
        return Group(table, note)
    return table
