package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Group grant (store.BatchStore, BatchRenewer): many keys in one
// statement, the keys passed as parallel arrays and joined with unnest.
// Each key's row is decided exactly as the single statement decides it:
// the grant's token is drawn by the nextval of DO UPDATE SET, after the
// statement has won that key's row lock and re-checked that the lease on
// it is over, so a token drawn in a batch is above every earlier grant of
// its key; the VALUES-side nextval only serves a key's first grant ever.
// Every statement takes its rows in key order (ORDER BY, FOR UPDATE
// below a sort), so two batches, from this lock-server or another, never
// wait for each other's rows in a cycle. A statement is atomic: if it
// fails, no member of the batch took effect (or, when the connection was
// lost, the outcome of every member is unknown), and every member is
// answered with the error.

var (
	_ store.BatchStore   = (*Store)(nil)
	_ store.BatchRenewer = (*Store)(nil)
)

const (
	// acquireManySQL is acquireSQL for the keys of arrays $1 (keys), $2
	// (owners) and $3 (TTLs in ms); it returns the rows it granted.
	acquireManySQL = `INSERT INTO lock_lease AS l (lock_key, owner_id, fencing_token, ttl_ms, granted_at, expires_at)
SELECT r.k, r.o, lockdb_draw_token(0), r.t, lock_clock(), lock_clock() + r.t * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(k, o, t)
ORDER BY r.k
ON CONFLICT (lock_key) DO UPDATE SET
    owner_id = EXCLUDED.owner_id,
    fencing_token = lockdb_draw_token(l.fencing_token),
    ttl_ms = EXCLUDED.ttl_ms,
    granted_at = lock_clock(),
    expires_at = lock_clock() + EXCLUDED.ttl_ms * interval '1 millisecond'
WHERE l.expires_at IS NULL OR l.expires_at <= lock_clock()
RETURNING l.lock_key, l.owner_id, l.fencing_token, l.ttl_ms, l.expires_at`

	// releaseManySQL is releaseSQL for the leases of arrays $1 (keys), $2
	// (tokens) and $3 (owners): it locks the live ones in key order, ends
	// them, and returns their keys.
	releaseManySQL = `WITH r AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) AS r(k, tok, o)
), live AS MATERIALIZED (
    SELECT l.lock_key FROM lock_lease l JOIN r ON l.lock_key = r.k
    WHERE l.fencing_token = r.tok AND l.owner_id = r.o AND l.expires_at > lock_clock()
    ORDER BY l.lock_key
    FOR UPDATE OF l
)
UPDATE lock_lease l SET owner_id = NULL, expires_at = NULL
FROM live WHERE l.lock_key = live.lock_key
RETURNING l.lock_key`

	// renewManySQL is renewSQL for the same arrays: it locks the live
	// leases in key order, extends each by its TTL, and returns them with
	// the expiry each replaced.
	renewManySQL = `WITH r AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) AS r(k, tok, o)
), live AS MATERIALIZED (
    SELECT l.lock_key, l.expires_at AS prev FROM lock_lease l JOIN r ON l.lock_key = r.k
    WHERE l.fencing_token = r.tok AND l.owner_id = r.o AND l.expires_at > lock_clock()
    ORDER BY l.lock_key
    FOR UPDATE OF l
)
UPDATE lock_lease l SET expires_at = lock_clock() + l.ttl_ms * interval '1 millisecond'
FROM live WHERE l.lock_key = live.lock_key
RETURNING l.lock_key, l.owner_id, l.fencing_token, l.ttl_ms, l.expires_at, live.prev`

	// lastTokensSQL reads the last token of each key of array $1, to
	// explain the refused members of a release or renewal (see refusal).
	lastTokensSQL = `SELECT lock_key, fencing_token FROM lock_lease WHERE lock_key = ANY($1::text[])`
)

