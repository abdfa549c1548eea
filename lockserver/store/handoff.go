package store

import (
	"context"
	"fmt"
)

// Handoff: the optional capability of a store to end one lease and grant
// its key to the next holder in one backend transaction. Lock-server's
// wait queue (lockserver/waitqueue.go) uses it when a release arrives for
// a key whose head waiter is parked: one backend round trip instead of a
// release followed by the waiter's own acquire. It is an extra interface
// beside LockStore, never part of it: over a store without it lock-server
// releases and wakes the head, which asks as usual.

// Handoffer is a LockStore that can release a lease and grant its key to
// another owner atomically.
//
// Handoff(ctx, from, to) is, for every observer, Release(from.Key,
// from.Owner, from.Token) immediately followed by Acquire(to.Key,
// to.Owner, to.TTL) with nothing in between, in one backend transaction:
//
//   - to.Key must equal from.Key (ErrInvalidArgument otherwise); from is
//     validated as Release validates it and to as Acquire validates it
//     (ErrInvalidArgument), before the backend is asked.
//   - The release part has exactly Release's conditions: from.Owner and
//     from.Token must name the live grant of the key. Otherwise Handoff
//     returns the error Release would return (ErrStaleToken when a newer
//     grant of the key exists, ErrNotHeld when the lease has ended or the
//     owner does not match) and NOTHING changes: in particular the key is
//     not granted to to.Owner.
//   - The grant part is a grant like any other: the returned Lease is held
//     by to.Owner for to.TTL (rounded as Acquire rounds it), and its token
//     is drawn as Acquire draws one, strictly greater than every earlier
//     token of the key, and, since every backend mints from one counter,
//     greater than every token issued before the call started (lock-server's
//     token floor, lockserver/floor.go, checks it as it checks any grant).
//   - The restore guard applies as for Acquire: a store that cannot prove
//     the backend is the one it issued tokens on returns
//     ErrBackendRestored, and no grant to to.Owner exists. from stays
//     held, except where a store learns of the restore only after its
//     transaction applied (etcdstore, when the cluster changed under an
//     open store): it then ends the new grant, and from has ended too,
//     as a Release followed by a refused Acquire would leave it.
//   - ErrUnavailable, wrapped, when the outcome is unknown: from may or may
//     not have been released, and the grant to to.Owner may or may not
//     exist. The caller must never report that grant (the backend did not
//     confirm it); if it exists, nobody knows its token and it expires
//     after to.TTL, exactly as an Acquire whose answer was lost.
//
// A type that embeds a Handoffer (a test double, a decorator) and
// overrides Release or Acquire must override Handoff too, or hide it:
// lock-server calls Handoff instead of Release whenever a waiter is
// parked on the key, and the embedded one would bypass the override.
// Lock-server's Batcher and lockserver.TraceStore's wrapper hide it
// deliberately (a handoff is never batched): lockserver.NewServer takes
// the capability from the store it is given, beneath both, and traces it
// with lockserver.TraceHandoff (span lockstore.Handoff). The HTTP API has
// no handoff route: the SDK's stores in tests (servertest.OverHTTP) have
// no Handoff either.
type Handoffer interface {
	// Handoff releases from and grants from.Key to to.Owner for to.TTL,
	// atomically; see the interface's documentation.
	Handoff(ctx context.Context, from LeaseRef, to AcquireRequest) (Lease, error)
}

// ValidateHandoff checks Handoff's arguments as Release and Acquire check
// theirs, and that both name the same key; stores call it before asking
// the backend. The errors wrap ErrInvalidArgument.
func ValidateHandoff(from LeaseRef, to AcquireRequest) error {
	if err := ValidateLease(from.Key, from.Owner, from.Token); err != nil {
		return err
	}
	if err := ValidateAcquire(to.Key, to.Owner, to.TTL); err != nil {
		return err
	}
	if to.Key != from.Key {
		return fmt.Errorf("%w: a handoff grants the released key (%q), not %q", ErrInvalidArgument, from.Key, to.Key)
	}
	return nil
}

// ReleaseOrderer is a LockStore that serves one client's requests in the
// order they are sent (etcd: every write goes through one raft log, and
// lock-server's requests reach the leader over one connection): an
// acquire sent while a release of its key is in flight is usually
// applied after that release, and granted. Lock-server's wait queue
// then asks at once instead of parking until the release's answer,
// which would put the two backend writes in a row instead of letting
// them share a flush. Like Handoffer, an extra interface beside
// LockStore; a store without it gets the park.
type ReleaseOrderer interface {
	LockStore
	// OrdersAfterRelease reports whether an acquire sent during a release
	// of its key is served after that release.
	OrdersAfterRelease() bool
}
