"""The payload tier: large payloads stored once, as content-addressed, compressed blobs.

An event's request or response longer than the threshold (1 KB by default)
leaves its row: the row keeps a reference, the text goes to the store's blob
tier. What an event's hash covers is unchanged (its canonical payload text),
so where a payload lives is a storage detail and every chain verifies the
same way whichever tier holds it.

**Segments.** Before hashing, a payload is cut at message boundaries: each
chat message (a JSON object with a ``role``, wherever it sits) and each long
string becomes a segment of its own, the text between them stays literal. A
chat whose every call re-sends its history therefore stores each message
once. The exact text is kept: segments are located in the payload's own
text, so joining the pieces gives the payload back byte for byte.

**Nodes.** A payload is a chain of nodes, each holding its parent node, a
literal and at most one segment's digest, and named by the sha256 of those.
Two payloads that start with the same messages share the nodes of that
prefix, so the references of a 50-turn chat grow by a node or two per call,
not by the whole history (a flat list of references would grow quadratically).

**Blobs.** A segment is stored once per tenant under the sha256 of its text,
compressed with zstd (with the tenant's trained dictionary when there is
one) and, when a data key is configured, encrypted (see
:mod:`replayable.store.crypto`). The codec column names how: ``zstd/<dict id
or ->/<key id or ->``. Reading decompresses and checks the digest: a blob
whose bytes do not match its hash makes the event unreadable, named in its
``problems``, so the reader that met it and ``verify`` report it.

**Run records and errors.** When payloads are encrypted, a run's input, output
and error and each event's error record are kept in the tier too (their column
holds :data:`REF_PREFIX` and the reference), so that nothing a data subject's run
recorded stays in clear where erasing its key cannot reach. Their records hash
those values by their sha256 (run records of version 2, events of version 3), so an
erased one still verifies; records of older versions keep them in their rows.

This module holds the logic every backend shares; a backend stores rows and
fetches them by digest (:class:`TierBackend`).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

import msgspec
import orjson
import zstandard

from replayable.errors import ConfigurationError
from replayable.events.canonical import payload_digest
from replayable.events.model import (
    SEALED_EVENT_VERSION,
    SEALED_SCHEMA_VERSION,
    Event,
    Run,
    RunEnd,
    RunStart,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "REF_PREFIX",
    "SUBJECT_KEY",
    "BlobRow",
    "NodeRow",
    "PayloadTier",
    "TierBackend",
    "TierRows",
    "TierStats",
    "check_tenant",
    "kept_runs",
    "node_digest",
    "prefix_hash",
    "reachable",
    "run_space",
    "space",
    "split_payload",
    "split_space",
    "subject_text",
    "tier_ref",
]

#: Payloads longer than this many characters leave the event row.
DEFAULT_THRESHOLD: Final = 1024
#: What a text column holds in place of a value the tier keeps (a run's input, output or
#: error, an event's error, when payloads are encrypted): this prefix, then the value's
#: reference. Never valid JSON, so no recorded value reads as one, and a reader that
#: knows nothing of it names the column unreadable rather than showing a wrong value.
REF_PREFIX: Final = "@tier:"


def kept_runs(runs: Iterable[Run]) -> set[str]:
    """The ids of the runs among ``runs`` with a value the tier keeps (see :data:`REF_PREFIX`)."""
    out = set()
    for run in runs:
        end = run.end
        if run.start.input.startswith(REF_PREFIX) or (
            end is not None
            and (
                (end.output is not None and end.output.startswith(REF_PREFIX))
                or (end.error is not None and end.error.startswith(REF_PREFIX))
            )
        ):
            out.add(run.run_id)
    return out


def tier_ref(text: str | None) -> str | None:
    """The tier reference a column's text holds, or ``None`` for a value kept in the row."""
    if text is not None and text.startswith(REF_PREFIX):
        return text[len(REF_PREFIX) :]
    return None


#: A segment shorter than this stays literal text in its node (a blob would cost more).
MIN_SEGMENT: Final = 64
#: A string value at least this long is a segment of its own (a document, a tool output).
LONG_STRING: Final = 512
_LEVEL: Final = 3


def space(tenant: str | None, subject: str | None) -> str:
    """The key space a run's payloads are stored in: its tenant ('' for none), and its
    data subject when the recording names one (each subject has blobs and keys of its
    own, so erasing one subject's payloads leaves everyone else's readable)."""
    # The separators of a key space never come from a name's own text (one subject must
    # not name another's epoch, nor a tenant another tenant's subject): such a name goes
    # by its hex. Tenants holding one are refused where they are named (see
    # :func:`check_tenant`); a stored row with one still gets a space of its own.
    tenant = _plain(tenant or "", epochs=False)
    if not subject:
        return tenant
    return f"{tenant}{_SUBJECT}{_plain(subject, epochs=True)}"


def _plain(name: str, *, epochs: bool) -> str:
    """``name`` as a part of a key space: as it is, or by its hex (after ``_ESCAPED``)
    where it holds the subject separator (or, with ``epochs``, the epoch one) or starts
    as an escaped name does."""
    if _SUBJECT in name or name[:1] == _ESCAPED or (epochs and _EPOCH in name):
        return _ESCAPED + name.encode("utf-8", "surrogatepass").hex()
    return name


def check_tenant(tenant: str | None, where: str) -> None:
    """Refuse a tenant name holding a control character (the separators of key spaces
    among them): names are printable text, shown and typed by people."""
    if tenant is not None and any(c < " " or c == "\x7f" for c in tenant):
        raise ConfigurationError(
            f"{where}: tenant {tenant!r} holds a control character; a tenant's name must "
            "be printable text"
        )


