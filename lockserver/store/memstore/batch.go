package memstore

import (
	"context"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

var (
	_ store.BatchStore   = (*Store)(nil)
	_ store.BatchRenewer = (*Store)(nil)
)

// AcquireMany implements store.BatchStore: Acquire for each member
// with a key not seen earlier in reqs, in order. There is no round trip to
// save in memory; it exists so that lock-server's batching runs over this
// store in tests and simulations as it does over the real backends.
func (s *Store) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	out := make([]store.Result, len(reqs))
	dups := store.ValidateBatchKeys(keysOf(reqs, func(r store.AcquireRequest) string { return r.Key }))
	for i, r := range reqs {
		if dups[i] != nil {
			out[i].Err = dups[i]
			continue
		}
		out[i].Lease, out[i].Err = s.Acquire(ctx, r.Key, r.Owner, r.TTL)
	}
	return out
}

// ReleaseMany implements store.BatchStore: Release for each member,
// in order, as AcquireMany does.
func (s *Store) ReleaseMany(ctx context.Context, refs []store.LeaseRef) []error {
	out := store.ValidateBatchKeys(keysOf(refs, func(r store.LeaseRef) string { return r.Key }))
	for i, r := range refs {
		if out[i] == nil {
			out[i] = s.Release(ctx, r.Key, r.Owner, r.Token)
		}
	}
	return out
}

// RenewMany implements store.BatchRenewer: Renew for each member, in
// order, as AcquireMany does.
func (s *Store) RenewMany(ctx context.Context, refs []store.LeaseRef) []store.Result {
	out := make([]store.Result, len(refs))
	dups := store.ValidateBatchKeys(keysOf(refs, func(r store.LeaseRef) string { return r.Key }))
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
