"""Secrets never reach storage: a corpus of secret shapes planted through every channel.

One agent run plants every shape (:mod:`tests.secrets_corpus`) through tool
arguments, results and errors, the run's input, output and metadata, the
environment snapshot, an LLM prompt, request and response headers, a query
string, a streamed answer (each secret split across chunks), a bytes body and
a gzip-compressed body, and locals the paused replay prints. Then every byte
the project wrote is searched: the SQLite file and its log, the outage spool
and the rejects file, a PostgreSQL dump, the reports and the replay's JSON.
Each secret is looked for as it is, as a piece of it, and in base64; bytes
bodies are also read decoded and decompressed.
"""

from __future__ import annotations

import base64
import gc
import importlib
import inspect
import json
import os
import shutil
import subprocess
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

import replayable
from replayable.capture.config import settings
from replayable.capture.writer import writer_for
from replayable.cli import app
from replayable.errors import AppendOnlyError, StoreError
from replayable.events.codec import TAG
from replayable.events.redaction import REDACTED, Redactor
from replayable.store.sqlite import SQLiteStore
from tests import secrets_corpus as corpus
from tests.pg_helpers import PgServer, pg

__all__ = ["pg"]

pytestmark = pytest.mark.slow


class OutageStore(SQLiteStore):
    """A store that is down until told otherwise: every batch goes to the spool."""

    down = True

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise StoreError("the store is down (test)")
        return super().append(*args, **kwargs)


class RefusingStore(SQLiteStore):
    """A store that refuses every record for good: they go to the rejects file."""

    def append(self, *args: Any, **kwargs: Any) -> Any:
        raise AppendOnlyError("refused (test)")


def forms(secret: str) -> list[bytes]:
    """How a secret could stand in stored bytes: whole, a piece of it, in base64."""
    out = [secret.encode()]
    if len(secret) >= 24:
        mid = len(secret) // 2
        out.append(secret[mid - 8 : mid + 8].encode())
    out.extend(corpus.b64_forms(secret))
    return out


def decoded(value: Any) -> Iterator[bytes]:
    """The bodies of the ``bytes`` values in a stored tree, decoded and decompressed."""
    if isinstance(value, dict):
        if value.get(TAG) in ("bytes", "bytearray") and isinstance(value.get("v"), str):
            raw = base64.b64decode(value["v"])
            yield raw
            if raw.startswith(b"\x1f\x8b"):
                yield zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw)
        for v in value.values():
            yield from decoded(v)
    elif isinstance(value, list):
        for v in value:
            yield from decoded(v)


def _bytes_of(paths: Iterable[Path]) -> bytes:
    """The files' bytes; a ``-wal`` or ``-shm`` file removed as the last connection to its
    database closed, between the listing and the read, held nothing."""
    out = []
    for p in paths:
        try:
            if p.is_file():
                out.append(p.read_bytes())
        except FileNotFoundError:
            continue
    return b"".join(out)


def stored_views(store: replayable.EventStore) -> bytes:
    """Every stored event's bytes bodies, read back decoded."""
    out = []
    for run in store.list_runs():
        for event in store.events(run.run_id):
            for text in (event.request, event.response):
                if text:
                    out.extend(decoded(orjson.loads(text)))
    return b"\n".join(out)


def leaks(data: bytes, channel: str) -> list[str]:
    """The shapes of ``channel`` whose secret (in any of its forms) is in ``data``."""
    table = corpus.secrets_by_channel()[channel]
    if channel == "response-headers":
        table = corpus.response_header_secrets()
    found = []
    for secret, shape in table.items():
        if any(f in data for f in forms(secret)):
            found.append(shape)
    return sorted(set(found))


def record(store: replayable.EventStore, base_url: str) -> str:
    with replayable.recording(store, metadata=corpus.run_metadata()) as rec:
        corpus.plant_everything(base_url, corpus.run_inputs())
    return rec.run_ids[0]


@pytest.fixture(scope="module")
def server() -> Iterator[corpus.CorpusServer]:
    with corpus.CorpusServer() as s:
        yield s


