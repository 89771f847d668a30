"""Replay and fork as background jobs (engineers and admins).

A job runs :meth:`AuditReader.replay` (so the read of the recording is in the
access log, as for ``replayable replay``) in a worker thread, with the same
guards as the library and the CLI: side-effect tools are faked from the
tape unless named allowed-live, and a fork or counterfactual is recorded as
a new run. The job page polls its JSON twin and, when done, links to the new
run and to its diff with the original.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from fastapi import Depends, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, Field

from replayable.errors import ConfigurationError, ReplayableError
from replayable.web import views
from replayable.web.app import ctx_of
from replayable.web.context import Ctx, WebState

Deco = Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]

__all__ = ["JobRunner", "ReplayIn", "register"]

CtxDep = Annotated[Ctx, Depends(ctx_of)]
Mode = Literal["full", "partial", "fork", "counterfactual"]


class ReplayIn(BaseModel):
    """What to replay: ``full``; ``partial`` to ``step``; ``fork`` at ``step`` with
    ``override`` (JSON of the value step N returns; none: that step runs live); or
    ``counterfactual`` with ``live`` kinds or tool names running live."""

    mode: Mode = "full"
    step: int | None = Field(default=None, ge=1, le=2**31 - 1)
    override: str | None = Field(default=None, max_length=1_000_000)
    live: list[str] = Field(default_factory=list, max_length=50)
    allow_live: list[str] = Field(default_factory=list, max_length=50)
    on_side_effect: Literal["stop", "recorded"] = "stop"


@dataclass
class Job:
    job_id: str
    run_id: str
    user: str
    request: ReplayIn
    state: str = "queued"
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    #: (step reached, steps recorded), as the replay reports it (``replay(progress=)``).
    progress: tuple[int, int] | None = None

    def advance(self, step: int, total: int) -> None:
        """The replay's progress hook (one tuple assigned: readers see a whole pair)."""
        self.progress = (step, total)

    def to_dict(self) -> dict[str, Any]:
        now = time.time()
        step, total = self.progress or (None, None)
        return {
            "job_id": self.job_id,
            "run_id": self.run_id,
            "user": self.user,
            "request": self.request.model_dump(),
            "state": self.state,
            "created": views.iso(self.created),
            "elapsed_s": round((self.finished or now) - (self.started or now), 3),
            "step": step,
            "total_steps": total,
            "result": self.result,
            "error": self.error,
        }


class JobRunner:
    """One worker thread: replays share the interpreter's import state, so one at a time."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replayable-job")
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def submit(self, job: Job, work: Callable[[], dict[str, Any]]) -> Job:
        with self._lock:
            self._jobs[job.job_id] = job

        def run() -> None:
            job.state, job.started = "running", time.time()
            try:
                job.result = work()
                job.state = "done"
            except ReplayableError as exc:
                job.error, job.state = " ".join(str(exc).split()), "failed"
            except Exception as exc:
                job.error, job.state = f"{type(exc).__name__}: {exc}", "failed"
            finally:
                job.finished = time.time()

        self._pool.submit(run)
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: -j.created)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _work(
    ctx: Ctx, run_id: str, body: ReplayIn, progress: Callable[[int, int], None]
) -> Callable[[], dict[str, Any]]:
    from replayable.cli._replay import agent_paths

    store = ctx.store
    # Read as this user through the audit reader, so the replay's reading of the
    # recording (and of child runs served from theirs) is in the access log.
    audit = ctx.reader()
    overrides: dict[int, Any] | None = None
    if body.mode in ("partial", "fork") and body.step is None:
        raise ConfigurationError(f"a {body.mode} replay needs a step")
    if body.mode == "fork" and body.override:
        from replayable.cli._overrides import check_overrides

        try:
            given = {int(body.step or 0): orjson.loads(body.override)}
        except orjson.JSONDecodeError as exc:
            raise ConfigurationError(f"the override is not JSON: {exc}") from exc
        # As `replay --override` does: the value must have the recorded step's shape.
        overrides = check_overrides(store, run_id, given)
    if body.mode == "counterfactual" and not body.live:
        raise ConfigurationError("a counterfactual replay names what runs live (llm, a tool)")

    def work() -> dict[str, Any]:
        agent_paths()
        result = audit.replay(
            run_id,
            stop_at=body.step if body.mode == "partial" else None,
            fork_at=body.step if body.mode == "fork" else None,
            overrides=overrides,
            live=body.live if body.mode == "counterfactual" else (),
            allow_live=body.allow_live,
            on_side_effect=body.on_side_effect,
            progress=progress,
        )
        paused = None
        if result.paused is not None:
            paused = views.clip(views.pretty(_paused(result.paused)), 50_000)
        return {
            "status": result.status,
            "events_served": result.events_served,
            "duration_s": result.duration_s,
            "new_run_id": result.new_run_id,
            "blocked": list(result.blocked),
            "divergence": None
            if result.divergence is None
            else views.visible(result.divergence.message),
            "paused": paused,
            "output": views.clip(views.pretty(_plain(result.output)), 20_000),
        }

    return work


def _plain(value: Any) -> Any:
    try:
        return orjson.loads(orjson.dumps(value, default=str))
    except TypeError:
        return repr(value)


def _paused(paused: Any) -> Any:
    to_dict = getattr(paused, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return repr(paused)


def register(
    both: Deco, page: Deco, api: Deco, out: Callable[..., Response], state: WebState
) -> None:
    if state.jobs is None:
        state.jobs = JobRunner()
    runner: JobRunner = state.jobs

    def start(ctx: Ctx, run: str, body: ReplayIn) -> Job:
        record = ctx.run(run)
        job = Job(uuid.uuid4().hex[:12], record.run_id, ctx.principal.name, body)
        return runner.submit(job, _work(ctx, record.run_id, body, job.advance))

    @api("/runs/{run}/replay", "replay", method="POST", status_code=202)
    def replay_api(ctx: CtxDep, run: str, body: ReplayIn) -> dict[str, Any]:
        """Start a replay job (engineers and admins); poll ``/api/jobs/{job_id}``."""
        return start(ctx, run, body).to_dict()

    @page("/runs/{run}/replay", "replay", method="POST")
    async def replay_form(ctx: CtxDep, run: str, request: Request) -> Response:
        form = await request.form()

        def text(name: str) -> str | None:
            value = form.get(name)
            return value.strip() or None if isinstance(value, str) else None

        def names(name: str) -> list[str]:
            return [n for n in (text(name) or "").replace(",", " ").split() if n]

        step = text("step")
        try:
            body = ReplayIn(
                mode=text("mode") or "full",  # type: ignore[arg-type]
                step=int(step) if step else None,
                override=text("override"),
                live=names("live"),
                allow_live=names("allow_live"),
                on_side_effect=text("on_side_effect") or "stop",  # type: ignore[arg-type]
            )
        except ValueError as exc:
            raise HTTPException(400, f"cannot start that replay: {exc}") from None
        job = start(ctx, run, body)
        return RedirectResponse(f"/jobs/{job.job_id}", 303)

    @both("/jobs", "replay")
    def jobs(ctx: CtxDep) -> Response:
        """Replay jobs started since the server started, newest first."""
        return out(ctx, "jobs.html", {"jobs": [j.to_dict() for j in runner.all()]})

    @both("/jobs/{job_id}", "replay")
    def job(ctx: CtxDep, job_id: str) -> Response:
        """One job: its state, and when done the new run and its diff with the original."""
        found = runner.get(job_id)
        if found is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return out(ctx, "job.html", found.to_dict())