// AcquireMany implements store.BatchStore: one round trip carries the
// restore guard's identity check and one acquireManySQL statement for
// every valid member, in one implicit transaction. A member whose key is
// held gets ErrLockHeld; every member gets ErrBackendRestored when the
// guard refuses, and ErrUnavailable (or, for an error in the statement
// itself, a plain error) when the round trip fails.
func (s *Store) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	out := make([]store.Result, len(reqs))
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	var (
		send       []int
		ks, owners []string
		ttls       []int64
		dups       = store.ValidateBatchKeys(keys)
	)
	for i, r := range reqs {
		err := dups[i]
		if err == nil {
			err = store.ValidateAcquire(r.Key, r.Owner, r.TTL)
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		send = append(send, i)
		ks, owners, ttls = append(ks, r.Key), append(owners, r.Owner), append(ttls, r.TTL.Milliseconds())
	}
	if len(send) == 0 {
		return out
	}
	granted, err := s.guardedAcquireMany(ctx, ks, owners, ttls)
	if s.promoted(ctx, err) { // a promoted synchronous standby: promotion.go
		granted, err = s.guardedAcquireMany(ctx, ks, owners, ttls)
	}
	if err != nil {
		if !errors.Is(err, store.ErrBackendRestored) {
			err = unavailable(fmt.Sprintf("acquire of %d keys", len(send)), "", err)
		}
		for _, i := range send {
			out[i].Err = err
		}
		return out
	}
	for _, i := range send {
		if l, ok := granted[reqs[i].Key]; ok {
			out[i].Lease = l
			s.log.Debug("pgstore granted", "lock", l.Key, "owner", l.Owner, "token", l.Token, "ttl_ms", l.TTL.Milliseconds(), "batch", len(send))
			continue
		}
		out[i].Err = fmt.Errorf("%w: key %q has an unexpired lease", store.ErrLockHeld, reqs[i].Key)
	}
	return out
}

// guardedAcquireMany is guardedAcquire for many keys: the identity check
// and the statement in one batch, one implicit transaction. It returns the
// leases granted, by key.
func (s *Store) guardedAcquireMany(ctx context.Context, keys, owners []string, ttls []int64) (map[string]store.Lease, error) {
	var granted map[string]store.Lease
	err := s.drawing(ctx, func() (err error) {
		granted, err = s.guardedAcquireManyOnce(ctx, keys, owners, ttls)
		return err
	})
	return granted, err
}

func (s *Store) guardedAcquireManyOnce(ctx context.Context, keys, owners []string, ttls []int64) (map[string]store.Lease, error) {
	b := &pgx.Batch{}
	b.Queue(checkIdentitySQL)
	b.Queue(s.acquireManySQL, keys, owners, ttls)
	br := s.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, restored(err)
	}
	granted := make(map[string]store.Lease, len(keys))
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			var (
				key, owner string
				token, ttl int64
				expires    time.Time
			)
			if err = rows.Scan(&key, &owner, &token, &ttl, &expires); err != nil {
				break
			}
			granted[key] = leaseOf(key, owner, token, ttl, expires)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr // the implicit commit failed
	}
	if err != nil {
		return nil, restored(err)
	}
	return granted, nil
}

// ReleaseMany implements store.BatchStore: one round trip carries
// releaseManySQL for every valid member and the read of their keys' last
// tokens, which explains each refused member as Release's refusal does
// (ErrStaleToken when its key has a newer grant, else ErrNotHeld).
func (s *Store) ReleaseMany(ctx context.Context, refs []store.LeaseRef) []error {
	res := s.leaseMany(ctx, "release", releaseManySQL, refs, false)
	out := make([]error, len(res))
	for i, r := range res {
		out[i] = r.Err
	}
	return out
}

// RenewMany implements store.BatchRenewer as ReleaseMany does, with
// renewManySQL; a renewal whose new expiry is earlier than the one it
// replaced logs lockdb_clock_stepped, as Renew does.
func (s *Store) RenewMany(ctx context.Context, refs []store.LeaseRef) []store.Result {
	return s.leaseMany(ctx, "renew", renewManySQL, refs, true)
}