def split_space(text: str) -> tuple[str, str]:
    """(tenant, subject) of a key space (subject '' for none)."""
    tenant, _, subject = text.partition(_SUBJECT)
    return tenant, subject


def subject_text(value: Any) -> str | None:
    """A data subject as metadata holds it: text, or a number written as text."""
    if value is None or isinstance(value, dict | list | bool):
        return None
    return str(value) or None


def run_space(start: Any, erasures: Iterable[Any] = ()) -> str:
    """The key space of a run's payloads, from its start record, in the epoch of its
    key space the run started in (see :func:`epoch_space`)."""
    base = space(start.tenant, subject_text(start.metadata.get(SUBJECT_KEY)))
    return epoch_space(base, start.started_at, erasures)


def erasure_times(erasures: Iterable[Any], key_space: str) -> list[float]:
    """When each erasure that ended an epoch of ``key_space`` (a base space, or any of its
    epochs) happened, oldest first: erasures of its tenant as a whole, of its subject, or
    of one of its epochs. One ``erase`` names the subject and each epoch of it at one
    time, so it counts once."""
    tenant, subject = split_space(key_space)
    subject = subject.partition(_EPOCH)[0]
    inner = subject + _EPOCH
    return sorted(
        {
            e.erased_at
            for e in erasures
            if e.tenant == tenant
            and (e.subject is None or e.subject == subject or e.subject.startswith(inner))
        }
    )


def epoch_space(base: str, started_at: float, erasures: Iterable[Any]) -> str:
    """The key space of a run that started at ``started_at`` in base space ``base``.

    An erasure destroys a key space's data keys for good, and its blobs stay stored
    as ciphertext no key opens. A run recorded after it must not share those blobs
    (a message or a literal it has in common with an erased run would read as erased),
    so each erasure starts a new epoch of the space, with blobs and keys of its own:
    ``<subject>\\x1e<n>`` after the ``n``-th. Erasures are ordered by their time, the
    run by its start: a run in progress when its space is erased stays in the erased
    epoch (see :func:`closed_by`)."""
    epoch = sum(1 for at in erasure_times(erasures, base) if at <= started_at)
    if not epoch:
        return base
    tenant, subject = split_space(base)
    return tenant + _SUBJECT + epoch_subject(subject, epoch)


def epoch_spaces(
    rows: Sequence[tuple[str, str | None, Any, Any]], erasures_of: Callable[[str], Sequence[Any]]
) -> dict[str, str]:
    """Each run's key space in the epoch it started in, from ``(run id, tenant, data
    subject as metadata holds it, started_at)`` rows; ``erasures_of(tenant)`` gives a
    tenant's erasures (asked once per tenant). A start time that is no number (a
    hostile row) counts as the earliest."""
    erasures = {t: erasures_of(t) for t in {r[1] or "" for r in rows}}
    return {
        rid: epoch_space(
            space(tenant, subject_text(subject)),
            started_at if type(started_at) in (int, float) else 0.0,
            erasures[tenant or ""],
        )
        for rid, tenant, subject, started_at in rows
    }


def epoch_subject(subject: str, epoch: int) -> str:
    """The subject column of epoch ``epoch`` of a data subject's key space ('' for a
    tenant's own); epoch 0 is the subject itself."""
    return f"{subject}{_EPOCH}{epoch}" if epoch else subject


def closed_by(erasures: Iterable[Any], key_space: str) -> Any | None:
    """The erasure that ended ``key_space``'s epoch, or ``None`` while it is current.
    Nothing is encrypted under a new key in an ended epoch: payloads that reach the
    store after their run's space was erased (from a stream, a spool, a run still in
    progress) are stored erased too."""
    rows = list(erasures)
    times = erasure_times(rows, key_space)
    _, subject = split_space(key_space)
    _, _, number = subject.partition(_EPOCH)
    epoch = int(number) if number.isdigit() else 0
    if len(times) <= epoch:
        return None
    at = times[epoch]
    return next(e for e in rows if e.erased_at == at)


_SUBJECT: Final = "\x1f"
#: Between a data subject and the epoch of its key space (see :func:`epoch_space`).
_EPOCH: Final = "\x1e"
#: Starts a subject written as hex, one whose text holds a separator (see :func:`space`).
_ESCAPED: Final = "\x1d"
#: The run metadata key naming a run's data subject (``recording(subject=...)``).
SUBJECT_KEY: Final = "data_subject"


class BlobRow(NamedTuple):
    #: The key space (see :func:`space`): tenant, and data subject if any.
    tenant: str
    digest: str
    codec: str
    data: bytes
    size: int


class NodeRow(NamedTuple):
    """A run of pieces (literal text, then a blob) continuing the ``parent`` node.

    ``digest`` is the prefix hash at the node's end (see :func:`prefix_hash`), so
    any two nodes ending at the same prefix are interchangeable, and a node is
    checked by recomputing it from its parent and its pieces. ``body`` is the
    JSON list of ``[literal, blob digest]`` pairs.
    """

    tenant: str
    digest: str
    parent: str | None
    body: str


class TierStats(NamedTuple):
    """What a store's blob tier holds: blobs, their text's bytes and their bytes on disk,
    and the nodes that reference them (with their bytes)."""

    blobs: int
    text_bytes: int
    stored_bytes: int
    nodes: int
    node_bytes: int


