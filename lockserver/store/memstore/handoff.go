package memstore

import (
	"context"
	"fmt"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

var _ lockserver.Handoffer = (*Store)(nil)

// Handoff implements lockserver.Handoffer: Release(from) and Acquire(to)
// under one hold of the store's mutex, so no call sees the key between
// them. A refused release changes nothing.
func (s *Store) Handoff(ctx context.Context, from lockserver.LeaseRef, to lockserver.AcquireRequest) (lockserver.Lease, error) {
	if err := lockserver.ValidateHandoff(from, to); err != nil {
		return lockserver.Lease{}, err
	}
	if err := ctx.Err(); err != nil {
		return lockserver.Lease{}, fmt.Errorf("%w: %w", lockserver.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	e := s.keys[from.Key]
	if e == nil || !e.live(now) || e.token != from.Token || e.owner != from.Owner {
		return lockserver.Lease{}, refusal(from.Key, e, from.Owner, from.Token)
	}
	s.lastToken++
	*e = entry{owner: to.Owner, token: s.lastToken, ttl: to.TTL, expiresAt: now.Add(to.TTL)}
	return e.lease(to.Key), nil
}
