-- needs_attention: a payout that an executor could not finish because of a
-- refusal no retry can change (a fence point holding a token above the
-- current lease, a rail reference recorded for another payout, ...). The
-- executor records why (attention_reason, a stable code of
-- functions/paymentresource/api) and stops redelivering it; a person or
-- the reconciler resolves it with a fenced result.
--
-- payout_transition.reason carries the reason on the row that entered
-- needs_attention. payout_transition.claims coalesces re-claims: consecutive
-- claimed -> claimed transitions by new tokens are one row, showing the
-- latest token, owner and time, and counting the claims it stands for, so
-- that redeliveries cannot grow a payout's history without bound.

-- +goose Up
ALTER TABLE payout DROP CONSTRAINT payout_state_known;
ALTER TABLE payout ADD CONSTRAINT payout_state_known
    CHECK (state IN ('pending', 'claimed', 'submitted', 'acknowledged', 'declined', 'posted', 'ambiguous', 'needs_attention'));
ALTER TABLE payout ADD COLUMN attention_reason text NULL
    CONSTRAINT payout_attention_reason_format CHECK (attention_reason ~ '^[a-z][a-z0-9_]{0,63}$');
ALTER TABLE payout_transition ADD COLUMN reason text NULL;
ALTER TABLE payout_transition ADD COLUMN claims integer NOT NULL DEFAULT 1
    CONSTRAINT payout_transition_claims_positive CHECK (claims >= 1);
CREATE INDEX payout_needs_attention_idx ON payout (payout_id) WHERE state = 'needs_attention';
