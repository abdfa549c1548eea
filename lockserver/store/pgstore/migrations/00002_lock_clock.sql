-- lockdb: lock_clock(), the one clock every pgstore statement decides expiry by.
--
-- It returns clock_timestamp(): the database host's wall clock, read anew at
-- each call (now() would be frozen at the start of the transaction). Having
-- one named function instead of clock_timestamp() spelled in every statement
-- gives tests a seam: a test replaces it in its own database (CREATE OR
-- REPLACE FUNCTION) to step lockdb's clock forward or backward, and the
-- statements follow.
--
-- VOLATILE, like clock_timestamp(): the planner must call it every time and
-- never fold it into a constant. A LANGUAGE sql function whose body is one
-- SELECT of an expression no more volatile than the function is inlined by
-- the planner, so the statements run exactly as if they named
-- clock_timestamp() themselves (EXPLAIN VERBOSE shows clock_timestamp()).
-- Replacing the function invalidates the cached plans that inlined it.
--
-- Expiry by a wall clock requires that lockdb's host clock is disciplined by
-- slewing only, never stepped while leases are live: see pgstore's package
-- doc and docs/runbooks/lockdb-clock.md.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION lock_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
-- +goose StatementEnd

COMMENT ON FUNCTION lock_clock() IS 'The clock of lease expiry: clock_timestamp(); tests replace it to step the clock.';
