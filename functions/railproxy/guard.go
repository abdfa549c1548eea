package railproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
)

// The restore guard. A restore of raildb forgets the high-water marks and
// forwards written after the backup, so a stale token or a paid payout could
// reach the rail again. Table raildb_identity (migration 00003) records the
// instance (system identifier, timeline, database OID, rail_attempt's id
// sequence OID), which every kind of restore changes; admit checks it first
// and refuses the submission (503 RAILDB_RESTORED, nothing recorded) until
// RecoverRestore. The same row holds the token floor of the last recovery.
// Reads are not checked. What it cannot see: docs/runbooks/raildb-restore.md.

const (
	// checkIdentitySQL raises SQLSTATE sqlstateRestored on a mismatch and
	// returns the token floor (0: none).
	checkIdentitySQL = `SELECT raildb_check_identity()`

	// sqlstateRestored is the SQLSTATE of raildb_check_identity's refusal.
	sqlstateRestored = "RD001"

	// sqlstateUndefinedFunction: raildb_check_identity does not exist.
	sqlstateUndefinedFunction = "42883"

	// guardLockSQL takes the guard's advisory lock exclusively ("railid";
	// raildb_check_identity takes it shared), so that no submission is
	// admitted while the recovery runs.
	guardLockSQL = `SELECT pg_advisory_xact_lock(x'7261696c6964'::bigint)`

	// identityText formats an identity as raildb_check_identity does.
	identityText = `format('system %s timeline %s database %s sequence %s', system_identifier, timeline_id, database_oid, sequence_oid)`

	// stampSQL records the current identity, raises the floor to $1 (never
	// lowers it) and records $1 as the last recovery's N.
	stampSQL = `INSERT INTO raildb_identity AS i (system_identifier, timeline_id, database_oid, sequence_oid, stamped_at, token_floor, recovered_past)
SELECT system_identifier, timeline_id, database_oid, sequence_oid, clock_timestamp(), $1::bigint, $1::bigint FROM raildb_current_identity()
ON CONFLICT (singleton) DO UPDATE SET
    system_identifier = EXCLUDED.system_identifier, timeline_id = EXCLUDED.timeline_id,
    database_oid = EXCLUDED.database_oid, sequence_oid = EXCLUDED.sequence_oid,
    stamped_at = EXCLUDED.stamped_at, token_floor = GREATEST(i.token_floor, EXCLUDED.token_floor),
    recovered_past = EXCLUDED.recovered_past
RETURNING ` + identityText + `, token_floor`

	// bumpAttemptIDsSQL moves the attempt id sequence to the largest of $1
	// (the operator's bound, 0 for none) and AttemptIDGap above both its
	// own value and every recorded id; never backwards.
	bumpAttemptIDsSQL = `SELECT setval('rail_attempt_attempt_id_seq', GREATEST($1::bigint,
    (SELECT last_value FROM rail_attempt_attempt_id_seq) + $2::bigint,
    (SELECT coalesce(max(attempt_id), 0) FROM rail_attempt) + $2::bigint))`

	sqlPayoutForwarded = `SELECT EXISTS (SELECT 1 FROM rail_payout WHERE payout_id = $1)`

	sqlInsertRebuilt = `
INSERT INTO rail_attempt (payout_id, account_id, token, owner_id, amount_minor, currency, state, rail_ref, finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())
RETURNING attempt_id, created_at, finished_at`
)

// Bounds and marks of the recovery.
const (
	// MaxRecoverPast bounds RestoreRecovery.Past and AttemptIDsPast: 2^53-1,
	// the largest integer a JSON reader that uses doubles keeps exactly.
	MaxRecoverPast = 1<<53 - 1
	// AttemptIDGap is how far RecoverRestore moves the attempt id sequence
	// above the largest id it can see (its value and every recorded id):
	// 2^32. The ids handed out between the backup and the restore are not
	// in raildb any more; there are at most as many as submissions arrived
	// in that time, and 2^32 covers 1,000 submissions a second for 49
	// days. The operator can give a larger bound (AttemptIDsPast) from the
	// logs. Skipped ids cost nothing; a repeated id names two attempts.
	AttemptIDGap = 1 << 32
)

// ErrRestored: raildb's identity stamp does not match the instance: it was
// restored (or failed over) and may have forgotten high-water marks and
// forwarded payouts. Submissions are refused, nothing recorded, until
// RecoverRestore runs.
var ErrRestored = errors.New("railproxy: raildb restored; submissions refused until rail-proxy recover-restore")

// ErrInvalidRecovery: an argument of RecoverRestore or the rail's journal
// is invalid; nothing was changed.
var ErrInvalidRecovery = errors.New("railproxy: invalid recovery")

