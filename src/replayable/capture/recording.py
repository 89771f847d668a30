"""``recording()``: the session under which workflow calls become recorded runs."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal

from replayable.capture._metadata import json_metadata
from replayable.capture.config import settings
from replayable.capture.context import _STATE, Lineage, State, install_task_factory
from replayable.capture.environment import code_fingerprint, environment_snapshot
from replayable.capture.guard import refuse_live
from replayable.capture.record import RecordRun
from replayable.capture.runtime import (
    Session,
    WorkflowInfo,
    encode_input,
    encode_output,
    intercept_http,
    new_run_id,
    serialization_error,
)
from replayable.capture.writer import OnStoreFailure, writer_for
from replayable.errors import ConfigurationError, StoreUnavailableError
from replayable.events.codec import UnencodableError, encode_error
from replayable.events.model import RunStart
from replayable.store import DEFAULT_STORE_URL, EventStore, open_store
from replayable.store.payloads import check_tenant

__all__ = ["Durability", "Recording"]

Durability = Literal["buffered", "durable"]


def _open(store: EventStore | str | None, on_store_failure: OnStoreFailure | None) -> EventStore:
    """The store, or, fail-open, a store opened once it answers: a store that is down
    when recording starts is an outage like any other, spooled and drained later."""
    try:
        return open_store(store)
    except StoreUnavailableError as exc:
        if on_store_failure == "raise" or isinstance(store, EventStore):
            raise
        import warnings

        from replayable.store.lazy import LazyStore

        url = store or os.environ.get("REPLAYABLE_STORE") or DEFAULT_STORE_URL
        lazy = LazyStore(url)
        warnings.warn(
            f"replayable: {exc}; recording to the spool until {lazy.url} answers",
            RuntimeWarning,
            stacklevel=4,
        )
        return lazy  # type: ignore[return-value]


class Recording(Session):
    """``with replayable.recording(store):`` — workflow calls inside are recorded.

    ``run_ids`` lists the top-level runs recorded, ``all_run_ids`` child runs
    too. Leaving the block waits until everything is committed.
    """

    def __init__(
        self,
        store: EventStore | str | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        durability: Durability = "buffered",
        env_vars: tuple[str, ...] = (),
        lineage: Mapping[str, Any] | None = None,
        on_store_failure: OnStoreFailure | None = None,
        max_block_s: float | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        # Importing an entry module for replay must not start a live recording.
        refuse_live("replayable.recording()")
        if durability not in ("buffered", "durable"):
            raise ConfigurationError(
                f"durability must be 'buffered' or 'durable', not {durability!r}"
            )
        check_tenant(tenant, "recording()")
        self.store = _open(store, on_store_failure)
        self.metadata = json_metadata(metadata, "metadata")
        self.tenant = tenant
        self.durability = durability
        self.durable = durability == "durable"
        self.env_vars = (*settings.env_vars, *env_vars)
        self.lineage = json_metadata(lineage, "lineage")
        self.run_ids: list[str] = []
        self.all_run_ids: list[str] = []
        self._env_hash: str | None = None
        self._tokens: list[Any] = []
        self.writer = writer_for(
            self.store,
            on_store_failure=on_store_failure,
            max_block_s=max_block_s,
            spool_dir=spool_dir,
        )
        #: Whether the recording was ever entered (``with``): one that never was
        #: recorded nothing, and says so when it is collected (see ``__del__``). A
        #: replay's live session is one too, used without ``with``.
        self._entered = type(self) is not Recording

    def __del__(self) -> None:
        if getattr(self, "_entered", True) is False:
            warnings.warn(
                "a replayable.recording() was created and never entered, so nothing was "
                "recorded: use it as `with replayable.recording(...):` around the calls",
                RuntimeWarning,
                stacklevel=1,
            )

    # -- context manager ------------------------------------------------------

    def __enter__(self) -> Recording:
        self._entered = True
        intercept_http()
        self._tokens.append(_STATE.set(State(self, None, Lineage())))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _STATE.reset(self._tokens.pop())
        self.writer.flush()

    async def __aenter__(self) -> Recording:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import asyncio

        _STATE.reset(self._tokens.pop())
        await asyncio.to_thread(self.writer.flush)

    # -- runs -----------------------------------------------------------------

    def _environment(self) -> str:
        if self._env_hash is None:
            digest, data = environment_snapshot(self.env_vars, settings.redactor)
            self.writer.blob(digest, data)
            self._env_hash = digest
        return self._env_hash

    def start_run(
        self,
        wf: WorkflowInfo,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        parent: tuple[RecordRun, int] | None = None,
        run_id: str | None = None,
        factory: Callable[[str, str], RecordRun] | None = None,
    ) -> RecordRun:
        """Write a run's start record and return its context (built by ``factory``)."""
        run_id = run_id or new_run_id()
        try:
            input_json = encode_input(args, kwargs)
        except UnencodableError as exc:
            raise serialization_error(
                f"the input of workflow {wf.name!r}", exc, None, wf.name
            ) from None
        parent_run, parent_seq = parent if parent is not None else (None, None)
        root = parent_run.root_run_id if parent_run is not None else run_id
        start = RunStart(
            run_id=run_id,
            workflow=wf.name,
            entrypoint=wf.entrypoint,
            parent_run_id=parent_run.run_id if parent_run is not None else None,
            parent_seq=parent_seq,
            root_run_id=root,
            tenant=self.tenant,
            input=input_json,
            metadata={**wf.metadata, **self.metadata},
            code=code_fingerprint(wf.fn),
            env_hash=self._environment(),
            lineage=self.lineage if parent is None else {},
            started_at=time.time(),
        )
        self.writer.start(start, self.durable)
        if parent is None:
            self.run_ids.append(run_id)
        self.all_run_ids.append(run_id)
        return factory(run_id, root) if factory is not None else RecordRun(self, run_id, root)

    def _finish(self, run: RecordRun, result: Any) -> None:
        try:
            output = encode_output(result)
        except UnencodableError as exc:
            err = serialization_error(f"the output of run {run.run_id}", exc, None)
            self.writer.end(
                (run.run_id, "failed", None, encode_error(err), time.time()), self.durable
            )
            raise err from None
        self.writer.end((run.run_id, "completed", output, None, time.time()), self.durable)

    def _fail(self, run: RecordRun, exc: BaseException) -> None:
        self.writer.end((run.run_id, "failed", None, encode_error(exc), time.time()), self.durable)

    def execute(
        self, run: RecordRun, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        token = _STATE.set(State(self, run, Lineage()))
        try:
            result = wf.fn(*args, **kwargs)
        except BaseException as exc:
            self._fail(run, exc)
            raise
        finally:
            _STATE.reset(token)
        self._finish(run, result)
        return result

    async def aexecute(
        self, run: RecordRun, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        import asyncio

        install_task_factory(asyncio.get_running_loop())
        token = _STATE.set(State(self, run, Lineage()))
        try:
            result = await wf.fn(*args, **kwargs)
        except BaseException as exc:
            self._fail(run, exc)
            raise
        finally:
            _STATE.reset(token)
        self._finish(run, result)
        return result

    def run_root(self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return self.execute(self.start_run(wf, args, kwargs), wf, args, kwargs)

    async def arun_root(
        self, wf: WorkflowInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        return await self.aexecute(self.start_run(wf, args, kwargs), wf, args, kwargs)
