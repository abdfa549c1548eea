package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

var _ store.Handoffer = (*Store)(nil)

// handoffSQL ends the live lease ($1 key, $2 token, $3 owner) and grants
// the key to $4 for $5 ms in one statement: it matches exactly the row
// releaseSQL matches, and sets what acquireSQL's DO UPDATE sets. The
// nextval runs for the row the statement updates, after its row lock is
// won: if another transaction updated the row meanwhile, PostgreSQL
// re-checks the WHERE on the newest version and evaluates the SET list
// again (a new nextval), so the token is above every token of the key
// committed before it, as for Acquire. No row matched: nothing changed.
const handoffSQL = `UPDATE lock_lease l SET
    owner_id = $4,
    fencing_token = lockdb_draw_token(l.fencing_token),
    ttl_ms = $5::bigint,
    granted_at = lock_clock(),
    expires_at = lock_clock() + $5::bigint * interval '1 millisecond'
WHERE l.lock_key = $1 AND l.fencing_token = $2 AND l.owner_id = $3 AND l.expires_at > lock_clock()
RETURNING l.owner_id, l.fencing_token, l.ttl_ms, l.expires_at`

// Handoff implements store.Handoffer in one round trip: the restore
// guard's identity check and handoffSQL in one batch, one implicit
// transaction (as Acquire: a mismatch refuses before a token is drawn,
// and from stays held). A promoted synchronous standby is handled as
// Acquire handles it (promotion.go). When no row matched, the key's row
// is read once more to tell ErrStaleToken from ErrNotHeld, as Release
// does. ErrInvalidArgument, ErrStaleToken, ErrNotHeld,
// ErrBackendRestored, ErrUnavailable (outcome unknown).
func (s *Store) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	if err := store.ValidateHandoff(from, to); err != nil {
		return store.Lease{}, err
	}
	l, err := s.guardedHandoff(ctx, from, to)
	if s.promoted(ctx, err) {
		l, err = s.guardedHandoff(ctx, from, to)
	}
	if errors.Is(err, store.ErrBackendRestored) {
		return store.Lease{}, err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Lease{}, s.refusal(ctx, "handoff", from.Key, from.Owner, from.Token)
	}
	if err != nil {
		return store.Lease{}, unavailable("handoff", from.Key, err)
	}
	s.log.Debug("pgstore handed off", "lock", from.Key, "from_owner", from.Owner, "from_token", from.Token,
		"owner", to.Owner, "token", l.Token, "ttl_ms", to.TTL.Milliseconds())
	return l, nil
}

// guardedHandoff is guardedAcquire for handoffSQL: pgx.ErrNoRows when
// from is not the live lease, an error wrapping ErrBackendRestored on an
// identity mismatch, or the driver's error.
func (s *Store) guardedHandoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	return s.guardedGrant(ctx, from.Key, handoffSQL, from.Key, from.Token, from.Owner, to.Owner, to.TTL.Milliseconds())
}
