-- not_sent: the outcome of a forwarded attempt that certainly never reached
-- the rail's record: the connection to the rail could not be established
-- (nothing was written), or the rail answered that it recorded nothing
-- (rail-stub's 503 RAIL_UNAVAILABLE). In the transaction that records it,
-- the attempt stops being the payout's row of rail_payout, so that a later
-- submission of the payout may be forwarded (see store.go, notSent). A
-- timeout or a broken connection after the request may have been written
-- stays 'ambiguous'.
--
-- No Down migration: a not_sent row would violate the old check.

-- +goose Up
ALTER TABLE rail_attempt DROP CONSTRAINT rail_attempt_state_check;
ALTER TABLE rail_attempt ADD CONSTRAINT rail_attempt_state_check
    CHECK (state IN ('forwarding', 'acked', 'declined', 'ambiguous', 'fenced', 'duplicate', 'not_at_rail', 'not_sent'));
