"""Streamed response bodies: recorded chunk by chunk live, served chunk by chunk on replay.

Recording, each chunk costs two list appends (its bytes and the clock). When
the response is closed the chunks are handed off as they are; the chunk
table, decoding, parsing the server-sent events and the assembled response
are built by the writer (see :mod:`~replayable.integrations._build`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from replayable.errors import ReplayError
from replayable.events.codec import decode_error, encode_error
from replayable.integrations._build import finish
from replayable.integrations._exchange import Exchange

if TYPE_CHECKING:
    from replayable.capture.runtime import OpenCall
    from replayable.integrations._seam import RetryScope

__all__ = ["StreamRecord", "recording_streams", "replay_streams"]


class StreamRecord:
    """The chunks of a live stream, finished into its event when the response closes."""

    __slots__ = (
        "call",
        "complete",
        "done",
        "error",
        "ex",
        "items",
        "marks",
        "parts",
        "scope",
        "status",
        "t0",
    )

    def __init__(
        self,
        call: OpenCall,
        scope: RetryScope | None,
        ex: Exchange,
        status: int,
        items: list[tuple[bytes, bytes, bytes]],
    ) -> None:
        self.call, self.scope, self.ex = call, scope, ex
        self.status = status
        self.items = items
        self.parts: list[bytes] = []
        self.marks: list[int] = []
        self.error: BaseException | None = None
        self.complete = False
        self.done = False
        self.t0 = time.perf_counter_ns()

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        error = None if self.error is None else encode_error(self.error)
        raw = ("s", self.status, self.items, self.parts, self.marks, self.t0, self.complete, error)
        meta: dict[str, Any] = {}
        if self.scope is not None:
            self.scope.annotate(meta)
        finish(self.call, self.ex, raw, None, meta)


def replay_chunks(stream: dict[str, Any]) -> Iterator[bytes]:
    """The chunks of a recorded stream, then its recorded ending (an error, or a cut)."""
    data = stream["data"]
    raw: bytes = data.encode() if isinstance(data, str) else data
    offset = 0
    for size, _ in stream["chunks"]:
        yield raw[offset : offset + size]
        offset += size
    if "error" in stream:
        raise decode_error(orjson.dumps(stream["error"]))
    if not stream["exhausted"]:
        raise ReplayError(
            f"the recorded stream was closed after {len(stream['chunks'])} chunks; "
            "the replayed code reads further than the recorded run did"
        )


def recording_streams(hx: ModuleType) -> tuple[type, type]:
    """The sync and async byte streams of ``hx`` that record a live body as it passes."""

    class RecordingStream(hx.SyncByteStream):  # type: ignore[misc,name-defined]
        """A live response body that records each chunk as it passes."""

        def __init__(self, inner: Any, record: StreamRecord) -> None:
            self.inner, self.record = inner, record

        def __iter__(self) -> Iterator[bytes]:
            rec = self.record
            parts, marks, clock = rec.parts.append, rec.marks.append, time.perf_counter_ns
            try:
                for chunk in self.inner:
                    parts(chunk)
                    marks(clock())
                    yield chunk
            except Exception as exc:
                rec.error = exc
                raise
            rec.complete = True

        def close(self) -> None:
            try:
                self.inner.close()
            finally:
                self.record.finish()

    class AsyncRecordingStream(hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        """A live async response body that records each chunk as it passes."""

        def __init__(self, inner: Any, record: StreamRecord) -> None:
            self.inner, self.record = inner, record

        async def __aiter__(self) -> AsyncIterator[bytes]:
            rec = self.record
            parts, marks, clock = rec.parts.append, rec.marks.append, time.perf_counter_ns
            try:
                async for chunk in self.inner:
                    parts(chunk)
                    marks(clock())
                    yield chunk
            except Exception as exc:
                rec.error = exc
                raise
            rec.complete = True

        async def aclose(self) -> None:
            try:
                await self.inner.aclose()
            finally:
                self.record.finish()

    return RecordingStream, AsyncRecordingStream


def replay_streams(hx: ModuleType) -> tuple[type, type]:
    """The sync and async byte streams of ``hx`` that serve a recorded body."""

    class ReplayStream(hx.SyncByteStream):  # type: ignore[misc,name-defined]
        """A recorded response body, yielded chunk by chunk."""

        def __init__(self, stream: dict[str, Any]) -> None:
            self.stream = stream

        def __iter__(self) -> Iterator[bytes]:
            yield from replay_chunks(self.stream)

        def close(self) -> None:
            pass

    class AsyncReplayStream(hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        """A recorded response body, yielded chunk by chunk to an async reader."""

        def __init__(self, stream: dict[str, Any]) -> None:
            self.stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in replay_chunks(self.stream):
                yield chunk

        async def aclose(self) -> None:
            pass

    return ReplayStream, AsyncReplayStream
