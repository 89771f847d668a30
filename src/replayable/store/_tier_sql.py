"""The blob tier's and the data keys' reads, as the SQLite and PostgreSQL stores share them.

The two tables are the same in both databases; only the placeholder differs
(``?`` against ``%s``) and SQLite's untyped ``data`` column, which is read as a
BLOB. A store mixes :class:`TierReads` in before :class:`EventStore` and
provides :meth:`TierReads._tier_rows`.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, ClassVar

from replayable.store.crypto import KeyRow, key_rows_for
from replayable.store.payloads import BlobRow, TierRows, TierStats, space, split_space

__all__ = ["TierReads", "blob_rows"]

_KEYS = "SELECT tenant, subject, key_id, kek_id, wrapped, created_at FROM data_keys"


_BY_DIGEST = operator.itemgetter(2)
_BY_KEY = operator.itemgetter(0, 1, 2)


def blob_rows(rows: TierRows) -> list[tuple[str, str, str, str, bytes, int]]:
    """A batch's new blobs as (tenant, subject, digest, codec, data, size) rows, in key
    order: each statement walks the key index once, forward."""
    blobs = rows.blobs.values()
    spaces = {t: split_space(t) for t in {b.tenant for b in blobs}}
    out = [(*spaces[b.tenant], b.digest, b.codec, b.data, b.size) for b in blobs]
    out.sort(key=_BY_DIGEST if len(spaces) == 1 else _BY_KEY)
    return out


class TierReads:
    """``tier_sample``, ``tier_stats``, ``tier_tenants``, ``key_rows``, ``all_key_rows``."""

    #: The SQL for a blob's bytes (SQLite casts its untyped column).
    _BLOB_DATA: ClassVar[str] = "data"

    def _tier_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of ``sql``, written with ``?`` placeholders."""
        raise NotImplementedError

    def tier_sample(self, tenant: str, limit: int) -> list[BlobRow]:
        rows = self._tier_rows(
            f"SELECT tenant, subject, digest, codec, {self._BLOB_DATA}, size FROM payload_blobs "
            "WHERE tenant = ? ORDER BY digest LIMIT ?",
            (tenant, limit),
        )
        return [BlobRow(space(r[0], r[1]), r[2], r[3], bytes(r[4]), r[5]) for r in rows]

    def tier_stats(self) -> TierStats:
        b = self._tier_rows(
            "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(length(data)), 0) "
            "FROM payload_blobs"
        )[0]
        n = self._tier_rows(
            "SELECT count(*), coalesce(sum(length(digest) + coalesce(length(parent), 0) "
            "+ length(body)), 0) FROM payload_nodes"
        )[0]
        return TierStats(int(b[0]), int(b[1]), int(b[2]), int(n[0]), int(n[1]))

    def tier_tenants(self) -> list[str]:
        return [str(r[0]) for r in self._tier_rows("SELECT DISTINCT tenant FROM payload_blobs")]

    def key_rows(self, tenant: str, subject: str | None) -> list[KeyRow]:
        if subject is None:
            return key_rows_for(self._tier_rows(f"{_KEYS} WHERE tenant = ?", (tenant,)))
        return key_rows_for(
            self._tier_rows(f"{_KEYS} WHERE tenant = ? AND subject = ?", (tenant, subject))
        )

    def all_key_rows(self) -> list[KeyRow]:
        return key_rows_for(self._tier_rows(_KEYS))
