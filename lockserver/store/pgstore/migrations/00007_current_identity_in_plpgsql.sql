-- lockdb: lockdb_current_identity() in PL/pgSQL, so that the restore
-- guard's check, which every grant runs, no longer parses and plans a SQL
-- function's body at each call: PL/pgSQL keeps its plans for the session.
--
-- Same facts, same columns. What a kept plan must not keep is any of
-- them, and none is a constant of the plan: the system identifier is read
-- from pg_control, the timeline from the WAL insert position, and the
-- database OID looked up by name, at each execution; the sequence's name
-- is cast from text to regclass, a cast that runs at each execution too,
-- through the session's search_path as the SQL body's parse did. A
-- sequence recreated under a session that already ran the check (a
-- pg_restore --clean of it) is seen at the next grant: pgstore's
-- TestSequenceRestoredUnderALiveSessionRefusesGrants. Why a plan is safe
-- here, and what would not be: docs/adr/0016-restore-guard.md.
--
-- No Down: the SQL body would only make the check slower again.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lockdb_current_identity(
    OUT system_identifier bigint, OUT timeline_id bigint, OUT database_oid bigint, OUT sequence_oid bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    SELECT s.system_identifier,
           ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint,
           (SELECT oid FROM pg_database WHERE datname = current_database())::bigint,
           'fencing_token_seq'::text::regclass::oid::bigint
      INTO system_identifier, timeline_id, database_oid, sequence_oid
      FROM pg_control_system() s;
END
$$;
-- +goose StatementEnd
