-- lockdb: every token is drawn by lockdb_draw_token, which refuses a draw
-- that a rollback of the token source could have produced.
--
-- Two checks, both in the granting statement (pgstore's guard.go says why):
--   * the rows: a draw at or below the token the key's row holds, or the
--     largest token of any row, means the sequence went back while the
--     rows did not. SQLSTATE DL001, the restore guard's refusal, until
--     "lockctl advance" moves the sequence past them.
--   * lockdb's clock: the sequence is kept no further than one second
--     behind lock_clock() in microseconds since 1970. A draw further
--     behind raises DL002; pgstore then runs lockdb_catch_up() and draws
--     again. A restore, a copied-back data directory or an ALTER SEQUENCE
--     leaves the sequence behind the clock by however long ago the state
--     it went back to was written, so the next draw lands above every
--     token issued before the rollback, on every lock-server at once.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION lockdb_clock_floor() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT floor(extract(epoch FROM lock_clock()) * 1000000)::bigint
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION lockdb_clock_floor() IS 'lock_clock() in whole microseconds since 1970: the value the token sequence is kept near.';

-- lockdb_draw_token(above) returns nextval('fencing_token_seq'). It
-- raises DL003 when the value is past 2^53 - 1 (tokens must stay exact in
-- JSON), DL001 when it is not above `above` (the key's row's token, 0 for
-- a new key) or not above the largest token any row held before the draw
-- (the sequence went back while the rows did not), and DL002 when it is
-- more than a second behind the clock. The largest token is read before
-- nextval: every row committed by then drew its token earlier, so only a
-- sequence that went back can give a value at or below it. It takes the
-- guard's advisory lock shared, as lockdb_check_identity does, so no draw
-- runs while lockdb_catch_up or an advance moves the sequence.
CREATE INDEX lock_lease_fencing_token ON lock_lease (fencing_token);

-- +goose StatementBegin
CREATE FUNCTION lockdb_draw_token(above bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    highest bigint;
    v bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'6c6f636b6964'::bigint);
    SELECT coalesce(max(fencing_token), 0) INTO highest FROM lock_lease;
    v := nextval('fencing_token_seq');
    IF v > 9007199254740991 THEN
        RAISE EXCEPTION USING ERRCODE = 'DL003',
            MESSAGE = format('fencing_token_seq gave %s, past the largest token (2^53 - 1)', v);
    END IF;
    IF v <= above OR v <= highest THEN
        RAISE EXCEPTION USING ERRCODE = 'DL001',
            MESSAGE = format('fencing_token_seq went back: it gave %s, and token %s was already granted', v, GREATEST(above, highest));
    END IF;
    IF v < lockdb_clock_floor() - 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'DL002',
            MESSAGE = format('fencing_token_seq (%s) is more than a second behind lockdb''s clock (%s us)', v, lockdb_clock_floor());
    END IF;
    RETURN v;
END
$$;
-- +goose StatementEnd

-- lockdb_catch_up() moves the sequence up to the clock floor, never down,
-- holding the guard's advisory lock exclusively so that no draw is in
-- flight while it reads and sets the sequence. When another caller has
-- already moved it (every grant in flight when the sequence fell behind
-- asks at once), it returns without taking the lock. It refuses a clock beyond
-- 2^53 - 1 microseconds (year 2255): a clock that far ahead is wrong, and
-- tokens must stay exact in JSON. It returns the sequence's value.
-- +goose StatementBegin
CREATE FUNCTION lockdb_catch_up() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    f bigint;
    cur bigint;
BEGIN
    SELECT last_value INTO cur FROM fencing_token_seq;
    IF cur >= lockdb_clock_floor() - 1000000 THEN
        RETURN cur;
    END IF;
    PERFORM pg_advisory_xact_lock(x'6c6f636b6964'::bigint);
    f := lockdb_clock_floor();
    IF f > 9007199254740991 THEN
        RAISE EXCEPTION USING ERRCODE = 'DL003',
            MESSAGE = format('lockdb''s clock reads %s, past the largest token (2^53 - 1 us after 1970): fix the clock', lock_clock());
    END IF;
    SELECT last_value INTO cur FROM fencing_token_seq;
    IF cur >= f THEN
        RETURN cur;
    END IF;
    RETURN setval('fencing_token_seq', f);
END
$$;
-- +goose StatementEnd
