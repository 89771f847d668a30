"""Streamed response bodies: recorded chunk by chunk live, served chunk by chunk on replay.

Recording, each chunk costs two list appends (its bytes and the clock);
everything else (the chunk table, decoding, parsing the server-sent events,
the assembled response) is done once, when the response is closed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from replayable.errors import ReplayError
from replayable.events.codec import decode_error, encode_error
from replayable.integrations import _wire
from replayable.integrations._exchange import STREAM_DROP, Exchange
from replayable.integrations._sse import read_sse

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
        "headers",
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
        pairs: list[tuple[str, str]],
    ) -> None:
        self.call, self.scope, self.ex = call, scope, ex
        self.status = status
        self.headers = [[k, v] for k, v in pairs if k not in STREAM_DROP]
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
        raw = b"".join(self.parts)
        encoded = any(k == "content-encoding" for k, _ in self.headers)
        data: str | bytes = raw
        if not encoded:
            try:
                data = raw.decode()
            except UnicodeDecodeError:
                pass
        t0 = self.t0
        chunks = [[len(p), (m - t0) // 1000] for p, m in zip(self.parts, self.marks, strict=True)]
        assembled, finished = (
            (None, False) if encoded or self.ex.kind != "llm" else read_sse(self.ex.name, raw)
        )
        # Complete: the provider's final event arrived (SDKs close right after it)
        # or the body ended. ``exhausted``: the body itself was read to its end.
        complete = self.complete or finished
        stream: dict[str, Any] = {
            "data": data,
            "chunks": chunks,
            "complete": complete,
            "exhausted": self.complete,
        }
        if self.error is not None:
            stream["error"] = orjson.loads(encode_error(self.error))
        value = {
            "status": self.status,
            "headers": self.headers,
            "stream": stream,
            "assembled": assembled,
        }
        meta = _wire.describe_response(self.ex.name, assembled) if self.ex.kind == "llm" else {}
        meta.update(status=self.status, stream=True, chunks=len(chunks), complete=complete)
        if self.scope is not None:
            self.scope.annotate(meta)
        self.call.finish(value, meta)


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
