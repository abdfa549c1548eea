package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgerr"
	"github.com/jackc/pgx/v5"
)

// The fence, behind the restore guard (checkIdentitySQL: it raises when
// raildb was restored, and returns the token floor), in one statement: for
// a token above the floor, raise the account's high-water to the token
// only if the token is greater (strict). On a conflict PostgreSQL locks the
// existing row before it evaluates the WHERE clause, whether or not it
// then updates, so concurrent submissions for one account are serialised
// on that row and each compares with the latest committed high-water. It
// returns the floor and the new high-water: NULL when the token is at or
// below the floor or the fence refused it (nothing written then).
const sqlGuardedAdvance = `
WITH g AS MATERIALIZED (SELECT raildb_check_identity() AS floor),
hw AS (
INSERT INTO rail_high_water (account_id, high_water, updated_at)
SELECT $1::text, $2::bigint, now() FROM g WHERE $2::bigint > g.floor
ON CONFLICT (account_id) DO UPDATE
   SET high_water = EXCLUDED.high_water, updated_at = now()
 WHERE rail_high_water.high_water < EXCLUDED.high_water
RETURNING high_water)
SELECT g.floor, (SELECT high_water FROM hw) FROM g`

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
VALUES ($1, $2, $3, $4, $5, $6, $7::text, CASE WHEN $7::text <> 'forwarding' THEN now() END)
RETURNING attempt_id`

// sqlInsertForward is sqlInsertAttempt of a forwarding attempt and, in
// the same statement, sqlClaimPayout's first try: it returns the attempt
// id and whether the attempt became the payout's forward.
const sqlInsertForward = `
WITH a AS (
INSERT INTO rail_attempt (payout_id, account_id, token, owner_id, amount_minor, currency, state)
VALUES ($1, $2, $3, $4, $5, $6, 'forwarding')
RETURNING attempt_id),
c AS (
INSERT INTO rail_payout (payout_id, attempt_id) SELECT $1, attempt_id FROM a
ON CONFLICT (payout_id) DO NOTHING
RETURNING attempt_id)
SELECT a.attempt_id, EXISTS (SELECT 1 FROM c) FROM a`

// sqlAdmitAccepted is admit's plain accepted case in one statement, one
// round trip, one implicit transaction: the restore guard, the fence's
// strict advance above the floor, the forwarding attempt and the payout's
// rail_payout row, each written only from the row the step before
// returned. It returns the attempt id, or no row when nothing was written
// (token at or below the floor or the high-water, or the payout already
// forwarded as this statement's snapshot saw it). The rail_payout insert
// has no ON CONFLICT: a forward of the payout committed after that
// snapshot (found by the key check, which waits for an uncommitted one)
// fails the statement with a unique violation, so the advance and the
// attempt roll back with it. Past $7, rail-proxy's deadline for it, the
// statement fails (division by zero) when it has written its rows: no
// commit follows a send rail-proxy may have given up on.
//
// Why this answers as admitTx would, in READ COMMITTED where the whole
// statement reads one snapshot: no write here depends on that snapshot.
// The guard's function reads with snapshots of its own after taking its
// shared lock, held to the commit; ON CONFLICT locks and compares the
// latest committed high-water, waiting for an uncommitted advance, as
// sqlGuardedAdvance does, so of two tokens racing on one account only a
// strictly greater one advances, and a holder's resend (equal token)
// never does; the primary key of rail_payout decides one forward per
// payout on the latest committed rows, so of two submissions racing on
// one payout the later one fails and is answered by admitTx. The
// snapshot's only use, the NOT EXISTS, can only make the statement write
// nothing: then, as after any failure of the statement, raildb keeps no
// trace of it but a skipped attempt id, and admitTx runs the submission
// afresh.
const sqlAdmitAccepted = `
WITH g AS MATERIALIZED (SELECT raildb_check_identity() AS floor),
hw AS (
INSERT INTO rail_high_water (account_id, high_water, updated_at)
SELECT $2::text, $3::bigint, now() FROM g
 WHERE $3::bigint > g.floor
   AND NOT EXISTS (SELECT 1 FROM rail_payout WHERE payout_id = $1::text)
ON CONFLICT (account_id) DO UPDATE
   SET high_water = EXCLUDED.high_water, updated_at = now()
 WHERE rail_high_water.high_water < EXCLUDED.high_water
RETURNING high_water),
a AS (
INSERT INTO rail_attempt (payout_id, account_id, token, owner_id, amount_minor, currency, state)
SELECT $1::text, $2::text, $3::bigint, $4::text, $5::bigint, $6::text, 'forwarding' FROM hw
RETURNING attempt_id),
c AS (
INSERT INTO rail_payout (payout_id, attempt_id) SELECT $1::text, attempt_id FROM a
RETURNING attempt_id)
SELECT attempt_id / (clock_timestamp() < $7::timestamptz)::int FROM c`

const (
	// payoutForwardedConstraint is rail_payout's primary key, whose
	// unique violation fails sqlAdmitAccepted when the payout went
	// meanwhile.
	payoutForwardedConstraint = "rail_payout_pkey"
)

// acceptBudget bounds how long after its sending sqlAdmitAccepted may
// still commit: a statement raildb reads only after a freeze, when
// rail-proxy has answered 503 and the submission will be sent again, must
// record nothing. With StallAfter the budget is at most half of it: the
// stall breaker cuts a call as early as StallAfter after it started (when
// raildb is already marked stalled, or the ping fails at once), and the
// other half is the margin for the hosts' clocks and for the commit after
// the check. The call's own deadline bounds it too. A slower admission
// (long lock waits) fails it and runs admitTx instead.
const acceptBudget = time.Second

// acceptDeadline is sqlAdmitAccepted's deadline ($7) for a statement sent
// at now (see acceptBudget).
func (p *Proxy) acceptDeadline(ctx context.Context, now time.Time) time.Time {
	budget := acceptBudget
	if s := p.cfg.StallAfter; s > 0 {
		budget = min(budget, s/2)
	}
	deadline := now.Add(budget)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return deadline
}

// The payout's one way to the rail: the primary key of rail_payout admits
// one attempt per payout. A concurrent transaction inserting the same
// payout makes this one wait for its outcome, so two submissions of one
// payout cannot both pass, whatever their tokens and accounts.
const sqlClaimPayout = `
INSERT INTO rail_payout (payout_id, attempt_id) VALUES ($1, $2)
ON CONFLICT (payout_id) DO NOTHING`

// The attempt that went to the rail for a payout, locked so that marking it
// abandoned cannot race the proxy that is recording its answer. abandoned
// is true for an attempt still forwarding after the longest time a live
// rail-proxy can take to call the rail and record the answer ($2, ms).
const sqlForwardedAttempt = `
SELECT a.attempt_id, a.payout_id, a.account_id, a.amount_minor, a.currency, a.token, a.owner_id, a.state,
       COALESCE(a.rail_ref, ''), a.created_at, a.finished_at,
       a.state = 'forwarding' AND a.created_at < now() - $2::bigint * interval '1 millisecond'
  FROM rail_payout p JOIN rail_attempt a USING (attempt_id)
 WHERE p.payout_id = $1
   FOR UPDATE OF a`

// Marks an attempt finished without forwarding (duplicate), or an
// abandoned forwarding attempt ambiguous.
const sqlSetAttemptState = `
UPDATE rail_attempt SET state = $2, finished_at = now() WHERE attempt_id = $1`

// Records the rail's answer to a forwarded attempt's own call: while the
// attempt is forwarding, or ambiguous because a later submission of the
// payout found it past the abandon threshold (abandoned, while its call
// was still at the rail). The call's own answer is the truth about that
// attempt, so it replaces "unknown"; a reconciliation that settled it
// first (stop order, then the rail's record) has written the same fact,
// and a final state is never overwritten.
const sqlFinishAttempt = `
UPDATE rail_attempt
   SET state = $2, rail_ref = NULLIF($3, ''), finished_at = now()
 WHERE attempt_id = $1 AND state IN ('forwarding', 'ambiguous')`

// A forwarded attempt the rail certainly did not take: recorded not_sent,
// only if still forwarding (an abandonment or a reconciliation may have
// recorded it meanwhile, and then it stays the payout's forward).
const sqlNotSent = `
UPDATE rail_attempt SET state = $2, finished_at = now()
 WHERE attempt_id = $1 AND state = 'forwarding'`

// Releases the payout's forward held by a not_sent attempt, in the same
// transaction: a later submission of the payout may be forwarded.
const sqlReleasePayout = `
DELETE FROM rail_payout WHERE payout_id = $1 AND attempt_id = $2`

// Whether an earlier attempt of the payout, on the account, carried the
// token past the fence: a submission whose token equals the high-water
// mark is then the same holder's resend of its own submission, not a stale
// one. A 'fenced' row is the fence's own refusal, an audit row that must
// decide nothing later: counting it let the second try of a token on a
// payout it was refused for through to the rail (one grant, two payouts;
// TestARefusedSubmissionDoesNotMakeTheNextOneOwn).
const sqlOwnEarlierAttempt = `
SELECT EXISTS (SELECT 1 FROM rail_attempt WHERE payout_id = $1 AND account_id = $2 AND token = $3 AND state <> 'fenced')`

const sqlAttempts = `
SELECT attempt_id, payout_id, account_id, amount_minor, currency, token, owner_id, state,
       COALESCE(rail_ref, ''), created_at, finished_at
  FROM rail_attempt
 WHERE payout_id = $1
 ORDER BY attempt_id`

// admit runs the checks made before the rail and records the attempt, in
// one transaction, in this order: the restore guard (ErrRestored, nothing
// recorded) and the token floor; the fence (the account's high-water is
// raised to the token, or ErrFencedOut); one forward per payout (the
// attempt becomes the payout's rail_payout row, or ErrAlreadySubmitted
// with the earlier attempt). A fresh token raises the high-water even when
// its payout already went. A token equal to the high-water passes only as
// its holder's resend of the same payout. Each refusal is committed as one
// audit row ('fenced' or 'duplicate'). It returns the attempt id and nil
// (recorded 'forwarding'), the attempt id and an error wrapping
// ErrFencedOut and a fencing.Refusal or ErrAlreadySubmitted and an
// *AlreadySubmitted, 0 and ErrRestored, or ErrUnavailable or another error
// when raildb failed (nothing known to be recorded). With fencing on it
// first tries the plain accepted case in one round trip
// (sqlAdmitAccepted); every other case, and fencing off, runs admitTx.
func (p *Proxy) admit(ctx context.Context, req api.SubmitRequest, token int64, owner string, lg *slog.Logger) (_ int64, err error) {
	ctx, done := p.dbCall(ctx)
	defer func() { done(err) }()
	if !p.cfg.FencingDisabled {
		id, err := p.admitAccepted(ctx, req, token, owner)
		if errors.Is(err, ErrRestored) {
			return 0, err
		}
		if err != nil {
			return 0, dbError("fence", err)
		}
		if id != 0 {
			return id, nil
		}
	}
	return p.admitTx(ctx, req, token, owner, lg)
}

// admitAccepted runs sqlAdmitAccepted: the attempt id when the submission
// was admitted and recorded forwarding, 0 when it wrote nothing and
// admitTx must decide, an error wrapping ErrRestored, or raildb's error.
func (p *Proxy) admitAccepted(ctx context.Context, req api.SubmitRequest, token int64, owner string) (int64, error) {
	var id int64
	err := p.pool.QueryRow(ctx, sqlAdmitAccepted, req.PayoutID, req.AccountID, token, owner,
		req.AmountMinor, req.Currency, p.acceptDeadline(ctx, time.Now())).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows),
		pgerr.Is(err, pgerr.UniqueViolation, payoutForwardedConstraint),
		pgerr.Is(err, pgerr.DivisionByZero, ""):
		return 0, nil
	case err != nil:
		if r := restored(err); errors.Is(r, ErrRestored) {
			return 0, r
		}
		return 0, fmt.Errorf("admit: %w", err)
	}
	return id, nil
}

// admitTx is admit in an explicit transaction, every case.
func (p *Proxy) admitTx(ctx context.Context, req api.SubmitRequest, token int64, owner string, lg *slog.Logger) (int64, error) {
	var (
		attemptID int64
		refusal   *fencing.Refusal
		dup       *AlreadySubmitted
	)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		// 0. The restore guard (guard.go): a restored raildb has forgotten
		// what it must know; refuse before anything is recorded. With
		// fencing on, the guard and the fence's advance are one statement
		// (sqlGuardedAdvance).
		var (
			floor    int64
			advanced *int64
		)
		if p.cfg.FencingDisabled {
			if err := tx.QueryRow(ctx, checkIdentitySQL).Scan(&floor); err != nil {
				return restored(err)
			}
		} else if err := tx.QueryRow(ctx, sqlGuardedAdvance, req.AccountID, token).Scan(&floor, &advanced); err != nil {
			if r := restored(err); errors.Is(r, ErrRestored) {
				return r
			}
			return fmt.Errorf("advance high-water: %w", err)
		}
		state := api.StateForwarding
		var hw int64
		switch {
		case token <= floor && !p.cfg.FencingDisabled:
			// The token floor of the last recovery: a token at or below
			// it may be a holder's from before the restore, whatever the
			// account's high-water says (or whether it has one).
			err := tx.QueryRow(ctx, sqlHighWater, req.AccountID).Scan(&hw)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read high-water: %w", err)
			}
			state = api.StateFenced
			refusal = &fencing.Refusal{Resource: "rail", ResourceID: req.AccountID, PresentedToken: token, HighestToken: max(hw, floor), Owner: owner}
		case p.cfg.FencingDisabled:
			if token <= floor {
				lg.WarnContext(ctx, "token at or below the restore's token floor forwarded: fencing is disabled", "event", api.EventFencingBypassed, "tokenFloor", floor)
			}
			if err := tx.QueryRow(ctx, sqlAdvanceUnfenced, req.AccountID, token).Scan(&hw); err != nil {
				return fmt.Errorf("advance high-water: %w", err)
			}
			if hw > token {
				lg.WarnContext(ctx, "stale token forwarded: fencing is disabled", "event", api.EventFencingBypassed, "highestToken", hw)
			}
		case advanced == nil:
			// The fence refused the token (sqlGuardedAdvance wrote nothing).
			if err := tx.QueryRow(ctx, sqlHighWater, req.AccountID).Scan(&hw); err != nil {
				return fmt.Errorf("read high-water: %w", err)
			}
			own := false
			if hw == token {
				// The high-water is this very token: no newer holder
				// has been seen. If this payout already came with it,
				// this is its holder's resend (a token names one
				// grant), answered by the one-forward check below,
				// never as stale.
				if err := tx.QueryRow(ctx, sqlOwnEarlierAttempt, req.PayoutID, req.AccountID, token).Scan(&own); err != nil {
					return fmt.Errorf("read earlier attempts: %w", err)
				}
			}
			if !own {
				state = api.StateFenced
				refusal = &fencing.Refusal{Resource: "rail", ResourceID: req.AccountID, PresentedToken: token, HighestToken: hw, Owner: owner}
			}
		}
		if state != api.StateForwarding {
			err := tx.QueryRow(ctx, sqlInsertAttempt, req.PayoutID, req.AccountID, token, owner,
				req.AmountMinor, req.Currency, state).Scan(&attemptID)
			if err != nil {
				return fmt.Errorf("record attempt: %w", err)
			}
			return nil
		}
		var claimed bool
		err := tx.QueryRow(ctx, sqlInsertForward, req.PayoutID, req.AccountID, token, owner,
			req.AmountMinor, req.Currency).Scan(&attemptID, &claimed)
		if err != nil {
			return fmt.Errorf("record attempt: %w", err)
		}
		dup, err = p.claimPayout(ctx, tx, req.PayoutID, attemptID, claimed, lg)
		return err
	})
	if errors.Is(err, ErrRestored) {
		return 0, err
	}
	if err != nil {
		return 0, dbError("fence", err)
	}
	if refusal != nil {
		return attemptID, fmt.Errorf("%w: %w", ErrFencedOut, *refusal)
	}
	if dup != nil {
		return attemptID, fmt.Errorf("%w: %w", ErrAlreadySubmitted, dup)
	}
	return attemptID, nil
}

// claimPayout makes attemptID the payout's one forward, inside admit's
// transaction; claimed says whether sqlInsertForward's first try already
// did. When an earlier attempt already holds the payout it
// returns that attempt (after marking it ambiguous if it was abandoned
// while forwarding) and records attemptID as 'duplicate', unless fencing
// is disabled: then the duplicate is forwarded anyway, as the experiment
// needs, and nil is returned. A forward released (not_sent) while it is
// being read is no earlier submission: the payout is claimed again, at
// most maxClaimTries times (then an error wrapping ErrUnavailable).
func (p *Proxy) claimPayout(ctx context.Context, tx pgx.Tx, payoutID string, attemptID int64, claimed bool, lg *slog.Logger) (*AlreadySubmitted, error) {
	var (
		first     api.Attempt
		abandoned bool
	)
	for try := 1; ; try++ {
		if try > 1 {
			tag, err := tx.Exec(ctx, sqlClaimPayout, payoutID, attemptID)
			if err != nil {
				return nil, fmt.Errorf("claim payout: %w", err)
			}
			claimed = tag.RowsAffected() == 1
		}
		if claimed {
			return nil, nil
		}
		err := tx.QueryRow(ctx, sqlForwardedAttempt, payoutID, p.abandonAfter().Milliseconds()).Scan(
			&first.AttemptID, &first.PayoutID, &first.AccountID, &first.AmountMinor, &first.Currency, &first.Token,
			&first.OwnerID, &first.State, &first.RailRef, &first.CreatedAt, &first.FinishedAt, &abandoned)
		// The forward that made the insert conflict may have been released
		// (notSent) before this read: the read then finds no forward (a
		// new snapshot), or, having waited for notSent's row lock, the
		// attempt as not_sent, which no longer holds the payout. Neither
		// is an earlier submission: claim the payout again (the release is
		// committed by now). Refusing it PAYOUT_ALREADY_SUBMITTED with a
		// not_sent attempt made the executor report AMBIGUOUS, and the
		// reconciler failed a payout nothing held
		// (TestAForwardReleasedWhileBeingReadIsNotAnAlreadySubmittedPayout).
		released := errors.Is(err, pgx.ErrNoRows) || err == nil && first.State == api.StateNotSent
		if !released {
			if err != nil {
				return nil, fmt.Errorf("read the payout's forwarded attempt: %w", err)
			}
			break
		}
		if try == maxClaimTries {
			return nil, fmt.Errorf("%w: the forward of payout %s was released %d times while this submission claimed it", ErrUnavailable, payoutID, try)
		}
	}
	if abandoned {
		// No live rail-proxy is still calling the rail for it: its
		// outcome is unknown for good, and says so.
		if _, err := tx.Exec(ctx, sqlSetAttemptState, first.AttemptID, api.StateAmbiguous); err != nil {
			return nil, fmt.Errorf("mark abandoned attempt ambiguous: %w", err)
		}
		lg.ErrorContext(ctx, "a forwarded attempt never recorded the rail's answer; marked ambiguous: reconcile with the rail",
			"event", api.EventAttemptAbandoned, "abandonedAttemptId", first.AttemptID, "abandonedToken", first.Token)
		first.State = api.StateAmbiguous
	}
	if p.cfg.FencingDisabled {
		lg.WarnContext(ctx, "second submission of a payout forwarded: fencing is disabled", "event", api.EventFencingBypassed,
			"firstAttemptId", first.AttemptID, "firstToken", first.Token)
		return nil, nil
	}
	if _, err := tx.Exec(ctx, sqlSetAttemptState, attemptID, api.StateDuplicate); err != nil {
		return nil, fmt.Errorf("record duplicate attempt: %w", err)
	}
	first.CreatedAt = first.CreatedAt.UTC()
	if first.FinishedAt != nil {
		t := first.FinishedAt.UTC()
		first.FinishedAt = &t
	}
	return &AlreadySubmitted{First: first}, nil
}

// maxClaimTries bounds how often claimPayout claims a payout whose forward
// was released while it read it; each retry needs another submission of
// the payout forwarded and released meanwhile.
const maxClaimTries = 5

// abandonAfter is the longest a forwarded attempt can stay 'forwarding' in
// a live rail-proxy of this configuration: the admit transaction, the rail
// call and the recording of its answer, plus a second of slack. Every
// rail-proxy sharing raildb must have timeouts no longer than these.
func (p *Proxy) abandonAfter() time.Duration {
	return 2*p.cfg.DBTimeout + p.cfg.RailTimeout + time.Second
}

// finish records the end of a forwarded attempt: state acked, declined (with
// the rail's reference) or ambiguous (railRef ""). It runs even when the
// caller has gone (ctx is detached from the request).
func (p *Proxy) finish(ctx context.Context, attemptID int64, state api.State, railRef string) (err error) {
	ctx, cancel := p.dbCtx(ctx)
	defer cancel()
	defer func() { p.observe(ctx, err) }()
	tag, err := p.pool.Exec(ctx, sqlFinishAttempt, attemptID, state, railRef)
	if err != nil {
		return dbError("finish attempt", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("railproxy: finish attempt %d: no forwarding or ambiguous attempt with that id", attemptID)
	}
	return nil
}

// notSent records a forwarded attempt that the rail certainly did not take
// (state not_sent) and, in the same transaction, releases the payout's
// forward that it held, so that a later submission of the payout may go
// to the rail. It reports whether it did: false when the attempt was no
// longer forwarding (marked abandoned, or reconciled, meanwhile), and
// then it stays the payout's forward. Like finish, it runs even when the
// caller has gone.
func (p *Proxy) notSent(ctx context.Context, attemptID int64, payoutID string) (released bool, err error) {
	ctx, cancel := p.dbCtx(ctx)
	defer cancel()
	defer func() { p.observe(ctx, err) }()
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlNotSent, attemptID, api.StateNotSent)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, sqlReleasePayout, payoutID, attemptID); err != nil {
			return err
		}
		released = true
		return nil
	})
	if err != nil {
		return false, dbError("record not_sent attempt", err)
	}
	return released, nil
}

// highWater returns the account's high-water, ErrNotFound when the account
// has none.
func (p *Proxy) highWater(ctx context.Context, account string) (_ int64, err error) {
	ctx, done := p.dbCall(ctx)
	defer func() { done(err) }()
	var hw int64
	err = p.pool.QueryRow(ctx, sqlHighWater, account).Scan(&hw)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: no high-water for account %q (no token accepted yet)", ErrNotFound, account)
	}
	if err != nil {
		return 0, dbError("read high-water", err)
	}
	return hw, nil
}

// attempts returns the attempts of a payout, oldest first.
func (p *Proxy) attempts(ctx context.Context, payout string) (_ []api.Attempt, err error) {
	ctx, done := p.dbCall(ctx)
	defer func() { done(err) }()
	rows, err := p.pool.Query(ctx, sqlAttempts, payout)
	if err != nil {
		return nil, dbError("list attempts", err)
	}
	out := []api.Attempt{}
	for rows.Next() {
		var a api.Attempt
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
	if pgerr.Unavailable(err) {
		return fmt.Errorf("%w: raildb %s: %v", ErrUnavailable, op, err)
	}
	return fmt.Errorf("railproxy: raildb %s: %w", op, err)
}
