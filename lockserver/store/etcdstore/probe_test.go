package etcdstore

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
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
	s := openCfgT(t, nil)
	const key = "payout:probe-renew-handoff"
	a, err := s.Acquire(ctxT(t), key, "worker-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ref := store.LeaseRef{Key: key, Owner: "worker-a", Token: a.Token}

	// Renew's first step: the read and the checks.
	kv, rec, err := s.get(ctxT(t), "renew", key)
	if err != nil {
		t.Fatal(err)
	}
	if err := refusal(key, kv, rec, ref.Owner, ref.Token); err != nil {
		t.Fatalf("renew's read: %v", err)
	}
	// The handoff lands, and its background revoke of the old lease ends.
	b, err := s.Handoff(ctxT(t), ref, store.AcquireRequest{Key: key, Owner: "worker-b", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.bg.Wait()
	// Renew's second step.
	_, err = s.keepAlive(ctxT(t), ref, kv)
	if err != nil && !errors.Is(err, store.ErrStaleToken) {
		t.Fatalf("renewal of token %d racing its handoff to token %d (live throughout): %v; want ErrStaleToken or success", a.Token, b.Token, err)
	}
}

// TestProbeCloseWithBackgroundRevokesInFlight: Close while releases and
// handoffs (each starting a background revoke of the emptied lease) run
// on other goroutines returns, and the background revokes ended no
// grant: after Close, every key a handoff last granted is still held by
// its new owner.
func TestProbeCloseWithBackgroundRevokesInFlight(t *testing.T) {
	prefix := newPrefix(t)
	onPrefix := func(cfg *Config) { cfg.Prefix = prefix }
	s := openCfgT(t, onPrefix) // its cleanup's Close returns the test's first one
	const n = 16
	handed := make([]store.Lease, n)
	started := make(chan struct{}, n)
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			key := "payout:probe-close-" + strconv.Itoa(i)
			a, err := s.Acquire(ctxT(t), key, "worker-a", 10*time.Second)
			if err != nil {
				t.Errorf("Acquire: %v", err)
				started <- struct{}{}
				return
			}
			started <- struct{}{}
			b, err := s.Handoff(ctxT(t), store.LeaseRef{Key: key, Owner: "worker-a", Token: a.Token},
				store.AcquireRequest{Key: key, Owner: "worker-b", TTL: 10 * time.Second})
			if err == nil {
				handed[i] = b
			}
		}()
	}
	for range n {
		<-started
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range n {
		<-done
	}
	check := openCfgT(t, onPrefix)
	held := 0
	for i, b := range handed {
		if b.Token == 0 {
			continue // the handoff ran into Close
		}
		held++
		st, err := check.Inspect(ctxT(t), "payout:probe-close-"+strconv.Itoa(i))
		if err != nil || st.Lease == nil || st.Lease.Owner != "worker-b" || st.Lease.Token != b.Token {
			t.Errorf("key %d after Close: %+v %v; want held by worker-b with token %d", i, st.Lease, err, b.Token)
		}
	}
	t.Logf("%d of %d handoffs completed before Close", held, n)
}
