package storetest

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// testForwardClockStep: the backend's clock jumps forward by more than a
// TTL while a lease is live. By the backend's clock the lease has expired,
// although its holder's local deadline (a monotonic clock) still says it
// holds; the next grant must carry a larger token, so that a fenced
// resource tells the two holders apart, and the old holder's renew and
// release must be refused with a sentinel, never fail.
func testForwardClockStep(t *testing.T, b Backend) {
	if b.StepClock == nil {
		t.Skipf("%s: the backend's clock cannot be stepped", b.Name)
	}
	const key = "payout:acct-1"
	s := open(t, b)
	a := mustAcquire(t, s, key, "worker-a", longTTL)
	b.StepClock(t, s, 2*longTTL)

	// The step ended the lease early: seconds after a grant of a minute.
	wantFree(t, s, key)
	_, err := s.Renew(ctxT(t), key, "worker-a", a.Token)
	wantErr(t, "Renew after a forward step past the TTL", err, store.ErrNotHeld)

	bl := mustAcquire(t, s, key, "worker-b", longTTL)
	if bl.Token <= a.Token {
		t.Fatalf("token of the grant after a forward step = %d; want > %d, or a fence cannot refuse the earlier holder", bl.Token, a.Token)
	}
	// worker-a may still believe it holds the key; from now on it is stale.
	_, err = s.Renew(ctxT(t), key, "worker-a", a.Token)
	wantErr(t, "earlier holder's Renew after the next grant", err, store.ErrStaleToken)
	wantErr(t, "earlier holder's Release after the next grant", s.Release(ctxT(t), key, "worker-a", a.Token), store.ErrStaleToken)
	wantHeldBy(t, s, key, bl)
	if _, err := s.Renew(ctxT(t), key, "worker-b", bl.Token); err != nil {
		t.Fatalf("Renew of the new lease: %v", err)
	}
	if err := s.Release(ctxT(t), key, "worker-b", bl.Token); err != nil {
		t.Fatalf("Release of the new lease: %v", err)
	}
	wantFree(t, s, key)
}

// testBackwardClockStep: the backend's clock jumps back by more than a TTL
// while a lease is live, then again after the next grant. Every call must
// answer as it would without the step (the lease simply lasts longer by
// the backend's clock until it is renewed), never with an internal error:
// a renewal counts its TTL from the stepped clock, so the new expiry lies
// before the moment the lease was granted.
func testBackwardClockStep(t *testing.T, b Backend) {
	if b.StepClock == nil {
		t.Skipf("%s: the backend's clock cannot be stepped", b.Name)
	}
	const key = "payout:acct-1"
	s := open(t, b)
	a := mustAcquire(t, s, key, "worker-a", longTTL)
	b.StepClock(t, s, -2*longTTL)

	wantHeldBy(t, s, key, a)
	_, err := s.Acquire(ctxT(t), key, "worker-b", longTTL)
	wantErr(t, "Acquire of a live lease after a backward step", err, store.ErrLockHeld)
	r, err := s.Renew(ctxT(t), key, "worker-a", a.Token)
	if err != nil {
		t.Fatalf("Renew after a backward step of %v: %v", 2*longTTL, err)
	}
	if r.Token != a.Token || r.Owner != "worker-a" || r.TTL != a.TTL {
		t.Fatalf("Renew after a backward step = %+v; want the same token %d, owner and TTL %v", r, a.Token, a.TTL)
	}
	if !r.ExpiresAt.Before(a.ExpiresAt) {
		t.Fatalf("renewed expiry %v is not before the granted expiry %v: the clock did not step back", r.ExpiresAt, a.ExpiresAt)
	}
	wantHeldBy(t, s, key, a)
	if err := s.Release(ctxT(t), key, "worker-a", a.Token); err != nil {
		t.Fatalf("Release after a backward step: %v", err)
	}
	wantFree(t, s, key)

	bl := mustAcquire(t, s, key, "worker-b", longTTL)
	if bl.Token <= a.Token {
		t.Fatalf("token of the grant after a backward step = %d; want > %d", bl.Token, a.Token)
	}
	b.StepClock(t, s, -2*longTTL)
	if _, err := s.Renew(ctxT(t), key, "worker-b", bl.Token); err != nil {
		t.Fatalf("Renew after a second backward step: %v", err)
	}
	_, err = s.Renew(ctxT(t), key, "worker-a", a.Token)
	wantErr(t, "earlier holder's Renew after a backward step", err, store.ErrStaleToken)
	got, err := s.Revoke(ctxT(t), key, bl.Token)
	if err != nil || got.Token != bl.Token {
		t.Fatalf("Revoke after a backward step = %+v, %v; want the lease with token %d", got, err, bl.Token)
	}
	c := mustAcquire(t, s, key, "worker-c", longTTL)
	if c.Token <= bl.Token {
		t.Fatalf("token of the grant after a revoke = %d; want > %d", c.Token, bl.Token)
	}
	if st := inspect(t, s, key); st.Lease == nil || st.Lease.Token != c.Token || st.LastToken != c.Token {
		t.Fatalf("Inspect after the steps = %+v; want held by worker-c with token %d", st, c.Token)
	}
}
