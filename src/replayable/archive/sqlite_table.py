"""An SQLite store's event rows straight into an Arrow table, for the archive.

The general path (``SQLiteStore.stored_columns``, then ``pa.array`` per column) turns
the rows into Python lists of text first: the rows transposed into columns, each hash
blob made a hex ``str`` one at a time, the call sites looked up value by value, and
every list converted again. Here pyarrow converts the rows in C as a struct array (the
same converters ``pa.array`` uses on a column, so every value lands as it would
there), the hashes become hex in one ``binascii.hexlify`` of their joined bytes, and
the call sites are looked up as arrays. Whatever this path does not know for certain
it would give exactly as the general one does (a hash stored as text, a side-effect
flag other than 0 or 1) is done for that column as the general path does it, and a
value a converter refuses here sends the batch back to the general path, whose
outcome (an error, if that is what it gives) then stands.
"""

from __future__ import annotations

import binascii
from array import array
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, Final

from replayable.store.cold import EVENT_FIELDS
from replayable.store.sqlite import SQLiteStore

__all__ = ["ROWS", "event_table", "read_rows"]

#: The columns read, as stored: those of the archive's events file, in its order, then
#: the call site's id (the text of ``call_site`` when that column is NULL).
ROWS: Final = (*EVENT_FIELDS, "site")
_AT: Final = {name: i for i, name in enumerate(ROWS)}
_HASHES: Final = tuple(_AT[name] for name in ("fingerprint", "prev_hash", "hash"))
_SIDE_EFFECT: Final = _AT["side_effect"]
_CALL_SITE: Final = _AT["call_site"]
_SITE: Final = _AT["site"]
#: A hash as stored by this version: 32 bytes, 64 hex digits as text.
_HASH_BYTES: Final = 32


def read_rows(store: SQLiteStore, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    """The runs' event rows as stored (:data:`ROWS`), ordered by run and seq."""
    out: list[tuple[Any, ...]] = []
    ids = sorted(run_ids)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        out += store._query(
            f"SELECT {', '.join(ROWS)} FROM events "
            f"WHERE run_id IN ({','.join('?' * len(chunk))}) ORDER BY run_id, seq",
            chunk,
        )
    return out


def event_table(store: SQLiteStore, rows: list[tuple[Any, ...]], schema: Any) -> Any | None:
    """The events-file table (``schema``) of ``rows`` (:func:`read_rows`'s), holding what
    ``SQLiteStore.stored_columns`` gives converted column by column; ``None`` when a
    value is one this path leaves to that general one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(rows)
    types = [schema.field(name).type for name in EVENT_FIELDS]
    # Hashes as bytes (replaced below), the flag as a number (compared below), the id
    # of the call site as the integer it is.
    types[_SIDE_EFFECT] = pa.float64()
    for at in _HASHES:
        types[at] = pa.binary()
    struct = pa.struct(list(zip(ROWS, [*types, pa.int64()], strict=True)))
    try:
        columns = pa.array(rows, type=struct).flatten()
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    for at in _HASHES:
        columns[at] = _hex_column(pa, _column(rows, at))
    flags = columns[_SIDE_EFFECT]
    ones = pc.equal(flags, 1.0)
    if flags.null_count or pc.sum(pc.or_(ones, pc.equal(flags, 0.0))).as_py() != n:
        raw = _column(rows, _SIDE_EFFECT)
        ones = pa.array([True if v == 1 else False if v == 0 else None for v in raw], pa.bool_())
    columns[_SIDE_EFFECT] = ones
    sites = columns.pop(_SITE)
    if sites.null_count != n:
        wanted = pc.unique(sites.drop_null())
        texts = store._site_texts(set(wanted.to_pylist()))
        found = pc.take(
            pa.array(list(texts.values()), pa.string()),
            pc.index_in(sites, value_set=pa.array(list(texts), pa.int64())),
        )
        columns[_CALL_SITE] = pc.coalesce(columns[_CALL_SITE], found)
    return pa.Table.from_arrays(columns, schema=schema)


def _column(rows: list[tuple[Any, ...]], at: int) -> list[Any]:
    return list(map(itemgetter(at), rows))


def _hex_column(pa: Any, values: list[Any]) -> Any:
    """A hash column as text: 32-byte blobs as their 64 lowercase hex digits in one
    ``hexlify`` of them joined, any other value as the general path gives it."""
    n = len(values)
    if set(map(type, values)) == {bytes} and set(map(len, values)) == {_HASH_BYTES}:
        step = 2 * _HASH_BYTES
        offsets = array("i", range(0, step * n + 1, step))
        digits = binascii.hexlify(b"".join(values))
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(digits))
    return pa.array([v.hex() if type(v) is bytes else v for v in values], pa.string())