class TierRows:
    """The blob-tier rows one batch adds (each digest once).

    ``pending`` holds the text of new blobs until the batch is split, then they are
    compressed together (:meth:`PayloadTier.split_events`) into ``blobs``.
    """

    __slots__ = ("blobs", "nodes", "pending", "prepared")

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, str], BlobRow] = {}
        self.nodes: dict[tuple[str, str], NodeRow] = {}
        self.pending: dict[tuple[str, str], bytes] = {}
        #: What the ``prepare`` given to :meth:`PayloadTier.pack_in_background` made of
        #: ``blobs`` once they were packed (a backend's rows), or ``None``.
        self.prepared: Any = None

    def __bool__(self) -> bool:
        return bool(self.blobs or self.nodes)


class TierBackend(Protocol):
    """What a store provides the tier: rows by digest, and its dictionaries."""

    def tier_nodes(self, tenant: str, digests: Sequence[str]) -> list[NodeRow]: ...

    def tier_blobs(self, tenant: str, digests: Sequence[str]) -> list[BlobRow]: ...

    def tier_dictionary(self, tenant: str, dict_id: str | None) -> tuple[str, bytes] | None:
        """The dictionary ``dict_id`` of ``tenant`` (the newest when ``None``), or ``None``."""
        ...


def prefix_hash(prev: str | None, literal: str, blob: str) -> str:
    """The prefix hash after one more piece: 128 bits of sha256 over the previous prefix
    hash, the piece's blob digest and its literal (node names only: blobs keep sha256)."""
    h = hashlib.sha256(b"replayable-prefix\x00")
    h.update((prev or "").encode())
    h.update(b"\x00")
    h.update(blob.encode())
    h.update(b"\x00")
    h.update(literal.encode())
    return h.hexdigest()[:32]


def node_digest(parent: str | None, body: str) -> str | None:
    """The digest a node with this parent and body must have (``None``: malformed body)."""
    try:
        pieces = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(pieces, list) or not pieces:
        return None
    at = parent
    for piece in pieces:
        if (
            not isinstance(piece, list)
            or len(piece) != 2
            or not isinstance(piece[0], str)
            or not isinstance(piece[1], str)
        ):
            return None
        at = prefix_hash(at, piece[0], piece[1])
    return at


#: A JSON string of LONG_STRING characters or more (escapes make it shorter, never longer).
_LONG: Final = re.compile(rf'"[^"]{{{LONG_STRING},}}')


def _has_long_string(text: str) -> bool:
    """Whether ``text`` holds LONG_STRING characters without a quote (a long string may).

    Such a run covers a whole aligned block of half that length, so blocks with a
    quote in them (most, in JSON) rule it out with one ``find`` each; the pattern only
    runs where a block has none.
    """
    half = LONG_STRING // 2
    find = text.find
    for start in range(0, len(text) - half + 1, half):
        if find('"', start, start + half) < 0:
            return _LONG.search(text) is not None
    return False


#: How much of a segment is searched for before the rest is compared.
_HEAD: Final = 64


def split_payload(text: str) -> tuple[list[tuple[str, str]], str]:
    """``text`` as (literal, segment) pieces and a trailing literal, which concatenated
    give ``text`` exactly.

    Segments are chat messages (objects with a ``role``) and long strings, found
    in the payload's own text in document order; a short segment joins the
    literal around it and a long literal becomes a segment. Text that is not
    JSON, or not in the canonical spelling segments are searched by, is one segment.
    """
    if '"role"' not in text and not _has_long_string(text):
        return [("", text)], ""  # no message and no long string: nothing to cut at
    found: list[tuple[str, str]] = []
    pos = 0
    try:
        tree = orjson.loads(text)
    except orjson.JSONDecodeError:
        tree = None

    def take(value: Any) -> bool:
        nonlocal pos
        sub = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        # The first place sub starts at is one of its first characters' places: found
        # those with a short search and compared, rather than searched for whole (a
        # segment of 20 KB took 0.1 ms to find in its payload).
        head = sub[:_HEAD]
        at = text.find(head, pos)
        while at >= 0 and not text.startswith(sub, at):
            at = text.find(head, at + 1)
        if at < 0:
            return False
        found.append((text[pos:at], sub))
        pos = at + len(sub)
        return True

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            if "role" in value and take(value):
                return
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            for v in value:
                visit(v)
        elif isinstance(value, str) and len(value) >= LONG_STRING:
            take(value)

    if tree is not None:
        visit(tree)
    pieces: list[tuple[str, str]] = []
    literal = ""
    for before, segment in [*found, (text[pos:], "")]:
        literal += before
        if len(literal) >= LONG_STRING:
            pieces.append(("", literal))
            literal = ""
        if not segment:
            continue
        if len(segment) < MIN_SEGMENT:
            literal += segment
        else:
            pieces.append((literal, segment))
            literal = ""
    if not pieces:  # short enough pieces only: the whole text is one segment
        return [("", text)], ""
    return pieces, literal


