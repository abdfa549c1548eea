// Package memstore is an in-process store.LockStore with an injected
// clock. It exists for tests and for the deterministic simulation: it follows
// the same contract as the PostgreSQL and etcd stores (it passes
// lockserver/store/storetest) but keeps its state in memory, so it survives
// no restart of its own and must never back a real lock-server.
//
// Tokens come from one counter shared by all keys, like PostgreSQL's global
// sequence; expiry is decided by the injected clock at the moment each call
// takes effect, like the backends' clocks.
package memstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Clock is the time source of a Store. Now must be monotonic non-decreasing
// across calls for expiry to mean anything.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Store is an in-memory LockStore, safe for concurrent use.
type Store struct {
	clock Clock

	mu        sync.Mutex
	lastToken int64
	keys      map[string]*entry
}

type entry struct {
	owner     string // "" when free
	token     int64  // last granted token of the key
	ttl       time.Duration
	expiresAt time.Time // zero when free
}

var _ store.LockStore = (*Store)(nil)

// New returns an empty store reading time from clock (the wall clock when
// clock is nil). The first token it grants is 1.
func New(clock Clock) *Store {
	if clock == nil {
		clock = wallClock{}
	}
	return &Store{clock: clock, keys: make(map[string]*entry)}
}

func (e *entry) live(now time.Time) bool {
	return e.owner != "" && now.Before(e.expiresAt)
}

func (e *entry) lease(key string) store.Lease {
	return store.Lease{
		Key: key, Owner: e.owner, Token: e.token,
		LeaseID: "mem-" + strconv.FormatInt(e.token, 10),
		TTL:     e.ttl, ExpiresAt: e.expiresAt,
	}
}

// Acquire implements store.LockStore.
func (s *Store) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateAcquire(key, owner, ttl); err != nil {
		return store.Lease{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Lease{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	e := s.keys[key]
	if e == nil {
		e = &entry{}
		s.keys[key] = e
	} else if e.live(now) {
		return store.Lease{}, fmt.Errorf("%w: key %q is held until %s with token %d", store.ErrLockHeld, key, e.expiresAt.Format(time.RFC3339Nano), e.token)
	}
	s.lastToken++
	*e = entry{owner: owner, token: s.lastToken, ttl: ttl, expiresAt: now.Add(ttl)}
	return e.lease(key), nil
}

// refusal classifies why (key, owner, token) is not the live lease.
func refusal(key string, e *entry, owner string, token int64) error {
	if e != nil && e.token > token {
		return fmt.Errorf("%w: key %q has a newer grant (token %d) than token %d", store.ErrStaleToken, key, e.token, token)
	}
	return fmt.Errorf("%w: no live lease on key %q for owner %q with token %d", store.ErrNotHeld, key, owner, token)
}

// Renew implements store.LockStore.
func (s *Store) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	if err := store.ValidateLease(key, owner, token); err != nil {
		return store.Lease{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Lease{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	e := s.keys[key]
	if e == nil || !e.live(now) || e.token != token || e.owner != owner {
		return store.Lease{}, refusal(key, e, owner, token)
	}
	e.expiresAt = now.Add(e.ttl)
	return e.lease(key), nil
}

// Release implements store.LockStore.
func (s *Store) Release(ctx context.Context, key, owner string, token int64) error {
	if err := store.ValidateLease(key, owner, token); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || !e.live(s.clock.Now()) || e.token != token || e.owner != owner {
		return refusal(key, e, owner, token)
	}
	e.owner, e.expiresAt = "", time.Time{}
	return nil
}

// Revoke implements store.LockStore.
func (s *Store) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Lease{}, err
	}
	if err := store.ValidateRevokeToken(token); err != nil {
		return store.Lease{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Lease{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || !e.live(s.clock.Now()) {
		return store.Lease{}, fmt.Errorf("%w: no live lease on key %q", store.ErrNotHeld, key)
	}
	if token != 0 && e.token != token {
		return store.Lease{}, refusal(key, e, e.owner, token)
	}
	revoked := e.lease(key)
	e.owner, e.expiresAt = "", time.Time{}
	return revoked, nil
}

// Inspect implements store.LockStore.
func (s *Store) Inspect(ctx context.Context, key string) (store.State, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.State{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.State{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := store.State{Key: key}
	if e := s.keys[key]; e != nil {
		st.LastToken = e.token
		if e.live(s.clock.Now()) {
			l := e.lease(key)
			st.Lease = &l
		}
	}
	return st, nil
}

// Ping implements store.LockStore; an in-memory store always answers.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

// Close implements store.LockStore; it keeps the state, so a store
// "reopened" by a test is simply the same Store.
func (s *Store) Close() error { return nil }
