"""The JetStream side of a stream store: one connection, on an event loop of its own.

Store calls come from the writer's threads; each runs a coroutine on this
client's loop thread and waits for it at most its timeout. A call that times
out, or a connection that breaks, drops the connection: the next call
connects again, so an outage ends by itself once the server answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from replayable.errors import ConfigurationError, StoreError, StoreUnavailableError

__all__ = ["StreamClient", "StreamConfig", "ensure_stream"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class StreamConfig:
    """Where records go: the server, the stream, its subjects, how it is made."""

    server: str
    stream: str
    prefix: str
    replicas: int = 1
    #: Seconds the server remembers a message id (what a retried publish is checked
    #: against). Spooled records drained later than this are still written once: the
    #: compactor skips what the sink holds.
    duplicate_window: float = 120.0
    timeout: float = 5.0


class StreamClient:
    """A JetStream connection shared by one store's threads."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="replayable-stream", daemon=True
        )
        self._thread.start()
        self._nc: Any = None
        self._js: Any = None
        self._made = False
        self._closed = False
        self._dropping: list[concurrent.futures.Future[None]] = []
        # The ack inbox of the current connection (see ``publish``).
        self._acks: dict[str, asyncio.Future[bytes]] | None = None
        self._ack_prefix = ""
        self._next_token = 0
        #: The most bytes a message may have (headers included) on the server last
        #: connected to; NATS's default until then.
        self.max_payload = 1 << 20

    # -- calls from other threads ------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, _T], what: str, timeout: float | None = None) -> _T:
        """Run ``coro`` on the loop; a failure is a :class:`StoreError` naming ``what``."""
        if self._closed:
            coro.close()
            raise StoreError(f"{self.config.server} stream {self.config.stream}: closed")
        bound = self.config.timeout if timeout is None else timeout
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(bound)
        except (StoreError, ConfigurationError):
            raise
        except TimeoutError as exc:
            future.cancel()
            self.drop()
            raise StoreUnavailableError(
                f"{what} on {self.config.server} (stream {self.config.stream}) took over {bound:g}s"
            ) from exc
        except Exception as exc:
            future.cancel()
            raise self._mapped(exc, what) from exc

    def _mapped(self, exc: Exception, what: str) -> StoreError:
        from nats.js.errors import APIError, NotFoundError

        where = f"{what} on {self.config.server} (stream {self.config.stream})"
        if isinstance(exc, NotFoundError):
            self._made = False  # deleted under us: made again on the next call
            self.drop()
            return StoreUnavailableError(f"{where}: the stream is gone: {exc}")
        if isinstance(exc, APIError) and exc.code is not None and 400 <= exc.code < 500:
            return StoreError(f"{where}: refused: {exc}")
        self.drop()
        return StoreUnavailableError(f"{where}: {exc!r}")

    def drop(self) -> None:
        """Close the connection (from any thread); the next call connects again."""
        nc, self._nc, self._js = self._nc, None, None
        self._acks = None
        if nc is not None and not self._closed:
            self._dropping.append(asyncio.run_coroutine_threadsafe(_quiet_close(nc), self._loop))

    def close(self) -> None:
        if self._closed:
            return
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            self._dropping.append(asyncio.run_coroutine_threadsafe(_quiet_close(nc), self._loop))
        self._closed = True
        for closing in self._dropping:
            try:
                closing.result(3)
            except Exception:
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2)
        if not self._thread.is_alive():
            self._loop.close()

    # -- on the loop ---------------------------------------------------------------

    async def js(self) -> Any:
        """The JetStream context, connecting (and making the stream) when needed."""
        if self._js is not None and self._nc is not None and self._nc.is_connected:
            return self._js
        import nats

        if self._nc is not None:
            await _quiet_close(self._nc)
        self._acks = None
        cfg = self.config
        self._nc = await nats.connect(
            cfg.server,
            connect_timeout=min(2.0, cfg.timeout),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            name="replayable",
        )
        self.max_payload = int(getattr(self._nc, "max_payload", 0) or self.max_payload)
        js = self._nc.jetstream(timeout=cfg.timeout)
        if not self._made:
            await ensure_stream(js, cfg)
            self._made = True
        self._js = js
        return js

    async def publish(self, messages: Sequence[tuple[str, str, bytes]]) -> None:
        """Publish ``(subject, message id, body)`` each and wait for every ack.

        The whole batch goes out as one write of ``HPUB`` frames, each with its message
        id and the expected stream, replies coming to one inbox of this connection: a
        tenth of the client's work per message of nats-py's ``publish_async`` (which
        takes a semaphore, a task and a header dict per message), the same bytes on
        the wire.
        """
        await self.js()
        nc = self._nc
        send = getattr(nc, "_send_command", None)
        if send is None:  # a client without the frame writer: its own publish_async
            await self._publish_each(messages)
            return
        if self._acks is None:
            await self._ack_inbox()
        acks = self._acks
        assert acks is not None
        loop = asyncio.get_running_loop()
        prefix = self._ack_prefix
        tail = f"Nats-Expected-Stream: {self.config.stream}\r\n\r\n"
        frames: list[bytes] = []
        futures: list[asyncio.Future[bytes]] = []
        base = self._next_token
        self._next_token += len(messages)
        for i, (subject, mid, body) in enumerate(messages):
            token = str(base + i)
            future: asyncio.Future[bytes] = loop.create_future()
            acks[token] = future
            futures.append(future)
            head = f"NATS/1.0\r\nNats-Msg-Id: {mid}\r\n{tail}".encode()
            frames.append(
                f"HPUB {subject} {prefix}{token} {len(head)} {len(head) + len(body)}\r\n".encode()
                + head
                + body
                + b"\r\n"
            )
        try:
            await send(b"".join(frames))
            await nc._flush_pending()
            replies = await asyncio.gather(*futures)
        finally:
            for i in range(len(messages)):
                acks.pop(str(base + i), None)
        for reply in replies:
            _check_ack(reply, self.config.stream)

    async def _ack_inbox(self) -> None:
        nc = self._nc
        self._ack_prefix = f"{nc.new_inbox()}."
        self._acks = {}
        acks = self._acks

        async def on_ack(msg: Any) -> None:
            future = acks.pop(msg.subject[len(self._ack_prefix) :], None)
            if future is not None and not future.done():
                future.set_result(msg.data or b"")

        await nc.subscribe(self._ack_prefix + "*", cb=on_ack)

    async def _publish_each(self, messages: Sequence[tuple[str, str, bytes]]) -> None:
        js = await self.js()
        stream = self.config.stream
        futures = [
            await js.publish_async(subject, body, stream=stream, headers={"Nats-Msg-Id": mid})
            for subject, mid, body in messages
        ]
        for ack in await asyncio.gather(*futures):
            if ack.stream != stream:
                raise StoreError(f"a record went to stream {ack.stream}, not {stream}")

    async def subject_counts(self, subjects: str) -> dict[str, int]:
        """How many messages each subject matching ``subjects`` holds."""
        js = await self.js()
        info = await js.stream_info(self.config.stream, subjects_filter=subjects)
        return dict(info.state.subjects or {})

    async def read(self, subjects: str, limit: int = 1_000_000) -> list[tuple[int, bytes]]:
        """The messages on ``subjects`` in stream order, as ``(stream seq, body)``."""
        from nats.js.errors import NotFoundError

        js = await self.js()
        out: list[tuple[int, bytes]] = []
        seq = 1
        while len(out) < limit:
            try:
                msg = await js.get_msg(self.config.stream, seq=seq, subject=subjects, next=True)
            except NotFoundError:
                break
            out.append((msg.seq, msg.data or b""))
            seq = msg.seq + 1
        return out

    async def info(self) -> Any:
        js = await self.js()
        return await js.stream_info(self.config.stream)


