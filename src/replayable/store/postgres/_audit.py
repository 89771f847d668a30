"""The PostgreSQL store's audit tables: schema migration, grants and the store's methods.

Annotations, the access log, anomaly flags and scan marks live in their own
append-only tables (the log's ``refuse_change`` trigger guards them too) with
row-level security per tenant like the log. Each row also records the
database login that wrote it (``db_login DEFAULT session_user``), which the
application cannot choose. Grants (see :func:`grant_audit`):

=================  ===============================================================
writer             INSERT into the access log (its reads are logged); nothing else
auditor            SELECT everything; INSERT into the access log
analyst            SELECT annotations and flags; INSERT annotations and access log
maintenance        SELECT; INSERT flags and scan marks (the anomaly scan job)
admin              all of the above
=================  ===============================================================

Which rows a login sees is decided by the log's tenant policies (``_tenancy``):
the tenants of its memberships, never a setting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

import psycopg
from msgspec.structs import replace
from psycopg import sql

from replayable.events.audit import AccessEntry, Annotation, AnomalyFlag, WorkflowStats
from replayable.events.model import Event, Run
from replayable.store._audit_sql import (
    CLOSERS_SQL,
    access_where,
    closers,
    columns,
    flag_where,
    from_row,
    to_row,
    unscanned_where,
    where_sql,
)
from replayable.store.audit_base import (
    STATS_WINDOW,
    RunSummary,
    scan_event_from_row,
    summaries_from_rows,
    summary_sql,
)
from replayable.store.postgres._tenancy import _READ
from replayable.store.rows import run_from_row

if TYPE_CHECKING:
    from replayable.store.postgres._connect import PgTarget

__all__ = ["AUDIT_KEYED", "AUDIT_TABLES", "PostgresAudit", "audit_migration", "grant_audit"]

AUDIT_TABLES: Final = ("annotations", "access_log", "anomaly_flags", "anomaly_scanned")


def audit_migration() -> list[str]:
    """The statements creating the audit tables, their guards and tenant policies."""
    statements = [
        """
        CREATE TABLE {s}.annotations (
            annotation_id  TEXT PRIMARY KEY,
            run_id         UUID NOT NULL,
            seq            INTEGER,
            author         TEXT NOT NULL,
            role           TEXT NOT NULL,
            login          TEXT NOT NULL,
            created_at     DOUBLE PRECISION NOT NULL,
            verdict        TEXT CHECK (verdict IN ('ok', 'concern', 'violation', 'needs-review')),
            policy         TEXT,
            note           TEXT NOT NULL,
            amends         TEXT,
            retract        BOOLEAN NOT NULL,
            closes_text    TEXT NOT NULL,
            tenant         TEXT,
            chain_index    INTEGER NOT NULL,
            prev_hash      TEXT NOT NULL,
            hash           TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            db_login       TEXT NOT NULL DEFAULT session_user,
            recorded_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT annotations_run_chain UNIQUE (run_id, chain_index)
        )
        """,
        """
        CREATE TABLE {s}.access_log (
            entry_id       TEXT PRIMARY KEY,
            at             DOUBLE PRECISION NOT NULL,
            login          TEXT NOT NULL,
            app_user       TEXT NOT NULL,
            role           TEXT NOT NULL,
            channel        TEXT NOT NULL,
            purpose        TEXT,
            run_id         UUID,
            steps_text     TEXT NOT NULL,
            what_text      TEXT NOT NULL,
            tenant         TEXT,
            schema_version INTEGER NOT NULL,
            db_login       TEXT NOT NULL DEFAULT session_user,
            recorded_at    TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """,
        "CREATE INDEX idx_access_log_at ON {s}.access_log (at)",
        "CREATE INDEX idx_access_log_run ON {s}.access_log (run_id, at)",
        """
        CREATE TABLE {s}.anomaly_flags (
            flag_id        TEXT PRIMARY KEY,
            rule           TEXT NOT NULL,
            run_id         UUID NOT NULL,
            workflow       TEXT NOT NULL,
            steps_text     TEXT NOT NULL,
            evidence_text  TEXT NOT NULL,
            score          DOUBLE PRECISION NOT NULL,
            created_at     DOUBLE PRECISION NOT NULL,
            tenant         TEXT,
            schema_version INTEGER NOT NULL,
            position       BIGSERIAL,
            db_login       TEXT NOT NULL DEFAULT session_user
        )
        """,
        "CREATE INDEX idx_anomaly_flags_run ON {s}.anomaly_flags (run_id)",
        "CREATE INDEX idx_anomaly_flags_rule ON {s}.anomaly_flags (rule, created_at)",
        """
        CREATE TABLE {s}.anomaly_scanned (
            run_id     UUID PRIMARY KEY,
            tenant     TEXT,
            scanned_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """,
    ]
    for table in AUDIT_TABLES:
        statements += [
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {{s}}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
            # The tenants of the login's memberships, never a setting. Reading a
            # tenant is enough to add to its audit trail (log a read, annotate);
            # the table grants decide who may add what.
            f"ALTER TABLE {{s}}.{table} ENABLE ROW LEVEL SECURITY",
            f"CREATE POLICY tenant_isolation ON {{s}}.{table} "
            f"USING (COALESCE(tenant, '') = ANY ({_READ})) "
            f"WITH CHECK (COALESCE(tenant, '') = ANY ({_READ}))",
        ]
    return statements


#: Migration 4: annotations record the chain key they were chained with.
AUDIT_KEYED: Final = ["ALTER TABLE {s}.annotations ADD COLUMN key_id TEXT"]


def grant_audit(
    conn: psycopg.Connection[tuple[object, ...]],
    schema: str,
    *,
    writer: str,
    auditor: str,
    analyst: str,
    maintenance: str,
    admin: str,
) -> None:
    """Grant the audit tables to the roles (see the module's table). Idempotent."""
    s = sql.Identifier(schema)

    def tables(*names: str) -> sql.Composable:
        return sql.SQL(", ").join(sql.SQL("{}.{}").format(s, sql.Identifier(t)) for t in names)

    w, a, an, m, ad = (sql.Identifier(r) for r in (writer, auditor, analyst, maintenance, admin))
    everyone = sql.SQL(", ").join([w, a, an, m, ad])
    statements = [
        sql.SQL("REVOKE ALL ON {} FROM {}").format(tables(*AUDIT_TABLES), everyone),
        sql.SQL("GRANT INSERT ON {} TO {}").format(tables("access_log"), everyone),
        sql.SQL("GRANT SELECT ON {} TO {}, {}").format(tables(*AUDIT_TABLES), a, ad),
        sql.SQL("GRANT SELECT ON {} TO {}, {}").format(
            tables("annotations", "anomaly_flags", "anomaly_scanned"), an, m
        ),
        sql.SQL("GRANT INSERT ON {} TO {}, {}").format(tables("annotations"), an, ad),
        sql.SQL("GRANT INSERT ON {} TO {}, {}").format(
            tables("anomaly_flags", "anomaly_scanned"), m, ad
        ),
        sql.SQL("GRANT USAGE ON SEQUENCE {}.{} TO {}, {}").format(
            s, sql.Identifier("anomaly_flags_position_seq"), m, ad
        ),
    ]
    for statement in statements:
        conn.execute(statement)


# Run ids are UUID columns, read back as text; JSON travels in the *_text columns.
_ANN_COLS = columns(Annotation, json_suffix="_text", run_id="run_id::text")
_ACCESS_COLS = columns(AccessEntry, json_suffix="_text", run_id="run_id::text")
_FLAG_COLS = columns(AnomalyFlag, json_suffix="_text", run_id="run_id::text")


def _insert(table: str, cols: str, values: Sequence[str] | None = None) -> str:
    names = cols.replace("run_id::text", "run_id")
    places = values or ["%s"] * (names.count(",") + 1)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join(places)})"


_UNKNOWN: Final = object()


def _literal(text: str) -> str:
    # Quoted for the server, and % doubled for the driver's placeholders.
    return "'" + text.replace("'", "''").replace("%", "%%") + "'"


_SUMMARY_SQL: Final = summary_sql(
    # Ordered (in summary_sql) like the (run_id, sequence) index, which then serves the
    # rows, whatever the planner believes of the table's size.
    events="agent_execution_events AS v WHERE v.run_id = ANY(%s::uuid[])",
    seq="sequence",
    kind="event_type",
    response="response_text",
    error="error_text",
    metadata="metadata_text",
    no_side_effect="NOT v.side_effect",
    contains=lambda column, text: f"strpos({column}, {_literal(text)}) > 0",
    literal=_literal,
)


class PostgresAudit:
    """Mixed into :class:`~replayable.store.postgres.PostgresStore`."""

    target: PgTarget
    tenant: str | None
    url: str
    _write_lock: threading.Lock
    _read_lock: threading.Lock
    _login: str | None = None
    _only_tenant: object = _UNKNOWN
    _run_info: dict[str, tuple[str | None, str | None]]

    def _conn(self, write: bool) -> psycopg.Connection[tuple[Any, ...]]:
        raise NotImplementedError  # pragma: no cover - PostgresStore provides it

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # pragma: no cover - PostgresStore provides it

    def _write_rows(
        self, what: str, statements: Sequence[tuple[str, list[tuple[Any, ...]]]]
    ) -> None:
        from replayable.store.postgres._connect import raise_store_error

        with self._write_lock:
            conn = self._conn(write=True)
            try:
                todo = [(st, rows) for st, rows in statements if rows]
                if len(todo) == 1 and len(todo[0][1]) == 1:
                    # One row is atomic on its own: one round trip, not BEGIN/INSERT/COMMIT.
                    conn.execute(todo[0][0], todo[0][1][0])
                    return
                with conn.transaction(), conn.cursor() as cur:
                    for statement, rows in todo:
                        cur.executemany(statement, rows)
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, f"writing {what}")

    def _row_tenant(self, run_id: str | None) -> str | None:
        """The tenant an audit row is filed under: the store's, else the run's tenant as
        the database holds it, else (no run) the login's only tenant."""
        if self.tenant is not None:
            return self.tenant
        if run_id is not None:
            known = self._run_info.get(run_id)
            if known is not None:
                return known[0]
            rows = self.query("SELECT tenant FROM runs WHERE run_id = %s", (run_id,))
            return None if not rows else rows[0][0]
        if self._only_tenant is _UNKNOWN:
            rows = self.query("SELECT session_tenants(false)")
            tenants = rows[0][0] if rows else None
            self._only_tenant = tenants[0] if tenants and len(tenants) == 1 else None
        return self._only_tenant  # type: ignore[return-value]

    def _prefetch_tenants(self, run_ids: Sequence[str]) -> None:
        """Learn the tenants of many runs in one query (before filing a scan's rows)."""
        if self.tenant is not None:
            return
        missing = [r for r in dict.fromkeys(run_ids) if r not in self._run_info]
        if not missing:
            return
        rows = self.query(
            "SELECT run_id::text, tenant, parent_run_id::text FROM runs "
            "WHERE run_id = ANY(%s::uuid[])",
            (missing,),
        )
        for run_id, tenant, parent in rows:
            self._run_info[run_id] = (tenant, parent)

    def login_name(self) -> str:
        if self._login is None:
            rows = self.query("SELECT session_user")
            self._login = str(rows[0][0])
        return self._login

    def append_annotations(self, annotations: Sequence[Annotation]) -> None:
        # The row is filed under the store's tenant, else the run's as the database
        # holds it (looked up in the same statement: the tenant's place takes two values).
        at = _ANN_COLS.split(", ").index("tenant")
        places = ["%s"] * len(_ANN_COLS.split(", "))
        places[at] = "COALESCE(%s, (SELECT r.tenant FROM runs r WHERE r.run_id = %s::uuid))"
        rows = []
        for a in annotations:
            row = to_row(a)
            rows.append((*row[:at], self.tenant, a.run_id, *row[at + 1 :]))
        self._write_rows("annotations", [(_insert("annotations", _ANN_COLS, places), rows)])

    def annotations(self, run_id: str) -> list[Annotation]:
        from replayable.store.postgres._store import _is_uuid

        if not _is_uuid(run_id):
            return []
        rows = self.query(
            f"SELECT {_ANN_COLS} FROM annotations WHERE run_id = %s ORDER BY chain_index",
            (run_id,),
        )
        return [from_row(Annotation, r) for r in rows]

    def annotation_head(self, run_id: str) -> Annotation | None:
        from replayable.store.postgres._store import _is_uuid

        if not _is_uuid(run_id):
            return None
        rows = self.query(
            f"SELECT {_ANN_COLS} FROM annotations WHERE run_id = %s "
            "ORDER BY chain_index DESC LIMIT 1",
            (run_id,),
        )
        return from_row(Annotation, rows[0]) if rows else None

    def flag_closers(self) -> dict[str, str]:
        return closers(self.query(CLOSERS_SQL.format(closes="closes_text")))

    def append_access(self, entries: Sequence[AccessEntry]) -> None:
        rows = [to_row(replace(e, tenant=self._row_tenant(e.run_id))) for e in entries]
        self._write_rows("access-log entries", [(_insert("access_log", _ACCESS_COLS), rows)])

    def access_entries(
        self,
        *,
        run_id: str | None = None,
        who: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[AccessEntry]:
        from replayable.store.postgres._store import _is_uuid

        if run_id is not None and not _is_uuid(run_id):
            return []
        where, params = access_where(run_id, who, since, "%s")
        statement = f"SELECT {_ACCESS_COLS} FROM access_log{where_sql(where)}"
        statement += " ORDER BY at DESC, entry_id DESC"
        if limit is not None:
            statement += " LIMIT %s"
            params.append(limit)
        return [from_row(AccessEntry, r) for r in reversed(self.query(statement, params))]

    def append_flags(self, flags: Sequence[AnomalyFlag], scanned: Sequence[str]) -> None:
        self._prefetch_tenants([*scanned, *(f.run_id for f in flags)])
        flag_rows = [to_row(replace(f, tenant=self._row_tenant(f.run_id))) for f in flags]
        tenants = {r: self._row_tenant(r) for r in scanned}
        self._write_rows(
            "anomaly flags",
            [
                (_insert("anomaly_flags", _FLAG_COLS), flag_rows),
                (
                    "INSERT INTO anomaly_scanned (run_id, tenant) VALUES (%s, %s)",
                    [(r, tenants.get(r, self.tenant)) for r in scanned],
                ),
            ],
        )

    def flags(
        self,
        *,
        run_id: str | None = None,
        rule: str | None = None,
        since: float | None = None,
    ) -> list[AnomalyFlag]:
        from replayable.store.postgres._store import _is_uuid

        if run_id is not None and not _is_uuid(run_id):
            return []
        where, params = flag_where(run_id, rule, since, "%s")
        statement = f"SELECT {_FLAG_COLS} FROM anomaly_flags{where_sql(where)} ORDER BY position"
        return [from_row(AnomalyFlag, r) for r in self.query(statement, params)]

    def _joined_runs(self, runs: list[Run]) -> list[Run]:
        """Runs with the values the payload tier keeps put back (the store's own)."""
        return runs

    def unscanned_runs(
        self,
        *,
        since: float | None = None,
        workflow: str | None = None,
        limit: int = 500,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        from replayable.store.postgres._store import _RUN_COLS

        where, params = unscanned_where(since, workflow, "%s")
        if after is not None:
            where.append("(r.started_at, r.run_id) > (%s, %s::uuid)")
            params.extend(after)
        statement = (
            f"SELECT {_RUN_COLS} FROM runs r JOIN run_ends e ON e.run_id = r.run_id"
            f"{where_sql(where)} ORDER BY r.started_at, r.run_id LIMIT %s"
        )
        return self._joined_runs([run_from_row(r) for r in self.query(statement, [*params, limit])])

    def _scan_query(self, statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """A read of the anomaly scan: a batch of runs (or a workflow's latest) looked up
        by id through an index. Without fresh statistics (no ANALYZE since a load) the
        planner takes the events table for huge and unknown: it chose to read all of it
        (3 s for a batch's 25,000 of 5.5M events) and spent longer compiling the query
        than running it (900 ms of JIT for a 40 ms read). Here it does neither.
        """
        from replayable.store.postgres._connect import raise_store_error

        with self._read_lock:
            conn = self._conn(write=False)
            try:
                with conn.transaction():
                    conn.execute("SET LOCAL jit = off")
                    conn.execute("SET LOCAL enable_seqscan = off")
                    # Parallel workers only compete for the cores the scan runs on.
                    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                    return conn.execute(statement, params).fetchall()
            except psycopg.Error as exc:
                raise_store_error(exc, self.target, "reading")

    def events_of(self, run_ids: Sequence[str]) -> dict[str, list[Event]]:
        from replayable.store.postgres._store import _EVENT_ROW_COLS, _is_uuid

        out: dict[str, list[Event]] = {r: [] for r in run_ids}
        valid = [r for r in out if _is_uuid(r)]
        if valid:
            # Ordered by the table's columns, not the selected ``run_id::text``: the
            # (run_id, sequence) index then delivers the rows in order, with no sort.
            rows = self._scan_query(
                f"SELECT {_EVENT_ROW_COLS} FROM agent_execution_events v "
                "WHERE v.run_id = ANY(%s::uuid[]) ORDER BY v.run_id, v.sequence",
                (valid,),
            )
            # Payloads in the blob tier are joined back by the store.
            tiered = {row[0] for row in rows if row[20] is not None or row[21] is not None}
            for row in rows:
                if row[0] not in tiered:
                    out[row[0]].append(scan_event_from_row(row[:20]))
            for run_id in tiered:
                out[run_id] = self.events(run_id)  # type: ignore[attr-defined]
        return out

    def run_summaries(self, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        from replayable.store.postgres._store import _is_uuid

        ids = list(dict.fromkeys(run_ids))
        valid = [r for r in ids if _is_uuid(r)]
        rows = self._scan_query(_SUMMARY_SQL, (valid,)) if valid else []
        return summaries_from_rows(ids, rows)

    def workflow_stats(self, workflows: Iterable[str]) -> dict[str, WorkflowStats]:
        names = list(dict.fromkeys(workflows))
        if not names:
            return {}
        # Per workflow, its latest finished runs; per run, its LLM calls counted through
        # the (run_id, sequence) index (the type is filtered in the aggregate: filtering
        # the scan on it let the planner read the whole type index, or every event).
        rows = self._scan_query(
            """
            SELECT w.workflow, s.runs, s.mean, s.std, s.median
              FROM unnest(%s::text[]) AS w(workflow)
             CROSS JOIN LATERAL (
                SELECT count(*) AS runs, COALESCE(avg(c.n), 0) AS mean,
                       COALESCE(stddev_pop(c.n), 0) AS std,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY p.duration) AS median
                  FROM (SELECT r.run_id, e.ended_at - r.started_at AS duration
                          FROM runs r JOIN run_ends e ON e.run_id = r.run_id
                         WHERE r.workflow = w.workflow
                         ORDER BY e.ended_at DESC LIMIT %s) AS p
                 CROSS JOIN LATERAL (
                    SELECT count(*) FILTER (WHERE v.event_type = 'llm') AS n
                      FROM agent_execution_events v WHERE v.run_id = p.run_id) AS c
             ) AS s
            """,
            (names, STATS_WINDOW),
        )
        return {
            str(wf): WorkflowStats(
                workflow=str(wf),
                runs=int(count),
                llm_mean=float(mean),
                llm_std=float(std),
                median_duration=None if median is None else float(median),
            )
            for wf, count, mean, std, median in rows
        }
