// Package store is the contract between lock-server and its backends:
// LockStore, the Lease it grants, the sentinel errors, the optional
// capabilities (BatchStore, BatchRenewer, Handoffer) and the argument
// checks every store shares. It lives beside its implementations
// (pgstore, etcdstore, memstore) so they import it, never the server.
// Safety model and design: docs/lock-service.md.
package store

import (
	"context"
	"errors"
	"time"
)

// Errors returned by every LockStore and by the server. Stores wrap them
// with context; callers test them with errors.Is.
var (
	// ErrLockHeld: another unexpired lease exists on the key.
	ErrLockHeld = errors.New("lockserver: lock held")
	// ErrNotHeld: the presented lease is not live (expired, released, revoked
	// or never granted) and no newer grant of the key is visible.
	ErrNotHeld = errors.New("lockserver: lease not held")
	// ErrStaleToken: a newer grant of the key exists than the presented token.
	ErrStaleToken = errors.New("lockserver: stale fencing token")
	// ErrInvalidArgument: a key, owner, TTL or token violates the bounds of
	// package api. Stores check their inputs too, so a direct caller gets the
	// same answer as an HTTP client.
	ErrInvalidArgument = errors.New("lockserver: invalid argument")
	// ErrUnavailable: the backend did not answer; the outcome of the
	// operation is unknown (a grant may or may not have happened).
	ErrUnavailable = errors.New("lockserver: backend unavailable")
	// ErrBackendRestored: Acquire only. The store cannot prove that the
	// backend is the instance it issued tokens on (its stamped identity
	// differs, or it handed out a token not above one already issued), so a
	// grant could repeat a token: it refuses to grant, and nothing was
	// issued. It lasts until an operator advances the tokens past the
	// largest one ever issued ("lockctl advance"). Renew, Release, Revoke
	// and Inspect are unaffected: they issue no token.
	ErrBackendRestored = errors.New("lockserver: backend may have been restored; grants refused until tokens are advanced")
)

// Lease is one grant of a key.
type Lease struct {
	// Key is the lock key.
	Key string
	// Owner is the holder the lease was granted to.
	Owner string
	// Token is the fencing token: strictly greater than the token of every
	// earlier grant of Key, across restarts of lock-server and the backend.
	Token int64
	// LeaseID identifies the lease inside the backend, for diagnostics. It
	// names this grant alone: no other grant, of any key, ever has the same
	// LeaseID, so an operator acting on it in the backend reaches this
	// grant and no other.
	LeaseID string
	// TTL is the granted duration (renewals extend by the same TTL). It may be
	// longer than requested: etcd rounds up to whole seconds and to its floor.
	TTL time.Duration
	// ExpiresAt is when the backend will consider the lease expired unless it
	// is renewed, by the backend's clock (for etcd, a lower bound computed by
	// lock-server: the etcd leader may expire it later, never earlier).
	ExpiresAt time.Time
}

// State is what Inspect reports about a key.
type State struct {
	// Key is the lock key.
	Key string
	// Lease is the live lease, or nil when the key is free.
	Lease *Lease
	// LastToken is the highest token of Key the backend remembers; 0 when it
	// remembers none.
	LastToken int64
}

// LockStore is a backend that grants leases and mints fencing tokens.
//
// Every method is atomic with respect to every other call on the same key,
// from any lock-server process sharing the backend; expiry is decided by the
// backend's clock at the moment the method takes effect, never by the
// caller's. Methods validate their arguments (ErrInvalidArgument) and return
// ErrUnavailable, wrapped, when the backend cannot be reached; in that case
// the operation may or may not have taken effect.
//
// Implementations: lockserver/store/pgstore (token = nextval of one global
// sequence, drawn after the grant has won the key's row),
// lockserver/store/etcdstore (token = the revision of the winning
// transaction plus an offset kept near lock-server's clock) and lockserver/store/memstore (in-process, injected clock,
// for tests and simulation). All pass lockserver/store/storetest.
type LockStore interface {
	// Acquire grants a lease on key to owner for ttl if no unexpired lease
	// exists on key, and returns it with a token greater than that of every
	// earlier grant of key. Otherwise it returns ErrLockHeld and changes
	// nothing. It never waits for the current holder.
	Acquire(ctx context.Context, key, owner string, ttl time.Duration) (Lease, error)

	// Renew extends the live lease (key, owner, token) to expire one TTL after
	// the backend processes the renewal, and returns it. ErrStaleToken if a
	// newer grant of key exists; ErrNotHeld if the lease is expired, released
	// or revoked, or the owner does not match. A refused renewal changes
	// nothing.
	Renew(ctx context.Context, key, owner string, token int64) (Lease, error)

	// Release ends the live lease (key, owner, token). It never removes a
	// lease with a different token: ErrStaleToken if a newer grant exists,
	// ErrNotHeld if the lease has already ended or the owner does not match.
	Release(ctx context.Context, key, owner string, token int64) error

	// Revoke force-ends the live lease on key, whatever its owner, and returns
	// it. With token > 0 it revokes only the lease carrying that token
	// (ErrStaleToken if a newer one is live). ErrNotHeld when no lease is live.
	Revoke(ctx context.Context, key string, token int64) (Lease, error)

	// Inspect reports the live lease on key, if any, by the backend's clock.
	Inspect(ctx context.Context, key string) (State, error)

	// Ping returns nil when the backend answers; the server's readiness.
	Ping(ctx context.Context) error

	// Close releases the store's connections. It does not end any lease.
	Close() error
}
