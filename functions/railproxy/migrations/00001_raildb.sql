-- raildb: the fence of rail-proxy (one high-water mark per account) and the
-- audit of every submission attempt, recorded before the rail is called.
--
-- No Down migration, on purpose: dropping rail_high_water would forget the
-- highest token accepted per account, and a paused, stale lock holder would
-- be let through to the rail again. Rows of both tables are never deleted.

-- +goose Up
CREATE TABLE rail_high_water (
    account_id text        PRIMARY KEY,
    high_water bigint      NOT NULL CHECK (high_water > 0), -- highest fencing token accepted
    updated_at timestamptz NOT NULL,
    CONSTRAINT rail_high_water_account_nonempty CHECK (account_id <> '')
);

CREATE TABLE rail_attempt (
    attempt_id   bigserial   PRIMARY KEY,
    payout_id    text        NOT NULL,
    account_id   text        NOT NULL,
    token        bigint      NOT NULL,             -- the fencing token presented
    owner_id     text        NOT NULL DEFAULT '',  -- as the holder claimed it; logs and audit only
    amount_minor bigint      NOT NULL,             -- minor currency units
    currency     text        NOT NULL,             -- ISO 4217
    state        text        NOT NULL CHECK (state IN ('forwarding', 'acked', 'declined', 'ambiguous', 'fenced')),
    rail_ref     text        NULL,                 -- the rail's reference, when it answered
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz NULL,                 -- NULL while forwarding
    CONSTRAINT rail_attempt_token_positive CHECK (token > 0),
    CONSTRAINT rail_attempt_amount_positive CHECK (amount_minor > 0),
    CONSTRAINT rail_attempt_currency_iso CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT rail_attempt_finished_unless_forwarding CHECK ((state = 'forwarding') = (finished_at IS NULL)),
    CONSTRAINT rail_attempt_ref_iff_answered CHECK ((state IN ('acked', 'declined')) = (rail_ref IS NOT NULL))
);

CREATE INDEX rail_attempt_payout_idx ON rail_attempt (payout_id, attempt_id);
CREATE INDEX rail_attempt_account_token_idx ON rail_attempt (account_id, token);

COMMENT ON TABLE rail_high_water IS 'Fence point two: the highest fencing token accepted per account; a token not greater is refused before the rail is called.';
COMMENT ON TABLE rail_attempt IS 'Every submission attempt, recorded before the rail is called (attempt-before-forward); forwarding rows that never finish and ambiguous rows need reconciliation with the rail.';
