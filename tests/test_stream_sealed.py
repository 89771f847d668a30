"""Records waiting in JetStream are encrypted when the store encrypts its payloads: the
server's disk holds no payload in clear, a compactor without the key leaves them in the
stream (never drops them), and an altered message is refused; against the real server
on 127.0.0.1:4222 and the real PostgreSQL."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

import replayable
import replayable.archive.stream as compactor_module
from replayable.archive.stream import Compactor, stream_state
from replayable.errors import ConfigurationError
from replayable.store import open_store
from replayable.store.crypto import ENV_DATA_KEY, ENV_DATA_KEYRING, ENV_DATA_PROVIDER
from replayable.store.stream import StreamStore
from replayable.store.stream._cipher import FrameCipher, SealedMessageError, stream_cipher
from replayable.store.stream._wire import decode, encode, records
from replayable.store.verify import verify_store
from tests.nats_helpers import SERVER, stream_name
from tests.pg_helpers import PgServer, pg
from tests.test_stream_ingest import publish_raw, raw_messages

__all__ = ["pg", "stream_name"]

MARK = "Zanzibar-Q7-account-holder"


def _kek(n: int) -> str:
    return f"kek{n}:" + base64.b64encode(bytes([n]) * 32).decode()


@pytest.fixture
def kek(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_DATA_KEYRING, ENV_DATA_PROVIDER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_DATA_KEY, _kek(1))


@replayable.tool
def lookup(name: str, i: int) -> dict[str, Any]:
    return {"holder": name, "i": i, "note": f"{name} " * 40}


@replayable.workflow
def sealed_agent(n: int) -> int:
    return sum(lookup(MARK, i)["i"] for i in range(n))


@pytest.fixture
def url(stream_name: str, pg: PgServer) -> str:
    return f"nats://{SERVER}?stream={stream_name}&sink={pg.url(pg.new_schema('sealed'))}"


@pytest.fixture
def store(url: str, kek: None) -> Iterator[StreamStore]:
    s = open_store(url)
    assert isinstance(s, StreamStore)
    yield s
    s.close()


def _compact(url: str) -> Any:
    return Compactor(url).run(until_idle=0.3, max_seconds=30)


def test_a_cipher_opens_what_it_sealed_and_names_what_it_cannot(kek: None) -> None:
    cipher = stream_cipher()
    assert cipher is not None
    assert cipher.seals
    body = encode("b", ("d" * 64, MARK.encode()))
    sealed = cipher.seal(body)
    assert sealed[:1] == b"c"
    assert MARK.encode() not in sealed
    assert cipher.open(sealed) == body
    assert decode(sealed, cipher) == decode(body)
    # Another process with the same KEK opens it; one without any, or with another, not.
    from replayable.store.crypto import data_keys_from_env

    other = data_keys_from_env({ENV_DATA_KEY: _kek(1)})
    assert other is not None
    assert FrameCipher(other).open(sealed) == body
    with pytest.raises(SealedMessageError, match="no data key configured"):
        decode(sealed)
    stranger = data_keys_from_env({ENV_DATA_KEY: _kek(2)})
    assert stranger is not None
    with pytest.raises(SealedMessageError, match=r"key kek1\) cannot be opened"):
        FrameCipher(stranger).open(sealed)
    # Altered or cut short: refused as no record, never taken for a missing key.
    altered = bytearray(sealed)
    altered[-1] ^= 1
    with pytest.raises(ConfigurationError, match="altered"):
        cipher.open(bytes(altered))
    for cut in (sealed[:2], sealed[:20]):
        with pytest.raises(ConfigurationError):
            cipher.open(cut)


@pytest.mark.slow
def test_records_in_the_stream_hold_no_payload_in_clear(
    store: StreamStore, url: str, tmp_path: Any
) -> None:
    with replayable.recording(store, spool_dir=tmp_path) as rec:
        sealed_agent(12)
    run_id = rec.run_ids[0]
    raw = raw_messages(store)
    assert raw
    assert all(body[:1] == b"c" for _, _, body in raw)
    assert all(MARK.encode() not in body for _, _, body in raw)
    # Still in the stream, the run reads back whole and replays.
    events = store.events(run_id)
    assert len(events) == 12
    assert MARK in events[0].response
    assert replayable.replay(run_id, store=store, fn=sealed_agent).status == "identical"
    report = _compact(url)
    assert report.records == 12 + 2
    assert report.sealed == 0
    assert stream_state(url)["depth"] == 0
    assert [e.seq for e in store.sink.events(run_id)] == list(range(1, 13))
    assert replayable.replay(run_id, store=store, fn=sealed_agent).status == "identical"
    assert verify_store(store.sink).ok


@pytest.mark.slow
def test_a_compactor_without_the_key_leaves_sealed_records_in_the_stream(
    store: StreamStore, url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with replayable.recording(store, spool_dir=tmp_path) as rec:
        sealed_agent(5)
    depth = stream_state(url)["depth"]
    assert depth >= 1
    monkeypatch.setattr(compactor_module, "SEALED_RETRY_S", 0.2)
    monkeypatch.setenv(ENV_DATA_KEY, _kek(2))  # a compactor started with the wrong key
    # A reader with the wrong key says it cannot open the run's records, not part of it.
    with (
        open_store(url) as blind_reader,
        pytest.raises(SealedMessageError, match="cannot be opened here"),
    ):
        blind_reader.events(rec.run_ids[0])
    blind = Compactor(url).run(until_idle=0.3, max_seconds=3)  # never idle: they come back
    assert blind.sealed >= depth
    assert blind.records == 0
    assert blind.rejected == 0
    assert "(wrapped by key-encryption key kek1) cannot be opened" in (blind.sealed_error or "")
    assert stream_state(url)["depth"] == depth  # nothing dropped
    monkeypatch.setenv(ENV_DATA_KEY, _kek(1))
    keyed = _compact(url)
    assert keyed.records == 5 + 2
    assert stream_state(url)["depth"] == 0
    assert [e.seq for e in store.sink.events(rec.run_ids[0])] == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_an_altered_sealed_message_is_refused_and_the_others_stored(
    store: StreamStore, url: str, tmp_path: Any
) -> None:
    with replayable.recording(store, spool_dir=tmp_path) as rec:
        sealed_agent(3)
    good = raw_messages(store)
    subject, _, body = next(m for m in good if records(m[2], store.cipher)[0][0] != "b")
    altered = bytearray(body)
    altered[-5] ^= 0xFF
    publish_raw(store, [(subject.replace(rec.run_ids[0], "x" * 8), None, bytes(altered))])
    report = _compact(url)
    assert report.rejected == 1
    assert report.sealed == 0
    assert report.records == 3 + 2
    assert stream_state(url)["depth"] == 0
