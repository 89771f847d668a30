"""Secret shapes, a benign corpus, and an agent that plants secrets through every channel.

Each shape makes a fresh secret from a seeded random source, so the secret
planted through one channel differs from the one planted through another:
a hit in stored bytes names the shape and the channel it came through.
The agent (:func:`plant_everything`) is importable by name, so the CLI can
replay it.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import os
import random
import string
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import httpx
import openai
import orjson

import replayable

AN = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = string.ascii_letters + string.digits + "+/"


class Rand:
    """Random text from a seed: the same seed gives the same secrets in every process."""

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)

    def of(self, alphabet: str, n: int) -> str:
        # A digit and a letter in every token, so that none reads like a word.
        body = "".join(self.rng.choice(alphabet) for _ in range(n))
        return body[:-2] + "7" + "q" if n > 4 and alphabet in (AN, B64) else body

    def an(self, n: int) -> str:
        return self.of(AN, n)

    def hex(self, n: int) -> str:
        return self.of(HEX, n)

    def pw(self) -> str:
        return "pw" + self.of(AN, 14) + "-9x"

    def b64(self, n: int) -> str:
        return self.of(B64, n)

    def pem_lines(self, kind: str) -> tuple[str, list[str]]:
        lines = [self.b64(64) for _ in range(3)] + [self.b64(20) + "=="]
        body = "\n".join(lines)
        return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----", lines


@dataclass(frozen=True)
class Plant:
    """What a shape plants: free ``text``, or a ``name`` whose value alone makes it secret
    (``text`` is then ``name=value``); ``secrets`` must never be stored."""

    shape: str
    text: str
    secrets: tuple[str, ...]
    name: str | None = None
    value: str | None = None

    @property
    def one_line(self) -> bool:
        return "\n" not in self.text


Maker = Callable[[Rand], tuple[str, tuple[str, ...]]]


def _t(make: Callable[[Rand], str]) -> Maker:
    """A shape whose whole text is the secret."""

    def out(r: Rand) -> tuple[str, tuple[str, ...]]:
        s = make(r)
        return s, (s,)

    return out


def _pem(kind: str) -> Maker:
    def out(r: Rand) -> tuple[str, tuple[str, ...]]:
        text, lines = r.pem_lines(kind)
        return text, tuple(lines)

    return out


def _url(template: str) -> Maker:
    def out(r: Rand) -> tuple[str, tuple[str, ...]]:
        pw = r.pw()
        return template.format(pw=pw), (pw,)

    return out


def _assign(template: str, make: Callable[[Rand], str]) -> Maker:
    def out(r: Rand) -> tuple[str, tuple[str, ...]]:
        v = make(r)
        return template.format(v=v), (v,)

    return out


def _gcp_service_account(r: Rand) -> tuple[str, tuple[str, ...]]:
    pem, lines = r.pem_lines("PRIVATE KEY")
    key_id = r.hex(40)
    doc = {
        "type": "service_account",
        "project_id": "acme-prod",
        "private_key_id": key_id,
        "private_key": pem + "\n",
        "client_email": "agent@acme-prod.iam.gserviceaccount.com",
    }
    return orjson.dumps(doc).decode(), (key_id, *lines)


def _cookie(r: Rand) -> tuple[str, tuple[str, ...]]:
    a, b = r.an(32), r.an(32)
    return f"Cookie: sessionid={a}; csrftoken={b}", (a, b)


def _basic(r: Rand) -> tuple[str, tuple[str, ...]]:
    creds = base64.b64encode(f"deploy:{r.pw()}".encode()).decode()
    return f"the proxy sent Basic {creds} upstream", (creds,)


#: Free-text shapes: what a secret looks like wherever it turns up in text.
TEXT_SHAPES: dict[str, Maker] = {
    "openai-proj": _t(lambda r: f"sk-proj-{r.an(40)}"),
    "openai-legacy": _t(lambda r: f"sk-{r.an(48)}"),
    "openai-svcacct": _t(lambda r: f"sk-svcacct-{r.an(40)}"),
    "anthropic": _t(lambda r: f"sk-ant-api03-{r.an(80)}"),
    "openrouter": _t(lambda r: f"sk-or-v1-{r.hex(64)}"),
    **{f"github-{p}": _t(lambda r, p=p: f"{p}_{r.an(36)}") for p in ("ghp", "gho", "ghs", "ghu")},
    "github-pat": _t(lambda r: f"github_pat_{r.an(22)}_{r.an(59)}"),
    "gitlab-pat": _t(lambda r: f"glpat-{r.an(20)}"),
    "gitlab-runner": _t(lambda r: f"glrt-{r.an(20)}"),
    "gitlab-deploy": _t(lambda r: f"gldt-{r.an(20)}"),
    "slack-bot": _t(
        lambda r: f"xoxb-{r.of(string.digits, 12)}-{r.of(string.digits, 13)}-{r.an(24)}"
    ),
    "slack-user": _t(lambda r: f"xoxp-{r.of(string.digits, 12)}-{r.an(32)}"),
    "slack-app": _t(lambda r: f"xapp-1-A{r.of(UPPER, 10)}-{r.of(string.digits, 13)}-{r.hex(40)}"),
    "slack-webhook": _t(
        lambda r: f"https://hooks.slack.com/services/T{r.of(UPPER, 8)}/B{r.of(UPPER, 8)}/{r.an(24)}"
    ),
    "stripe-live": _t(lambda r: f"sk_live_{r.an(24)}"),
    "stripe-test": _t(lambda r: f"sk_test_{r.an(24)}"),
    "stripe-restricted": _t(lambda r: f"rk_live_{r.an(24)}"),
    "stripe-webhook": _t(lambda r: f"whsec_{r.an(32)}"),
    "aws-access-key-id": _t(lambda r: f"AKIA{r.of(UPPER, 16)}"),
    "aws-session-key-id": _t(lambda r: f"ASIA{r.of(UPPER, 16)}"),
    "aws-secret-assigned": _assign("aws_secret_access_key = {v}", lambda r: r.b64(40)),
    "gcp-api-key": _t(lambda r: f"AIza{r.an(35)}"),
    "gcp-oauth-token": _t(lambda r: f"ya29.{r.an(60)}"),
    "gcp-client-secret": _t(lambda r: f"GOCSPX-{r.an(28)}"),
    "gcp-refresh-token": _t(lambda r: f"1//0{r.an(40)}"),
    "gcp-service-account": _gcp_service_account,
    "azure-storage-conn": _assign(
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={v};"
        "EndpointSuffix=core.windows.net",
        lambda r: r.b64(86) + "==",
    ),
    "azure-sas-url": _assign(
        "https://acme.blob.core.windows.net/c/report.pdf?sv=2022-11-02&sr=b&sig={v}",
        lambda r: quote(r.b64(43) + "=", safe=""),
    ),
    "azure-servicebus": _assign(
        "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={v}",
        lambda r: r.b64(43) + "=",
    ),
    "huggingface": _t(lambda r: f"hf_{r.an(34)}"),
    "jwt": _t(
        lambda r: (
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
            + base64.urlsafe_b64encode(f'{{"sub":"{r.an(12)}","admin":true}}'.encode())
            .decode()
            .rstrip("=")
            + "."
            + r.of(AN + "-_", 43)
        )
    ),
    "pem-rsa": _pem("RSA PRIVATE KEY"),
    "pem-ec": _pem("EC PRIVATE KEY"),
    "pem-openssh": _pem("OPENSSH PRIVATE KEY"),
    "pem-pkcs8": _pem("PRIVATE KEY"),
    "pem-encrypted": _pem("ENCRYPTED PRIVATE KEY"),
    "pgp-private": _pem("PGP PRIVATE KEY BLOCK"),
    "url-postgres": _url("postgresql://app:{pw}@db.internal:5432/prod"),
    "url-mysql": _url("mysql://root:{pw}@mysql.local/app"),
    "url-mongodb-srv": _url(
        "mongodb+srv://svc:{pw}@cluster0.abcde.mongodb.net/db?retryWrites=true"
    ),
    "url-redis": _url("redis://:{pw}@cache.internal:6379/0"),
    "url-amqp": _url("amqp://guest:{pw}@rabbit.internal:5672/vhost"),
    "url-https-basic": _url("https://deploy:{pw}@git.example.com/acme/repo.git"),
    "basic-auth": _basic,
    "bearer": _t(lambda r: f"Bearer {r.an(40)}"),
    "cookie-header-text": _cookie,
    "session-id-text": _assign("PHPSESSID={v}", lambda r: r.an(26)),
    "password-in-exception": _assign(
        "FATAL: could not connect: host=db.internal user=app password={v} dbname=prod",
        lambda r: r.pw(),
    ),
    "password-yaml": _assign("password: {v}", lambda r: r.pw()),
    "password-dict-repr": _assign("{{'db_password': '{v}', 'host': 'db'}}", lambda r: r.pw()),
    "api-key-env-line": _assign("export OPENAI_API_KEY={v}", lambda r: r.an(40)),
    "client-secret-json-text": _assign('{{"client_secret": "{v}"}}', lambda r: r.an(32)),
    "sendgrid": _t(lambda r: f"SG.{r.an(22)}.{r.an(43)}"),
    "npm": _t(lambda r: f"npm_{r.an(36)}"),
    "pypi": _t(lambda r: f"pypi-AgEIcHlwaS5vcmc{r.an(60)}"),
    "shopify": _t(lambda r: f"shpat_{r.hex(32)}"),
    "digitalocean": _t(lambda r: f"dop_v1_{r.hex(64)}"),
    "databricks": _t(lambda r: f"dapi{r.hex(32)}"),
    "groq": _t(lambda r: f"gsk_{r.an(52)}"),
    "vault": _t(lambda r: f"hvs.{r.an(90)}"),
    "age": _t(lambda r: f"AGE-SECRET-KEY-1{r.of(UPPER, 58)}"),
    "telegram-bot": _t(lambda r: f"{r.of('123456789', 9)}:AA{r.an(33)}"),
    "discord-webhook": _t(
        lambda r: f"https://discord.com/api/webhooks/{r.of(string.digits, 18)}/{r.an(68)}"
    ),
    "mailgun": _t(lambda r: f"key-{r.hex(32)}"),
    "square": _t(lambda r: f"sq0atp-{r.an(22)}"),
    "atlassian": _t(lambda r: f"ATATT3{r.an(180)}"),
    "linear": _t(lambda r: f"lin_api_{r.an(40)}"),
    "notion": _t(lambda r: f"ntn_{r.an(46)}"),
    "perplexity": _t(lambda r: f"pplx-{r.an(48)}"),
    "xai": _t(lambda r: f"xai-{r.an(80)}"),
    "tailscale": _t(lambda r: f"tskey-auth-{r.an(30)}"),
    "postman": _t(lambda r: f"PMAK-{r.hex(24)}-{r.hex(34)}"),
    "replicate": _t(lambda r: f"r8_{r.an(37)}"),
}

#: Names whose value is secret whatever it looks like (a header, a key, a variable).
FIELD_SHAPES: dict[str, Callable[[Rand], str]] = {
    "X-Auth-Token": lambda r: r.an(32),
    "openai_api_key": lambda r: r.an(40),
    "db_password": lambda r: r.pw(),
    "aws_secret_access_key": lambda r: r.b64(40),
    "client_secret": lambda r: r.an(32),
    "ANTHROPIC_API_KEY": lambda r: r.an(40),
    "GOOGLE_CREDS": lambda r: r.an(40),
    "x-api-key": lambda r: r.an(32),
    "apiKey": lambda r: r.an(32),
    "accessToken": lambda r: r.an(32),
    "refresh_token": lambda r: r.an(40),
    "session_id": lambda r: r.an(32),
    "PGPASSWORD": lambda r: r.pw(),
    "private_key_id": lambda r: r.hex(40),
    "x-amz-security-token": lambda r: r.b64(60),
    "stripe_secret_key": lambda r: r.an(32),
    "slack_signing_secret": lambda r: r.hex(32),
    "AZURE_STORAGE_KEY": lambda r: r.b64(86) + "==",
    "hf_token": lambda r: r.an(34),
    "SENTRY_DSN": lambda r: f"https://{r.hex(32)}@o12345.ingest.sentry.io/67",
    "webhook_secret": lambda r: r.an(32),
}
#: Field shapes whose value holds a secret only in part (the URL's password).
URL_FIELDS: dict[str, str] = {
    "DATABASE_URL": "postgresql://app:{pw}@db.internal:5432/prod",
    "REDIS_URL": "rediss://default:{pw}@cache.internal:6380",
}
#: Query parameters that only their name in a URL gives away (``?key=…`` and the like).
QUERY_FIELDS: dict[str, Callable[[Rand], str]] = {
    "key": lambda r: r.an(39),
    "sig": lambda r: r.b64(43),
    "access_token": lambda r: r.an(40),
    "X-Amz-Signature": lambda r: r.hex(64),
    "token": lambda r: r.an(32),
}
#: Response headers that carry secrets (the header's whole value).
RESPONSE_FIELDS = ("Set-Cookie", "X-Auth-Token", "x-amz-security-token", "WWW-Authenticate-Token")

CHANNELS = (
    "tool-args",
    "tool-result",
    "tool-error",
    "run-input",
    "run-output",
    "metadata",
    "environment",
    "prompt",
    "request-headers",
    "response-headers",
    "query",
    "stream",
    "bytes-body",
    "gzip-body",
    "locals",
)


def plants(channel: str) -> list[Plant]:
    """Every shape, each with secrets of its own for ``channel``."""
    out = []
    for shape, make in TEXT_SHAPES.items():
        text, secrets = make(Rand(f"{channel}/{shape}"))
        out.append(Plant(shape, text, secrets))
    for name, make_value in FIELD_SHAPES.items():
        value = make_value(Rand(f"{channel}/{name}"))
        secret = value.split("//", 1)[1].split("@", 1)[0] if name == "SENTRY_DSN" else value
        out.append(Plant(f"field:{name}", f"{name}={value}", (secret,), name, value))
    if channel == "query":
        for name, make_value in QUERY_FIELDS.items():
            value = make_value(Rand(f"{channel}/?{name}"))
            out.append(Plant(f"query:{name}", f"{name}={value}", (value,), name, value))
    for name, template in URL_FIELDS.items():
        pw = Rand(f"{channel}/{name}").pw()
        value = template.format(pw=pw)
        out.append(Plant(f"field:{name}", f"{name}={value}", (pw,), name, value))
    return out


def secrets_by_channel() -> dict[str, dict[str, str]]:
    """channel -> {secret: shape} for every plant."""
    return {c: {s: p.shape for p in plants(c) for s in p.secrets} for c in CHANNELS}


def shape_count() -> int:
    return len(TEXT_SHAPES) + len(FIELD_SHAPES) + len(URL_FIELDS) + len(QUERY_FIELDS)


def fields(channel: str) -> dict[str, str]:
    return {p.name: p.value for p in plants(channel) if p.name is not None and p.value is not None}


def texts(channel: str, *, one_line: bool = False) -> list[str]:
    return [p.text for p in plants(channel) if p.name is None and (p.one_line or not one_line)]


def all_text(channel: str) -> str:
    """Every plant of ``channel`` as text, one per paragraph (fields as ``name=value``)."""
    return "\n\n".join(p.text for p in plants(channel))


def response_headers() -> list[tuple[str, str]]:
    out = []
    for name in RESPONSE_FIELDS:
        value = Rand(f"response-headers/{name}").an(32)
        shown = f"session={value}; Path=/; HttpOnly" if name == "Set-Cookie" else value
        out.append((name, shown))
    for name, value in fields("response-headers").items():
        out.append((name, value))
    for i, text in enumerate(texts("response-headers", one_line=True)):
        out.append((f"X-Corpus-{i}", text))
    return out


def response_header_secrets() -> dict[str, str]:
    found = {
        Rand(f"response-headers/{name}").an(32): f"response:{name}" for name in RESPONSE_FIELDS
    }
    for p in plants("response-headers"):
        if p.name is not None or p.one_line:
            found.update(dict.fromkeys(p.secrets, p.shape))
    return found


# -- the fake server ------------------------------------------------------------------


# The request carries a header for each shape: more than http.server's default hundred.
http.client._MAXHEADERS = 1000  # type: ignore[attr-defined]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _chunked(self, ctype: str, parts: list[bytes], extra: list[tuple[str, str]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        for part in parts:
            self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        if self.path.startswith("/headers"):
            self._send(200, b'{"ok":true}', "application/json", response_headers())
        else:
            self._send(200, b'{"ok":true}', "application/json", [])

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/chat/completions":
            request = orjson.loads(body)
            text = "echo: " + str(request["messages"][-1]["content"])
            if request.get("stream"):
                self._stream(text)
                return
            answer = {
                "id": "chatcmpl-corpus",
                "object": "chat.completion",
                "created": 1700000000,
                "model": request.get("model", "fake"),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
            self._send(200, orjson.dumps(answer), "application/json", [])
        elif self.path == "/bytes":
            reply = b"\xff\xfe" + all_text("bytes-body").encode() + b"\x00\x81"
            self._send(200, reply, "application/octet-stream", [])
        elif self.path == "/gz":
            lines = b"".join(orjson.dumps({"note": t}) + b"\n" for t in texts("gzip-body"))
            packed = gzip.compress(lines)
            third = len(packed) // 3
            parts = [packed[:third], packed[third : 2 * third], packed[2 * third :]]
            self._chunked("application/x-ndjson", parts, [("Content-Encoding", "gzip")])
        else:
            self._send(404, b"{}", "application/json", [])

    def _stream(self, text: str) -> None:
        # Seven characters a chunk: every secret in the answer is split across chunks.
        parts = []
        for i in range(0, len(text), 7):
            chunk = {
                "id": "chatcmpl-corpus",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": "fake",
                "choices": [{"index": 0, "delta": {"content": text[i : i + 7]}}],
            }
            parts.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        done = {
            "id": "chatcmpl-corpus",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "fake",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        parts.append(b"data: " + orjson.dumps(done) + b"\n\ndata: [DONE]\n\n")
        self._chunked("text/event-stream", parts, [])


class CorpusServer:
    """The fake server on 127.0.0.1, in a thread."""

    def __enter__(self) -> CorpusServer:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- the agent --------------------------------------------------------------------------


@replayable.tool
def corpus_tool(notes: list[str], settings: dict[str, str]) -> dict[str, Any]:
    """Returns the result channel's plants."""
    return {"notes": texts("tool-result"), **fields("tool-result")}


