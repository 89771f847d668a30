"""Secrets never reach storage: they are redacted at capture time, before
fingerprinting, so replay still matches when only a secret changed."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import replayable
from replayable.events import _re2 as re2_module
from replayable.events import redaction as redaction_module
from replayable.events.canonical import canonical
from replayable.events.codec import decode_value
from replayable.events.redaction import REDACTED, Redactor
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
    """The database file and its write-ahead log, as bytes on disk (a log removed as the
    last connection closes, between the listing and the read, held nothing)."""
    out = []
    for p in (path, Path(f"{path}-wal")):
        try:
            out.append(p.read_bytes())
        except FileNotFoundError:
            continue
    return b"".join(out)


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


@pytest.fixture
def re2_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """re2 scans every payload and checks every string, however short (left to ``re``
    below a size where it is faster), so that the comparisons below exercise it."""
    monkeypatch.setattr(redaction_module, "_RE2_MIN_PAYLOAD", 0)
    monkeypatch.setattr(redaction_module, "_TEXT_HINT_MIN", 0)


def pure_re(monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> Redactor:
    """A redactor built as if re2 were not installed: every scan runs on ``re``."""
    with monkeypatch.context() as m:
        m.setattr(redaction_module, "_re2", None)
        return Redactor(*args, **kwargs)


#: Words the randomized payloads are made of: secret names, secret values, near misses,
#: fragments that overlap ("akiauthor", "passk-"), and text ``re`` reads as Unicode.
WORDS = [
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
    "akiauthor", "akiakia", "passk-Abcdefghijklmnop1234", "secretoken", "xoxox",
    "é", "ésk-proj-Abcdefghijklmnop1234", "naïve", "—", "\n", "\t", "\x0b", "\x85",
    "\u00a0", "\u2003", "Bearer\u00a0abcdefghij", "Bearer\x0babcdefghij", "Bearer\u2003abcdefghij",
    "ſk-proj-Abcdefghijklmnop1234", "\u212aey", "\u0130", "clé", "пароль", "ключ",
    "AKIAABCDEFGHIJKLMNOPé", "sk-proj-Abcdefghijklmnop1234é", '"', "\\", ":", ",",
    "weather in paris tomorrow will be mild with light rain in the morning",
    "acct-123456", "tok 0123abcd", "tok\x0b0123abcd", "pin=1234", "pin=12", "secret-aa",
    "end-marker", "INTERNAL-abc", "zz", "azz",
    # Names by their words, assignments, URLs, tokens with other prefixes, tagged bytes.
    "db_password", "X-Auth-Token", "openai_api_key", "prompt_tokens", "tokens", "token_type",
    "password=hunter22x", "password: ", "'db_password': '", "postgresql://u:pa55word@h/db",
    "eyJabcdefghijk.abcdefghijkl.", "AIza" + "f" * 35, "glpat-" + "g" * 20, "key-" + "0" * 32,
    "-----BEGIN EC PRIVATE KEY-----", "Basic dXNlcjpwYXNzd29yZA==", ":AA" + "h" * 33,
    "?key=", "&sig=", "AccountKey=", "tokenizer", "keyword", '"$t":"bytes"', "sessionid",
]  # fmt: skip
#: Raw bytes for payloads that are not canonical JSON: key names followed by the spaces
#: ``re`` and re2 read differently, Latin-1 letters, bytes that are not UTF-8, a final
#: newline (where ``$`` matches for ``re`` only).
RAW = [
    b'"api_key":', b'"API_KEY"\x0b:', b'"password" \t,', b'"cl\xc3\xa9":', b'"CL\xc3\xa9":',
    b'"CL\xe3\xa9":',  # "clé" with its first byte in the other case, read as Latin-1
    b'"akiauthor"\x0c:', b"Bearer\x0babcdefghij", b"Bearer\xa0abcdefghij", b"\xe9sk-proj-",
    b"\xff", b"\xa0", b"\x85", b"\x00", b"\xc3", b'"', b":", b",", b" ", b"end-marker\n",
]  # fmt: skip
#: User patterns: some re2 takes, some it reads differently or lacks (those stay on ``re``).
USER_PATTERNS = [
    r"(acct)-\d{6}",  # re2
    r"tok\s+[0-9a-f]{8}",  # re2, with \s spelt out
    r"pin=(?=\d{4})\d+",  # lookahead: re
    r"end-marker$",  # $: re
    r"(?i:internal)-[a-z]{3,}",  # flags: re
    r"\Bzz\b",  # \B: re
]
EXTRA_KEYS = ["private key", "monkey", "akiauthor"]
#: Text that makes a payload long enough for the re2 scans.
FILLER = "the weather in paris tomorrow will be mild with light rain. " * 12


def random_text(rng: random.Random, words: list[str], n: int) -> str:
    return "".join(rng.choice(words) for _ in range(rng.randint(0, n)))


def random_tree(rng: random.Random, words: list[str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for _ in range(rng.randint(1, 5)):
        key = random_text(rng, words, 2) or "k"
        value: Any = random_text(rng, words, 4)
        if rng.random() < 0.2:
            value = [key, value]
        elif rng.random() < 0.2:
            value = {"content": value * rng.randint(1, 4), "n": rng.randint(0, 9)}
        tree[key if rng.random() < 0.8 else key.upper()] = value
    return tree


def random_payloads(seed: int, count: int) -> list[bytes]:
    """Canonical JSON of random trees, and as many raw byte strings."""
    rng = random.Random(seed)
    payloads = []
    for _ in range(count):
        payloads.append(orjson.dumps(random_tree(rng, WORDS), option=orjson.OPT_SORT_KEYS))
        first = rng.choice(WORDS).encode() if rng.random() < 0.6 else rng.choice(RAW)
        second = rng.choice([*RAW, *(w.encode() for w in WORDS)])
        payloads.append((first + second) * 2)
    return payloads


@pytest.mark.usefixtures("re2_everywhere")
def test_prefilter_decides_as_the_full_scans_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass pre-filter only skips scans that could not match: on random payloads
    mixing secret names, secret values and near misses it agrees with the full scans
    (``re`` alone, as without re2) and with the re2 scans."""
    fast = pure_re(monkeypatch, extra_keys=EXTRA_KEYS)
    full = pure_re(monkeypatch, extra_keys=EXTRA_KEYS)
    with_re2 = Redactor(extra_keys=EXTRA_KEYS)
    assert fast._prefilter is not None
    assert with_re2._re2_scans is not None
    full._prefilter = None
    disagreements = []
    for payload in random_payloads(7, 4000):
        expected = full.needs_redaction(payload)
        if {fast.needs_redaction(payload), with_re2.needs_redaction(payload)} != {expected}:
            disagreements.append(payload)
    assert disagreements == []