async def ensure_stream(js: Any, cfg: StreamConfig) -> None:
    """Make the stream (a work queue over ``<prefix>.>``) unless it exists; refuse one
    that takes other subjects."""
    from nats.js.api import RetentionPolicy, StorageType
    from nats.js.api import StreamConfig as Config
    from nats.js.errors import NotFoundError

    try:
        info = await js.stream_info(cfg.stream)
    except NotFoundError:
        await js.add_stream(
            Config(
                name=cfg.stream,
                subjects=[f"{cfg.prefix}.>"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                num_replicas=cfg.replicas,
                duplicate_window=cfg.duplicate_window,
            )
        )
        return
    if f"{cfg.prefix}.>" not in (info.config.subjects or []):
        raise ConfigurationError(
            f"stream {cfg.stream} on {cfg.server} takes {info.config.subjects}, not "
            f"{cfg.prefix}.>; name another stream or subject prefix"
        )


def _check_ack(reply: bytes, stream: str) -> None:
    """Raise what a JetStream publish ack says went wrong (nothing for a stored message)."""
    try:
        ack = orjson.loads(reply) if reply else None
    except orjson.JSONDecodeError:
        ack = None
    if not isinstance(ack, dict):
        # No responders (an empty reply with a status header): the stream is gone.
        raise StoreUnavailableError(f"stream {stream} did not acknowledge a record")
    error = ack.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, dict) else None
        text = f"stream {stream} refused a record: {error}"
        if isinstance(code, int) and code == 503:
            raise StoreUnavailableError(text)
        raise StoreError(text)
    if ack.get("stream") != stream:
        raise StoreError(f"a record went to stream {ack.get('stream')}, not {stream}")


async def _quiet_close(nc: Any) -> None:
    try:
        await asyncio.wait_for(nc.close(), 2)
    except Exception:
        pass
