-- lockdb: drop lock_lease_expires_after_grant (expires_at > granted_at).
--
-- That CHECK held only while lockdb's clock never went back. A renewal sets
-- expires_at to lock_clock() + TTL; after the host clock is stepped back by
-- more than the time since the grant plus one TTL, that lies before
-- granted_at, the CHECK refused the renewal, and lock-server answered 500
-- for a live lease (found with storetest's BackwardClockStepAnswersNormally).
-- A backward step is an operational fault to be reported (pgstore logs
-- lockdb_clock_stepped; see docs/runbooks/lockdb-clock.md), not a reason to
-- refuse a holder. Nothing reads granted_at to decide anything; it records
-- lock_clock() at the last grant, as read then.
--
-- No Down: putting the CHECK back could fail on rows written since.

-- +goose Up
ALTER TABLE lock_lease DROP CONSTRAINT lock_lease_expires_after_grant;
