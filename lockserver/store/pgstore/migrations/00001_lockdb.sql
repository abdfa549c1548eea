-- lockdb: the lease table and the fencing-token sequence of pgstore.
--
-- No Down migration, on purpose: dropping fencing_token_seq would let tokens
-- start again at 1, below the high-water marks the fence points have
-- persisted, and every later holder would be fenced out (or, with a fence
-- point reset too, a stale holder let back in). Rows of lock_lease are
-- never deleted for the same reason: the row keeps the last token of its
-- key, and its existence makes every later grant draw its token after it
-- has won the row (see pgstore's acquire statement).

-- +goose Up
CREATE SEQUENCE fencing_token_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 CACHE 1 NO CYCLE;

CREATE TABLE lock_lease (
    lock_key      text        PRIMARY KEY,
    owner_id      text        NULL,     -- NULL: released or revoked
    fencing_token bigint      NOT NULL, -- token of the last grant of the key
    ttl_ms        bigint      NOT NULL, -- granted lease duration, milliseconds
    granted_at    timestamptz NOT NULL, -- clock_timestamp() of the last grant
    expires_at    timestamptz NULL,     -- NULL: released or revoked
    CONSTRAINT lock_lease_key_nonempty CHECK (lock_key <> ''),
    CONSTRAINT lock_lease_owner_nonempty CHECK (owner_id <> ''),
    CONSTRAINT lock_lease_token_positive CHECK (fencing_token > 0),
    CONSTRAINT lock_lease_ttl_positive CHECK (ttl_ms > 0),
    CONSTRAINT lock_lease_free_together CHECK ((owner_id IS NULL) = (expires_at IS NULL)),
    CONSTRAINT lock_lease_expires_after_grant CHECK (expires_at IS NULL OR expires_at > granted_at)
);

COMMENT ON TABLE lock_lease IS 'One row per lock key ever granted; rows are never deleted (they remember the last fencing token).';
COMMENT ON SEQUENCE fencing_token_seq IS 'Fencing tokens of every key: unique and increasing, not dense (every acquire attempt draws one).';
