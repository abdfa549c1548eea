-- One submission per payout reaches the rail. rail_payout holds, for each
-- payout that rail-proxy ever let through to the rail, the attempt that
-- went: its primary key is what makes a second forward of the same payout
-- impossible, whichever holder's token arrives first. The insert runs in
-- the same transaction as the high-water fence (see store.go, admit).
--
-- A refused second submission is recorded as a 'duplicate' attempt, like a
-- 'fenced' one: finished at once, never forwarded.
--
-- No Down migration: forgetting which payouts reached the rail would let a
-- second submission of one of them through.

-- +goose Up
CREATE TABLE rail_payout (
    payout_id  text        PRIMARY KEY,
    attempt_id bigint      NOT NULL UNIQUE REFERENCES rail_attempt (attempt_id),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Payouts forwarded before this migration: the first attempt that reached
-- or may have reached the rail stands for the payout.
INSERT INTO rail_payout (payout_id, attempt_id, created_at)
SELECT DISTINCT ON (payout_id) payout_id, attempt_id, created_at
  FROM rail_attempt
 WHERE state <> 'fenced'
 ORDER BY payout_id, attempt_id;

ALTER TABLE rail_attempt DROP CONSTRAINT rail_attempt_state_check;
ALTER TABLE rail_attempt ADD CONSTRAINT rail_attempt_state_check
    CHECK (state IN ('forwarding', 'acked', 'declined', 'ambiguous', 'fenced', 'duplicate'));

COMMENT ON TABLE rail_payout IS 'The one attempt per payout that rail-proxy let through to the rail; a later submission of the payout is refused PAYOUT_ALREADY_SUBMITTED and never forwarded.';
