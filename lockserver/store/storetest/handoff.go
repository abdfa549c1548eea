package storetest

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// handoffer returns the Handoffer of s (under a Batcher, which hides it),
// or skips.
func handoffer(t *testing.T, s store.LockStore) store.Handoffer {
	t.Helper()
	if b, ok := s.(interface{ Unwrap() store.LockStore }); ok {
		s = b.Unwrap()
	}
	h, ok := s.(store.Handoffer)
	if !ok {
		t.Skipf("%T is not a store.Handoffer", s)
	}
	return h
}

// testHandoffGrantsTheNextOwner: a handoff of the live lease grants the
// key to the new owner with a token above the released one and above a
// grant of another key made before it; the released token is then stale
// for renew, release and another handoff; the new lease renews, releases
// and hands off like any grant.
func testHandoffGrantsTheNextOwner(t *testing.T, b Backend) {
	s := open(t, b)
	h := handoffer(t, s)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	other := mustAcquire(t, s, "other", "worker-x", longTTL)
	l, err := h.Handoff(ctxT(t), store.LeaseRef{Key: "k", Owner: "worker-a", Token: a.Token},
		store.AcquireRequest{Key: "k", Owner: "worker-b", TTL: longTTL})
	if err != nil {
		t.Fatalf("Handoff: %v", err)
	}
	if l.Key != "k" || l.Owner != "worker-b" || l.Token <= a.Token || l.Token <= other.Token || l.TTL < longTTL || l.LeaseID == "" || l.LeaseID == a.LeaseID {
		t.Fatalf("Handoff = %+v; want key k held by worker-b, token > %d and > %d, TTL >= %v, a lease id of its own (not %q)",
			l, a.Token, other.Token, longTTL, a.LeaseID)
	}
	wantHeldBy(t, s, "k", l)
	_, err = s.Renew(ctxT(t), "k", "worker-a", a.Token)
	wantErr(t, "Renew of the handed-off lease", err, store.ErrStaleToken)
	wantErr(t, "Release of the handed-off lease", s.Release(ctxT(t), "k", "worker-a", a.Token), store.ErrStaleToken)
	_, err = h.Handoff(ctxT(t), store.LeaseRef{Key: "k", Owner: "worker-a", Token: a.Token},
		store.AcquireRequest{Key: "k", Owner: "worker-c", TTL: longTTL})
	wantErr(t, "second Handoff of the same lease", err, store.ErrStaleToken)
	_, err = s.Acquire(ctxT(t), "k", "worker-c", longTTL)
	wantErr(t, "Acquire after the handoff", err, store.ErrLockHeld)
	wantHeldBy(t, s, "k", l)
	r, err := s.Renew(ctxT(t), "k", "worker-b", l.Token)
	if err != nil || r.Token != l.Token || r.Owner != "worker-b" {
		t.Fatalf("Renew of the handed lease: %+v, %v; want token %d kept", r, err, l.Token)
	}
	// A chain: b hands to c; the tokens keep increasing.
	c, err := h.Handoff(ctxT(t), store.LeaseRef{Key: "k", Owner: "worker-b", Token: l.Token},
		store.AcquireRequest{Key: "k", Owner: "worker-c", TTL: longTTL})
	if err != nil || c.Owner != "worker-c" || c.Token <= l.Token {
		t.Fatalf("second Handoff: %+v, %v; want worker-c with a token > %d", c, err, l.Token)
	}
	wantHeldBy(t, s, "k", c)
	if err := s.Release(ctxT(t), "k", "worker-c", c.Token); err != nil {
		t.Fatalf("Release of the handed lease: %v", err)
	}
	wantFree(t, s, "k")
	if d := mustAcquire(t, s, "k", "worker-d", longTTL); d.Token <= c.Token {
		t.Fatalf("token after the handed lease's release = %d; want > %d", d.Token, c.Token)
	}
	wantHeldBy(t, s, "other", other)
}

