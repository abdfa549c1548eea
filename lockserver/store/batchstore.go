package store

import (
	"context"
	"fmt"
	"time"
)

// Group grant: the optional capability of a store to serve many calls in
// one backend round trip, which lock-server's Batcher (lockserver/batcher.go) uses to
// coalesce concurrent requests. It is an extra interface beside LockStore,
// never part of it: a store without it is called once per request.

// AcquireRequest is one member of BatchStore.AcquireMany: the arguments of
// LockStore.Acquire.
type AcquireRequest struct {
	Key   string
	Owner string
	TTL   time.Duration
}

// LeaseRef names one grant: the (key, owner, token) arguments of
// LockStore.Renew and LockStore.Release, one member of ReleaseMany or
// RenewMany.
type LeaseRef struct {
	Key   string
	Owner string
	Token int64
}

// Result is one member's answer in a batch: the lease (AcquireMany,
// RenewMany; zero for ReleaseMany) or the error the single call would have
// returned.
type Result struct {
	Lease Lease
	Err   error
}

// BatchStore is a LockStore that can grant and release many keys in one
// backend round trip. Each member of a batch has exactly the semantics of
// the single call (LockStore's documentation), decided independently of the
// other members: one member's key being held refuses that member alone, and
// a grant's token is drawn after its own key is won, greater than every
// earlier grant of that key. Members may share a token when the backend
// mints one per round trip (etcd's revision): tokens are unique per key,
// never across keys (docs/lock-service.md).
//
// The keys of one call must be distinct; a key repeated in a call is
// answered ErrInvalidArgument, after the first occurrence, and is not
// attempted (ValidateBatchKeys). Each member's arguments are validated as
// the single call validates them; a bad member is answered
// ErrInvalidArgument and the others go on. A failure to reach the backend
// answers every member that was sent with an error wrapping
// ErrUnavailable: the outcome of each is unknown, as for a single call, and
// no member is reported granted unless the backend confirmed its grant.
// The returned slice has one Result (one error for ReleaseMany) per
// member, in the order of the request.
//
// A type that embeds a BatchStore (a test double, a decorator) and
// overrides Acquire or Release must override the batch methods too, or
// hide them: lock-server's Batcher calls AcquireMany and ReleaseMany
// whenever two or more requests meet, and the embedded ones would bypass
// the override.
type BatchStore interface {
	// AcquireMany is Acquire for each member.
	AcquireMany(ctx context.Context, reqs []AcquireRequest) []Result
	// ReleaseMany is Release for each member.
	ReleaseMany(ctx context.Context, refs []LeaseRef) []error
}

// BatchRenewer is a store that can also renew many leases in one backend
// round trip, under the rules of BatchStore. A BatchStore without it is
// renewed one call per request.
type BatchRenewer interface {
	// RenewMany is Renew for each member.
	RenewMany(ctx context.Context, refs []LeaseRef) []Result
}

// ValidateBatchKeys returns, for each position of keys, nil or an error
// wrapping ErrInvalidArgument when the key already appeared earlier in
// keys. Stores call it so that a repeated key (which lock-server's Batcher
// never sends) cannot reach the backend twice in one statement.
func ValidateBatchKeys(keys []string) []error {
	out := make([]error, len(keys))
	seen := make(map[string]int, len(keys))
	for i, k := range keys {
		if first, ok := seen[k]; ok {
			out[i] = fmt.Errorf("%w: key %q appears twice in one batch (members %d and %d)", ErrInvalidArgument, k, first, i)
			continue
		}
		seen[k] = i
	}
	return out
}