@pytest.fixture(scope="module")
def environment() -> Iterator[None]:
    """The planted environment variables, recorded in each run's snapshot."""
    env = corpus.env_plants()
    saved = {k: os.environ.get(k) for k in env}
    before = settings.env_vars
    os.environ.update(env)
    replayable.configure(env_vars=[*before, *env])
    try:
        yield
    finally:
        settings.env_vars = before
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def written(
    server: corpus.CorpusServer, environment: None, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Record the corpus into SQLite (and through an outage and a refusing store), replay
    it paused, write its report; every file and output written, as bytes."""
    # An event loop another module's test left open is collected here, not blamed here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    tmp = tmp_path_factory.mktemp("corpus")
    db = tmp / "runs.db"
    store = SQLiteStore(db)
    run_id = record(store, server.url)
    events = store.events(run_id)
    while_open = _bytes_of(tmp.glob("runs.db*"))
    views = stored_views(store)
    store.close()
    url = f"sqlite:///{db}"
    runner = CliRunner()
    paused = runner.invoke(
        app,
        ["--store", url, "replay", run_id, "--stop-at", str(events[-1].seq), "--json"],
        env={"COLUMNS": "200", "CORPUS_LOCAL_PASSWORD": corpus.fields("locals")["db_password"]},
    )
    assert paused.exit_code == 0, paused.output
    assert json.loads(paused.stdout)["status"] == "paused"
    reports = tmp / "reports"
    report = runner.invoke(app, ["--store", url, "report", "--out", str(reports)])
    assert report.exit_code == 0, report.output
    replay = replayable.replay(run_id, store=SQLiteStore(db), fn=corpus.plant_everything)
    spool = tmp / "spool"
    before = settings.writer
    replayable.configure(writer="thread")
    try:
        outage = OutageStore(tmp / "outage.db")
        writer_for(outage, spool_dir=spool, max_block_s=0.5)
        with replayable.recording(outage, metadata=corpus.run_metadata()):
            corpus.plant_everything(server.url, corpus.run_inputs())
        spooled = _bytes_of(spool.rglob("*"))
        outage.down = False
        outage.close()
        refusing = RefusingStore(tmp / "refusing.db")
        writer_for(refusing, spool_dir=spool, max_block_s=0.5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            with replayable.recording(refusing, metadata=corpus.run_metadata()):
                corpus.plant_everything(server.url, corpus.run_inputs())
            refusing.close()
        assert any("refused" in str(w.message) for w in caught), [str(w.message) for w in caught]
        rejected = _bytes_of(spool.rglob("*.rejected.jsonl"))
    finally:
        settings.writer = before
    files = _bytes_of(tmp.rglob("*"))
    return {
        "bytes": while_open
        + spooled
        + files
        + views
        + paused.stdout.encode()
        + report.stdout.encode(),
        "spool": spooled,
        "rejected": rejected,
        "reports": _bytes_of(reports.rglob("*")),
        "paused": paused.stdout,
        "replay": replay,
        "events": events,
    }


def test_the_corpus_is_large_enough() -> None:
    """At least 60 secret shapes, each planted through each of the 15 channels."""
    assert corpus.shape_count() >= 60
    assert len(corpus.CHANNELS) == 15


@pytest.mark.parametrize("channel", corpus.CHANNELS)
def test_no_secret_reaches_storage(written: dict[str, Any], channel: str) -> None:
    """No planted secret is in any byte written: database, spool, rejects, reports, the
    paused replay's JSON, nor in a stored bytes body once decoded and decompressed."""
    assert leaks(written["bytes"], channel) == []


def test_every_file_was_written_and_holds_text(written: dict[str, Any]) -> None:
    """The search sees what was stored: the spool, rejects and reports exist and hold the
    runs' ordinary text, and the redaction marks stand where the secrets were."""
    assert b"corpus_tool" in written["spool"]
    assert b"corpus_tool" in written["rejected"]
    assert b"plant-everything" in written["reports"]
    assert REDACTED.encode() in written["bytes"]
    assert "local_texts" in written["paused"]


def test_the_redacted_run_replays_identically(written: dict[str, Any]) -> None:
    """Redacted at every channel, the run still replays: every request matches."""
    assert written["replay"].status == "identical", written["replay"].divergence


def test_postgres_holds_no_secret(
    pg: PgServer, server: corpus.CorpusServer, environment: None, tmp_path: Path
) -> None:
    """The same run recorded into PostgreSQL: a dump of the database holds no secret."""
    if shutil.which("pg_dump") is None:
        pytest.fail("pg_dump is needed to read back what PostgreSQL stored")
    store = replayable.open_store(pg.url(pg.new_schema("corpus")))
    try:
        record(store, server.url)
    finally:
        store.close()
    dump = subprocess.run(
        ["pg_dump", "--data-only", f"{pg.server}/{pg.database}"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    assert b"plant-everything" in dump
    found = {c: leaks(dump, c) for c in corpus.CHANNELS}
    assert {c: v for c, v in found.items() if v} == {}


# -- false positives -----------------------------------------------------------------

#: Source files of the standard library read as a benign corpus of ordinary code and its
#: documentation: they are full of "password", "token", "auth" and "key=".
STDLIB_MODULES = (
    "textwrap", "json.decoder", "argparse", "http.client", "urllib.request", "smtplib",
    "imaplib", "ftplib", "netrc", "getpass", "secrets", "hmac", "base64", "tokenize",
    "keyword", "configparser", "http.cookies", "http.cookiejar", "email.utils", "ssl",
    "logging", "uuid", "hashlib", "poplib", "xmlrpc.client",
)  # fmt: skip
#: What the default redactor may change there (the README gives the figure): a line in
#: a thousand at most (the cookies of ``http.cookies``' examples, a sample password).
FALSE_POSITIVE_RATE = 0.001


def test_false_positives_on_a_benign_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    """Ordinary prose and code (monkey, keyword, tokenizer, password reset instructions,
    UUIDs, hashes, a base64 image, LLM usage blocks; 25,000 lines of the standard
    library's source) is left as it is, but for a line in a thousand at most."""
    r = Redactor()
    changed = [t for t in corpus.BENIGN_TEXTS if r.redact_text(t) != t]
    changed += [str(t) for t in corpus.BENIGN_TREES if r(t) != t]
    samples = len(corpus.BENIGN_TEXTS) + len(corpus.BENIGN_TREES)
    lines = [
        line
        for module in STDLIB_MODULES
        for line in inspect.getsource(importlib.import_module(module)).splitlines()
    ]
    in_code = [line for line in lines if r.redact_text(line) != line]
    with capsys.disabled():
        print(
            f"\nredaction false positives: {len(changed)} of {samples} benign samples, "
            f"{len(in_code)} of {len(lines)} lines of standard-library source"
        )
    assert changed == []
    assert len(in_code) <= FALSE_POSITIVE_RATE * len(lines), in_code


# -- streams ---------------------------------------------------------------------------


def test_a_streamed_secret_split_across_chunks_is_redacted_consistently(
    written: dict[str, Any],
) -> None:
    """The stream's stored chunks still add up to its data, the events they carry
    assemble into the stored (redacted) answer, and no secret piece is left."""
    (event,) = [
        e for e in written["events"] if e.kind == "llm" and '"stream"' in (e.response or "")
    ]
    value = orjson.loads(event.response or "")
    stream = value["stream"]
    data = stream["data"].encode()
    assert sum(size for size, _ in stream["chunks"]) == len(data)
    pieces = []
    for block in data.split(b"\n\n"):
        if block.startswith(b"data: {"):
            chunk = orjson.loads(block[6:])
            pieces.extend(c["delta"].get("content") or "" for c in chunk["choices"])
    assembled = value["assembled"]["choices"][0]["message"]["content"]
    assert "".join(pieces) == assembled
    assert REDACTED in assembled
    assert leaks(data, "stream") == []