// testRefusedHandoffChangesNothing: a handoff presenting a token or owner
// that is not the live grant's, or a lease that has ended (released,
// expired), is refused as Release refuses it, and the key is exactly as
// before: not granted to the new owner.
func testRefusedHandoffChangesNothing(t *testing.T, b Backend) {
	s := open(t, b)
	h := handoffer(t, s)
	refused := func(what string, from store.LeaseRef, want error) {
		t.Helper()
		before := inspect(t, s, from.Key)
		l, err := h.Handoff(ctxT(t), from, store.AcquireRequest{Key: from.Key, Owner: "worker-z", TTL: longTTL})
		wantErr(t, what, err, want)
		if l != (store.Lease{}) {
			t.Fatalf("%s: refused Handoff returned the lease %+v", what, l)
		}
		after := inspect(t, s, from.Key)
		if (before.Lease == nil) != (after.Lease == nil) || before.LastToken != after.LastToken ||
			before.Lease != nil && (after.Lease.Owner != before.Lease.Owner || after.Lease.Token != before.Lease.Token) {
			t.Fatalf("%s: Inspect before %+v (lease %+v), after %+v (lease %+v); want no change", what, before, before.Lease, after, after.Lease)
		}
	}
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	refused("Handoff with a token never granted", store.LeaseRef{Key: "k", Owner: "worker-a", Token: a.Token + 1_000_000}, store.ErrNotHeld)
	refused("Handoff by another owner", store.LeaseRef{Key: "k", Owner: "mallory", Token: a.Token}, store.ErrNotHeld)
	// Owners that begin or extend the holder's name are other owners.
	refused("Handoff by a prefix of the owner", store.LeaseRef{Key: "k", Owner: "worker-", Token: a.Token}, store.ErrNotHeld)
	refused("Handoff by an extension of the owner", store.LeaseRef{Key: "k", Owner: "worker-ab", Token: a.Token}, store.ErrNotHeld)
	refused("Handoff of a never-granted key", store.LeaseRef{Key: "never", Owner: "worker-a", Token: a.Token}, store.ErrNotHeld)
	if err := s.Release(ctxT(t), "k", "worker-a", a.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	refused("Handoff of a released lease", store.LeaseRef{Key: "k", Owner: "worker-a", Token: a.Token}, store.ErrNotHeld)
	e := mustAcquire(t, s, "k", "worker-e", b.ShortTTL)
	awaitExpiry(t, b, s, e)
	refused("Handoff of an expired lease", store.LeaseRef{Key: "k", Owner: "worker-e", Token: e.Token}, store.ErrNotHeld)
	n := mustAcquire(t, s, "k", "worker-n", longTTL)
	if n.Token <= e.Token {
		t.Fatalf("grant after refused handoffs has token %d; want > %d", n.Token, e.Token)
	}
	refused("Handoff of a lease a newer grant replaced", store.LeaseRef{Key: "k", Owner: "worker-e", Token: e.Token}, store.ErrStaleToken)
	wantHeldBy(t, s, "k", n)
}

// testHandoffBadInputChangesNothing: arguments Release or Acquire would
// refuse, or a grant of another key than the released one, are
// ErrInvalidArgument, and the live lease stays.
func testHandoffBadInputChangesNothing(t *testing.T, b Backend) {
	s := open(t, b)
	h := handoffer(t, s)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	from := store.LeaseRef{Key: "k", Owner: "worker-a", Token: a.Token}
	to := store.AcquireRequest{Key: "k", Owner: "worker-b", TTL: longTTL}
	for _, tc := range []struct {
		what string
		from store.LeaseRef
		to   store.AcquireRequest
	}{
		{"another key", from, store.AcquireRequest{Key: "k2", Owner: "worker-b", TTL: longTTL}},
		{"token 0", store.LeaseRef{Key: "k", Owner: "worker-a"}, to},
		{"empty from owner", store.LeaseRef{Key: "k", Token: a.Token}, to},
		{"empty to owner", from, store.AcquireRequest{Key: "k", TTL: longTTL}},
		{"zero TTL", from, store.AcquireRequest{Key: "k", Owner: "worker-b"}},
		{"bad key", store.LeaseRef{Key: "bad key", Owner: "worker-a", Token: a.Token}, store.AcquireRequest{Key: "bad key", Owner: "worker-b", TTL: longTTL}},
	} {
		_, err := h.Handoff(ctxT(t), tc.from, tc.to)
		wantErr(t, "Handoff with "+tc.what, err, store.ErrInvalidArgument)
		wantHeldBy(t, s, "k", a)
	}
}
