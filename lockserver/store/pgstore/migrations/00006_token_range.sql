-- lockdb: lockdb_draw_token refuses a draw beyond 2^53 - 1 (SQLSTATE DL003,
-- lockdb_catch_up's refusal of a clock past the range). Tokens must stay
-- exact in JSON; the sequence can pass 2^53 - 1 without the clock, after
-- lockctl advance to a value near it. Nothing is granted; the operator
-- must fix what moved the sequence there.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lockdb_draw_token(above bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'6c6f636b6964'::bigint);
    v := nextval('fencing_token_seq');
    IF v > 9007199254740991 THEN
        RAISE EXCEPTION USING ERRCODE = 'DL003',
            MESSAGE = format('fencing_token_seq gave %s, past the largest token (2^53 - 1)', v);
    END IF;
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

