package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The fence: raise the account's high-water to the token only if the token
// is greater (strict). On a conflict PostgreSQL locks the existing row
// before it evaluates the WHERE clause, whether or not it then updates, so
// concurrent submissions for one account are serialised on that row and
// each compares with the latest committed high-water. Zero rows: stale.
const sqlAdvanceStrict = `
INSERT INTO rail_high_water (account_id, high_water, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (account_id) DO UPDATE
   SET high_water = EXCLUDED.high_water, updated_at = now()
 WHERE rail_high_water.high_water < EXCLUDED.high_water
RETURNING high_water`

// With the kill switch off: no check, but the high-water still becomes the
// greatest token seen, so it stays meaningful when fencing is back on.
const sqlAdvanceUnfenced = `
INSERT INTO rail_high_water (account_id, high_water, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (account_id) DO UPDATE
   SET high_water = GREATEST(rail_high_water.high_water, EXCLUDED.high_water), updated_at = now()
RETURNING high_water`

// Read after a refused advance, inside the same transaction: the row is
// locked by the INSERT's conflict check, so this is the value that refused.
const sqlHighWater = `SELECT high_water FROM rail_high_water WHERE account_id = $1`

const sqlInsertAttempt = `
INSERT INTO rail_attempt (payout_id, account_id, token, owner_id, amount_minor, currency, state, finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::text, CASE WHEN $7::text = 'fenced' THEN now() END)
RETURNING attempt_id`

const sqlFinishAttempt = `
UPDATE rail_attempt
   SET state = $2, rail_ref = NULLIF($3, ''), finished_at = now()
 WHERE attempt_id = $1 AND state = 'forwarding'`

const sqlAttempts = `
SELECT attempt_id, payout_id, account_id, amount_minor, currency, token, owner_id, state,
       COALESCE(rail_ref, ''), created_at, finished_at
  FROM rail_attempt
 WHERE payout_id = $1
 ORDER BY attempt_id`

// admit runs the fence and records the attempt in one transaction, before
// the rail is called. It returns the attempt id and nil when the
// submission may be forwarded (recorded 'forwarding'); the id of the
// 'fenced' attempt and an error wrapping ErrFencedOut and a
// fencing.Refusal when the token is stale (that refusal is committed);
// ErrUnavailable or another error when raildb failed (nothing known to be
// recorded).
func (p *Proxy) admit(ctx context.Context, req SubmitRequest, token int64, owner string, lg *slog.Logger) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
	defer cancel()
	var (
		attemptID int64
		refusal   *fencing.Refusal
	)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		state := StateForwarding
		var hw int64
		if p.cfg.FencingDisabled {
			if err := tx.QueryRow(ctx, sqlAdvanceUnfenced, req.AccountID, token).Scan(&hw); err != nil {
				return fmt.Errorf("advance high-water: %w", err)
			}
			if hw > token {
				lg.Warn("stale token forwarded: fencing is disabled", "event", "fencing_bypassed", "highestToken", hw)
			}
		} else {
			err := tx.QueryRow(ctx, sqlAdvanceStrict, req.AccountID, token).Scan(&hw)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				if err := tx.QueryRow(ctx, sqlHighWater, req.AccountID).Scan(&hw); err != nil {
					return fmt.Errorf("read high-water: %w", err)
				}
				state = StateFenced
				refusal = &fencing.Refusal{Resource: "rail", ResourceID: req.AccountID, PresentedToken: token, HighestToken: hw, Owner: owner}
			case err != nil:
				return fmt.Errorf("advance high-water: %w", err)
			}
		}
		err := tx.QueryRow(ctx, sqlInsertAttempt, req.PayoutID, req.AccountID, token, owner,
			req.AmountMinor, req.Currency, state).Scan(&attemptID)
		if err != nil {
			return fmt.Errorf("record attempt: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, dbError("fence", err)
	}
	if refusal != nil {
		return attemptID, fmt.Errorf("%w: %w", ErrFencedOut, *refusal)
	}
	return attemptID, nil
}

// finish records the end of a forwarded attempt: state acked, declined (with
// the rail's reference) or ambiguous (railRef ""). It runs even when the
// caller has gone (ctx is detached from the request).
func (p *Proxy) finish(ctx context.Context, attemptID int64, state, railRef string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, sqlFinishAttempt, attemptID, state, railRef)
	if err != nil {
		return dbError("finish attempt", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("railproxy: finish attempt %d: no forwarding attempt with that id", attemptID)
	}
	return nil
}

// highWater returns the account's high-water, ErrNotFound when the account
// has none.
func (p *Proxy) highWater(ctx context.Context, account string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
	defer cancel()
	var hw int64
	err := p.pool.QueryRow(ctx, sqlHighWater, account).Scan(&hw)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: no high-water for account %q (no token accepted yet)", ErrNotFound, account)
	}
	if err != nil {
		return 0, dbError("read high-water", err)
	}
	return hw, nil
}

// attempts returns the attempts of a payout, oldest first.
func (p *Proxy) attempts(ctx context.Context, payout string) ([]Attempt, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DBTimeout)
	defer cancel()
	rows, err := p.pool.Query(ctx, sqlAttempts, payout)
	if err != nil {
		return nil, dbError("list attempts", err)
	}
	out := []Attempt{}
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.AttemptID, &a.PayoutID, &a.AccountID, &a.AmountMinor, &a.Currency, &a.Token,
			&a.OwnerID, &a.State, &a.RailRef, &a.CreatedAt, &a.FinishedAt); err != nil {
			rows.Close()
			return nil, dbError("list attempts", err)
		}
		a.CreatedAt = a.CreatedAt.UTC()
		if a.FinishedAt != nil {
			t := a.FinishedAt.UTC()
			a.FinishedAt = &t
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list attempts", err)
	}
	return out, nil
}

// dbError classifies a raildb failure: a server error that says the
// database cannot serve now (connection, resources, shutdown, lock or
// serialization conflict) and every client-side failure (dial, timeout,
// broken connection) wrap ErrUnavailable; any other server error is a bug
// (a violated constraint, a bad statement) and stays unwrapped (500).
func dbError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), strings.HasPrefix(pgErr.Code, "40"),
			strings.HasPrefix(pgErr.Code, "53"), strings.HasPrefix(pgErr.Code, "57"):
			return fmt.Errorf("%w: raildb %s: %v", ErrUnavailable, op, err)
		}
		return fmt.Errorf("railproxy: raildb %s: %w", op, err)
	}
	return fmt.Errorf("%w: raildb %s: %v", ErrUnavailable, op, err)
}