// restored wraps the guard's refusal in ErrRestored and returns other
// errors as they are.
func restored(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case sqlstateRestored:
		return fmt.Errorf("%w: %s", ErrRestored, pgErr.Message)
	case sqlstateUndefinedFunction:
		// raildb lost the guard itself: restored from a backup taken
		// before migration 00003, under a running rail-proxy.
		return fmt.Errorf("%w: raildb has no identity stamp (restored from a backup older than the guard?): %s", ErrRestored, pgErr.Message)
	}
	return err
}

// RailRecord is one submission as the rail recorded it: what it was asked
// to pay and what it answered.
type RailRecord struct {
	// PayoutID, AccountID, AmountMinor and Currency are the request's.
	PayoutID    string `json:"payoutId"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	// Status is api.RailAck or api.RailDecline.
	Status api.RailStatus `json:"status"`
	// RailRef is the rail's reference of the submission.
	RailRef string `json:"railRef"`
}

// Validate returns an error wrapping ErrInvalidRecovery describing the
// first invalid field: the bounds of api.SubmitRequest, an ACK or DECLINE, a
// reference of 1..128 bytes.
func (r RailRecord) Validate() error {
	req := api.SubmitRequest{PayoutID: r.PayoutID, AccountID: r.AccountID, AmountMinor: r.AmountMinor, Currency: r.Currency}
	if err := req.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRecovery, err)
	}
	if r.Status != api.RailAck && r.Status != api.RailDecline {
		return fmt.Errorf("%w: payout %s: status %q is neither %s nor %s", ErrInvalidRecovery, r.PayoutID, r.Status, api.RailAck, api.RailDecline)
	}
	if r.RailRef == "" || len(r.RailRef) > api.MaxRailRefLen {
		return fmt.Errorf("%w: payout %s: railRef must be 1..%d bytes", ErrInvalidRecovery, r.PayoutID, api.MaxRailRefLen)
	}
	return nil
}

// ReadRailJournal decodes the rail's own record of every submission it
// received, a rail.SubmissionList as GET rail.PathJournal serves it
// (unknown fields ignored), in the rail's order. Errors wrap
// ErrInvalidRecovery: unreadable JSON, no "submissions" array, an invalid
// record (RailRecord.Validate).
func ReadRailJournal(r io.Reader) ([]RailRecord, error) {
	var j rail.SubmissionList // a missing or null "submissions" leaves it nil; [] does not
	if err := json.NewDecoder(r).Decode(&j); err != nil {
		return nil, fmt.Errorf("%w: rail journal: %v", ErrInvalidRecovery, err)
	}
	if j.Submissions == nil {
		return nil, fmt.Errorf("%w: rail journal: no \"submissions\" array", ErrInvalidRecovery)
	}
	out := make([]RailRecord, 0, len(j.Submissions))
	for i, s := range j.Submissions {
		rec := RailRecord{PayoutID: s.Request.PayoutID, AccountID: s.Request.AccountID, AmountMinor: s.Request.AmountMinor,
			Currency: s.Request.Currency, Status: api.RailStatus(s.Answer.Status), RailRef: s.Answer.RailRef}
		if err := rec.Validate(); err != nil {
			return nil, fmt.Errorf("rail journal submission %d: %w", i, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// RestoreRecovery is the input of RecoverRestore.
type RestoreRecovery struct {
	// Past is N: at least every fencing token any holder may still present
	// from before the restore (the largest token the lock service issued).
	// Required, 1..MaxRecoverPast. It becomes the token floor, and the
	// token of every rebuilt attempt.
	Past int64
	// AttemptIDsPast, when positive, is a bound the operator knows for the
	// attempt ids handed out before the restore (the largest attemptId in
	// rail-proxy's logs); 0 leaves the bound to AttemptIDGap alone.
	AttemptIDsPast int64
	// Journal is the rail's record of every submission (ReadRailJournal),
	// at least since the backup was taken.
	Journal []RailRecord
}

// Validate returns an error wrapping ErrInvalidRecovery.
func (r RestoreRecovery) Validate() error {
	if r.Past <= 0 || r.Past > MaxRecoverPast {
		return fmt.Errorf("%w: past is %d; want the largest fencing token ever issued, 1..%d", ErrInvalidRecovery, r.Past, int64(MaxRecoverPast))
	}
	if r.AttemptIDsPast < 0 || r.AttemptIDsPast > MaxRecoverPast {
		return fmt.Errorf("%w: attempt ids past %d; want 0..%d", ErrInvalidRecovery, r.AttemptIDsPast, int64(MaxRecoverPast))
	}
	for i, rec := range r.Journal {
		if err := rec.Validate(); err != nil {
			return fmt.Errorf("journal record %d: %w", i, err)
		}
	}
	return nil
}

// RestoreRecovered is what RecoverRestore did.
type RestoreRecovered struct {
	// Previous is the identity stamped before ("" when none was).
	Previous string `json:"previous"`
	// Identity is the identity stamped now.
	Identity string `json:"identity"`
	// TokenFloor is the floor now in force (at least Past).
	TokenFloor int64 `json:"tokenFloor"`
	// AttemptIDsAbove: every attempt id handed out from now on is greater.
	AttemptIDsAbove int64 `json:"attemptIdsAbove"`
	// Rebuilt are the attempts recorded from the rail's journal, for the
	// payouts raildb did not know went to the rail.
	Rebuilt []api.Attempt `json:"rebuilt"`
}

// RecoverRestore is the operator's step after a restore of raildb
// ("rail-proxy recover-restore"). It applies pending migrations and, in one
// transaction that holds submissions off, moves the attempt id sequence
// past every id it may have handed out (RestoreRecovery.AttemptIDsPast),
// records each payout of the rail's journal that raildb forgot as
// forwarded (owner api.RebuiltOwner, token rec.Past), raises the token
// floor to rec.Past and stamps the current identity. Running it again adds
// no attempt and lowers nothing. Errors wrap ErrInvalidRecovery (nothing
// changed), ErrUnavailable, or describe the failed migration.
func RecoverRestore(ctx context.Context, db pgpool.Config, rec RestoreRecovery, log *slog.Logger) (RestoreRecovered, error) {
	if log == nil {
		return RestoreRecovered{}, fmt.Errorf("%w: nil logger", ErrInvalidRecovery)
	}
	if err := rec.Validate(); err != nil {
		return RestoreRecovered{}, err
	}
	pool, closePool, err := pgpool.Open(ctx, db)
	if err != nil {
		return RestoreRecovered{}, fmt.Errorf("%w: open raildb: %v", ErrUnavailable, err)
	}
	defer closePool()
	if err := migrate(ctx, pool); err != nil {
		return RestoreRecovered{}, err
	}
	out := RestoreRecovered{Rebuilt: []api.Attempt{}}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, guardLockSQL); err != nil {
			return fmt.Errorf("take the guard's lock: %w", err)
		}
		err := tx.QueryRow(ctx, `SELECT `+identityText+` FROM raildb_identity`).Scan(&out.Previous)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read identity: %w", err)
		}
		if err := tx.QueryRow(ctx, bumpAttemptIDsSQL, rec.AttemptIDsPast, int64(AttemptIDGap)).Scan(&out.AttemptIDsAbove); err != nil {
			return fmt.Errorf("move attempt ids on: %w", err)
		}
		// What each payout of the journal is: forwarded before this run
		// (left alone), not yet seen in raildb, or rebuilt by this run (a
		// later rail submission of it is recorded too, as an attempt, not
		// as its forward: the rail was paid twice before).
		const (
			unknown = iota
			forwardedBefore
			rebuilt
		)
		status := map[string]int{}
		for _, r := range rec.Journal {
			st := status[r.PayoutID]
			if st == unknown {
				var forwarded bool
				if err := tx.QueryRow(ctx, sqlPayoutForwarded, r.PayoutID).Scan(&forwarded); err != nil {
					return fmt.Errorf("look up payout %s: %w", r.PayoutID, err)
				}
				if forwarded {
					status[r.PayoutID] = forwardedBefore
					continue
				}
			}
			if st == forwardedBefore {
				continue
			}
			a := api.Attempt{PayoutID: r.PayoutID, AccountID: r.AccountID, AmountMinor: r.AmountMinor, Currency: r.Currency,
				Token: rec.Past, OwnerID: api.RebuiltOwner, State: api.StateAcked, RailRef: r.RailRef}
			if r.Status == api.RailDecline {
				a.State = api.StateDeclined
			}
			if err := tx.QueryRow(ctx, sqlInsertRebuilt, a.PayoutID, a.AccountID, a.Token, a.OwnerID, a.AmountMinor,
				a.Currency, a.State, a.RailRef).Scan(&a.AttemptID, &a.CreatedAt, &a.FinishedAt); err != nil {
				return fmt.Errorf("record payout %s from the rail's journal: %w", r.PayoutID, err)
			}
			if st == unknown {
				if _, err := tx.Exec(ctx, sqlClaimPayout, a.PayoutID, a.AttemptID); err != nil {
					return fmt.Errorf("record payout %s as forwarded: %w", r.PayoutID, err)
				}
				status[r.PayoutID] = rebuilt
			}
			a.CreatedAt = a.CreatedAt.UTC()
			if a.FinishedAt != nil {
				t := a.FinishedAt.UTC()
				a.FinishedAt = &t
			}
			out.Rebuilt = append(out.Rebuilt, a)
		}
		return tx.QueryRow(ctx, stampSQL, rec.Past).Scan(&out.Identity, &out.TokenFloor)
	})
	if err != nil {
		return RestoreRecovered{}, dbError("recover restore", err)
	}
	log.WarnContext(ctx, "raildb recovered after a restore: submissions admitted again",
		"event", api.EventRaildbRecovered, "past", rec.Past, "tokenFloor", out.TokenFloor, "attemptIdsAbove", out.AttemptIDsAbove,
		"rebuilt", len(out.Rebuilt), "identity", out.Identity, "previous", out.Previous)
	return out, nil
}