@pytest.mark.parametrize(
    ("keys", "patterns"),
    [
        pytest.param({}, {}, id="defaults"),
        pytest.param({"extra_keys": EXTRA_KEYS}, {}, id="extra-keys"),
        pytest.param({"extra_keys": ["clé", "пароль"]}, {}, id="non-ascii-keys"),
        pytest.param({}, {"extra_patterns": USER_PATTERNS}, id="user-patterns"),
        # A backreference names its group by number, which in the one alternation ``re``
        # scans may be another pattern's group: then no value pattern goes to re2.
        pytest.param(
            {}, {"extra_patterns": [*USER_PATTERNS, r"secret-(\w)\1"]}, id="backreference"
        ),
        pytest.param(
            {"keys": ["token"]}, {"value_patterns": [r"\bsk-\w{8,}", r"Bearer\s+\S+"]}, id="own"
        ),
        pytest.param({"keys": [], "key_words": False}, {"value_patterns": []}, id="nothing"),
    ],
)
@pytest.mark.usefixtures("re2_everywhere")
def test_re2_scans_decide_and_redact_as_re_does(
    monkeypatch: pytest.MonkeyPatch, keys: dict[str, Any], patterns: dict[str, Any]
) -> None:
    """The re2 scans are a faster spelling of the ``re`` ones: on random payloads (Unicode
    text, raw bytes, secrets against word characters, escapes and other fragments) a
    redactor with re2 decides and redacts exactly as one with ``re`` alone."""
    with_re2 = Redactor(**keys, **patterns)
    plain = pure_re(monkeypatch, **keys, **patterns)
    assert plain._re2_scans is None
    assert plain._text_hint is None
    payloads = random_payloads(11, 1500)
    decided = [with_re2.needs_redaction(p) for p in payloads]
    assert decided == [plain.needs_redaction(p) for p in payloads]
    assert any(decided) == bool(with_re2.keys or with_re2.patterns or with_re2.key_words)
    for payload in payloads[::2]:  # the canonical JSON ones
        assert with_re2.redact_bytes(payload) == plain.redact_bytes(payload), payload
    rng = random.Random(5)
    for _ in range(300):
        # Strings with and without the defaults' literal text, some with lone surrogates
        # (which an environment can hold), straight to the tree walk and the mapping.
        tree = random_tree(rng, [*WORDS, "\ud800", "x" * 40])
        assert with_re2(tree) == plain(tree)
        env = {k: v for k, v in tree.items() if isinstance(v, str)}
        assert with_re2.redact_mapping(env) == plain.redact_mapping(env)


