package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The restore guard. Table lockdb_identity (migration 00004) records the
// instance tokens are issued on (system identifier, timeline, database OID,
// sequence OID), which every kind of restore changes. Every grant runs
// lockdb_check_identity() in the same round trip and implicit transaction,
// so a mismatch refuses the grant (store.ErrBackendRestored) before a
// token is drawn, as does lockdb running with fsync off (ErrNotDurable,
// migration 00006); the other methods issue no token and are not checked.
// promotion.go decides when a promoted standby's new timeline is accepted.
// A rollback that keeps all four facts is caught by the token draw
// (migration 00005, docs/adr/0002-token-floor-from-lockdbs-clock.md).

const (
	// checkIdentitySQL raises SQLSTATE sqlstateRestored on a mismatch.
	checkIdentitySQL = `SELECT lockdb_check_identity()`

	// sqlstateRestored is the SQLSTATE of lockdb_check_identity's refusal,
	// and of lockdb_draw_token's when a draw is not above a token a row
	// already holds.
	sqlstateRestored = "DL001"

	// sqlstateBehindClock is lockdb_draw_token's answer to a draw more
	// than a second behind lockdb's clock: run catchUpSQL and draw again.
	sqlstateBehindClock = "DL002"

	// sqlstateNotDurable is lockdb_check_identity's refusal of a grant
	// while lockdb runs with fsync off (migration 00006).
	sqlstateNotDurable = "DL004"

	// sqlstateClockPastRange is lockdb_catch_up's refusal of a clock that
	// reads beyond the largest token, and lockdb_draw_token's of a draw
	// beyond it.
	sqlstateClockPastRange = "DL003"

	// catchUpSQL moves fencing_token_seq up to lockdb's clock, in
	// microseconds, never down (migration 00005).
	catchUpSQL = `SELECT lockdb_catch_up()`

	// advanceSQL moves the sequence to the largest of N, its own value and
	// every token recorded in lock_lease; the next nextval returns one more.
	advanceSQL = `SELECT setval('fencing_token_seq', GREATEST($1::bigint,
    (SELECT last_value FROM fencing_token_seq),
    (SELECT coalesce(max(fencing_token), 0) FROM lock_lease)))`

	// identityText formats an identity as lockdb_check_identity does.
	identityText = `format('system %s timeline %s database %s sequence %s', system_identifier, timeline_id, database_oid, sequence_oid)`

	// stampSQL records the current identity, with N.
	stampSQL = `INSERT INTO lockdb_identity AS i (system_identifier, timeline_id, database_oid, sequence_oid, stamped_at, advanced_past)
SELECT system_identifier, timeline_id, database_oid, sequence_oid, clock_timestamp(), $1::bigint FROM lockdb_current_identity()
ON CONFLICT (singleton) DO UPDATE SET
    system_identifier = EXCLUDED.system_identifier, timeline_id = EXCLUDED.timeline_id,
    database_oid = EXCLUDED.database_oid, sequence_oid = EXCLUDED.sequence_oid,
    stamped_at = EXCLUDED.stamped_at, advanced_past = EXCLUDED.advanced_past
RETURNING ` + identityText

	// guardLockSQL takes the guard's advisory lock exclusively ("lockid";
	// lockdb_check_identity takes it shared).
	guardLockSQL = `SELECT pg_advisory_xact_lock(x'6c6f636b6964'::bigint)`
)

// guardedAcquire runs the identity check and the acquire statement in one
// batch: one round trip, one implicit transaction, so the statement runs
// only if the check passed, and under the guard's shared lock. It returns
// pgx.ErrNoRows when the key is held, an error wrapping
// store.ErrBackendRestored on a mismatch, or the driver's error.
func (s *Store) guardedAcquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	return s.guardedGrant(ctx, key, s.acquireSQL, key, owner, ttl.Milliseconds())
}

// guardedGrant runs the identity check and grantSQL (with args), a
// statement that grants key and returns the lease as scanLease reads it,
// in one batch: one round trip, one implicit transaction, the statement
// run only if the check passed. pgx.ErrNoRows when the statement granted
// nothing, an error wrapping store.ErrBackendRestored on a mismatch,
// or the driver's error (the implicit commit's included).
func (s *Store) guardedGrant(ctx context.Context, key, grantSQL string, args ...any) (store.Lease, error) {
	var l store.Lease
	err := s.drawing(ctx, func() (err error) {
		l, err = s.guardedGrantOnce(ctx, key, grantSQL, args...)
		return err
	})
	return l, err
}

