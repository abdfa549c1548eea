package memstore

import (
	"context"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

var (
	_ lockserver.BatchStore   = (*Store)(nil)
	_ lockserver.BatchRenewer = (*Store)(nil)
)

// AcquireMany implements lockserver.BatchStore: Acquire for each member
// with a key not seen earlier in reqs, in order. There is no round trip to
// save in memory; it exists so that lock-server's batching runs over this
// store in tests and simulations as it does over the real backends.
func (s *Store) AcquireMany(ctx context.Context, reqs []lockserver.AcquireRequest) []lockserver.Result {
	out := make([]lockserver.Result, len(reqs))
	dups := lockserver.ValidateBatchKeys(keysOf(reqs, func(r lockserver.AcquireRequest) string { return r.Key }))
	for i, r := range reqs {
		if dups[i] != nil {
			out[i].Err = dups[i]
			continue
		}
		out[i].Lease, out[i].Err = s.Acquire(ctx, r.Key, r.Owner, r.TTL)
	}
	return out
}

// ReleaseMany implements lockserver.BatchStore: Release for each member,
// in order, as AcquireMany does.
func (s *Store) ReleaseMany(ctx context.Context, refs []lockserver.LeaseRef) []error {
	out := lockserver.ValidateBatchKeys(keysOf(refs, func(r lockserver.LeaseRef) string { return r.Key }))
	for i, r := range refs {
		if out[i] == nil {
			out[i] = s.Release(ctx, r.Key, r.Owner, r.Token)
		}
	}
	return out
}

// RenewMany implements lockserver.BatchRenewer: Renew for each member, in
// order, as AcquireMany does.
func (s *Store) RenewMany(ctx context.Context, refs []lockserver.LeaseRef) []lockserver.Result {
	out := make([]lockserver.Result, len(refs))
	dups := lockserver.ValidateBatchKeys(keysOf(refs, func(r lockserver.LeaseRef) string { return r.Key }))
	for i, r := range refs {
		if dups[i] != nil {
			out[i].Err = dups[i]
			continue
		}
		out[i].Lease, out[i].Err = s.Renew(ctx, r.Key, r.Owner, r.Token)
	}
	return out
}

func keysOf[T any](xs []T, key func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = key(x)
	}
	return out
}
