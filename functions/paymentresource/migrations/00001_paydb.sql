-- paydb: accounts, payouts and their state history, the double-entry
-- ledger, the rail results already recorded, and the transactional outbox
-- of payment-resource.
--
-- No Down migration, on purpose: the fence columns of account and payout
-- are the high-water marks of fence point one. Dropping them would let a
-- stale lock holder (an old token) write again, which is the one thing this
-- database exists to refuse.

-- +goose Up
CREATE TABLE account (
    account_id            text        PRIMARY KEY,
    currency              char(3)     NOT NULL,          -- ISO 4217
    opening_balance_minor bigint      NOT NULL,          -- minor units
    balance_minor         bigint      NOT NULL,          -- minor units; may go negative (a rail ACK is a fact)
    fence                 bigint      NOT NULL DEFAULT 0, -- highest token that debited the account (strict)
    created_at            timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT account_id_nonempty CHECK (account_id <> ''),
    CONSTRAINT account_currency_iso CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT account_opening_nonnegative CHECK (opening_balance_minor >= 0),
    CONSTRAINT account_fence_nonnegative CHECK (fence >= 0)
);

CREATE TABLE payout (
    payout_id    text        PRIMARY KEY,
    account_id   text        NOT NULL REFERENCES account (account_id),
    amount_minor bigint      NOT NULL,
    currency     char(3)     NOT NULL,
    state        text        NOT NULL DEFAULT 'pending',
    fence        bigint      NOT NULL DEFAULT 0, -- highest token that wrote the row (non-strict)
    owner_id     text        NULL,               -- owner id of the last writer, for people
    rail_ref     text        NULL,               -- rail reference of the last result
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payout_id_nonempty CHECK (payout_id <> ''),
    CONSTRAINT payout_amount_positive CHECK (amount_minor > 0),
    CONSTRAINT payout_currency_iso CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT payout_state_known CHECK (state IN ('pending', 'claimed', 'submitted', 'acknowledged', 'declined', 'posted', 'ambiguous')),
    CONSTRAINT payout_fence_nonnegative CHECK (fence >= 0)
);
CREATE INDEX payout_account_idx ON payout (account_id);

CREATE TABLE payout_transition (
    transition_id bigserial   PRIMARY KEY,
    payout_id     text        NOT NULL REFERENCES payout (payout_id),
    from_state    text        NULL,   -- NULL: the payout was created
    to_state      text        NOT NULL,
    token         bigint      NULL,   -- NULL: creation carries no token
    owner_id      text        NULL,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX payout_transition_payout_idx ON payout_transition (payout_id, transition_id);

-- A rail result is a fact about one rail submission, keyed by the rail's
-- reference: recording the same fact again changes nothing.
CREATE TABLE rail_result (
    rail_ref    text        PRIMARY KEY,
    payout_id   text        NOT NULL REFERENCES payout (payout_id),
    outcome     text        NOT NULL,
    token       bigint      NOT NULL,
    owner_id    text        NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rail_result_ref_nonempty CHECK (rail_ref <> ''),
    CONSTRAINT rail_result_outcome_known CHECK (outcome IN ('ACK', 'DECLINE'))
);

CREATE TABLE ledger_txn (
    txn_id     bigserial   PRIMARY KEY,
    payout_id  text        NOT NULL REFERENCES payout (payout_id),
    kind       text        NOT NULL,
    rail_ref   text        NULL UNIQUE,
    token      bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ledger_txn_kind_known CHECK (kind IN ('payout_debit')),
    CONSTRAINT ledger_txn_debit_has_ref CHECK (kind <> 'payout_debit' OR rail_ref IS NOT NULL)
);
CREATE INDEX ledger_txn_payout_idx ON ledger_txn (payout_id);

CREATE TABLE ledger_entry (
    entry_id       bigserial PRIMARY KEY,
    txn_id         bigint    NOT NULL REFERENCES ledger_txn (txn_id),
    ledger_account text      NOT NULL, -- "account:{account_id}" or "rail:clearing"
    amount_minor   bigint    NOT NULL, -- signed: negative leaves the ledger account
    currency       char(3)   NOT NULL,
    CONSTRAINT ledger_entry_amount_nonzero CHECK (amount_minor <> 0)
);
CREATE INDEX ledger_entry_txn_idx ON ledger_entry (txn_id);
CREATE INDEX ledger_entry_account_idx ON ledger_entry (ledger_account);

CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    ordering_key text        NOT NULL,
    data         bytea       NOT NULL, -- the message body, published byte for byte
    attrs        jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz NULL      -- NULL: not yet acknowledged by the broker
);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;

COMMENT ON COLUMN account.fence IS 'Fence point one, strict: a debit needs a token greater than this; one debit per token.';
COMMENT ON COLUMN payout.fence IS 'Fence point one, non-strict: a write needs a token not lower than this, so one holder may make several steps.';
COMMENT ON TABLE outbox IS 'Transactional outbox: rows written with the payout, published at least once, in id order.';