class _LRU:
    """A bounded map (by entries and by the sizes given), safe across threads."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self._data: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            found = self._data.get(key)
            if found is None:
                return None
            self._data.move_to_end(key)
            return found[0]

    def put(self, key: Any, value: Any, size: int = 1) -> None:
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._data[key] = (value, size)
            self._bytes += size
            while self._data and (
                len(self._data) > self._max_items or self._bytes > self._max_bytes
            ):
                _, (_, dropped) = self._data.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0


class _Seen:
    """A bounded set of keys: when full, the older half is forgotten. Adding is safe
    across threads; a lookup is a plain dict lookup (the hot path)."""

    __slots__ = ("_data", "_lock", "_max")

    def __init__(self, max_items: int) -> None:
        self._data: dict[Any, None] = {}
        self._max = max_items
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def update(self, keys: Iterable[Any]) -> None:
        with self._lock:
            data = self._data
            data.update(dict.fromkeys(keys))
            if len(data) > self._max:
                self._data = dict.fromkeys(list(data)[len(data) - self._max // 2 :])

    def clear(self) -> None:
        with self._lock:
            self._data = {}


#: A batch with at least this many new blobs is compressed on zstd's threads.
_THREADED_BATCH: Final = 64


def _done() -> None:
    return None


class Unreadable(Exception):
    """A payload the tier could not put back together (missing, altered, erased)."""


class Erased(Unreadable):
    """A payload whose data key was destroyed: "erased on DATE by WHO"."""


#: The codec a blob is written with: ``zstd/<dictionary id>/<key id>`` ("-" for none).
def codec_name(dict_id: str | None, key_id: str | None) -> str:
    return f"zstd/{dict_id or '-'}/{key_id or '-'}"


def parse_codec(codec: str) -> tuple[str | None, str | None]:
    if not isinstance(codec, str):
        raise Unreadable(f"blob codec is {type(codec).__name__}, not text")
    parts = codec.split("/")
    if len(parts) != 3 or parts[0] != "zstd":
        raise Unreadable(f"blob codec {codec[:40]!r} is unknown to this replayable")
    return (None if parts[1] == "-" else parts[1]), (None if parts[2] == "-" else parts[2])


Sealer = Callable[[str, bytes, str], tuple[str | None, bytes]]
Opener = Callable[[str, str, str, bytes], bytes]


@dataclass
class PayloadTier:
    """Splits, compresses and references payloads for a store, and puts them back together.

    One per store object. ``seal(tenant, data, digest)`` (set by the crypto
    layer) encrypts a compressed blob and returns the key id it used;
    ``open(tenant, digest, key_id, data)`` decrypts. Without them blobs are
    compressed only.
    """

    threshold: int = DEFAULT_THRESHOLD
    seal: Sealer | None = None
    open: Opener | None = None
    #: Called before references are resolved: the store forgets what it holds of
    #: payloads erased since it last looked (see ``EventStore.notice_erasures``).
    fresh: Callable[[], None] | None = None
    #: Blob and node keys known to be stored: their text is not compressed or sent again.
    _known: _Seen = field(default_factory=lambda: _Seen(200_000))
    _nodes: _LRU = field(default_factory=lambda: _LRU(200_000, 1 << 62))
    _texts: _LRU = field(default_factory=lambda: _LRU(50_000, 64 << 20))
    _compressors: dict[str, tuple[str | None, zstandard.ZstdCompressor]] = field(
        default_factory=dict
    )
    _decompressors: dict[tuple[str, str | None], zstandard.ZstdDecompressor] = field(
        default_factory=dict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: A zstd compressor is not safe across threads: one batch compresses at a time.
    _pack_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- writing --------------------------------------------------------------------

    def needs_tier(self, text: str | None) -> bool:
        if text is None:
            return False
        return self.seal is not None or len(text) > self.threshold

    def externalize(self, backend: TierBackend, tenant: str, text: str, rows: TierRows) -> str:
        """Put ``text``'s new pieces into ``rows``; returns its reference: the payload's
        sha256 (64 hex), then the head node's digest (32 hex) and the trailing literal
        unless the payload is a single blob (then the digest is the blob's)."""
        pending = rows.pending
        known = self._known
        if '"role"' not in text and not _has_long_string(text):
            # Nothing to cut at (split_payload's first test, without its lists): one
            # segment, the whole payload, and the reference is the blob's digest alone.
            data = text.encode()
            blob = hashlib.sha256(data).hexdigest()
            key = (tenant, blob)
            if key not in known._data and key not in pending and key not in rows.blobs:
                pending[key] = data
            return blob
        pieces, tail = split_payload(text)
        if self.seal is not None and (tail or any(lit for lit, _ in pieces)):
            # Encrypting: node rows and the reference are stored in clear and outlive an
            # erasure, so no text may stay in them. Each literal (the text between
            # messages: a streamed answer's assembled message, a short message) is a
            # blob of its own, encrypted like the segments.
            pieces = [("", part) for piece in pieces for part in piece if part]
            if tail:
                pieces.append(("", tail))
            tail = ""
        if len(pieces) == 1 and pieces[0][1] is text:
            data = text.encode()
            blob = hashlib.sha256(data).hexdigest()
            key = (tenant, blob)
            if key not in known and key not in pending and key not in rows.blobs:
                pending[key] = data
            return blob
        prefixes: list[str] = []
        blobs: list[str] = []
        at: str | None = None
        whole: str | None = None
        # The payload's own sha256, from the bytes of its pieces in order (they join to
        # it exactly, and UTF-8 of a join is the join of UTF-8s): the text is not encoded
        # a second time, which for a long non-ASCII payload cost as much as its hashing.
        full = hashlib.sha256()
        for literal, segment in pieces:
            data = segment.encode()
            if literal:
                full.update(literal.encode())
            full.update(data)
            blob = hashlib.sha256(data).hexdigest()
            if segment is text:
                whole = blob  # the payload is one segment: its digest is the payload's
            blobs.append(blob)
            key = (tenant, blob)
            if key not in known and key not in pending and key not in rows.blobs:
                pending[key] = data
            at = prefix_hash(at, literal, blob)
            prefixes.append(at)
        # The longest prefix some node already ends at: only the rest is new.
        start = 0
        for i in range(len(prefixes) - 1, -1, -1):
            key = (tenant, prefixes[i])
            if key in rows.nodes or key in known:
                start = i + 1
                break
        if start < len(pieces):
            body = orjson.dumps(
                [[lit, blobs[i]] for i, (lit, _) in enumerate(pieces) if i >= start]
            ).decode()
            head = prefixes[-1]
            rows.nodes[(tenant, head)] = NodeRow(
                tenant, head, prefixes[start - 1] if start else None, body
            )
        if whole is None:
            full.update(tail.encode())
            whole = full.hexdigest()
        return whole + prefixes[-1] + tail

    def committed(self, rows: TierRows) -> None:
        """``rows`` are stored: later batches need not compress or send them again."""
        self._known.update(rows.blobs)
        self._known.update(rows.nodes)
        for key, node in rows.nodes.items():
            # Only the node's own end is a node: a later payload extends from there.
            self._nodes.put(key, node)

    def forget_stored(self) -> None:
        """Forget which blobs and nodes are stored (after some were deleted)."""
        self._known.clear()
        self._nodes.clear()
        self._texts.clear()

    def pack_in_background(
        self,
        backend: TierBackend,
        rows: TierRows,
        prepare: Callable[[TierRows], Any] | None = None,
    ) -> Callable[[], None]:
        """Start compressing the batch's new blobs on another thread (zstd runs without
        the GIL, so the store writes the event rows meanwhile); the call returned waits
        for them to be in ``rows.blobs`` and raises what compressing raised. ``prepare``
        then turns them into the backend's rows on that thread too (while the writing
        thread is in the database, without the GIL), into ``rows.prepared``.

        A small batch, or one to encrypt (sealing may read or write data keys), is
        packed here and now."""
        if len(rows.pending) < _THREADED_BATCH or self.seal is not None:
            self._pack(backend, rows)
            if prepare is not None and rows.blobs:
                rows.prepared = prepare(rows)
            return _done
        # The compressors looked up here: their dictionary is read on this thread.
        compressors = {t: self._compressor(backend, t) for t in {t for t, _ in rows.pending}}
        failed: list[BaseException] = []

        def work() -> None:
            try:
                self._pack(backend, rows, compressors)
                if prepare is not None and rows.blobs:
                    rows.prepared = prepare(rows)
            except BaseException as exc:  # handed to the waiting thread
                failed.append(exc)

        worker = threading.Thread(target=work, name="replayable-pack", daemon=True)
        worker.start()

        def wait() -> None:
            worker.join()
            if failed:
                raise failed[0]

        return wait

    def _pack(
        self,
        backend: TierBackend,
        rows: TierRows,
        compressors: Mapping[str, tuple[str | None, zstandard.ZstdCompressor]] | None = None,
    ) -> None:
        """Compress (and seal) the batch's new blobs, each tenant's with one call into
        zstd (on its threads for a large batch), into ``rows.blobs``."""
        pending = rows.pending
        if not pending:
            return
        by_tenant: dict[str, tuple[list[str], list[bytes | bytearray | memoryview[int]]]] = {}
        for (tenant, digest), data in pending.items():
            group = by_tenant.get(tenant)
            if group is None:
                group = by_tenant[tenant] = ([], [])
            group[0].append(digest)
            group[1].append(data)
        seal = self.seal
        blobs = rows.blobs
        make = BlobRow._make
        for tenant, (digests, datas) in by_tenant.items():
            found = compressors.get(tenant) if compressors is not None else None
            dict_id, compressor = found or self._compressor(backend, tenant)
            with self._pack_lock:
                if len(datas) >= _THREADED_BATCH:
                    done = compressor.multi_compress_to_buffer(datas, threads=-1)
                    packed = [done[i].tobytes() for i in range(len(done))]
                else:
                    packed = list(map(compressor.compress, datas))
            if seal is None:
                codec = codec_name(dict_id, None)
                for digest, raw, out in zip(digests, datas, packed, strict=True):
                    blobs[(tenant, digest)] = make((tenant, digest, codec, out, len(raw)))
            else:
                for digest, raw, out in zip(digests, datas, packed, strict=True):
                    key_id, sealed = seal(tenant, out, digest)
                    blobs[(tenant, digest)] = BlobRow(
                        tenant, digest, codec_name(dict_id, key_id), sealed, len(raw)
                    )
        pending.clear()

    def _compressor(
        self, backend: TierBackend, tenant: str
    ) -> tuple[str | None, zstandard.ZstdCompressor]:
        found = self._compressors.get(tenant)
        if found is None:
            with self._lock:
                found = self._compressors.get(tenant)
                if found is None:
                    latest = backend.tier_dictionary(split_space(tenant)[0], None)
                    if latest is None:
                        found = (None, zstandard.ZstdCompressor(level=_LEVEL))
                    else:
                        d = zstandard.ZstdCompressionDict(latest[1])
                        found = (latest[0], zstandard.ZstdCompressor(level=_LEVEL, dict_data=d))
                    self._compressors[tenant] = found
        return found

    def forget_texts(self) -> None:
        """Drop the payload text held in memory (after an erasure)."""
        self._texts.clear()

    def forget_dictionaries(self) -> None:
        """Look the newest dictionary up again (after one was trained)."""
        with self._lock:
            self._compressors.clear()

    # -- reading --------------------------------------------------------------------

    def resolve(
        self, backend: TierBackend, tenant: str, refs: Iterable[str]
    ) -> dict[str, str | Unreadable]:
        """The text of each reference, or why it cannot be read."""
        wanted = set(refs)
        nodes: dict[str, NodeRow] = {}
        missing: set[str] = set()
        todo = {r[64:96] for r in wanted if len(r) > 64}
        while todo:
            fetch = []
            for d in todo:
                cached = self._nodes.get((tenant, d))
                if cached is not None:
                    nodes[d] = cached
                else:
                    fetch.append(d)
            for row in backend.tier_nodes(tenant, fetch) if fetch else ():
                if node_digest(row.parent, row.body) != row.digest:
                    continue  # an altered node is as good as a missing one
                nodes[row.digest] = row
                self._nodes.put((tenant, row.digest), row)
            missing.update(d for d in fetch if d not in nodes)
            todo = (
                {n.parent for d in todo if (n := nodes.get(d)) is not None and n.parent is not None}
                - nodes.keys()
                - missing
            )
        bodies = {d: orjson.loads(n.body) for d, n in nodes.items()}
        blobs = {piece[1] for body in bodies.values() for piece in body}
        blobs.update(r for r in wanted if len(r) == 64)
        texts, bad = self._texts_of(backend, tenant, blobs)
        out: dict[str, str | Unreadable] = {}
        for ref in wanted:
            out[ref] = self._join(ref, nodes, bodies, texts, bad)
        return out

    def _join(
        self,
        ref: str,
        nodes: Mapping[str, NodeRow],
        bodies: Mapping[str, list[list[str]]],
        texts: Mapping[str, str],
        bad: Mapping[str, Unreadable],
    ) -> str | Unreadable:
        if len(ref) == 64:  # the payload is one blob
            text = texts.get(ref)
            if text is None:
                return bad.get(ref) or Unreadable(f"blob {ref[:12]} is missing")
            return text
        parts: list[str] = [ref[96:]]
        at: str | None = ref[64:96]
        seen = 0
        while at is not None:
            node = nodes.get(at)
            if node is None:
                return Unreadable(f"payload node {at[:12]} is missing or altered")
            for literal, blob in reversed(bodies[at]):
                text = texts.get(blob)
                if text is None:
                    return bad.get(blob) or Unreadable(f"blob {blob[:12]} is missing")
                parts.append(text)
                parts.append(literal)
            at = node.parent
            seen += 1
            if seen > len(nodes):
                return Unreadable(f"payload node {ref[64:76]} has a cycle")
        parts.reverse()
        text = "".join(parts)
        if payload_digest(text) != ref[:64]:
            return Unreadable(f"payload {ref[:12]} does not match its hash")
        return text

    def _texts_of(
        self, backend: TierBackend, tenant: str, digests: set[str]
    ) -> tuple[dict[str, str], dict[str, Unreadable]]:
        texts: dict[str, str] = {}
        bad: dict[str, Unreadable] = {}
        fetch = []
        for d in digests:
            cached = self._texts.get((tenant, d))
            if cached is not None:
                texts[d] = cached
            else:
                fetch.append(d)
        for start in range(0, len(fetch), 500):
            for row in backend.tier_blobs(tenant, fetch[start : start + 500]):
                try:
                    text = self.unpack(backend, row)
                except Unreadable as exc:
                    bad[row.digest] = exc
                    continue
                texts[row.digest] = text
                self._texts.put((tenant, row.digest), text, len(text))
        return texts, bad

    def unpack(self, backend: TierBackend, row: BlobRow) -> str:
        """A blob's text, its digest checked; :class:`Unreadable` says what is wrong."""
        dict_id, key_id = parse_codec(row.codec)
        data = row.data
        if key_id is not None:
            if self.open is None:
                raise Unreadable(f"blob {row.digest[:12]} is encrypted and no data keys are set")
            data = self.open(row.tenant, row.digest, key_id, data)
        try:
            raw = self._decompressor(backend, row.tenant, dict_id).decompress(data)
        except zstandard.ZstdError as exc:
            raise Unreadable(f"blob {row.digest[:12]} cannot be decompressed ({exc})") from None
        if hashlib.sha256(raw).hexdigest() != row.digest:
            raise Unreadable(f"blob {row.digest[:12]} does not match its hash")
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise Unreadable(f"blob {row.digest[:12]} is not UTF-8 text") from None

    def _decompressor(
        self, backend: TierBackend, tenant: str, dict_id: str | None
    ) -> zstandard.ZstdDecompressor:
        key = (tenant, dict_id)
        found = self._decompressors.get(key)
        if found is None:
            if dict_id is None:
                found = zstandard.ZstdDecompressor()
            else:
                stored = backend.tier_dictionary(split_space(tenant)[0], dict_id)
                if stored is None:
                    raise Unreadable(f"compression dictionary {dict_id} is missing")
                found = zstandard.ZstdDecompressor(
                    dict_data=zstandard.ZstdCompressionDict(stored[1])
                )
            self._decompressors[key] = found
        return found

    # -- events ---------------------------------------------------------------------

    def split_events(
        self,
        backend: TierBackend,
        events: Sequence[Event],
        tenant_of: Callable[[str], str],
        rows: TierRows,
        *,
        pack: bool = True,
    ) -> list[tuple[Event, str | None, str | None]]:
        """Each event with its large payloads replaced by placeholders, and their refs.

        The new blobs are compressed into ``rows.blobs`` unless ``pack`` is false (then
        they wait in ``rows.pending`` for :meth:`pack_in_background`)."""
        out: list[tuple[Event, str | None, str | None]] = []
        append = out.append
        # Encrypting, every payload goes to the tier: none may stay in clear in its row,
        # and neither may the error of an event whose hash covers its error's digest.
        sealing = self.seal is not None
        threshold = -1 if sealing else self.threshold
        externalize, replace = self.externalize, msgspec.structs.replace
        # The common payload, one blob with nothing to cut at (externalize's first
        # branch), is stored here without the calls: most batches are mostly these.
        sha256, known, pending, blobs = hashlib.sha256, self._known._data, rows.pending, rows.blobs
        run_id: str | None = None
        tenant = ""
        for e in events:
            request, response = e.request, e.response
            big_req = len(request) > threshold
            big_resp = response is not None and len(response) > threshold
            if not (big_req or big_resp):
                append((e, None, None))
                continue
            if e.run_id != run_id:  # a batch holds few runs, each in a row
                run_id = e.run_id
                tenant = tenant_of(run_id)
            req_ref = resp_ref = None
            if big_req:
                if '"role"' not in request and not _has_long_string(request):
                    data = request.encode()
                    req_ref = sha256(data).hexdigest()
                    key = (tenant, req_ref)
                    if key not in known and key not in pending and key not in blobs:
                        pending[key] = data
                else:
                    req_ref = externalize(backend, tenant, request, rows)
            if big_resp:
                resp_ref = externalize(backend, tenant, response, rows)  # type: ignore[arg-type]
            error = e.error
            if sealing and error is not None and e.schema_version >= SEALED_EVENT_VERSION:
                stored = replace(
                    e,
                    request="null" if big_req else request,
                    response=None if big_resp else response,
                    error=self.seal_text(backend, tenant, error, rows),
                )
            elif not big_resp:
                stored = replace(e, request="null")
            elif not big_req:
                stored = replace(e, response=None)
            else:
                stored = replace(e, request="null", response=None)
            append((stored, req_ref, resp_ref))
        if pack:
            self._pack(backend, rows)
        return out

    def seal_text(self, backend: TierBackend, tenant: str, text: str, rows: TierRows) -> str:
        """What a text column holds for ``text`` kept in the tier (see :data:`REF_PREFIX`)."""
        if text.startswith(REF_PREFIX):
            return text  # kept there already (a record read back undecoded, appended again)
        return REF_PREFIX + self.externalize(backend, tenant, text, rows)

    def seal_runs(
        self,
        backend: TierBackend,
        starts: Sequence[RunStart],
        ends: Sequence[RunEnd],
        tenant_of: Callable[[str], str],
        rows: TierRows,
    ) -> tuple[Sequence[RunStart], Sequence[RunEnd]]:
        """The run records with their input, output and error in the tier (their new
        blobs left in ``rows.pending`` for the caller to pack), when payloads are
        encrypted and the record's seal covers those values' digests; otherwise as given.
        """
        if self.seal is None:
            return starts, ends
        new_starts = [
            msgspec.structs.replace(
                s, input=self.seal_text(backend, tenant_of(s.run_id), s.input, rows)
            )
            if s.schema_version >= SEALED_SCHEMA_VERSION
            else s
            for s in starts
        ]
        new_ends = []
        for end in ends:
            if end.schema_version >= SEALED_SCHEMA_VERSION and (
                end.output is not None or end.error is not None
            ):
                tenant = tenant_of(end.run_id)
                end = msgspec.structs.replace(
                    end,
                    output=None
                    if end.output is None
                    else self.seal_text(backend, tenant, end.output, rows),
                    error=None
                    if end.error is None
                    else self.seal_text(backend, tenant, end.error, rows),
                )
            new_ends.append(end)
        return new_starts, new_ends

    def join_runs(
        self, backend: TierBackend, runs: Sequence[Run], tenant_of: Callable[[str], str]
    ) -> list[Run]:
        """Runs with the input, output and error the tier keeps put back, or named in
        ``problems`` ("erased on DATE by WHO" for an erased one: its sha256 then stands
        in for it in the seal)."""
        wanted: dict[str, set[str]] = {}
        for run in runs:
            refs = [tier_ref(run.start.input)]
            if run.end is not None:
                refs += [tier_ref(run.end.output), tier_ref(run.end.error)]
            held = [r for r in refs if r is not None]
            if held:
                wanted.setdefault(tenant_of(run.run_id), set()).update(held)
        if not wanted:
            return list(runs)
        if self.fresh is not None:
            self.fresh()
        texts = {t: self.resolve(backend, t, refs) for t, refs in wanted.items()}
        out = []
        for run in runs:
            ref = tier_ref(run.start.input)
            end_refs = (
                (tier_ref(run.end.output), tier_ref(run.end.error))
                if run.end is not None
                else (None, None)
            )
            if ref is None and end_refs == (None, None):
                out.append(run)
                continue
            found = texts[tenant_of(run.run_id)]
            problems = list(run.problems)
            erased: str | None = None
            start, end = run.start, run.end
            if ref is not None:
                value, digest, notice = _placed("input", found[ref], ref, problems)
                start = msgspec.structs.replace(start, input=value, input_digest=digest)
                erased = erased or notice
            if end is not None:
                changes: dict[str, Any] = {}
                for column, end_ref in zip(("output", "error"), end_refs, strict=True):
                    if end_ref is None:
                        continue
                    value, digest, notice = _placed(column, found[end_ref], end_ref, problems)
                    changes[column] = value
                    changes[f"{column}_digest"] = digest
                    erased = erased or notice
                end = msgspec.structs.replace(end, **changes)
            out.append(
                msgspec.structs.replace(
                    run, start=start, end=end, problems=tuple(problems), erased=erased
                )
            )
        return out

    def any_tiered(self, events: Sequence[Event]) -> bool:
        """Whether some event of ``events`` has a payload for the tier (one length check
        per payload: a batch with none costs the append nothing more)."""
        if self.seal is not None:
            return bool(events)
        threshold = self.threshold
        for e in events:
            if len(e.request) > threshold:
                return True
            r = e.response
            if r is not None and len(r) > threshold:
                return True
        return False

    def join_events(
        self,
        backend: TierBackend,
        rows: Sequence[tuple[Event, str | None, str | None]],
        tenant_of: Callable[[str], str],
    ) -> list[Event]:
        """Events with their referenced payloads put back (or named in ``problems``)."""
        by_tenant: dict[str, set[str]] = {}
        for e, req, resp in rows:
            err = tier_ref(e.error)
            if req is None and resp is None and err is None:
                continue
            heads = by_tenant.setdefault(tenant_of(e.run_id), set())
            if req is not None:
                heads.add(req)
            if resp is not None:
                heads.add(resp)
            if err is not None:
                heads.add(err)
        if not by_tenant:
            return [e for e, _, _ in rows]
        if self.fresh is not None:
            self.fresh()
        texts = {t: self.resolve(backend, t, heads) for t, heads in by_tenant.items()}
        out = []
        for e, req, resp in rows:
            err = tier_ref(e.error)
            if req is None and resp is None and err is None:
                out.append(e)
                continue
            found = texts[tenant_of(e.run_id)]
            changes: dict[str, Any] = {}
            problems = list(e.problems)
            for column, ref in (("request", req), ("response", resp), ("error", err)):
                if ref is None:
                    continue
                text = found[ref]
                if isinstance(text, Erased):
                    # By design, not damage: the notice takes the payload's place, and
                    # its sha256 takes the payload's place in the hash.
                    notice = str(text)
                    problems.append(f"{column}: {notice}")
                    changes[column] = _erased_value(column, notice)
                    changes[f"{column}_digest"] = ref[:64]
                    changes["erased"] = notice
                elif isinstance(text, Unreadable):
                    problems.append(f"{column}: {text}")
                    changes[column] = None if column == "error" else "null"
                else:
                    changes[column] = text
            if problems:
                changes["problems"] = tuple(problems)
            out.append(msgspec.structs.replace(e, **changes))
        return out

    def needs_join(self, rows: Sequence[tuple[Event, str | None, str | None]]) -> bool:
        """Whether some row refers to the tier (a payload's reference, or an error kept there)."""
        return any(
            rq is not None or rs is not None or (e.error is not None and e.error[:6] == REF_PREFIX)
            for e, rq, rs in rows
        )


def _erased_value(column: str, notice: str) -> str:
    """What an erased value's place holds: the notice, as JSON text of the column's shape
    (an error record is an object; the rest a string)."""
    if column == "error":
        return orjson.dumps({"erased": notice, "message": notice}).decode()
    return orjson.dumps(notice).decode()


def _placed(
    column: str, text: str | Unreadable, ref: str, problems: list[str]
) -> tuple[Any, str | None, str | None]:
    """A run record's value from the tier: (value, digest standing in for it, notice)."""
    if isinstance(text, Erased):
        notice = str(text)
        problems.append(f"{column}: {notice}")
        return _erased_value(column, notice), ref[:64], notice
    if isinstance(text, Unreadable):
        problems.append(f"{column}: {text}")
        return ('{"args":[],"kwargs":{}}' if column == "input" else None), None, None
    return text, None, None


# -- dictionaries --------------------------------------------------------------------


class DictionaryReport(NamedTuple):
    """A trained dictionary and what it does on the blobs it was trained on."""

    tenant: str
    dict_id: str
    samples: int
    sample_bytes: int
    plain_bytes: int
    dict_bytes: int

    @property
    def plain_ratio(self) -> float:
        return self.sample_bytes / max(self.plain_bytes, 1)

    @property
    def dict_ratio(self) -> float:
        return self.sample_bytes / max(self.dict_bytes, 1)


def train_dictionary(
    store: Any, tenant: str, *, size: int = 16_384, samples: int = 2_000, at: float
) -> DictionaryReport:
    """Train a zstd dictionary on up to ``samples`` of ``tenant``'s blobs and store it;
    writes from then on compress with it. Raises ``ValueError`` with too few blobs."""
    texts = [store.tier.unpack(store, row).encode() for row in store.tier_sample(tenant, samples)]
    if len(texts) < 8:
        raise ValueError(
            f"tenant {tenant or '(none)'!r} has {len(texts)} payload blob(s); a dictionary "
            "needs at least 8 to train on (record more runs first)"
        )
    try:
        trained = zstandard.train_dictionary(size, texts)
    except zstandard.ZstdError as exc:
        raise ValueError(f"training a dictionary on {len(texts)} blobs failed: {exc}") from None
    data = trained.as_bytes()
    dict_id = hashlib.sha256(data).hexdigest()[:16]
    plain = zstandard.ZstdCompressor(level=_LEVEL)
    with_dict = zstandard.ZstdCompressor(level=_LEVEL, dict_data=trained)
    report = DictionaryReport(
        tenant,
        dict_id,
        len(texts),
        sum(map(len, texts)),
        sum(len(plain.compress(t)) for t in texts),
        sum(len(with_dict.compress(t)) for t in texts),
    )
    store.tier_put_dictionary(tenant, dict_id, data, at)
    return report


def reachable(
    backend: TierBackend, key_space: str, refs: Iterable[str]
) -> tuple[list[NodeRow], list[BlobRow]]:
    """The stored node and blob rows that the references ``refs`` need, as stored
    (blobs still compressed and encrypted): what the archive copies."""
    nodes: dict[str, NodeRow] = {}
    refs = set(refs)
    todo = {r[64:96] for r in refs if len(r) > 64}
    while todo:
        found = backend.tier_nodes(key_space, sorted(todo))
        for row in found:
            nodes[row.digest] = row
        todo = {n.parent for n in found if n.parent is not None} - nodes.keys()
    wanted: set[str] = {r for r in refs if len(r) == 64}
    for node in nodes.values():
        try:
            wanted.update(piece[1] for piece in orjson.loads(node.body))
        except (orjson.JSONDecodeError, TypeError, IndexError):
            continue  # an altered node: the reader names it
    blobs: list[BlobRow] = []
    ordered = sorted(wanted)
    for start in range(0, len(ordered), 500):
        blobs.extend(backend.tier_blobs(key_space, ordered[start : start + 500]))
    return list(nodes.values()), blobs
