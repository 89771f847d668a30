"""The real NATS JetStream server for the tests (``$REPLAYABLE_TEST_NATS``, default
127.0.0.1:4222): a fresh stream name per test, deleted (with the compactors' status
bucket) afterwards. An unreachable server skips, except under ``CI=true``, where it
fails the build."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Iterator

import pytest

SERVER = os.environ.get("REPLAYABLE_TEST_NATS", "127.0.0.1:4222")


def require_nats() -> None:
    host, port = SERVER.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError as exc:
        message = f"NATS at {SERVER} is not reachable: {exc}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: the NATS tests must run)")
        pytest.skip(message)


async def _remove(name: str) -> None:
    import nats

    nc = await nats.connect(f"nats://{SERVER}", connect_timeout=2)
    try:
        js = nc.jetstream()
        try:
            await js.delete_stream(name)
        except Exception:
            pass
        try:
            await js.delete_key_value(f"{name}_compactors")
        except Exception:
            pass
    finally:
        await nc.close()


@pytest.fixture
def stream_name() -> Iterator[str]:
    """A stream name no other test uses; the stream is deleted after the test."""
    require_nats()
    name = f"rt_{secrets.token_hex(5)}"
    try:
        yield name
    finally:
        asyncio.run(_remove(name))
