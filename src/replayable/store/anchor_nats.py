"""An anchor on a NATS JetStream subject (``nats://host:port/subject?stream=NAME``).

The stream is created on first use with deletes and purges denied, so the
entries stay put for whoever holds only the database; give the stream's
account to someone else than the database's owner. The writer thread calls
:meth:`JetStreamAnchor.publish` once per batch; it waits for JetStream's
acknowledgement of every entry.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import orjson

from replayable.errors import ConfigurationError, StoreError

__all__ = ["JetStreamAnchor"]

_T = TypeVar("_T")
_TIMEOUT_S = 5.0


class JetStreamAnchor:
    """Anchor entries as JetStream messages on one subject."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        subject = parts.path.lstrip("/")
        if not parts.hostname or not subject or not re.fullmatch(r"[A-Za-z0-9_.-]+", subject):
            raise ConfigurationError(
                f"anchor URL {url!r} must be nats://host:port/subject (subject of letters, "
                "digits, '.', '_', '-')"
            )
        query = parse_qs(parts.query)
        default = "REPLAYABLE_ANCHOR_" + re.sub(r"[^A-Za-z0-9_-]", "_", subject).upper()
        self.stream = query.get("stream", [default])[0]
        self.subject = subject
        self.server = f"nats://{parts.hostname}:{parts.port or 4222}"
        self.url = f"{self.server}/{subject}?stream={self.stream}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="replayable-anchor", daemon=True
        )
        self._thread.start()
        self._nc: Any = None
        self._js: Any = None

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(_TIMEOUT_S * 2)
        except StoreError:
            raise
        except Exception as exc:
            future.cancel()
            raise StoreError(f"anchor {self.url}: {exc!r}") from exc

    async def _connect(self) -> Any:
        if self._js is not None and self._nc is not None and self._nc.is_connected:
            return self._js
        import nats
        from nats.js.errors import NotFoundError

        self._nc = await nats.connect(
            self.server, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0
        )
        js = self._nc.jetstream(timeout=_TIMEOUT_S)
        try:
            await js.stream_info(self.stream)
        except NotFoundError:
            await js.add_stream(
                name=self.stream, subjects=[self.subject], deny_delete=True, deny_purge=True
            )
        self._js = js
        return js

    async def _publish(self, entries: Sequence[dict[str, Any]]) -> None:
        js = await self._connect()
        for entry in entries:
            await js.publish(
                self.subject, orjson.dumps(entry, option=orjson.OPT_SORT_KEYS), stream=self.stream
            )

    def publish(self, entries: Sequence[dict[str, Any]]) -> None:
        if entries:
            self._run(self._publish(entries))

    async def _read(self) -> list[dict[str, Any] | str]:
        js = await self._connect()
        info = await js.stream_info(self.stream)
        out: list[dict[str, Any] | str] = []
        first, last = info.state.first_seq, info.state.last_seq
        if not info.state.messages:
            return out
        sub = await js.pull_subscribe(self.subject, stream=self.stream)
        try:
            seen = first - 1
            while seen < last:
                msgs = await sub.fetch(min(1000, last - seen), timeout=_TIMEOUT_S)
                for msg in msgs:
                    seen = msg.metadata.sequence.stream
                    out.append(_decode(msg.data, seen))
                    await msg.ack()
        finally:
            await sub.unsubscribe()
        return out

    def entries(self) -> Iterator[dict[str, Any] | str]:
        return iter(self._run(self._read()))

    def close(self) -> None:
        if self._nc is not None:
            try:
                self._run(self._nc.close())
            except StoreError:
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2)
        self._loop.close()

    def __repr__(self) -> str:
        return f"JetStreamAnchor({self.url!r})"


def _decode(data: bytes, seq: int) -> dict[str, Any] | str:
    try:
        entry = orjson.loads(data)
    except orjson.JSONDecodeError:
        return f"message {seq} is not JSON"
    return entry if isinstance(entry, dict) else f"message {seq} is not an object"
