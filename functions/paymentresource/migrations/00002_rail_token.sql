-- The token that reached the rail. A holder may report the outcome of a
-- submission that an earlier holder made (rail-proxy refuses to send a
-- payout twice and names the submission that went): the payout's fence
-- then moves to the reporter's token, and rail_token keeps the token of
-- the submission the rail actually received, so that the books and
-- rail-proxy's attempts can be matched.

-- +goose Up
ALTER TABLE payout ADD COLUMN rail_token bigint NULL
    CONSTRAINT payout_rail_token_positive CHECK (rail_token > 0);
ALTER TABLE rail_result ADD COLUMN rail_token bigint NULL
    CONSTRAINT rail_result_rail_token_positive CHECK (rail_token > 0);
