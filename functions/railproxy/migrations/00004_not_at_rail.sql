-- not_at_rail: the outcome a reconciliation records for a forwarded
-- attempt (forwarding or ambiguous, older than the abandon threshold) when
-- the rail's own record holds no submission under the payout's reference:
-- the forward never reached the rail and no money moved. The attempt stays
-- the payout's row of rail_payout, so the payout is still never forwarded
-- again.
--
-- No Down migration: a not_at_rail row would violate the old check.

-- +goose Up
ALTER TABLE rail_attempt DROP CONSTRAINT rail_attempt_state_check;
ALTER TABLE rail_attempt ADD CONSTRAINT rail_attempt_state_check
    CHECK (state IN ('forwarding', 'acked', 'declined', 'ambiguous', 'fenced', 'duplicate', 'not_at_rail'));
