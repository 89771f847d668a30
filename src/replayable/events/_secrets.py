"""What a secret looks like: secret-looking names, and the shapes of secret values.

Two halves, used by :class:`~replayable.events.redaction.Redactor`:

* :func:`secret_name` tells whether a key, header, query parameter, variable
  or environment name holds a secret. Names are split into words (``_``, ``-``,
  ``.``, spaces, camelCase), and a name is secret when its last word is a
  secret word (``db_password``, ``X-Auth-Token``, ``openai_api_key``,
  ``AccountKey``), or a secret word followed only by words that qualify it
  (``password_confirmation``, ``session_id``). ``keyword``, ``monkey``,
  ``prompt_tokens``, ``tokenizer`` and ``password_reset_url`` are not.
* :data:`DETECTORS` are the value shapes: provider tokens with a known prefix
  (OpenAI, Anthropic, GitHub, GitLab, Slack, Stripe, AWS, Google, Hugging Face
  …), JWTs, PEM private-key blocks, passwords in URLs, ``Basic`` and
  ``Bearer`` credentials, and ``name=value`` assignments whose name is secret
  (``password=…`` in an exception's text, ``AccountKey=…`` in a connection
  string, ``?key=…`` in a URL).

Each detector names the lower-cased text every match contains (its
*fragments*): a payload holding none of them is not scanned for it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DETECTORS",
    "KEY_FRAGMENTS",
    "Detector",
    "query_secret_name",
    "secret_name",
]

#: A name's last word (or a secret word followed by qualifiers) that makes it secret.
_SECRET_WORDS: Final = frozenset(
    {
        "password", "passwd", "passphrase", "pass", "pwd", "secret", "secrets", "token",
        "apikey", "apikeys", "credential", "credentials", "creds", "cred", "cookie", "cookies",
        "auth", "authorization", "authentication", "privatekey", "sessionid", "sessid",
        "jsessionid", "phpsessid", "jwt", "bearer", "dsn", "signature", "sig", "connstr",
        "passcode",
        "accesskey", "secretkey", "authkey", "apitoken", "accesstoken", "refreshtoken",
        "idtoken", "authtoken", "sessiontoken", "csrftoken", "xsrftoken", "clientsecret",
        "apisecret", "masterkey", "accountkey", "signingkey", "encryptionkey",
    }
)  # fmt: skip
#: Endings of a one-word name that make it secret (``pgpassword``, ``githubtoken``).
_SECRET_SUFFIXES: Final = (
    "password", "passwd", "secret", "token", "apikey", "accesskey", "secretkey", "privatekey",
    "sessionid", "credentials", "creds",
)  # fmt: skip
#: Words before ``key``/``keys`` that make it a secret key (``api_key``, ``secret_key``).
_KEY_QUALIFIERS: Final = frozenset(
    {
        "api", "access", "secret", "private", "client", "signing", "sign", "encryption", "enc",
        "master", "account", "storage", "service", "auth", "subscription", "app", "application",
        "consumer", "webhook", "deploy", "ssh", "gpg", "pgp", "shared", "sas", "license",
        "session", "admin", "root", "hmac", "aes", "rsa", "jwt", "x", "openai", "anthropic",
        "stripe", "aws", "gcp", "azure", "google", "github", "gitlab", "slack", "twilio",
        "sendgrid", "mailgun", "hf", "huggingface", "cohere", "mistral", "groq", "pinecone",
        "supabase", "firebase", "datadog", "dd", "sentry", "llm",
        "decryption", "crypt", "cipher", "sk", "live",
        "mac", "otp", "recovery", "backup", "personal", "bot", "integration", "partner",
    }
)  # fmt: skip
#: Words that may follow a secret word and leave it secret (``password_hash``, ``token_2``).
_QUALIFIERS: Final = frozenset(
    {
        "value", "val", "hash", "hashed", "b64", "base64", "raw", "enc", "encrypted", "plain",
        "plaintext", "str", "string", "text", "data", "bytes", "hex", "env", "old", "new",
        "current", "confirm", "confirmation", "again", "repeat", "id", "key", "header",
        "json", "file", "content", "contents", "cleartext", "override", "default",
    }
)  # fmt: skip
#: Secret words that need a qualifier of their own: ``session_id`` is secret, ``session`` not.
_PAIRED: Final = {("session", "id"), ("session", "key")}
#: Query parameter names that carry a credential (``?key=AIza…``, a signed URL's ``sig``).
_QUERY_NAMES: Final = frozenset(
    {
        "key", "sig", "signature", "x-amz-signature", "x-amz-security-token",
        "x-goog-signature", "access_token", "token", "auth", "apikey", "api_key", "password",
        "pass", "pwd", "secret", "client_secret", "private_token",
    }
)  # fmt: skip
#: Lower-cased text every secret name contains (what the byte scans look for).
KEY_FRAGMENTS: Final = (
    "auth", "key", "pass", "pwd", "secret", "token", "cookie", "cred", "sess", "jwt", "bearer",
    "dsn", "sig", "connstr",
)  # fmt: skip
#: A fragment in a lower-cased name: "tokens" alone ("prompt_tokens") is not one, so that
#: the usage block of every LLM response sends nothing through the name checks.
NAME_FRAGMENT: Final = re.compile(
    "|".join("token(?!s)" if f == "token" else re.escape(f) for f in KEY_FRAGMENTS)
)


def name_fragment_re2() -> str:
    """:data:`NAME_FRAGMENT` and the rest of the name after it, for re2, which has no
    lookahead: ``token`` then the end of the name or a name character other than ``s``.
    A name ends in a letter, digit, ``_`` or ``-`` (not in the ``.`` that ends a sentence)."""
    others = "|".join(re.escape(f) for f in KEY_FRAGMENTS if f != "token")
    tail = r"(?:[a-z0-9_.\-]*[a-z0-9_\-])?"
    token = r"token(?:[a-rt-z0-9_\-]|[a-rt-z0-9_.\-][a-z0-9_.\-]*[a-z0-9_\-])?"
    return f"(?:(?:{others}){tail}|{token})"


_NAME_CHARS: Final = re.compile(r"[A-Za-z0-9_.\-]{0,79}[A-Za-z0-9_\-]")
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SPLIT: Final = re.compile(r"[_.\-]+")


def _words(name: str) -> list[str]:
    return [w for w in _SPLIT.split(_CAMEL.sub("_", name).lower()) if w]


def _classify(name: str) -> bool:
    if _NAME_CHARS.fullmatch(name) is None or NAME_FRAGMENT.search(name.lower()) is None:
        return False
    words = _words(name)
    if not words:
        return False
    # The last word that is not a qualifier decides, with what stands before it.
    i = len(words) - 1
    while i > 0 and (words[i] in _QUALIFIERS or words[i].isdigit()) and words[i] != "key":
        i -= 1
    word = words[i]
    before = words[i - 1] if i else ""
    if word in ("key", "keys"):
        if before in _KEY_QUALIFIERS or before in _SECRET_WORDS:
            return True
        # "session_key", "connection_string": a pair of words that is secret together.
        return any(w in _KEY_QUALIFIERS for w in words[:i]) and i >= 2
    if i + 1 < len(words) and (word, words[i + 1]) in _PAIRED:
        return True
    if word == "auth":
        # "auth" holds a credential alone or as "x-auth", "basic_auth"; "server_auth" and
        # "client_auth" (TLS purposes) and "auth_type" do not.
        return i == len(words) - 1 and (i == 0 or before in _AUTH_QUALIFIERS)
    if word in _SECRET_WORDS:
        # "sig" and "pass" are short and common: only as the name's last word, never
        # before a qualifier ("pass_id" is not a password).
        return not (word in _SHORT and i != len(words) - 1)
    if len(words) == 1 or i == len(words) - 1:
        return word.endswith(_SECRET_SUFFIXES)
    return False


_SHORT: Final = frozenset({"sig", "pass"})
_AUTH_QUALIFIERS: Final = frozenset(
    {"x", "http", "proxy", "basic", "bearer", "api", "user", "upstream", "header", "my", "db"}
)


@functools.lru_cache(maxsize=8192)
def secret_name(name: str) -> bool:
    """Whether ``name`` (a key, header, variable or environment name) holds a secret."""
    return _classify(name)


@functools.lru_cache(maxsize=1024)
def query_secret_name(name: str) -> bool:
    """Whether a URL query parameter or form field called ``name`` carries a credential."""
    return name.lower() in _QUERY_NAMES or _classify(name)


# -- value shapes ------------------------------------------------------------------


@dataclass(frozen=True)
class Detector:
    """One secret shape.

    ``text`` is matched on strings (``re``; a group named ``secret``, when there is
    one, is what gets replaced); ``scan`` on serialized JSON, lower-cased first when
    ``lower``, and must match wherever ``text`` matches in a string (a looser scan
    only costs a walk). ``check`` turns down a match that only looks like one.
    ``bounded``: a word boundary must come before the ``scan`` match (checked by hand).
    """

    name: str
    fragments: tuple[str, ...]
    text: str
    scan: str
    lower: bool = False
    bounded: bool = False
    check: Callable[[re.Match[str]], bool] | None = None


def _token(name: str, prefix: str, body: str, bounded: bool = True) -> Detector:
    """A token that starts with a literal ``prefix``."""
    rx = re.escape(prefix) + body
    return Detector(name, (prefix.lower(),), (r"\b" if bounded else "") + rx, rx, bounded=bounded)


_PLACEHOLDERS: Final = re.compile(
    r"(?ai)\[?redacted\]?|\*+|x{3,}|\.{3}|<[^>]*>?|\$\{.*|\{\{.*|%\(?\w*\)?s|none|null|nil"
    r"|true|false|undefined|\$\w+|os\.environ.*|env\[.*|getenv.*"
)
_SECRETISH: Final = re.compile(r"(?a)(?=.*\d)(?=.*[A-Za-z])|(?=.*[^\w\s])(?=.*\w)|.{16,}")


_CODE: Final = re.compile(r"(?a)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def _assignment(m: re.Match[str]) -> bool:
    """A ``name = value`` match holds a secret: a secret name and a value that is not a
    placeholder, a template or code. Set off by spaces (prose, code, YAML), the value must
    be long and look random unless it is quoted; quoted, it must not be a plain word."""
    name, value = m.group("name"), m.group("secret")
    text = m.string
    query = m.start() > 0 and text[m.start() - 1] in "?&;"
    if not (query_secret_name(name) if query else secret_name(name)):
        return False
    if _PLACEHOLDERS.fullmatch(value) is not None or "%s" in value or "%(" in value:
        return False
    random_looking = _SECRETISH.match(value) is not None
    if m.group("quote"):
        return len(value) >= 4 and (random_looking or len(value) >= 10)
    if _CODE.fullmatch(value) is not None or text.startswith("(", m.end()):
        return False  # self.passwd, read_password(…): an attribute or a call, not a value
    if m.group("sep").strip() != m.group("sep"):
        # "token = tokenizer(text)" is code, "password: must be long" is prose.
        return len(value) >= 8 and random_looking
    return len(value) >= 3 or query


def _basic(m: re.Match[str]) -> bool:
    """``Basic`` with base64 that decodes to ``user:password`` (not the word in prose)."""
    raw = m.group("secret")
    try:
        decoded = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


_TOKEN_BODY: Final = r"[A-Za-z0-9_\-]"
_TOKENS: Final = (
    # OpenAI (sk-, sk-proj-, sk-svcacct-), Anthropic (sk-ant-), OpenRouter, DeepSeek …
    _token("openai", "sk-", r"(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}"),
    *(_token("github", p, r"[A-Za-z0-9_]{20,}") for p in ("ghp_", "gho_", "ghs_", "ghu_", "ghr_")),
    _token("github", "github_pat_", r"[A-Za-z0-9_]{20,}"),
    *(
        _token("gitlab", p, rf"{_TOKEN_BODY}{{20,}}")
        for p in ("glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glsoat-", "glcbt-", "glimt-")
    ),
    _token("slack", "xox", r"[abposer]-[A-Za-z0-9\-]{10,}"),
    _token("slack", "xapp-", r"[0-9]-[A-Za-z0-9\-]{10,}"),
    _token("slack-webhook", "hooks.slack.com/", r"(?:services|workflows|triggers)/[\w/\-]{16,}"),
    *(
        _token("stripe", p, r"[A-Za-z0-9]{16,}")
        for p in ("sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_")
    ),
    *(_token("aws", p, r"[0-9A-Z]{16}\b") for p in ("AKIA", "ASIA", "ABIA", "ACCA")),
    _token("google", "AIza", r"[0-9A-Za-z_\-]{35}"),
    _token("google", "ya29.", r"[0-9A-Za-z_\-]{20,}"),
    _token("google", "GOCSPX-", r"[0-9A-Za-z_\-]{20,}"),
    _token("google", "1//0", r"[0-9A-Za-z_\-]{30,}"),
    _token("huggingface", "hf_", r"[A-Za-z0-9]{30,}"),
    _token("sendgrid", "SG.", r"[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"),
    _token("npm", "npm_", r"[A-Za-z0-9]{36}"),
    _token("pypi", "pypi-AgEIcHlwaS5vcmc", r"[A-Za-z0-9_\-]{20,}"),
    *(_token("shopify", p, r"[a-fA-F0-9]{32}") for p in ("shpat_", "shpss_", "shpca_", "shppa_")),
    *(_token("digitalocean", p, r"[a-f0-9]{64}") for p in ("dop_v1_", "doo_v1_", "dor_v1_")),
    _token("databricks", "dapi", r"[a-f0-9]{32}"),
    _token("groq", "gsk_", r"[A-Za-z0-9]{20,}"),
    _token("replicate", "r8_", r"[A-Za-z0-9]{20,}"),
    _token("vault", "hvs.", r"[A-Za-z0-9_\-]{20,}"),
    _token("age", "AGE-SECRET-KEY-1", r"[0-9A-Z]{50,}"),
    _token("mailgun", "key-", r"[0-9a-f]{32}"),
    *(_token("square", p, r"[0-9A-Za-z_\-]{22,}") for p in ("sq0atp-", "sq0csp-", "EAAA")),
    _token("atlassian", "ATATT3", r"[A-Za-z0-9_\-=]{30,}"),
    _token("linear", "lin_api_", r"[A-Za-z0-9]{30,}"),
    _token("notion", "ntn_", r"[A-Za-z0-9]{30,}"),
    _token("notion", "secret_", r"[A-Za-z0-9]{43}\b"),
    _token("perplexity", "pplx-", r"[A-Za-z0-9]{30,}"),
    _token("xai", "xai-", r"[A-Za-z0-9]{30,}"),
    _token("tailscale", "tskey-", r"[a-z]+-[A-Za-z0-9]{10,}"),
    _token("postman", "PMAK-", r"[a-f0-9]{24}-[a-f0-9]{34}"),
    _token("discord-webhook", "/api/webhooks/", r"[0-9]{5,}/[A-Za-z0-9_\-]{20,}", bounded=False),
    _token("bearer", "Bearer", r"\s+[A-Za-z0-9._~+/=\-]{8,}"),
)

DETECTORS: Final[tuple[Detector, ...]] = (
    *_TOKENS,
    Detector(
        "telegram",
        (":aa",),
        r"[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}",
        r":AA[A-Za-z0-9_\-]{33}",
    ),
    Detector(
        "jwt",
        ("eyj",),
        r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]*",
        r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.",
        bounded=True,
    ),
    # A PEM (or PGP) private-key block, its body and END line included; cut short (no END
    # line in this string), everything that can be its body.
    Detector(
        "private-key",
        ("private key",),
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=:,\-\s]*)",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY",
    ),
    # A password in a URL's user info: postgresql://user:[REDACTED]@host/db.
    Detector(
        "url-password",
        ("://",),
        r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@\"'<>]*:(?P<secret>[^\s/?#@\"'<>]+)@",
        r"://[^\s:/?#@\"'<>]*:[^\s/?#@\"'<>]+@",
    ),
    Detector(
        "basic-auth",
        ("basic",),
        r"\bBasic\s+(?P<secret>[A-Za-z0-9+/]{6,}={0,2})",
        r"Basic\s+[A-Za-z0-9+/]{6,}",
        check=_basic,
    ),
    # name=value and name: value with a secret name: "password=hunter2" in an error's
    # text, "AccountKey=…;" in a connection string, "?key=…" in a URL, a dict's repr.
    Detector(
        "assignment",
        KEY_FRAGMENTS,
        r"(?ai)(?<![a-z0-9_.\-])(?P<name>[a-z0-9_.\-]*(?:" + "|".join(KEY_FRAGMENTS) + r")"
        r"[a-z0-9_.\-]*)[\"']?(?P<sep>[ \t]*[:=][ \t]*)(?P<quote>[\"'])?"
        r"(?P<secret>[^\s\"'&;,<>()\[\]{}]+)",
        r"{name}(?:\\\"|')?(?:[ \t]|\\t)*[:=]",
        lower=True,
        check=_assignment,
    ),
)
