"""Versioned migrations for the PostgreSQL store.

Every migration is a list of statements applied in one transaction under an
advisory lock, and recorded in ``schema_version``. ``upgrade`` is idempotent;
a database at a newer version than this code is refused, never downgraded.
The log tables follow the shape of the classic ``agent_execution_events``
table; canonical JSON is kept as text (``*_text``) because hashes are taken
over those exact bytes, and the JSONB columns are generated from it for
queries.
"""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg import sql

from replayable.errors import SchemaVersionError
from replayable.store.postgres._audit import AUDIT_KEYED, audit_migration
from replayable.store.postgres._tenancy import V2_TENANCY, tenant_policy

__all__ = ["LATEST_VERSION", "MIGRATIONS", "current_version", "upgrade", "valid_identifier"]

#: The tables the log is made of; every one refuses UPDATE, DELETE and TRUNCATE.
APPEND_ONLY_TABLES: Final = ("runs", "run_ends", "agent_execution_events", "blobs", "batches")
#: The tables every role reads (under the tenant policies); ``batches`` is the writer's alone.
LOG_TABLES: Final = ("runs", "run_ends", "agent_execution_events", "blobs")

# Version 1's tenant test: a setting any session could change. Migration 2
# (``_tenancy``) replaces it with memberships bound to the login.
_TENANT = "NULLIF(current_setting('replayable.tenant', true), '')"