@replayable.tool
def failing_tool(host: str) -> None:
    """Fails with the error channel's plants in the message."""
    raise ConnectionError(
        f"cannot reach {host}: " + " | ".join(all_text("tool-error").split("\n\n"))
    )


def env_plants() -> dict[str, str]:
    """Environment variables the snapshot records: secret names and free text."""
    env = {k.upper().replace("-", "_"): v for k, v in fields("environment").items()}
    for i, text in enumerate(texts("environment")):
        env[f"CORPUS_NOTE_{i}"] = text
    return env


@replayable.workflow("plant-everything")
def plant_everything(base_url: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Plants every shape through every channel, with real SDK and HTTP calls."""
    local_fields = fields("locals")
    local_texts = texts("locals")
    api_key = local_fields["openai_api_key"]
    db_password = os.environ.get("CORPUS_LOCAL_PASSWORD", local_fields["db_password"])
    notes = corpus_tool(texts("tool-args"), fields("tool-args"))
    try:
        failing_tool("db.internal")
    except ConnectionError:
        pass
    with openai.OpenAI(
        api_key="sk-test-corpus-key-0000000000000000",
        base_url=f"{base_url}/v1",
        default_headers={
            **fields("request-headers"),
            **{f"X-Corpus-{i}": t for i, t in enumerate(texts("request-headers", one_line=True))},
        },
        max_retries=0,
    ) as client:
        reply = client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": all_text("prompt")}]
        )
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="fake",
                messages=[{"role": "user", "content": all_text("stream")}],
                stream=True,
            )
            if chunk.choices
        )
    with httpx.Client(base_url=base_url) as http:
        http.get("/headers")
        params = {**fields("query"), **{f"note{i}": t for i, t in enumerate(texts("query"))}}
        http.get("/q", params=params)
        http.post(
            "/bytes",
            content=b"\xff\xfe" + all_text("bytes-body").encode() + b"\x00",
            headers={"content-type": "application/octet-stream"},
        )
        http.post(
            "/gz",
            content=gzip.compress(all_text("gzip-body").encode(), mtime=0),
            headers={"content-type": "text/plain", "content-encoding": "gzip"},
        )
    del api_key, db_password, local_texts
    return {
        "notes": notes["notes"][:1],
        # What the agent saw whole: a piece of a secret would not be one any more.
        "reply": (reply.choices[0].message.content or "").startswith("echo: "),
        "streamed": streamed.startswith("echo: "),
        "out": texts("run-output"),
        **fields("run-output"),
    }


def run_inputs() -> dict[str, Any]:
    return {"texts": texts("run-input"), **fields("run-input")}


def run_metadata() -> dict[str, Any]:
    meta: dict[str, Any] = dict(fields("metadata"))
    for i, text in enumerate(texts("metadata")):
        meta[f"note{i}"] = text
    return meta


def b64_forms(secret: str) -> Iterator[bytes]:
    """The secret as it stands in base64 of a longer body, at each of the three alignments."""
    raw = secret.encode()
    for k in range(3):
        encoded = base64.b64encode(b"\x00" * k + raw)
        start = (k * 8 + 5) // 6
        middle = encoded[start : len(encoded) - 4]
        if len(middle) >= 12:
            yield middle


# -- the benign corpus -----------------------------------------------------------------

BENIGN_TEXTS = [
    "Please follow the password reset instructions we sent to your email address.",
    "The tokenizer splits text into tokens; set max_tokens=256 to limit the answer.",
    "monkey keyword keyboard turkey hockey donkey whiskey jockey",
    "def tokenize(text):\n    tokens = text.split()\n    return tokens",
    "token = tokenizer.encode(text)",
    "api_key = os.environ['OPENAI_API_KEY']",
    "password_reset_url = 'https://example.com/reset'",
    "The author's session ran long; the secretary took notes in the passage.",
    "Use the secret sauce recipe, but keep it to yourself.",
    "Basic training starts Monday; bring comfortable shoes.",
    "He was the bearer of bad news about the quarterly numbers.",
    "https://example.com/search?page=2&sort=asc&q=weather+in+paris",
    "postgresql://db.internal:5432/prod",
    "Send the report to ada@example.com by Friday.",
    "git@github.com:acme/agents.git",
    "ftp://ftp.example.com/pub/README",
    "3f2b8c1e-9a4d-4e7b-8c6f-2d1a0b9e8f7c",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "9fceb02d0ae598e95dc970b74767f19372d61af8",
    "commit 4b825dc642cb6eb9a060e54bf8d69288fbee4904 merged into main",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    '{"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}',
    "sk-learn is the usual nickname of scikit-learn",
    "task-1234567890abcdefgh finished in 3.2 s",
    "The key: value pairs are sorted by key before hashing.",
    "primary_key = 'id'; sort_key = 'created_at'",
    "ssh-keygen -t ed25519 -C 'ops@example.com'",
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUY2VydA==\n-----END CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----",
    "AKIA is the prefix AWS uses for access key ids.",
    "Authentication failed for user bob: check the credentials in the vault.",
    "CSRF token mismatch: the session expired, please sign in again.",
    "Compass bypass: a passage through the mountains, passable in summer.",
    "#ff8800 and #00aaff are the brand colours",
    "The Bearer token scheme is described in RFC 6750.",
    "Set the cookie policy in settings; cookies are optional.",
    "ORDER-2024-000123, INVOICE-88812, SKU-0042",
    "The function returns a dict with the keys 'status', 'token_count' and 'elapsed'.",
    "Signature required on page 3; the signatory is the CFO.",
    "connect.sid and JSESSIONID are cookie names, not values.",
    "Use DATABASE_URL to point at your own database.",
    "See https://docs.example.com/auth/api-keys for how to create an API key.",
    "The passcode screen appears after three minutes.",
    "The secret to good soup is patience.",
    "A tokenizer_config.json file ships with every model.",
]
BENIGN_TREES: list[dict[str, Any]] = [
    {"max_tokens": 256, "prompt_tokens": 12, "total_tokens": 40, "tokenizer": "cl100k_base"},
    {"keywords": ["monkey", "keyboard"], "author": "ada", "session": {"user": "ada", "n": 3}},
    {"primary_key": "id", "sort_key": "created_at", "cache_key": "user:42", "public_key": "ssh"},
    {"token_type": "bearer_like", "token_count": 17, "passage": "once upon a time"},
    {"password_reset_url": "https://example.com/reset", "password_policy": "12+ characters"},
    {"usage": {"input_tokens": 3, "output_tokens": 5, "cache_read_input_tokens": 0}},
    {"headers": [["content-type", "application/json"], ["x-request-id", "req_123"]]},
    {"uuid": "3f2b8c1e-9a4d-4e7b-8c6f-2d1a0b9e8f7c", "sha": "9fceb02d0ae598e95dc970b74767f1937"},
]
