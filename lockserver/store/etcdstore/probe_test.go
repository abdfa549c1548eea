package etcdstore

import (
	"errors"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// TestProbeRenewRacingAHandoffIsStale: Renew is two requests, a read of
// the key and a keep-alive of the lease read. A Handoff that lands
// between them moves the key to a new lease and revokes the old one in
// the background; the keep-alive then finds the old lease gone. The key
// is held by the newer grant during the whole renewal (a handoff leaves
// it free at no moment), so the only correct refusals are ErrStaleToken
// (linearized after the handoff) or success (before it): ErrNotHeld says
// that no newer grant exists, which was never true while the renewal
// ran. The test runs Renew's two steps (get, refusal, keepAlive) with
// the handoff forced between them.
func TestProbeRenewRacingAHandoffIsStale(t *testing.T) {
	prefix := newPrefix(t)
	s, err := Open(ctxT(t), conf(func(cfg *Config) {
		cfg.Endpoints, cfg.Prefix = shared.Endpoints(), prefix
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const key = "payout:probe-renew-handoff"
	a, err := s.Acquire(ctxT(t), key, "worker-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ref := lockserver.LeaseRef{Key: key, Owner: "worker-a", Token: a.Token}

	// Renew's first step: the read and the checks.
	kv, rec, err := s.get(ctxT(t), "renew", key)
	if err != nil {
		t.Fatal(err)
	}
	if err := refusal(key, kv, rec, ref.Owner, ref.Token); err != nil {
		t.Fatalf("renew's read: %v", err)
	}
	// The handoff lands, and its background revoke of the old lease ends.
	b, err := s.Handoff(ctxT(t), ref, lockserver.AcquireRequest{Key: key, Owner: "worker-b", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.bg.Wait()
	// Renew's second step.
	_, err = s.keepAlive(ctxT(t), ref, kv)
	if err != nil && !errors.Is(err, lockserver.ErrStaleToken) {
		t.Fatalf("renewal of token %d racing its handoff to token %d (live throughout): %v; want ErrStaleToken or success", a.Token, b.Token, err)
	}
}
