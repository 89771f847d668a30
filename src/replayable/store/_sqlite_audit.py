"""The SQLite store's audit tables: annotations, access log, anomaly flags, scan marks.

They are created beside the log tables (``CREATE … IF NOT EXISTS``, so an
existing database gains them on open) and refuse UPDATE and DELETE by
trigger, like the log.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from replayable.errors import AppendOnlyError, StoreError
from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag, WorkflowStats
from replayable.events.model import Event, Run
from replayable.store.audit_base import (
    STATS_WINDOW,
    RunSummary,
    scan_event_from_row,
    summaries_from_rows,
    summary_sql,
)
from replayable.store.rows import run_from_row

__all__ = ["AUDIT_SCHEMA", "AUDIT_TABLES", "SQLiteAudit"]

AUDIT_TABLES = ("annotations", "access_log", "anomaly_flags", "anomaly_scanned")

AUDIT_SCHEMA = """
CREATE TABLE IF NOT EXISTS annotations (
    annotation_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER, author TEXT NOT NULL,
    role TEXT NOT NULL, login TEXT NOT NULL, created_at REAL NOT NULL, verdict TEXT,
    policy TEXT, note TEXT NOT NULL, amends TEXT, retract INTEGER NOT NULL,
    closes TEXT NOT NULL, tenant TEXT, chain_index INTEGER NOT NULL, prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL, schema_version INTEGER NOT NULL, key_id TEXT,
    UNIQUE (run_id, chain_index)
);
CREATE TABLE IF NOT EXISTS access_log (
    entry_id TEXT PRIMARY KEY, at REAL NOT NULL, login TEXT NOT NULL, app_user TEXT NOT NULL,
    role TEXT NOT NULL, channel TEXT NOT NULL, purpose TEXT, run_id TEXT, steps TEXT NOT NULL,
    what TEXT NOT NULL, tenant TEXT, schema_version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS access_log_at ON access_log (at);
CREATE INDEX IF NOT EXISTS access_log_run ON access_log (run_id, at);
CREATE TABLE IF NOT EXISTS anomaly_flags (
    flag_id TEXT PRIMARY KEY, rule TEXT NOT NULL, run_id TEXT NOT NULL, workflow TEXT NOT NULL,
    steps TEXT NOT NULL, evidence TEXT NOT NULL, score REAL NOT NULL, created_at REAL NOT NULL,
    tenant TEXT, schema_version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS anomaly_flags_run ON anomaly_flags (run_id);
CREATE INDEX IF NOT EXISTS anomaly_flags_rule ON anomaly_flags (rule, created_at);
CREATE TABLE IF NOT EXISTS anomaly_scanned (
    run_id TEXT PRIMARY KEY, scanned_at REAL NOT NULL
) WITHOUT ROWID;
"""

_ANN_COLS = (
    "annotation_id, run_id, seq, author, role, login, created_at, verdict, policy, note, "
    "amends, retract, closes, tenant, chain_index, prev_hash, hash, schema_version, key_id"
)
_ACCESS_COLS = (
    "entry_id, at, login, app_user, role, channel, purpose, run_id, steps, what, tenant, "
    "schema_version"
)
_FLAG_COLS = (
    "flag_id, rule, run_id, workflow, steps, evidence, score, created_at, tenant, schema_version"
)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def annotation_row(a: Annotation) -> tuple[Any, ...]:
    """An annotation's columns in :data:`_ANN_COLS` order (shared with PostgreSQL)."""
    return (
        a.annotation_id,
        a.run_id,
        a.seq,
        a.author,
        a.role,
        a.login,
        a.created_at,
        a.verdict,
        a.policy,
        a.note,
        a.amends,
        int(a.retract),
        _json(list(a.closes)),
        a.tenant,
        a.chain_index,
        a.prev_hash,
        a.hash,
        a.schema_version,
        a.key_id,
    )


def annotation_from_row(r: Sequence[Any]) -> Annotation:
    return Annotation(
        annotation_id=r[0],
        run_id=r[1],
        seq=r[2],
        author=r[3],
        role=r[4],
        login=r[5],
        created_at=r[6],
        verdict=r[7],
        policy=r[8],
        note=r[9],
        amends=r[10],
        retract=bool(r[11]),
        closes=tuple(orjson.loads(r[12])),
        tenant=r[13],
        chain_index=r[14],
        prev_hash=r[15],
        hash=r[16],
        schema_version=r[17],
        key_id=r[18],
    )


def access_row(e: AccessEntry) -> tuple[Any, ...]:
    return (
        e.entry_id,
        e.at,
        e.login,
        e.user,
        e.role,
        e.channel,
        e.purpose,
        e.run_id,
        _json(list(e.steps)),
        _json(list(e.what)),
        e.tenant,
        e.schema_version,
    )


def access_from_row(r: Sequence[Any]) -> AccessEntry:
    return AccessEntry(
        entry_id=r[0],
        at=r[1],
        login=r[2],
        user=r[3],
        role=r[4],
        channel=r[5],
        purpose=r[6],
        run_id=r[7],
        steps=tuple(orjson.loads(r[8])),
        what=tuple(orjson.loads(r[9])),
        tenant=r[10],
        schema_version=r[11],
    )


def flag_row(f: AnomalyFlag) -> tuple[Any, ...]:
    return (
        f.flag_id,
        f.rule,
        f.run_id,
        f.workflow,
        _json(list(f.steps)),
        _json(f.evidence),
        f.score,
        f.created_at,
        f.tenant,
        f.schema_version,
    )


def flag_from_row(r: Sequence[Any]) -> AnomalyFlag:
    return AnomalyFlag(
        flag_id=r[0],
        rule=r[1],
        run_id=r[2],
        workflow=r[3],
        steps=tuple(orjson.loads(r[4])),
        evidence=orjson.loads(r[5]),
        score=r[6],
        created_at=r[7],
        tenant=r[8],
        schema_version=r[9],
    )


def upgrade_audit(c: sqlite3.Connection) -> None:
    """Bring audit tables made by an earlier layout up to date (inside the schema's
    transaction): annotations gained the chain key id."""
    columns = {row[1] for row in c.execute("PRAGMA table_info(annotations)")}
    if "key_id" not in columns:
        c.execute("ALTER TABLE annotations ADD COLUMN key_id TEXT")


class SQLiteAudit:
    """Mixed into :class:`~replayable.store.sqlite.SQLiteStore`."""

    url: str
    _conn: sqlite3.Connection
    _write_lock: threading.Lock

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError  # pragma: no cover - SQLiteStore provides it

    def _select_runs(self) -> str:
        raise NotImplementedError  # pragma: no cover - SQLiteStore provides it

    def _write(
        self, what: str, statements: Sequence[tuple[str, Sequence[tuple[Any, ...]]]]
    ) -> None:
        with self._write_lock:
            c = self._conn
            try:
                c.execute("BEGIN IMMEDIATE")
                for sql, rows in statements:
                    if rows:
                        c.executemany(sql, rows)
                c.execute("COMMIT")
            except sqlite3.IntegrityError as exc:
                c.execute("ROLLBACK")
                raise AppendOnlyError(f"{self.url} refused the {what}: {exc}") from exc
            except sqlite3.Error as exc:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise StoreError(f"writing {what} to {self.url} failed: {exc}") from exc

    def append_annotations(self, annotations: Sequence[Annotation]) -> None:
        rows = [annotation_row(a) for a in annotations]
        sql = f"INSERT INTO annotations ({_ANN_COLS}) VALUES ({','.join('?' * 19)})"
        self._write("annotations", [(sql, rows)])

    def annotations(self, run_id: str) -> list[Annotation]:
        rows = self._query(
            f"SELECT {_ANN_COLS} FROM annotations WHERE run_id = ? ORDER BY chain_index", (run_id,)
        )
        return [annotation_from_row(r) for r in rows]

    def flag_closers(self) -> dict[str, str]:
        rows = self._query(
            "SELECT annotation_id, closes FROM annotations WHERE closes != '[]' "
            "ORDER BY created_at, annotation_id"
        )
        out: dict[str, str] = {}
        for annotation_id, text in rows:
            for flag_id in orjson.loads(text):
                out.setdefault(flag_id, annotation_id)
        return out

    def append_access(self, entries: Sequence[AccessEntry]) -> None:
        sql = f"INSERT INTO access_log ({_ACCESS_COLS}) VALUES ({','.join('?' * 12)})"
        self._write("access-log entries", [(sql, [access_row(e) for e in entries])])

    def access_entries(
        self,
        *,
        run_id: str | None = None,
        who: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[AccessEntry]:
        where, params = _access_where(run_id, who, since, "?")
        sql = f"SELECT {_ACCESS_COLS} FROM access_log"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY at DESC, entry_id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [access_from_row(r) for r in reversed(self._query(sql, params))]

    def append_flags(self, flags: Sequence[AnomalyFlag], scanned: Sequence[str]) -> None:
        import time

        now = time.time()
        self._write(
            "anomaly flags",
            [
                (
                    f"INSERT INTO anomaly_flags ({_FLAG_COLS}) VALUES ({','.join('?' * 10)})",
                    [flag_row(f) for f in flags],
                ),
                ("INSERT INTO anomaly_scanned VALUES (?, ?)", [(r, now) for r in scanned]),
            ],
        )

    def flags(
        self,
        *,
        run_id: str | None = None,
        rule: str | None = None,
        since: float | None = None,
    ) -> list[AnomalyFlag]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("run_id", run_id), ("rule", rule)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("created_at >= ?")
            params.append(since)
        sql = f"SELECT {_FLAG_COLS} FROM anomaly_flags"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY rowid"
        return [flag_from_row(r) for r in self._query(sql, params)]

    def unscanned_runs(
        self,
        *,
        since: float | None = None,
        workflow: str | None = None,
        limit: int = 500,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        where = [
            "e.run_id IS NOT NULL",
            "NOT EXISTS (SELECT 1 FROM anomaly_scanned s WHERE s.run_id = r.run_id)",
        ]
        params: list[Any] = []
        if since is not None:
            where.append("r.started_at >= ?")
            params.append(since)
        if workflow is not None:
            where.append("r.workflow = ?")
            params.append(workflow)
        if after is not None:
            where.append("(r.started_at > ? OR (r.started_at = ? AND r.run_id > ?))")
            params.extend((after[0], after[0], after[1]))
        sql = (
            self._select_runs()
            + " WHERE "
            + " AND ".join(where)
            + " ORDER BY r.started_at, r.run_id LIMIT ?"
        )
        return [run_from_row(r) for r in self._query(sql, [*params, limit])]

    def events_of(self, run_ids: Sequence[str]) -> dict[str, list[Event]]:
        from replayable.store.sqlite import _EVENT_COLS

        out: dict[str, list[Event]] = {r: [] for r in run_ids}
        ids = list(out)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = self._query(
                f"SELECT {_EVENT_COLS} FROM events WHERE run_id IN ({','.join('?' * len(chunk))}) "
                "ORDER BY run_id, seq",
                chunk,
            )
            for row in rows:
                out[row[0]].append(scan_event_from_row(row))
        return out

    def run_summaries(self, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        ids = list(dict.fromkeys(run_ids))
        rows: list[Any] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows += self._query(_summary_sql(len(chunk)), chunk)
        return summaries_from_rows(ids, rows)

    def workflow_stats(self, workflows: Iterable[str]) -> dict[str, WorkflowStats]:
        out: dict[str, WorkflowStats] = {}
        for workflow in dict.fromkeys(workflows):
            recent = (
                "SELECT r.run_id, e.ended_at - r.started_at AS duration FROM runs r "
                "JOIN run_ends e ON e.run_id = r.run_id WHERE r.workflow = ? "
                "ORDER BY e.ended_at DESC LIMIT ?"
            )
            rows = self._query(
                f"WITH recent AS ({recent}), per AS (SELECT duration, (SELECT count(*) FROM "
                "events v WHERE v.run_id = recent.run_id AND v.kind = 'llm') AS n FROM recent) "
                "SELECT count(*), avg(n), avg(n * n), "
                "(SELECT duration FROM per ORDER BY duration LIMIT 1 "
                " OFFSET (SELECT (count(*) - 1) / 2 FROM per)), "
                "(SELECT duration FROM per ORDER BY duration LIMIT 1 "
                " OFFSET (SELECT count(*) / 2 FROM per)) FROM per",
                (workflow, STATS_WINDOW),
            )
            count, mean, mean_sq, low, high = rows[0]
            mean = float(mean or 0.0)
            variance = max(float(mean_sq or 0.0) - mean * mean, 0.0)
            out[workflow] = WorkflowStats(
                workflow=workflow,
                runs=int(count),
                llm_mean=mean,
                llm_std=variance**0.5,
                median_duration=None if low is None else (low + high) / 2,
            )
        return out


def _summary_sql(n: int) -> str:
    return summary_sql(
        events=f"events AS v WHERE v.run_id IN ({','.join('?' * n)})",
        seq="seq",
        kind="kind",
        response="response",
        error="error",
        metadata="metadata",
        no_side_effect="v.side_effect = 0",
        contains=lambda column, text: f"instr({column}, {_literal(text)}) > 0",
        literal=_literal,
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _access_where(
    run_id: str | None, who: str | None, since: float | None, ph: str
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if run_id is not None:
        where.append(f"run_id = {ph}")
        params.append(run_id)
    if who is not None:
        where.append(f"(login = {ph} OR app_user = {ph})")
        params.extend((who, who))
    if since is not None:
        where.append(f"at >= {ph}")
        params.append(since)
    return where, params