_V1: Final = [
    """
    CREATE TABLE {s}.runs (
        run_id         UUID PRIMARY KEY,
        workflow       TEXT NOT NULL,
        entrypoint     TEXT NOT NULL,
        parent_run_id  UUID,
        parent_seq     INTEGER,
        root_run_id    UUID NOT NULL,
        tenant         TEXT,
        record_tenant  TEXT,
        input_text     TEXT NOT NULL,
        metadata_text  TEXT NOT NULL,
        metadata       JSONB GENERATED ALWAYS AS (metadata_text::jsonb) STORED,
        tags           TEXT[] NOT NULL,
        code_text      TEXT NOT NULL,
        env_hash       TEXT,
        lineage_text   TEXT NOT NULL,
        started_at     DOUBLE PRECISION NOT NULL,
        schema_version INTEGER NOT NULL,
        created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX idx_runs_started ON {s}.runs (started_at DESC, run_id DESC)",
    "CREATE INDEX idx_runs_workflow ON {s}.runs (workflow, started_at DESC)",
    "CREATE INDEX idx_runs_parent ON {s}.runs (parent_run_id)",
    "CREATE INDEX idx_runs_tags ON {s}.runs USING GIN (tags)",
    "CREATE INDEX idx_runs_metadata ON {s}.runs USING GIN (metadata jsonb_path_ops)",
    """
    CREATE TABLE {s}.run_ends (
        run_id         UUID PRIMARY KEY,
        tenant         TEXT,
        status         TEXT NOT NULL CHECK (status IN ('completed', 'failed')),
        output_text    TEXT,
        error_text     TEXT,
        ended_at       DOUBLE PRECISION NOT NULL,
        event_count    INTEGER NOT NULL,
        last_hash      TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE TABLE {s}.agent_execution_events (
        run_id         UUID NOT NULL,
        parent_run_id  UUID,
        sequence       INTEGER NOT NULL,
        event_type     VARCHAR(50) NOT NULL,
        name           TEXT NOT NULL,
        key            TEXT,
        parent         INTEGER,
        call_site      TEXT,
        request_text   TEXT NOT NULL,
        input_payload  JSONB GENERATED ALWAYS AS (request_text::jsonb) STORED,
        fingerprint    TEXT NOT NULL,
        response_text  TEXT,
        output_payload JSONB GENERATED ALWAYS AS (response_text::jsonb) STORED,
        encoding       TEXT NOT NULL,
        error_text     TEXT,
        side_effect    BOOLEAN NOT NULL,
        timestamp_utc  DOUBLE PRECISION NOT NULL,
        duration_ns    BIGINT NOT NULL,
        metadata_text  TEXT NOT NULL,
        metadata       JSONB GENERATED ALWAYS AS (metadata_text::jsonb) STORED,
        chain_index    INTEGER NOT NULL,
        prev_hash      TEXT NOT NULL,
        hash           TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        tenant         TEXT,
        created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
        CONSTRAINT agent_execution_events_run_seq UNIQUE (run_id, sequence)
    )
    """,
    # The UNIQUE constraint's index serves (run_id, sequence ASC) reads.
    "CREATE INDEX idx_events_parent ON {s}.agent_execution_events (parent_run_id)",
    "CREATE INDEX idx_events_type ON {s}.agent_execution_events (event_type, name)",
    """
    CREATE TABLE {s}.blobs (
        tenant     TEXT NOT NULL DEFAULT '',
        digest     TEXT NOT NULL,
        data       BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant, digest)
    )
    """,
    # One row per committed batch: a batch retried after a lost COMMIT
    # acknowledgement finds its digest here and is a no-op.
    """
    CREATE TABLE {s}.batches (
        digest     TEXT PRIMARY KEY,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF current_setting('replayable.maintenance', true) = 'on' THEN
            IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'replayable: % on %.% refused: the log is append-only',
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = 'RPL01';
    END $$
    """,
    # The maintenance procedure is the one path that may change recorded rows:
    # it raises a transaction-local flag the triggers honour, then lowers it.
    """
    CREATE FUNCTION {s}.purge_payloads(p_run_id UUID) RETURNS INTEGER
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = {s}, pg_temp AS $$
    DECLARE n INTEGER;
    BEGIN
        PERFORM set_config('replayable.maintenance', 'on', true);
        UPDATE agent_execution_events
           SET request_text = '{{"$purged":true}}',
               response_text = CASE WHEN response_text IS NULL THEN NULL
                                    ELSE '{{"$purged":true}}' END
         WHERE run_id = p_run_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        PERFORM set_config('replayable.maintenance', 'off', true);
        RETURN n;
    END $$
    """,
    "REVOKE ALL ON FUNCTION {s}.purge_payloads(UUID) FROM PUBLIC",
]


def _v1_guards() -> list[str]:
    out: list[str] = []
    for table in APPEND_ONLY_TABLES:
        out.append(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {{s}}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()"
        )
        out.append(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()"
        )
    check = f"tenant IS NOT DISTINCT FROM {_TENANT}"
    for table in ("runs", "run_ends", "agent_execution_events"):
        out.append(f"ALTER TABLE {{s}}.{table} ENABLE ROW LEVEL SECURITY")
        out.append(
            f"CREATE POLICY tenant_isolation ON {{s}}.{table} USING ({check}) WITH CHECK ({check})"
        )
    blob_check = f"tenant = COALESCE({_TENANT}, '')"
    out.append("ALTER TABLE {s}.blobs ENABLE ROW LEVEL SECURITY")
    out.append(
        f"CREATE POLICY tenant_isolation ON {{s}}.blobs USING ({blob_check}) "
        f"WITH CHECK ({blob_check})"
    )
    return out


# Keyed chains: the start's chain label, the end's seal signature (NULL in rows
# written before: the v1 chain), and the id anchor entries name the store by.
_V4_CHAIN: Final = [
    "ALTER TABLE {s}.runs ADD COLUMN chain TEXT",
    "ALTER TABLE {s}.run_ends ADD COLUMN signature TEXT",
    """
    CREATE TABLE {s}.store_info (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )
    """,
    "INSERT INTO {s}.store_info (key, value) VALUES ('store_id', gen_random_uuid()::text)",
    "CREATE TRIGGER store_info_append_only BEFORE UPDATE OR DELETE ON {s}.store_info "
    "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
    "CREATE TRIGGER store_info_no_truncate BEFORE TRUNCATE ON {s}.store_info "
    "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
    "REVOKE ALL ON {s}.store_info FROM PUBLIC",
]

#: The payload tier's tables (migration 6): append-only, under the tenant policy.
TIER_TABLES: Final = ("payload_blobs", "payload_nodes", "payload_dicts", "data_keys", "erasures")


def _tier_migration() -> list[str]:
    out = [
        "ALTER TABLE {s}.agent_execution_events ADD COLUMN request_ref TEXT, "
        "ADD COLUMN response_ref TEXT",
        """
        CREATE TABLE {s}.payload_blobs (
            tenant     TEXT NOT NULL,
            subject    TEXT NOT NULL,
            digest     TEXT NOT NULL,
            codec      TEXT NOT NULL,
            size       INTEGER NOT NULL,
            data       BYTEA NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (tenant, subject, digest)
        )
        """,
        """
        CREATE TABLE {s}.payload_nodes (
            tenant  TEXT NOT NULL,
            subject TEXT NOT NULL,
            digest  TEXT NOT NULL,
            parent  TEXT,
            body    TEXT NOT NULL,
            PRIMARY KEY (tenant, subject, digest)
        )
        """,
        """
        CREATE TABLE {s}.payload_dicts (
            tenant     TEXT NOT NULL,
            dict_id    TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            data       BYTEA NOT NULL,
            PRIMARY KEY (tenant, dict_id)
        )
        """,
        """
        CREATE TABLE {s}.data_keys (
            tenant     TEXT NOT NULL,
            subject    TEXT NOT NULL,
            key_id     TEXT NOT NULL,
            kek_id     TEXT NOT NULL,
            wrapped    BYTEA NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (tenant, subject, key_id, kek_id)
        )
        """,
        """
        CREATE TABLE {s}.erasures (
            erasure_id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
            tenant     TEXT NOT NULL,
            subject    TEXT,
            erased_at  DOUBLE PRECISION NOT NULL,
            erased_by  TEXT NOT NULL,
            key_ids    TEXT[] NOT NULL
        )
        """,
        # Crypto-shredding: the one path that deletes data keys. It runs as the
        # steward (SECURITY DEFINER, EXECUTE granted to the maintenance role only),
        # checks the session may write the tenant, and records who erased what.
        """
        CREATE FUNCTION {s}.erase_data_keys(p_tenant TEXT, p_subject TEXT, p_at DOUBLE PRECISION)
        RETURNS TEXT[]
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE ids TEXT[];
        BEGIN
            IF NOT p_tenant = ANY ({s}.session_tenants(true)) THEN
                RAISE EXCEPTION 'replayable: % may not erase data keys of tenant %',
                    session_user, quote_literal(p_tenant) USING ERRCODE = '42501';
            END IF;
            WITH gone AS (
                DELETE FROM {s}.data_keys
                 WHERE tenant = p_tenant AND (p_subject IS NULL OR subject = p_subject)
                RETURNING key_id
            )
            SELECT COALESCE(array_agg(DISTINCT key_id ORDER BY key_id), '{{}}') INTO ids FROM gone;
            INSERT INTO {s}.erasures (tenant, subject, erased_at, erased_by, key_ids)
            VALUES (p_tenant, p_subject, p_at, session_user, ids);
            RETURN ids;
        END $$
        """,
        "REVOKE ALL ON FUNCTION {s}.erase_data_keys(TEXT, TEXT, DOUBLE PRECISION) FROM PUBLIC",
    ]
    for table in TIER_TABLES:
        out += [
            f"REVOKE ALL ON {{s}}.{table} FROM PUBLIC",
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {{s}}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
            *tenant_policy(table, "tenant"),
        ]
    return out


#: The archive index (migration 7): which Parquet files hold which archived runs.
ARCHIVE_TABLES: Final = ("archive_parts", "archived_runs")


def _archive_migration() -> list[str]:
    out = [
        """
        CREATE TABLE {s}.archive_parts (
            part_id    TEXT PRIMARY KEY,
            tenant     TEXT NOT NULL,
            day        TEXT NOT NULL,
            runs       TEXT NOT NULL,
            events_url TEXT NOT NULL,
            blobs_url  TEXT NOT NULL,
            planned_at DOUBLE PRECISION NOT NULL
        )
        """,
        """
        CREATE TABLE {s}.archived_runs (
            run_id      UUID PRIMARY KEY,
            tenant      TEXT NOT NULL,
            part_id     TEXT NOT NULL,
            space       TEXT NOT NULL,
            archived_at DOUBLE PRECISION NOT NULL
        )
        """,
        # Dropping the hot copies of archived payloads: the steward's, for the
        # maintenance role, and only for runs the archive index holds.
        """
        CREATE FUNCTION {s}.drop_archived_payloads(p_run_ids UUID[]) RETURNS INTEGER
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE n INTEGER;
        BEGIN
            UPDATE {s}.agent_execution_events e
               SET request_text = 'null', response_text = NULL,
                   request_ref = NULL, response_ref = NULL
             WHERE e.run_id = ANY (p_run_ids)
               AND e.run_id IN (SELECT a.run_id FROM {s}.archived_runs a)
               AND COALESCE(e.tenant, '') = ANY ({s}.session_tenants(true))
               AND (e.request_text <> 'null' OR e.response_text IS NOT NULL
                    OR e.request_ref IS NOT NULL OR e.response_ref IS NOT NULL);
            GET DIAGNOSTICS n = ROW_COUNT;
            RETURN n;
        END $$
        """,
        "REVOKE ALL ON FUNCTION {s}.drop_archived_payloads(UUID[]) FROM PUBLIC",
    ]
    for table in ARCHIVE_TABLES:
        out += [
            f"REVOKE ALL ON {{s}}.{table} FROM PUBLIC",
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {{s}}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
            *tenant_policy(table, "tenant"),
        ]
    return out


#: Retention's purge records (migration 8): which archive parts were purged, when and by
#: whom, and the payload sha256 of each of their events (so that the chains verify).
PURGE_TABLES: Final = ("archive_purges", "purged_payloads")


def _purge_migration() -> list[str]:
    out = [
        """
        CREATE TABLE {s}.archive_purges (
            part_id   TEXT PRIMARY KEY,
            tenant    TEXT NOT NULL,
            purged_at DOUBLE PRECISION NOT NULL,
            purged_by TEXT NOT NULL
        )
        """,
        """
        CREATE TABLE {s}.purged_payloads (
            run_id          UUID NOT NULL,
            sequence        INTEGER NOT NULL,
            tenant          TEXT NOT NULL,
            request_digest  TEXT NOT NULL,
            response_digest TEXT,
            PRIMARY KEY (run_id, sequence)
        )
        """,
        # The steward's, for the maintenance role: only a part the index holds, of a
        # tenant the session may write, and only digests of that part's runs; the
        # purging login is the session user, whatever the caller says.
        """
        CREATE FUNCTION {s}.record_archive_purge(
            p_part_id TEXT, p_at DOUBLE PRECISION, p_runs UUID[], p_seqs INTEGER[],
            p_requests TEXT[], p_responses TEXT[]
        ) RETURNS TEXT
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE part_tenant TEXT;
        BEGIN
            SELECT p.tenant INTO part_tenant FROM {s}.archive_parts p
             WHERE p.part_id = p_part_id;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'replayable: no archive part % among the tenants % may read',
                    quote_literal(p_part_id), session_user USING ERRCODE = 'RPL02';
            END IF;
            IF NOT part_tenant = ANY ({s}.session_tenants(true)) THEN
                RAISE EXCEPTION 'replayable: % may not purge archives of tenant %',
                    session_user, quote_literal(part_tenant) USING ERRCODE = '42501';
            END IF;
            IF EXISTS (
                SELECT 1 FROM unnest(p_runs) r(run_id)
                 WHERE NOT EXISTS (SELECT 1 FROM {s}.archived_runs a
                                    WHERE a.run_id = r.run_id AND a.part_id = p_part_id)
            ) THEN
                RAISE EXCEPTION 'replayable: digests given for runs not in archive part %',
                    quote_literal(p_part_id) USING ERRCODE = '22023';
            END IF;
            INSERT INTO {s}.purged_payloads
                (run_id, sequence, tenant, request_digest, response_digest)
            SELECT d.run_id, d.seq, part_tenant, d.request, d.response
              FROM unnest(p_runs, p_seqs, p_requests, p_responses) d(run_id, seq, request, response)
            ON CONFLICT DO NOTHING;
            INSERT INTO {s}.archive_purges (part_id, tenant, purged_at, purged_by)
            VALUES (p_part_id, part_tenant, p_at, session_user) ON CONFLICT DO NOTHING;
            RETURN session_user;
        END $$
        """,
        "REVOKE ALL ON FUNCTION {s}.record_archive_purge(TEXT, DOUBLE PRECISION, UUID[], "
        "INTEGER[], TEXT[], TEXT[]) FROM PUBLIC",
    ]
    for table in PURGE_TABLES:
        out += [
            f"REVOKE ALL ON {{s}}.{table} FROM PUBLIC",
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {{s}}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
            *tenant_policy(table, "tenant"),
        ]
    return out


#: Blob drops (migration 9): one row per drop of blobs only archived runs used; the
#: newest ``drop_id`` is the generation writers compare with what they cached as stored.
DROP_TABLES: Final = ("blob_drops",)

# Writers hold this advisory lock shared from the generation check to their commit, the
# blob drop holds it exclusive: a drop never runs while a batch that may reference
# blobs is being written, and a batch after a drop sees its generation.
_DROP_LOCK = "pg_advisory_xact_lock{shared}(1919250540, hashtext('{{s}}'))"

# Every (tenant, digest) of a node or blob a hot row references: events' payloads and
# errors, and the run records' input, output and error. By tenant, not by key space:
# a digest another subject of the tenant uses is kept too (more than needed, never less).
_LIVE = """
    WITH RECURSIVE refs(tenant, ref) AS (
        SELECT COALESCE(e.tenant, ''), e.request_ref FROM {s}.agent_execution_events e
         WHERE e.request_ref IS NOT NULL
        UNION ALL
        SELECT COALESCE(e.tenant, ''), e.response_ref FROM {s}.agent_execution_events e
         WHERE e.response_ref IS NOT NULL
        UNION ALL
        SELECT COALESCE(e.tenant, ''), substr(e.error_text, 7) FROM {s}.agent_execution_events e
         WHERE left(e.error_text, 6) = '@tier:'
        UNION ALL
        SELECT COALESCE(r.tenant, ''), substr(r.input_text, 7) FROM {s}.runs r
         WHERE left(r.input_text, 6) = '@tier:'
        UNION ALL
        SELECT COALESCE(r.tenant, ''), substr(r.output_text, 7) FROM {s}.run_ends r
         WHERE left(r.output_text, 6) = '@tier:'
        UNION ALL
        SELECT COALESCE(r.tenant, ''), substr(r.error_text, 7) FROM {s}.run_ends r
         WHERE left(r.error_text, 6) = '@tier:'
    ), live_nodes(tenant, digest) AS (
        SELECT DISTINCT tenant, substr(ref, 65, 32) FROM refs WHERE length(ref) > 64
        UNION
        SELECT n.tenant, n.parent FROM {s}.payload_nodes n
          JOIN live_nodes l ON n.tenant = l.tenant AND n.digest = l.digest
         WHERE n.parent IS NOT NULL
    ), live_blobs(tenant, digest) AS (
        SELECT tenant, ref FROM refs WHERE length(ref) = 64
        UNION
        SELECT n.tenant, p.piece ->> 1 FROM {s}.payload_nodes n
          JOIN live_nodes l ON n.tenant = l.tenant AND n.digest = l.digest
         CROSS JOIN LATERAL jsonb_array_elements(n.body::jsonb) p(piece)
    )
"""


def _drop_migration() -> list[str]:
    out = [
        """
        CREATE TABLE {s}.blob_drops (
            drop_id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            dropped_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            dropped_by TEXT NOT NULL,
            tenants    TEXT[] NOT NULL,
            blobs      INTEGER NOT NULL,
            nodes      INTEGER NOT NULL
        )
        """,
        # The writer's check, in its batch's transaction: VOLATILE, so the generation is
        # read with a snapshot taken after the lock was granted (after any drop committed).
        f"""
        CREATE FUNCTION {{s}}.tier_generation() RETURNS BIGINT
        LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            PERFORM {_DROP_LOCK.format(shared="_shared")};
            RETURN COALESCE((SELECT max(d.drop_id) FROM {{s}}.blob_drops d), 0);
        END $$
        """,
        # The steward's, for the maintenance role: deletes, in the tenants the session may
        # write, the blobs and nodes no hot row references (those only archived runs whose
        # payloads were dropped used; the archive holds its own copy), and records the drop.
        # A node whose body is not a JSON array aborts it: nothing is dropped.
        f"""
        CREATE FUNCTION {{s}}.drop_archived_blobs() RETURNS INTEGER[]
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            nb INTEGER;
            nn INTEGER;
            mine TEXT[];
        BEGIN
            PERFORM {_DROP_LOCK.format(shared="")};
            mine := {{s}}.session_tenants(true);
            {_LIVE}
            DELETE FROM {{s}}.payload_blobs b
             WHERE b.tenant = ANY (mine)
               AND NOT EXISTS (SELECT 1 FROM live_blobs l
                                WHERE l.tenant = b.tenant AND l.digest = b.digest);
            GET DIAGNOSTICS nb = ROW_COUNT;
            {_LIVE}
            DELETE FROM {{s}}.payload_nodes n
             WHERE n.tenant = ANY (mine)
               AND NOT EXISTS (SELECT 1 FROM live_nodes l
                                WHERE l.tenant = n.tenant AND l.digest = n.digest);
            GET DIAGNOSTICS nn = ROW_COUNT;
            IF nb + nn > 0 THEN
                INSERT INTO {{s}}.blob_drops (dropped_by, tenants, blobs, nodes)
                VALUES (session_user, mine, nb, nn);
            END IF;
            RETURN ARRAY[nb, nn];
        END $$
        """,
        "REVOKE ALL ON FUNCTION {s}.drop_archived_blobs() FROM PUBLIC",
    ]
    for table in DROP_TABLES:
        out += [
            f"REVOKE ALL ON {{s}}.{table} FROM PUBLIC",
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {{s}}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {{s}}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
        ]
    return out


# Migration 10: the blob drops name the tenants they swept, which are not every login's
# to read; the writer's generation check reads them as the schema owner instead.
_V10_DROPS_PRIVATE: Final = ["ALTER FUNCTION {s}.tier_generation() SECURITY DEFINER"]

# Migration 11: the first maintenance procedure, ``purge_payloads``, overwrote a run's
# payloads in place, which left its hash chain broken ("altered") for good. Erasure by
# crypto-shredding and the archive's drop replaced it, so it goes; the append-only
# triggers now know the steward as the owner of ``erase_data_keys`` instead.
_V11_NO_PURGE: Final = [
    """
    CREATE OR REPLACE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
        IF TG_OP <> 'TRUNCATE' AND EXISTS (
            SELECT 1 FROM pg_proc p JOIN pg_class c ON c.oid = TG_RELID
             WHERE p.oid = to_regprocedure('{s}.erase_data_keys(text, text, double precision)')
               AND p.proowner <> c.relowner
               AND p.proowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
        ) THEN
            IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'replayable: % on %.% refused: the log is append-only',
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = 'RPL01';
    END $$
    """,
    "DROP FUNCTION IF EXISTS {s}.purge_payloads(UUID)",
]

#: Migration n (1-based) brings a database from version n-1 to n.
MIGRATIONS: Final[list[list[str]]] = [
    _V1 + _v1_guards(),
    V2_TENANCY,
    audit_migration(),
    _V4_CHAIN,
    AUDIT_KEYED,
    _tier_migration(),
    _archive_migration(),
    _purge_migration(),
    _drop_migration(),
    _V10_DROPS_PRIVATE,
    _V11_NO_PURGE,
]
LATEST_VERSION: Final = len(MIGRATIONS)

_LOCK_KEY = 0x7265706C6179  # "replay": serializes concurrent upgrades


def valid_identifier(name: str) -> bool:
    """Whether ``name`` is a plain lower-case SQL identifier (schema or role names)."""
    return (
        bool(name)
        and len(name) <= 63
        and name[0].isalpha()
        and all(c.isalnum() or c == "_" for c in name)
        and name.isascii()
        and name == name.lower()
    )


def current_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int | None:
    """The schema version recorded in ``schema``, or ``None`` when it holds no store."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_version",)
    ).fetchone()
    if row is None or not row[0]:
        return None
    q = sql.SQL("SELECT max(version) FROM {}.schema_version").format(sql.Identifier(schema))
    found = conn.execute(q).fetchone()
    return None if found is None or found[0] is None else int(str(found[0]))


def check_version(version: int | None, where: str) -> None:
    """Refuse a database written by a newer replayable."""
    if version is not None and version > LATEST_VERSION:
        raise SchemaVersionError(
            f"{where} has schema version {version}; this replayable knows up to "
            f"{LATEST_VERSION} and never downgrades. Upgrade replayable."
        )


def upgrade(conn: psycopg.Connection[tuple[object, ...]], schema: str, where: str) -> list[int]:
    """Apply the missing migrations to ``schema``; returns the versions applied (maybe none)."""
    applied: list[int] = []
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        version = current_version(conn, schema)
        check_version(version, where)
        if version is None:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {}.schema_version (version INTEGER PRIMARY KEY, "
                    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                ).format(ident)
            )
            version = 0
        for number in range(version + 1, LATEST_VERSION + 1):
            for statement in MIGRATIONS[number - 1]:
                conn.execute(sql.SQL(statement).format(s=ident))
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)").format(ident),
                (number,),
            )
            applied.append(number)
    return applied
