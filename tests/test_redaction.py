"""Secrets never reach storage: they are redacted at capture time, before
fingerprinting, so replay still matches when only a secret changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

import replayable
from replayable.events.canonical import REDACTED
from replayable.store.sqlite import SQLiteStore

API_KEY = "sk-proj-Q7w8E9r0T1y2U3i4O5p6"
OTHER_KEY = "sk-proj-Z9x8C7v6B5n4M3l2K1j0"
BEARER_TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0cGF5bG9hZA"
ACCESS_TOKEN = "tok-live-8f3a9c2e7b1d"
PASSWORD = "hunter2-correct-horse"
CLIENT_SECRET = "cs-5e6f7a8b9c0d1e2f"
TEXT_KEY = "sk-ant-api03-Lm4Nn5Oo6Pp7Qq8Rr9Ss"
METADATA_KEY = "sk-meta-Aa1Bb2Cc3Dd4Ee5Ff6Gg7"

SECRETS = (
    API_KEY,
    OTHER_KEY,
    BEARER_TOKEN,
    ACCESS_TOKEN,
    PASSWORD,
    CLIENT_SECRET,
    TEXT_KEY,
    METADATA_KEY,
)
MARKER = "weather-in-oslo-marker"


@replayable.tool
def call_api(query: str, api_key: str, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "answer": f"results for {query}",
        "session": {
            "access_token": ACCESS_TOKEN,
            "expires_in": 3600,
            "user": {"name": "ada", "password": PASSWORD},
        },
        "apps": [{"client_id": "app-1", "client_secret": CLIENT_SECRET}],
        "debug": f"authenticated with {api_key}; fallback key {TEXT_KEY} also valid",
    }


@replayable.workflow
def agent(question: str) -> dict[str, Any]:
    key = os.environ["DEMO_API_KEY"]  # read directly: the key is not a recorded input
    headers = {"Authorization": f"Bearer {BEARER_TOKEN}", "Accept": "application/json"}
    return call_api(f"{question}; my key is {key}", api_key=key, headers=headers)


@replayable.workflow
def agent_with_key(question: str, api_key: str) -> str:
    first = call_api(question, api_key=api_key, headers={"Authorization": f"Bearer {api_key}"})
    second = call_api(question, api_key=OTHER_KEY, headers={"Authorization": f"Bearer {OTHER_KEY}"})
    return f"{first['answer']} / {second['answer']}"


def database_bytes(path: Path) -> bytes:
    """The database file and its write-ahead log, as bytes on disk."""
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


@pytest.fixture
def recorded(sqlite_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> tuple[SQLiteStore, str]:
    monkeypatch.setenv("DEMO_API_KEY", API_KEY)
    with replayable.recording(sqlite_store, metadata={"team": "a", "api_key": METADATA_KEY}) as rec:
        out = agent(MARKER)
    assert out["session"]["access_token"] == ACCESS_TOKEN  # the agent saw the real value
    return sqlite_store, rec.run_ids[0]


def test_request_and_response_hold_no_secret(recorded: tuple[SQLiteStore, str]) -> None:
    """The stored request and response have every secret replaced by the redaction mark."""
    store, run_id = recorded
    (event,) = store.events(run_id)
    request = event.request_value()
    assert request["api_key"] == REDACTED
    assert request["headers"] == {"Authorization": REDACTED, "Accept": "application/json"}
    assert request["query"] == f"{MARKER}; my key is {REDACTED}"
    response = event.response_tree()
    assert response["session"]["access_token"] == REDACTED
    assert response["session"]["user"] == {"name": "ada", "password": REDACTED}
    assert response["apps"] == [{"client_id": "app-1", "client_secret": REDACTED}]
    assert response["debug"] == f"authenticated with {REDACTED}; fallback key {REDACTED} also valid"
    assert response["session"]["expires_in"] == 3600
    stored = f"{event.request} {event.response}"
    for secret in SECRETS:
        assert secret not in stored


def test_run_records_hold_no_secret(recorded: tuple[SQLiteStore, str]) -> None:
    """The run's output and metadata are redacted too; other metadata is kept."""
    store, run_id = recorded
    run = store.get_run(run_id)
    assert run.end is not None
    assert run.end.output is not None
    for secret in SECRETS:
        assert secret not in run.end.output
        assert secret not in run.start.input
    assert run.metadata == {"team": "a", "api_key": REDACTED}


