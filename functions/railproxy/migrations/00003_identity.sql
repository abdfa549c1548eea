-- raildb: the identity stamp of the restore guard and the token floor (see
-- guard.go).
--
-- raildb holds what makes a second payment impossible: the high-water mark
-- per account and the one forward per payout. A restore from an older
-- backup forgets every mark and every rail_payout row written after the
-- backup, and the attempt id sequence goes back too. The row below travels
-- with every backup unchanged, while a restore changes at least one of the
-- facts it records: a pg_dump restored into a new database gets a new
-- database OID, one restored over the old database (pg_restore --clean)
-- recreates rail_attempt's id sequence under a new OID, a physical restore
-- with archive recovery (PITR) or a promoted standby ends on a new
-- timeline, and a restore into another cluster has another system
-- identifier. Every submission checks the row against the facts first, in
-- the transaction that runs the fence, and is refused with SQLSTATE RD001
-- when they differ, until "rail-proxy recover-restore" has rebuilt what the
-- rail's journal says went to it, recorded the token floor, moved the
-- attempt ids on and stamped the row again.
--
-- token_floor is the floor of the fence: every token at or below it is
-- refused for every account, with or without a high-water row (0: none).
--
-- The row is first stamped here, when the table is created: an existing
-- raildb is trusted as it is at its upgrade (as a brand-new one is). The
-- statements tolerate a table and row that already exist: a backup taken
-- before this migration, restored with pg_restore --clean over a raildb
-- that has it, leaves raildb_identity in place (with its stamp, which no
-- longer matches) while goose's version table goes back.
--
-- No Down migration: without the stamp a restore goes unnoticed.

-- +goose Up
CREATE TABLE IF NOT EXISTS raildb_identity (
    singleton         boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier bigint      NOT NULL, -- pg_control_system()
    timeline_id       bigint      NOT NULL, -- of the current WAL insert position
    database_oid      bigint      NOT NULL, -- pg_database.oid of raildb
    sequence_oid      bigint      NOT NULL, -- rail_attempt's attempt id sequence
    stamped_at        timestamptz NOT NULL,
    token_floor       bigint      NOT NULL DEFAULT 0 CHECK (token_floor >= 0),
    recovered_past    bigint      NULL      -- N of the last "rail-proxy recover-restore"
);

COMMENT ON TABLE raildb_identity IS 'The PostgreSQL instance raildb''s records were written on; submissions are refused when it differs (restore guard). token_floor: every token at or below it is fenced out.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION raildb_current_identity(
    OUT system_identifier bigint, OUT timeline_id bigint, OUT database_oid bigint, OUT sequence_oid bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT s.system_identifier,
           ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint,
           (SELECT oid FROM pg_database WHERE datname = current_database())::bigint,
           pg_get_serial_sequence('rail_attempt', 'attempt_id')::regclass::oid::bigint
    FROM pg_control_system() s
$$;
-- +goose StatementEnd

-- raildb_check_identity raises SQLSTATE RD001 unless the stamp matches the
-- instance, and returns the token floor. It takes advisory lock
-- 0x7261696c6964 ("railid") shared until the end of the transaction; the
-- recovery takes it exclusively, so no submission is admitted while it
-- rebuilds the records.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION raildb_check_identity() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    st raildb_identity;
    cur record;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'7261696c6964'::bigint);
    SELECT * INTO st FROM raildb_identity;
    SELECT * INTO cur FROM raildb_current_identity();
    IF st IS NULL OR st.system_identifier IS DISTINCT FROM cur.system_identifier
       OR st.timeline_id IS DISTINCT FROM cur.timeline_id
       OR st.database_oid IS DISTINCT FROM cur.database_oid
       OR st.sequence_oid IS DISTINCT FROM cur.sequence_oid THEN
        RAISE EXCEPTION USING ERRCODE = 'RD001',
            MESSAGE = format('raildb identity changed: stamped %s, now %s',
                coalesce(format('system %s timeline %s database %s sequence %s',
                    st.system_identifier, st.timeline_id, st.database_oid, st.sequence_oid), 'nothing'),
                format('system %s timeline %s database %s sequence %s',
                    cur.system_identifier, cur.timeline_id, cur.database_oid, cur.sequence_oid));
    END IF;
    RETURN st.token_floor;
END
$$;
-- +goose StatementEnd

INSERT INTO raildb_identity (system_identifier, timeline_id, database_oid, sequence_oid, stamped_at)
SELECT system_identifier, timeline_id, database_oid, sequence_oid, clock_timestamp() FROM raildb_current_identity()
ON CONFLICT (singleton) DO NOTHING;