// drawing runs grant, a statement that draws tokens; when its draw was
// behind lockdb's clock, it moves the sequence up to the clock and runs
// grant once more. A draw still behind the clock after that (the clock
// moved on by more than a second: a step, or a grant that waited that
// long), and a draw or a clock past the largest token (2^53 - 1), granted
// nothing and are ErrUnavailable.
func (s *Store) drawing(ctx context.Context, grant func() error) error {
	err := grant()
	if sqlstate(err) == sqlstateBehindClock {
		var seq int64
		if err = s.pool.QueryRow(ctx, catchUpSQL).Scan(&seq); err == nil {
			s.log.Debug("pgstore moved fencing_token_seq up to lockdb's clock", "sequence", seq)
			err = grant()
		}
	}
	if c := sqlstate(err); c == sqlstateBehindClock || c == sqlstateClockPastRange {
		return fmt.Errorf("%w: pgstore: %w", store.ErrUnavailable, err)
	}
	if !errors.Is(err, ErrNotDurable) {
		s.refusingNotDurable.Store(false)
	} else if !s.refusingNotDurable.Swap(true) {
		s.log.Error("grants are refused: lockdb runs with fsync off, so a grant it acknowledged could be lost in a crash and its token issued again; set fsync = on and reload (docs/lock-service.md)",
			"event", eventNotDurable, "error", err.Error())
	}
	return err
}

// sqlstate returns the SQLSTATE of a PostgreSQL error in err's chain, ""
// when there is none.
func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func (s *Store) guardedGrantOnce(ctx context.Context, key, grantSQL string, args ...any) (store.Lease, error) {
	b := &pgx.Batch{}
	b.Queue(checkIdentitySQL)
	b.Queue(grantSQL, args...)
	br := s.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return store.Lease{}, restored(err)
	}
	l, err := scanLease(br.QueryRow(), key)
	if cerr := br.Close(); err == nil && cerr != nil {
		return store.Lease{}, cerr // the implicit commit failed
	}
	return l, restored(err)
}

// restored wraps the guard's refusals: a changed identity in
// store.ErrBackendRestored, fsync off in ErrNotDurable (and
// store.ErrUnavailable). Other errors are returned as they are.
func restored(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateRestored {
		return fmt.Errorf("%w: pgstore: %s", store.ErrBackendRestored, pgErr.Message)
	}
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateNotDurable {
		return notDurable(pgErr.Message)
	}
	return err
}

// Advance is the operator's step after a restore of lockdb (lockctl
// advance). past must be at least the largest token ever issued, by any
// lock-server, before the restore: the maximum of the gauge
// lockserver_highest_token_issued, or of the tokens in lock_granted log
// lines and at the fence points. In one transaction, holding the guard's
// lock exclusively (grants wait), it moves fencing_token_seq to the largest
// of past, its own value and every token in lock_lease, never backwards,
// and stamps the current identity, so grants resume with tokens above
// past. ErrInvalidArgument (wrapped) unless 0 < past <= MaxAdvancePast;
// ErrUnavailable.
func (s *Store) Advance(ctx context.Context, past int64) (store.Advanced, error) {
	if past <= 0 || past > store.MaxAdvancePast {
		return store.Advanced{}, fmt.Errorf("%w: past is %d; want the largest token ever issued, 1..%d", store.ErrInvalidArgument, past, int64(store.MaxAdvancePast))
	}
	out := store.Advanced{Past: past}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, guardLockSQL); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `SELECT `+identityText+` FROM lockdb_identity`).Scan(&out.Previous)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if err := tx.QueryRow(ctx, advanceSQL, past).Scan(&out.NextAbove); err != nil {
			return err
		}
		return tx.QueryRow(ctx, stampSQL, past).Scan(&out.Identity)
	})
	if err != nil {
		return store.Advanced{}, unavailable("advance", "", err)
	}
	s.log.Debug("pgstore advanced", "past", past, "next_above", out.NextAbove, "identity", out.Identity, "previous", out.Previous)
	var lead int64
	if err := s.pool.QueryRow(ctx, `SELECT $1::bigint - lockdb_clock_floor()`, out.NextAbove).Scan(&lead); err == nil && lead > time.Second.Microseconds() {
		s.log.Warn("tokens now lead lockdb's clock: until the clock passes them, a rollback of lockdb that takes the rows back too is not caught by the clock floor; give advance the largest token issued with a margin of seconds, not more",
			"next_above", out.NextAbove, "lead", time.Duration(lead)*time.Microsecond)
	}
	return out, nil
}
