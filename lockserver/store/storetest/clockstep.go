package storetest

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
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
	wantErr(t, "Renew after a forward step past the TTL", err, lockserver.ErrNotHeld)

	bl := mustAcquire(t, s, key, "worker-b", longTTL)
	if bl.Token <= a.Token {
		t.Fatalf("token of the grant after a forward step = %d; want > %d, or a fence cannot refuse the earlier holder", bl.Token, a.Token)
	}
	// worker-a may still believe it holds the key; from now on it is stale.
	_, err = s.Renew(ctxT(t), key, "worker-a", a.Token)
	wantErr(t, "earlier holder's Renew after the next grant", err, lockserver.ErrStaleToken)
	wantErr(t, "earlier holder's Release after the next grant", s.Release(ctxT(t), key, "worker-a", a.Token), lockserver.ErrStaleToken)
	wantHeldBy(t, s, key, bl)
	if _, err := s.Renew(ctxT(t), key, "worker-b", bl.Token); err != nil {
		t.Fatalf("Renew of the new lease: %v", err)
	}
	if err := s.Release(ctxT(t), key, "worker-b", bl.Token); err != nil {
		t.Fatalf("Release of the new lease: %v", err)
	}
	wantFree(t, s, key)
}
