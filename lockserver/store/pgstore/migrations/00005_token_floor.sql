-- lockdb: every token is drawn by lockdb_draw_token, which refuses a draw
-- that a rollback of the token source could have produced.
--
-- Two checks, both in the granting statement (pgstore's guard.go says why):
--   * the key's row: a draw at or below the token the key's row already
--     holds means the sequence went back while the row did not. SQLSTATE
--     DL001, the restore guard's refusal, for as long as the sequence is
--     not above the row ("lockctl advance" moves it past).
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

-- lockdb_draw_token(above) returns nextval('fencing_token_seq'), or raises
-- DL001 when the value is not above `above` (the key's row's token, 0 for
-- a new key) and DL002 when it is more than a second behind the clock.
-- It takes the guard's advisory lock shared, as lockdb_check_identity
-- does, so no draw runs while lockdb_catch_up or an advance moves the
-- sequence.
-- +goose StatementBegin
CREATE FUNCTION lockdb_draw_token(above bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'6c6f636b6964'::bigint);
    v := nextval('fencing_token_seq');
    IF v <= above THEN
        RAISE EXCEPTION USING ERRCODE = 'DL001',
            MESSAGE = format('fencing_token_seq went back: it gave %s, and the key''s row already holds token %s', v, above);
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
-- flight while it reads and sets the sequence. It refuses a clock beyond
-- 2^53 - 1 microseconds (year 2255): a clock that far ahead is wrong, and
-- tokens must stay exact in JSON. It returns the sequence's value.
-- +goose StatementBegin
CREATE FUNCTION lockdb_catch_up() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    f bigint;
    cur bigint;
BEGIN
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