@pytest.mark.parametrize(
    "patterns",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"extra_patterns": USER_PATTERNS}, id="user-patterns"),
    ],
)
def test_one_scan_over_a_batch_finds_what_each_payload_scan_finds(
    patterns: dict[str, Any],
) -> None:
    """A writer scans a batch's payloads joined, not one by one: the joined scan says
    "may hold a secret" whenever one payload's own scan does, wherever in the batch the
    secret stands (first, last, against the neighbour's edge), and with the user's
    anchored or look-around patterns too."""
    redactor = Redactor(extra_keys=EXTRA_KEYS, **patterns)
    payloads = random_payloads(13, 1500)
    rng = random.Random(3)
    clean = [p for p in payloads if not redactor.needs_redaction(p)]
    hits = [p for p in payloads if redactor.needs_redaction(p)]
    assert clean
    assert hits
    for hit in hits:
        group = rng.sample(clean, 6)
        for at in (0, 3, 6):
            assert redactor.needs_redaction_any([*group[:at], hit, *group[at:]]), hit
    assert not redactor.needs_redaction_any(clean[:200]) or patterns
    assert not redactor.needs_redaction_any([])


def test_the_writer_redacts_a_secret_among_many_clean_events(tmp_path: Path) -> None:
    """A batch of many clean events and one that holds a secret: the one is redacted, the
    others are stored as they came, every fingerprint is the canonical one and the chain
    verifies."""
    from replayable.events.canonical import fingerprint

    @replayable.tool
    def lookup(text: str) -> str:
        return "ok"

    @replayable.workflow("tests.batch_scan")
    def agent() -> None:
        for i in range(700):
            # Requests of 20 to 80 bytes: hashed on either side of one SHA-256 block.
            lookup("my key is sk-" + "a1B2" * 8 if i == 431 else f"weather {i}" + "x" * (i % 60))

    store = SQLiteStore(tmp_path / "batch.db")
    try:
        with replayable.recording(store):
            agent()
        run_id = store.list_runs()[0].run_id
        events = store.events(run_id)
        assert len(events) == 700
        assert "sk-" not in events[431].request
        assert REDACTED in events[431].request
        assert all(REDACTED not in e.request for i, e in enumerate(events) if i != 431)
        assert events[5].request == canonical({"text": "weather 5xxxxx"}).decode()
        for e in events:
            assert e.fingerprint == fingerprint(e.kind, e.name, e.request.encode())
        assert replayable.verify_run(store, run_id).ok
    finally:
        store.close()


