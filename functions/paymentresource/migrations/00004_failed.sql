-- failed: a final state for a payout whose rail submission never reached
-- the rail, as a reconciliation found from the rail's own record past
-- rail-proxy's abandon threshold (rail-proxy's receipt with outcome NONE).
-- No money moved and none will: rail-proxy never forwards the payout
-- again. The payout has no debit, like a declined one.
--
-- No Down migration: a failed row would violate the old check.

-- +goose Up
ALTER TABLE payout DROP CONSTRAINT payout_state_known;
ALTER TABLE payout ADD CONSTRAINT payout_state_known
    CHECK (state IN ('pending', 'claimed', 'submitted', 'acknowledged', 'declined', 'posted', 'ambiguous', 'needs_attention', 'failed'));
CREATE INDEX payout_ambiguous_idx ON payout (payout_id) WHERE state = 'ambiguous';