// leaseMany runs a release or renewal statement over refs and the read of
// last tokens, in one round trip.
func (s *Store) leaseMany(ctx context.Context, op, stmt string, refs []store.LeaseRef, renew bool) []store.Result {
	out := make([]store.Result, len(refs))
	keys := make([]string, len(refs))
	for i, r := range refs {
		keys[i] = r.Key
	}
	dups := store.ValidateBatchKeys(keys)
	var (
		send       []int
		ks, owners []string
		toks       []int64
	)
	for i, r := range refs {
		err := dups[i]
		if err == nil {
			err = store.ValidateLease(r.Key, r.Owner, r.Token)
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		send = append(send, i)
		ks, owners, toks = append(ks, r.Key), append(owners, r.Owner), append(toks, r.Token)
	}
	if len(send) == 0 {
		return out
	}
	done, last, err := s.leaseManyRoundTrip(ctx, stmt, ks, toks, owners, renew)
	if err != nil {
		err = unavailable(fmt.Sprintf("%s of %d keys", op, len(send)), "", err)
		for _, i := range send {
			out[i].Err = err
		}
		return out
	}
	for _, i := range send {
		r := refs[i]
		row, ok := done[r.Key]
		if !ok {
			t := last[r.Key]
			s.log.Debug("pgstore "+op+" refused", "lock", r.Key, "owner", r.Owner, "token", r.Token, "last_token", t)
			if t > r.Token {
				out[i].Err = fmt.Errorf("%w: key %q has a newer grant (token %d) than token %d", store.ErrStaleToken, r.Key, t, r.Token)
			} else {
				out[i].Err = fmt.Errorf("%w: no live lease on key %q for owner %q with token %d (last token of the key: %d)", store.ErrNotHeld, r.Key, r.Owner, r.Token, t)
			}
			continue
		}
		if renew {
			if row.expires.Before(row.prev) {
				s.log.Error("lockdb's clock went back: a renewal's expiry is earlier than the one it replaced; expiry requires a clock that is slewed, never stepped (docs/runbooks/lockdb-clock.md)",
					"event", eventClockStepped, "lock", r.Key, "owner", r.Owner, "token", r.Token,
					"expiresAt", row.expires.UTC(), "previousExpiresAt", row.prev.UTC(), "steppedBackAtLeastMs", row.prev.Sub(row.expires).Milliseconds())
			}
			out[i].Lease = leaseOf(r.Key, r.Owner, r.Token, row.ttl, row.expires)
		}
		s.log.Debug("pgstore "+op+" done", "lock", r.Key, "owner", r.Owner, "token", r.Token, "batch", len(send))
	}
	return out
}

// changedRow is a row a release or renewal statement changed.
type changedRow struct {
	ttl           int64
	expires, prev time.Time
}

// leaseManyRoundTrip sends stmt and lastTokensSQL in one batch (one
// implicit transaction: the read sees the statement's changes, and any
// grant committed before it started) and returns the changed rows and the
// last token of every key, by key.
func (s *Store) leaseManyRoundTrip(ctx context.Context, stmt string, keys []string, tokens []int64, owners []string, renew bool) (map[string]changedRow, map[string]int64, error) {
	b := &pgx.Batch{}
	b.Queue(stmt, keys, tokens, owners)
	b.Queue(lastTokensSQL, keys)
	br := s.pool.SendBatch(ctx, b)
	done := map[string]changedRow{}
	last := map[string]int64{}
	err := func() error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				key string
				row changedRow
			)
			if renew {
				err = rows.Scan(&key, new(string), new(int64), &row.ttl, &row.expires, &row.prev)
			} else {
				err = rows.Scan(&key)
			}
			if err != nil {
				rows.Close()
				return err
			}
			done[key] = row
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if rows, err = br.Query(); err != nil {
			return err
		}
		for rows.Next() {
			var (
				key string
				tok int64
			)
			if err := rows.Scan(&key, &tok); err != nil {
				rows.Close()
				return err
			}
			last[key] = tok
		}
		rows.Close()
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	return done, last, nil
}