def test_database_file_holds_no_secret(
    recorded: tuple[SQLiteStore, str], sqlite_path: Path
) -> None:
    """No secret appears anywhere in the bytes of the database or its log."""
    store, _ = recorded
    while_open = database_bytes(sqlite_path)
    store.close()  # checkpoints the log into the database file
    for data in (while_open, database_bytes(sqlite_path)):
        assert MARKER.encode() in data  # the search can see stored text
        for secret in SECRETS:
            assert secret.encode() not in data, secret


def test_replay_works_with_redacted_recording(
    recorded: tuple[SQLiteStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redacted run replays identically, even when the live key has changed since."""
    store, run_id = recorded
    monkeypatch.setenv("DEMO_API_KEY", OTHER_KEY)
    result = replayable.replay(run_id, store=store, fn=agent)
    assert result.status == "identical", result.divergence
    assert result.events_served == 1
    assert result.output["session"]["access_token"] == REDACTED
    assert result.output["answer"] == f"results for {MARKER}; my key is {REDACTED}"


def test_fingerprint_ignores_secrets(sqlite_store: SQLiteStore) -> None:
    """Two calls differing only in their secrets get one fingerprint; other changes do not."""

    @replayable.workflow
    def twice() -> None:
        call_api("q", api_key=API_KEY, headers={"Authorization": f"Bearer {API_KEY}"})
        call_api("q", api_key=OTHER_KEY, headers={"Authorization": f"Bearer {OTHER_KEY}"})
        call_api("other q", api_key=API_KEY, headers={"Authorization": f"Bearer {API_KEY}"})

    with replayable.recording(sqlite_store) as rec:
        twice()
    first, second, third = sqlite_store.events(rec.run_ids[0])
    assert first.request == second.request
    assert first.fingerprint == second.fingerprint
    assert third.fingerprint != first.fingerprint


def test_secret_in_workflow_input_redacted_and_replayable(sqlite_store: SQLiteStore) -> None:
    """A secret passed as a workflow argument is stored redacted, and the run still replays."""
    with replayable.recording(sqlite_store) as rec:
        agent_with_key(MARKER, API_KEY)
    run_id = rec.run_ids[0]
    run = sqlite_store.get_run(run_id)
    assert API_KEY not in run.start.input
    assert orjson.loads(run.start.input)["args"] == [MARKER, REDACTED]
    result = replayable.replay(run_id, store=sqlite_store, fn=agent_with_key)
    assert result.status == "identical", result.divergence
    assert result.events_served == 2


def test_environment_snapshot_redacts_secret_names(
    sqlite_store: SQLiteStore, sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment snapshot keeps named variables' values, secret-looking ones redacted."""
    token = "plain-looking-value-7d1e"
    monkeypatch.setenv("MY_TOKEN", token)
    monkeypatch.setenv("REGION", "eu-west-1")
    monkeypatch.setenv("DEMO_API_KEY", API_KEY)
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with replayable.recording(
        sqlite_store, env_vars=("MY_TOKEN", "REGION", "NOT_SET_ANYWHERE")
    ) as rec:
        agent(MARKER)
    run = sqlite_store.get_run(rec.run_ids[0])
    assert run.start.env_hash is not None
    blob = sqlite_store.get_blob(run.start.env_hash)
    assert blob is not None
    assert hashlib.sha256(blob).hexdigest() == run.start.env_hash
    env = orjson.loads(blob)["env"]
    assert env == {"MY_TOKEN": REDACTED, "REGION": "eu-west-1"}
    assert token.encode() not in blob
    assert token.encode() not in database_bytes(sqlite_path)


BASIC_AUTH = "Basic dXNlcjpodW50ZXIyLWNvcnJlY3Q="
COOKIE = "session=a8f5f167f44f4964e6c998dee827110c"


@replayable.tool
def raw_request(url: str, headers: list[tuple[str, str]]) -> dict[Any, Any]:
    return {
        "status": 200,
        "headers": [["Set-Cookie", COOKIE], ["Content-Type", "text/plain"]],
        1: {"password": PASSWORD},
    }


def test_headers_as_pairs_redacted(sqlite_store: SQLiteStore, sqlite_path: Path) -> None:
    """Secrets in [name, value] pairs (headers as a list, non-str-key maps) are redacted."""

    @replayable.workflow
    def fetch() -> dict[Any, Any]:
        headers = [("Authorization", BASIC_AUTH), ("Accept", "text/plain")]
        return raw_request("https://example.test/x", headers)

    with replayable.recording(sqlite_store) as rec:
        fetch()
    (event,) = sqlite_store.events(rec.run_ids[0])
    assert event.request_value()["headers"] == [
        ["Authorization", REDACTED],
        ["Accept", "text/plain"],
    ]
    response = replayable.replay(rec.run_ids[0], store=sqlite_store, fn=fetch)
    assert response.status == "identical", response.divergence
    assert response.output["headers"] == [["Set-Cookie", REDACTED], ["Content-Type", "text/plain"]]
    assert response.output[1] == {"password": REDACTED}
    data = database_bytes(sqlite_path)
    for secret in (BASIC_AUTH.split()[1], COOKIE, PASSWORD):
        assert secret.encode() not in data


def test_prefilter_decides_as_the_full_scans_do() -> None:
    """The one-pass pre-filter only skips scans that could not match: on random payloads
    mixing secret names, secret values and near misses it agrees with the full scans."""
    import random

    from replayable.events.canonical import Redactor

    fast = Redactor(extra_keys=["private key", "monkey"])
    full = Redactor(extra_keys=["private key", "monkey"])
    assert fast._prefilter is not None
    full._prefilter = None
    words = [
        "prompt_tokens", "total_tokens", "api_key", "API-KEY", "x-api-key", "Authorization",
        "password", "passwd", "client_secret", "private_key", "private key", "cookie",
        "Set-Cookie", "session_token", "keyboard", "monkey", "passage", "secretary",
        "sk-", "ask-", "task-1", "sk-proj-Abcdefghijklmnop1234", "ghp_" + "a" * 24,
        "xoxb-1234567890ab", "AKIAABCDEFGHIJKLMNOP", "Bearer abc.def.ghi", "bearer",
        "-----BEGIN RSA PRIVATE KEY-----", "github_pat_" + "b" * 22, "akia", "tokenize",
        "weather", "Paris", "usage", "content", "role", "assistant", "", " ", "-", "_",
        "risk-level", "task-", "xsk-sk-Abcdefghijklmnop1234", "_sk-Abcdefghijklmnop1234",
        "BEARER abcdefghij", "Bearer\tabcdefghij", "SK-PROJ-ABCDEFGHIJKLMNOP", "xoxz-1234567890",
        "AKIAABCDEFGHIJKLMNO", "AKIAABCDEFGHIJKLMNOPQ", "-----BEGIN PRIVATE KEY-----",
        "ghs_short", "gho_" + "c" * 30, "github_pat", "sk-ant-" + "d" * 20, "9ghp_" + "e" * 22,
    ]  # fmt: skip
    rng = random.Random(7)
    disagreements = []
    for _ in range(6000):
        tree: dict[str, object] = {}
        for _ in range(rng.randint(1, 5)):
            key = "".join(rng.choice(words) for _ in range(rng.randint(1, 2)))
            value = "".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
            tree[key if rng.random() < 0.8 else key.upper()] = (
                [key, value] if rng.random() < 0.2 else value
            )
        payload = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
        if fast.needs_redaction(payload) != full.needs_redaction(payload):
            disagreements.append(payload)
    assert disagreements == []