def test_re2_reads_accepted_patterns_as_re_does() -> None:
    """Every pattern handed to re2 matches the same bytes as under ``re``: random patterns
    over the syntax where the two engines differ (``\\s``, ``$``, ``\\B``, ``{,n}``, nested
    classes, flags, lookarounds …), each accepted one tried on random bytes."""
    atoms = [
        "a", "A", "_", "-", " ", "\t", "\n", "\x0b", ".", r"\s", r"\S", r"\d", r"\W", r"\b",
        r"\B", r"\A", r"\x41", r"\xe9", r"\-", r"\\", r"\]", "]", "}", "{", "^", "$", r"\v",
        "[ab]", "[^ab]", "[a-c]", r"[\s]", r"[^\s]", r"[\S]", "[-a]", "[a-c-e]", "[]a]",
        r"[\x00-\x7f]", r"[^\W]", r"[\b]", "é", "(?i)a", "(?i:a)", "(?=a)", "(?<!a)", r"(a)\1",
        "x{,2}", "x{2}", "x{1,3}", "x{2,}", "(?s:.)", r"\Z", r"\0",
    ]  # fmt: skip
    repeats = ["", "", "", "*", "+", "?", "*?", "??", "{2}", "{0,}", "*+", "{,2}"]
    alphabet = [bytes([b]) for b in b"aAb_- \t\n\x0b\x0c\r.1]}{[\\^$#\x00\xe9\xc3\x80"]
    rng = random.Random(3)
    accepted = 0
    for _ in range(6000):
        pattern = "".join(rng.choice(atoms) + rng.choice(repeats) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.2:
            pattern = f"({pattern})|{rng.choice(atoms)}"
        try:
            by_re = re.compile(pattern.encode())
        except re.error:
            continue
        spelt = re2_module._re2_syntax(pattern)
        by_re2 = None if spelt is None else re2_module._re2_compile(spelt.encode())
        if by_re2 is None:
            continue
        accepted += 1
        for _ in range(20):
            text = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
            text += b"\n" if rng.random() < 0.3 else b""
            assert (by_re.search(text) is None) == (by_re2.search(text) is None), (pattern, text)
    assert accepted > 500


def test_user_pattern_with_lookahead_falls_back_to_re() -> None:
    """A pattern re2 cannot read (a lookahead) is still applied, by ``re``; re2 keeps the
    key names and the other patterns. The payloads are long enough for re2 to scan them."""
    lookahead = r"pin=(?=\d{4}\b)\d+"
    redactor = Redactor(extra_patterns=[lookahead, r"acct-\d{6}"])
    assert re2_module._re2_syntax(lookahead) is None
    scans = redactor._re2_scans
    assert scans is not None
    _, rest = scans
    assert rest is not None
    assert rest.pattern == f"(?:{lookahead})".encode()
    assert b"acct-" in redactor._re2_pattern
    for text, redacted in [
        ("use pin=1234 now", f"use {REDACTED} now"),
        ("pin=12345 stays", "pin=12345 stays"),
        ("acct-123456 and pin=9876", f"{REDACTED} and {REDACTED}"),
    ]:
        payload = canonical({"history": FILLER, "note": text})
        assert len(payload) >= redaction_module._RE2_MIN_PAYLOAD
        assert redactor.needs_redaction(payload) == (text != redacted)
        assert orjson.loads(redactor.redact_bytes(payload)) == {"history": FILLER, "note": redacted}


@pytest.fixture
def lookahead_configured() -> Iterator[str]:
    pattern = r"pin=(?=\d{4}\b)\d+"
    replayable.configure(redact_patterns=[pattern])
    yield pattern
    replayable.configure(redact_keys=(), redact_patterns=())


def test_configured_lookahead_pattern_redacts_recordings(
    lookahead_configured: str, sqlite_store: SQLiteStore, sqlite_path: Path
) -> None:
    """``configure(redact_patterns=...)`` with a lookahead redacts what is recorded."""

    @replayable.workflow
    def login() -> dict[str, Any]:
        return call_api(f"my pin=4821 please; {FILLER}", api_key="none", headers={})

    with replayable.recording(sqlite_store) as rec:
        login()
    (event,) = sqlite_store.events(rec.run_ids[0])
    assert event.request_value()["query"] == f"my {REDACTED} please; {FILLER}"
    sqlite_store.close()
    # Four digits alone also turn up by chance in ids and binary hashes; the secret is the
    # digits where the agent put them.
    on_disk = database_bytes(sqlite_path)
    assert b"pin=4821" not in on_disk
    assert b"4821 please" not in on_disk


@pytest.mark.slow
def test_redaction_without_re2() -> None:
    """Without re2 installed every scan runs on ``re``, and secrets are still redacted."""
    script = """
import sys
sys.modules["re2"] = None  # the import fails as when the package is missing
from replayable.events.canonical import canonical
from replayable.events.codec import decode_value
from replayable.events.redaction import Redactor, _re2
assert _re2 is None
r = Redactor()
assert r._re2_scans is None and r._prefilter is not None
payload = canonical({"note": "key sk-proj-Q7w8E9r0T1y2U3i4O5p6", "password": "x"})
print(r.redact_bytes(payload).decode())
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert orjson.loads(out.stdout) == {"note": f"key {REDACTED}", "password": REDACTED}


SECRETS_AFTER_ESCAPES = [
    "sk-proj-Q7w8E9r0T1y2U3i4O5p6",
    "ghp_" + "Z" * 24,
    "xoxb-1234567890ab",
    "AKIAQWERTYUIOPASDFGH",
    "Bearer abcdefgh.ijkl",
]


@pytest.mark.parametrize("escape", ["\n", "\t", "\r", "\b", "\f", "\x01", "\x1f"])
@pytest.mark.parametrize("engine", ["re", "re2"])
@pytest.mark.parametrize("filler", ["", FILLER], ids=["short", "long"])
def test_a_secret_right_after_a_json_escape_is_redacted(
    monkeypatch: pytest.MonkeyPatch, escape: str, engine: str, filler: str
) -> None:
    """In serialized JSON a newline is the two bytes ``\\n``: the ``n`` stands right before
    the secret, yet in the text the secret starts a word and must be redacted."""
    redactor = pure_re(monkeypatch) if engine == "re" else Redactor()
    if engine == "re2":
        assert redactor._re2_scans is not None
    for secret in SECRETS_AFTER_ESCAPES:
        payload = canonical({"content": f"{filler}my key:{escape}{secret} thanks"})
        assert redactor.needs_redaction(payload), (secret, payload[-60:])
        stored = redactor.redact_bytes(payload)
        assert secret.encode() not in stored
        assert orjson.loads(stored)["content"].endswith(f"my key:{escape}[REDACTED] thanks")
    # An escaped backslash followed by a letter is text, not an escape: nothing to redact.
    quiet = canonical({"content": f"{filler}path C:\\new\\nsk-proj-Q7w8E9r0T1y2U3i4O5p6"})
    assert redactor.redact_bytes(quiet) == quiet


@pytest.mark.parametrize("engine", ["re", "re2"])
@pytest.mark.parametrize("filler", ["", FILLER], ids=["short", "long"])
def test_a_token_after_any_kind_of_space_is_redacted(
    monkeypatch: pytest.MonkeyPatch, engine: str, filler: str
) -> None:
    """``Bearer\\s+…`` matches the text after every character ``\\s`` matches there: in the
    serialized bytes a newline is escaped and a no-break space is two UTF-8 bytes."""
    redactor = pure_re(monkeypatch) if engine == "re" else Redactor()
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert len(spaces) == 29
    missed = []
    for space in spaces:
        payload = canonical({"h": f"{filler} Bearer{space}abcdefgh1234"})
        stored = redactor.redact_bytes(payload)
        if b"abcdefgh1234" in stored or not redactor.needs_redaction(payload):
            missed.append(hex(ord(space)))
    assert missed == []


@replayable.tool
def echo_note(note: str) -> str:
    return note


def test_a_secret_in_a_string_with_a_lone_surrogate_is_redacted(
    sqlite_store: SQLiteStore, sqlite_path: Path
) -> None:
    """A string JSON cannot hold (a lone surrogate) is stored as its bytes in base64; a
    secret in it is redacted all the same, and the rest of the string kept."""

    @replayable.workflow
    def odd() -> str:
        return echo_note(f"\ud800 key {API_KEY}")

    with replayable.recording(sqlite_store) as rec:
        odd()
    (event,) = sqlite_store.events(rec.run_ids[0])
    assert decode_value(event.response, event.encoding) == f"\ud800 key {REDACTED}"
    sqlite_store.close()
    data = database_bytes(sqlite_path)
    assert API_KEY.encode() not in data
    assert base64.b64encode(f"\ud800 key {API_KEY}".encode("utf-8", "surrogatepass")) not in data


def test_a_key_split_across_anthropic_stream_events_is_redacted_consistently() -> None:
    """A key cut into three ``text_delta`` events (and one network chunk boundary inside
    an event) is redacted in the stream as in the assembled text: the chunk sizes add up
    to the new data, and the deltas join into the redacted text."""
    from replayable.integrations._sse import read_sse

    text = f"use {TEXT_KEY} for the call"
    pieces = [text[:9], text[9:20], text[20:]]
    events = [b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n']
    for i, piece in enumerate(pieces):
        delta = {"type": "content_block_delta", "index": 0}
        delta["delta"] = {"type": "text_delta", "text": piece}
        events.append(b"event: content_block_delta\ndata: " + orjson.dumps(delta) + b"\n\n")
        if i == 0:
            events.append(b'data: {"type":"ping"}\n\n')
    events.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    raw = b"".join(events)
    cut = len(events[0]) + 20  # a network chunk that ends inside the first delta's event
    chunks = [[cut, 0], [len(raw) - cut, 5]]
    assembled, _ = read_sse("anthropic.messages", raw)
    value = {"stream": {"data": raw.decode(), "chunks": chunks}, "assembled": assembled}
    payload = canonical(value)
    r = Redactor()
    assert r.needs_redaction(payload)
    out = orjson.loads(r.redact_bytes(payload))
    data = out["stream"]["data"].encode()
    assert sum(size for size, _ in out["stream"]["chunks"]) == len(data)
    again, _ = read_sse("anthropic.messages", data)
    assert again["content"][0]["text"] == out["assembled"]["content"][0]["text"]
    assert out["assembled"]["content"][0]["text"] == f"use {REDACTED} for the call"
    for part in (TEXT_KEY, TEXT_KEY[:12], TEXT_KEY[-12:]):
        assert part.encode() not in r.redact_bytes(payload)


def test_fragments_a_match_may_hide_are_found_as_by_their_definition() -> None:
    """The prefilter's table of fragments one match may hide (inside it, or begun by its
    end) is the pairwise definition's, on the built-in fragments and on random ones."""
    import random

    from replayable.events import redaction

    def by_definition(fragments: tuple[str, ...]) -> dict[str, frozenset[str]]:
        frags = list(dict.fromkeys(fragments))
        return {
            f: frozenset(
                g
                for g in frags
                if g != f and (g in f or any(f.endswith(g[:n]) for n in range(1, len(g))))
            )
            for f in frags
        }

    builtin = tuple(
        f.decode()
        for f in redaction.Redactor()._dispatch  # the fragments it was built on
    )
    assert len(builtin) > 50
    rng = random.Random(7)
    cases = [builtin] + [
        tuple(
            "".join(rng.choice("abc") for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 12))
        )
        for _ in range(300)
    ]
    for fragments in cases:
        assert redaction._hides.__wrapped__(fragments) == by_definition(fragments), fragments
