-- lockdb: the identity stamp of the restore guard (see pgstore's guard.go).
--
-- A backup carries this row forward unchanged, but a restore changes at
-- least one of the facts it records: a pg_dump restored into a new
-- database gets a new database OID, and one restored over the old database
-- (pg_restore --clean) recreates the sequence under a new OID; a physical
-- restore with archive recovery (PITR), or a promoted standby, ends on a
-- new timeline; a restore into another cluster has another system
-- identifier. Every grant checks the row against the facts, in the same
-- transaction as the grant, and is refused with SQLSTATE DL001 when they
-- differ, until "lockctl advance" moves the sequence past every token
-- issued and stamps the row again.
--
-- The row is first stamped here, when the table is created: an existing
-- lockdb is trusted as it is at its upgrade (as a brand-new one is).

-- +goose Up
CREATE TABLE lockdb_identity (
    singleton         boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier bigint      NOT NULL, -- pg_control_system()
    timeline_id       bigint      NOT NULL, -- of the current WAL insert position
    database_oid      bigint      NOT NULL, -- pg_database.oid of lockdb
    sequence_oid      bigint      NOT NULL, -- 'fencing_token_seq'::regclass
    stamped_at        timestamptz NOT NULL,
    advanced_past     bigint      NULL      -- N of the last "lockctl advance"
);

COMMENT ON TABLE lockdb_identity IS 'The PostgreSQL instance pgstore issues fencing tokens on; grants are refused when it differs (restore guard).';

-- +goose StatementBegin
CREATE FUNCTION lockdb_current_identity(
    OUT system_identifier bigint, OUT timeline_id bigint, OUT database_oid bigint, OUT sequence_oid bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT s.system_identifier,
           ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint,
           (SELECT oid FROM pg_database WHERE datname = current_database())::bigint,
           'fencing_token_seq'::regclass::oid::bigint
    FROM pg_control_system() s
$$;
-- +goose StatementEnd

-- lockdb_check_identity raises SQLSTATE DL001 unless the stamp matches the
-- instance. It takes advisory lock 0x6c6f636b6964 ("lockid") shared until
-- the end of the transaction; Advance takes it exclusively, so no grant
-- draws a token while the sequence is being moved.
-- +goose StatementBegin
CREATE FUNCTION lockdb_check_identity() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    st lockdb_identity;
    cur record;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'6c6f636b6964'::bigint);
    SELECT * INTO st FROM lockdb_identity;
    SELECT * INTO cur FROM lockdb_current_identity();
    IF st IS NULL OR st.system_identifier IS DISTINCT FROM cur.system_identifier
       OR st.timeline_id IS DISTINCT FROM cur.timeline_id
       OR st.database_oid IS DISTINCT FROM cur.database_oid
       OR st.sequence_oid IS DISTINCT FROM cur.sequence_oid THEN
        RAISE EXCEPTION USING ERRCODE = 'DL001',
            MESSAGE = format('lockdb identity changed: stamped %s, now %s',
                coalesce(format('system %s timeline %s database %s sequence %s',
                    st.system_identifier, st.timeline_id, st.database_oid, st.sequence_oid), 'nothing'),
                format('system %s timeline %s database %s sequence %s',
                    cur.system_identifier, cur.timeline_id, cur.database_oid, cur.sequence_oid));
    END IF;
END
$$;
-- +goose StatementEnd

INSERT INTO lockdb_identity (system_identifier, timeline_id, database_oid, sequence_oid, stamped_at)
SELECT system_identifier, timeline_id, database_oid, sequence_oid, clock_timestamp() FROM lockdb_current_identity();
