-- lockdb: the restore guard's check, which every grant runs in its own
-- transaction, also refuses a grant while lockdb runs with fsync off.
--
-- pgstore refuses a server with fsync off when it connects, but fsync can
-- be turned off later by a reload (ALTER SYSTEM SET fsync = off; SELECT
-- pg_reload_conf()), which connections already open do not report. With
-- fsync off a commit is acknowledged before it is on disk, and a crash of
-- lockdb's host can lose a grant and issue its token again. Each backend
-- reads a reloaded file before its next statement, so the grant's own
-- check sees the setting in force, at no cost of its own: SQLSTATE DL004,
-- until fsync is on again. What this leaves open: ADR 0002, "fsync stays
-- on" (docs/adr/0002-token-floor-from-lockdbs-clock.md).
--
-- No Down: the check is the whole point.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lockdb_check_identity() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    st lockdb_identity;
    cur record;
BEGIN
    IF current_setting('fsync') <> 'on' THEN
        RAISE EXCEPTION USING ERRCODE = 'DL004',
            MESSAGE = 'lockdb runs with fsync off: a grant it acknowledged could be lost in a crash and its token issued again; set fsync = on and reload';
    END IF;
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
