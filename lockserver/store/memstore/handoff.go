package memstore

import (
	"context"
	"fmt"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

var _ store.Handoffer = (*Store)(nil)

// Handoff implements store.Handoffer: Release(from) and Acquire(to)
// under one hold of the store's mutex, so no call sees the key between
// them. A refused release changes nothing.
func (s *Store) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	if err := store.ValidateHandoff(from, to); err != nil {
		return store.Lease{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Lease{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	e := s.keys[from.Key]
	if e == nil || !e.live(now) || e.token != from.Token || e.owner != from.Owner {
		return store.Lease{}, refusal(from.Key, e, from.Owner, from.Token)
	}
	s.lastToken++
	*e = entry{owner: to.Owner, token: s.lastToken, ttl: to.TTL, expiresAt: now.Add(to.TTL)}
	return e.lease(to.Key), nil
}
