"""Redaction inside payloads that are not plain JSON text: bytes, compressed bodies, streams.

* A ``bytes`` value is stored base64-encoded, where no pattern can see it: it is
  decoded, a gzip, zlib or zstd body decompressed, the text redacted, and the
  body compressed again the same way, so what replay serves still decodes.
* A recorded stream (``{"data": …, "chunks": [[size, µs], …], …}``) is redacted
  as the events it carries: each server-sent event's (or JSON line's) strings
  are grouped by where they stand (``choices[0].delta.content``, one content
  block's ``delta.text`` …) and each group is redacted as the text it
  assembles into, so a key split across chunks is caught. The pieces of a
  group keep their places (the one where a secret starts holds the mark, the
  others lose their part of it), the events are written back, and the chunk
  sizes are moved to the same event boundaries: the stored chunks still add up
  to the stored data, and assemble into the redacted text.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import gzip
import zlib
from collections.abc import Callable
from typing import Any, Final

import orjson

__all__ = ["redact_blob", "redact_stream", "redact_tagged_bytes", "rescale", "splice"]

#: Past this size a decompressed body is not examined (a decompression bomb).
_MAX_INFLATED: Final = 64 * 1024 * 1024
_GZIP: Final = b"\x1f\x8b"
_ZSTD: Final = b"\x28\xb5\x2f\xfd"

Spans = Callable[[str], list[tuple[int, int]]]
_SSE_FIELDS: Final = (b"data:", b"event:", b"id:", b"retry:", b":")
_MARK: Final = "[REDACTED]"


def splice(text: str, spans: list[tuple[int, int]], mark: str) -> str:
    """``text`` with each of the sorted, disjoint ``spans`` replaced by ``mark``."""
    out: list[str] = []
    pos = 0
    for start, end in spans:
        out.append(text[pos:start])
        out.append(mark)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _inflate(raw: bytes) -> tuple[bytes, Callable[[bytes], bytes]] | None:
    """The decompressed body and how to compress it again, or ``None`` if not compressed."""
    try:
        if raw.startswith(_GZIP):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            return d.decompress(raw, _MAX_INFLATED), lambda b: gzip.compress(b, mtime=0)
        if len(raw) > 2 and raw[0] == 0x78 and (raw[0] << 8 | raw[1]) % 31 == 0:
            d = zlib.decompressobj()
            return d.decompress(raw, _MAX_INFLATED), zlib.compress
        if raw.startswith(_ZSTD):
            try:
                import zstandard
            except ImportError:  # not installed: the body is looked at as it is
                return None
            inflated = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
            return inflated[:_MAX_INFLATED], zstandard.ZstdCompressor().compress
    except (zlib.error, ValueError, MemoryError):
        return None
    except Exception:  # zstandard.ZstdError and the like: not a body we can read
        return None
    return None


#: Every byte that is not ASCII, as a character that is neither a word nor a space
#: character: in bytes of unknown encoding a key right after such a byte starts a word.
_OPAQUE: Final = bytes(range(128)) + b"\x00" * 128


def redact_blob(raw: bytes, redact_document: Callable[[str], str], spans: Spans) -> bytes:
    """``raw`` with the secrets in it (decompressed first) redacted; itself when none.

    UTF-8 text is redacted as a document (``redact_document``: JSON lines are read as
    JSON); other bytes as Latin-1, one character a byte, so that everything around a
    secret stays as it was, with the bytes beyond ASCII read as separators.
    """
    inflated = _inflate(raw)
    if inflated is not None:
        inner, deflate = inflated
        redacted = redact_blob(inner, redact_document, spans)
        return raw if redacted is inner else deflate(redacted)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        found = spans(raw.translate(_OPAQUE).decode("ascii"))
        if not found:
            return raw
        return splice(raw.decode("latin-1"), found, _MARK).encode("latin-1")
    out = redact_document(text)
    return raw if out == text else out.encode()


def redact_tagged_bytes(
    node: dict[str, Any], redact_document: Callable[[str], str], spans: Spans
) -> dict[str, Any] | None:
    """A tagged ``bytes`` node with its body redacted, or ``None`` when it holds no secret."""
    encoded = node.get("v")
    if not isinstance(encoded, str):
        return None
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    out = redact_blob(raw, redact_document, spans)
    if out is raw:
        return None
    return {**node, "v": base64.b64encode(out).decode()}


def rescale(sizes: list[int], old_total: int, new_total: int) -> list[int]:
    """Chunk sizes for a body that went from ``old_total`` to ``new_total`` bytes: each
    boundary moved in proportion, so that they add up to the new length."""
    out: list[int] = []
    done = mapped = 0
    for size in sizes:
        done += size
        end = new_total if done >= old_total else done * new_total // max(old_total, 1)
        out.append(end - mapped)
        mapped = end
    if out:
        out[-1] += new_total - mapped
    return out


# -- streams ----------------------------------------------------------------------


def _leaves(value: Any, path: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any, Any]]) -> None:
    """``(group, container, key)`` of each string in ``value``: a dict's ``index`` (a choice,
    a tool call, a content block) stands in the group in place of its list position."""
    if isinstance(value, dict):
        index = value.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            path = (*path, ("index", index))
        for k, v in value.items():
            if isinstance(v, str):
                out.append(((*path, k), value, k))
            elif isinstance(v, dict | list):
                _leaves(v, (*path, k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, str):
                out.append(((*path, i), value, i))
            elif isinstance(v, dict):
                index = v.get("index")
                _leaves(v, path if isinstance(index, int) else (*path, i), out)
            elif isinstance(v, list):
                _leaves(v, (*path, i), out)


def _redact_groups(records: list[Any], spans: Spans, mark: str) -> bool:
    """Redact the strings of ``records`` group by group, in place; whether any changed."""
    groups: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {}
    for record in records:
        leaves: list[tuple[tuple[Any, ...], Any, Any]] = []
        _leaves(record, (), leaves)
        for group, container, key in leaves:
            groups.setdefault(group, []).append((container, key))
    changed = False
    for pieces in groups.values():
        texts: list[str] = [c[k] for c, k in pieces]
        joined = "".join(texts)
        # The group's text, where a secret split across pieces is whole, and each piece
        # on its own (JSON lines that only share a key are not one text).
        found = spans(joined)
        if len(texts) > 1:
            offset = 0
            for text in texts:
                found.extend((s + offset, e + offset) for s, e in spans(text))
                offset += len(text)
            found = _merged(found)
        if not found:
            continue
        changed = True
        offset = 0
        for (container, key), text in zip(pieces, texts, strict=True):
            end = offset + len(text)
            local: list[tuple[int, int, bool]] = []  # (start, end, holds the mark)
            for s, e in found:
                if (s < end and e > offset) or (s == e == offset and text == ""):
                    local.append((max(s, offset) - offset, min(e, end) - offset, s >= offset))
            if local:
                out: list[str] = []
                pos = 0
                for s, e, marked in local:
                    out.append(text[pos:s])
                    if marked:
                        out.append(mark)
                    pos = e
                out.append(text[pos:])
                container[key] = "".join(out)
            offset = end
    return changed


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint spans covering ``spans``."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _records(lines: list[bytes]) -> list[tuple[int, bytes, Any]]:
    """``(line, prefix, value)`` of each line holding JSON: ``data: {…}`` or a JSON line."""
    found = []
    for i, line in enumerate(lines):
        body = line.rstrip(b"\r")
        prefix = b""
        if body.startswith(b"data:"):
            rest = body[5:]
            stripped = rest.lstrip(b" ")
            prefix = body[: 5 + len(rest) - len(stripped)]
            body = stripped
        if not body.startswith((b"{", b"[")):
            continue
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            continue
        found.append((i, prefix, value))
    return found


def redact_stream(
    data: str,
    sizes: list[int],
    spans: Spans,
    redact_text: Callable[[str], str],
    redact_keys: Callable[[Any], Any],
    mark: str,
) -> tuple[str, list[int]] | None:
    """A stream's data and chunk sizes with its secrets redacted, or ``None`` if it had none.

    ``spans`` finds secrets in a text, ``redact_text`` redacts a line that holds no
    JSON, ``redact_keys`` redacts the values under secret names of one event.
    """
    raw = data.encode("utf-8", "surrogatepass")
    lines = raw.split(b"\n")
    records = _records(lines)
    in_records = {i for i, _, _ in records}
    # Events or JSON lines, with at most the fields of server-sent events between them;
    # anything else is a text whose secrets may span lines (a private key), read whole.
    structured = all(
        i in in_records or not line.strip() or line.startswith(_SSE_FIELDS)
        for i, line in enumerate(lines)
    )
    if not records or not structured:
        out = redact_text(data)
        if out == data:
            return None
        new = out.encode("utf-8", "surrogatepass")
        return out, rescale(sizes, len(raw), len(new))
    values = [v for _, _, v in records]
    before = [orjson.dumps(v) for v in values]
    _redact_groups(values, spans, mark)
    values = [redact_keys(v) for v in values]
    new_lines = list(lines)
    changed = False
    for (i, prefix, _), value, old in zip(records, values, before, strict=True):
        dumped = orjson.dumps(value)
        if dumped != old:
            changed = True
            ending = b"\r" if lines[i].endswith(b"\r") else b""
            new_lines[i] = prefix + dumped + ending
    for i, line in enumerate(lines):
        if i not in in_records and line:
            text = line.decode("utf-8", "surrogatepass")
            out = redact_text(text)
            if out != text:
                changed = True
                new_lines[i] = out.encode("utf-8", "surrogatepass")
    if not changed:
        return None
    new_raw = b"\n".join(new_lines)
    return new_raw.decode("utf-8", "surrogatepass"), _moved(sizes, lines, new_lines)


def _moved(sizes: list[int], old: list[bytes], new: list[bytes]) -> list[int]:
    """Chunk sizes over the new lines: a boundary inside an unchanged line keeps its place
    in it, one inside a rewritten line moves to that line's end."""
    old_starts, new_starts = [0], [0]
    for a, b in zip(old, new, strict=True):
        old_starts.append(old_starts[-1] + len(a) + 1)
        new_starts.append(new_starts[-1] + len(b) + 1)
    old_total, new_total = old_starts[-1] - 1, new_starts[-1] - 1

    def place(offset: int) -> int:
        if offset >= old_total:
            return new_total
        i = bisect.bisect_right(old_starts, offset) - 1
        into = offset - old_starts[i]
        if old[i] == new[i] or into == 0:
            return new_starts[i] + into
        return new_starts[i] + len(new[i])

    out: list[int] = []
    done = mapped = 0
    for size in sizes:
        done += size
        end = place(done)
        out.append(end - mapped)
        mapped = end
    if out:
        out[-1] += new_total - mapped
    return out
