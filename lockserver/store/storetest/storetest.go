package storetest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// opTimeout bounds every single store call made by the suite.
const opTimeout = 15 * time.Second

// longTTL is the TTL of leases that must not expire during a test.
const longTTL = 60 * time.Second

// Run runs the LockStore contract against b. Each subtest opens its own
// store, so subtests are independent; they are not run in parallel because
// the expiry tests wait on real time and must not be starved.
func Run(t *testing.T, b Backend) {
	t.Helper()
	if b.Open == nil || b.Reopen == nil || b.ShortTTL <= 0 || b.Half < 0 || b.Half > 2 {
		t.Fatalf("storetest: Backend %q needs Open, Reopen, a positive ShortTTL and a Half of 0, 1 or 2", b.Name)
	}
	// The clock-step cases sit at even positions, in the half a backend
	// that can step its clock (PostgreSQL) runs when the suite is split.
	tests := []struct {
		name string
		fn   func(t *testing.T, b Backend)
	}{
		{"GrantThenRefuseWhileHeld", testGrantThenRefuse},
		{"ReleaseFreesTheKey", testReleaseFreesKey},
		{"InspectUnknownKey", testInspectUnknownKey},
		{"ExpiryByBackendClock", testExpiry},
		{"RenewExtendsTheLease", testRenewExtends},
		{"StaleRenewAndReleaseRefused", testStaleRenewRelease},
		{"WrongOwnerRefused", testWrongOwner},
		{"ForceRevoke", testRevoke},
		{"TokensIncreaseAcrossLockServerRestart", testReopen},
		{"TokensIncreaseAcrossBackendRestart", testBackendRestart},
		{"ConcurrentAcquirers", testConcurrent},
		{"Linearizable", testLinearizable},
		{"LinearizableAcrossBackendRestart", testLinearizableAcrossBackendRestart},
		{"LinearizableAcrossReplicasAndRestart", testLinearizableAcrossReplicasAndRestart},
		{"BadInputChangesNothing", testBadInput},
		{"ForwardClockStepEndsLeasesButTokensStillIncrease", testForwardClockStep},
		{"BatchAnswersEachMember", testBatchAnswersEachMember},
		{"BackwardClockStepAnswersNormally", testBackwardClockStep},
		{"HandoffGrantsTheNextOwner", testHandoffGrantsTheNextOwner},
		{"RefusedHandoffChangesNothing", testRefusedHandoffChangesNothing},
		{"HandoffBadInputChangesNothing", testHandoffBadInputChangesNothing},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b.SkipOtherHalf(t, i+1)
			tc.fn(t, b)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, b Backend) store.LockStore {
	t.Helper()
	s := b.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustAcquire(t *testing.T, s store.LockStore, key, owner string, ttl time.Duration) store.Lease {
	t.Helper()
	l, err := s.Acquire(ctxT(t), key, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %q, %v): %v", key, owner, ttl, err)
	}
	if l.Key != key || l.Owner != owner || l.Token <= 0 || l.TTL < ttl || l.LeaseID == "" {
		t.Fatalf("Acquire(%q, %q, %v) = %+v; want that key and owner, token > 0, TTL >= requested, a lease id", key, owner, ttl, l)
	}
	return l
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func inspect(t *testing.T, s store.LockStore, key string) store.State {
	t.Helper()
	st, err := s.Inspect(ctxT(t), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return st
}

func wantHeldBy(t *testing.T, s store.LockStore, key string, l store.Lease) {
	t.Helper()
	st := inspect(t, s, key)
	if st.Lease == nil || st.Lease.Owner != l.Owner || st.Lease.Token != l.Token {
		t.Fatalf("Inspect(%q) = %+v; want held by %q with token %d", key, st.Lease, l.Owner, l.Token)
	}
	if st.LastToken < l.Token {
		t.Fatalf("Inspect(%q).LastToken = %d; want >= live token %d", key, st.LastToken, l.Token)
	}
}

func wantFree(t *testing.T, s store.LockStore, key string) {
	t.Helper()
	if st := inspect(t, s, key); st.Lease != nil {
		t.Fatalf("Inspect(%q) = %+v; want no live lease", key, *st.Lease)
	}
}

// awaitExpiry lets l expire by the backend's clock: it advances a fake clock,
// or polls Inspect until the backend reports the key free. It fails the test
// if the lease is still live long after its TTL.
func awaitExpiry(t *testing.T, b Backend, s store.LockStore, l store.Lease) {
	t.Helper()
	if b.Advance != nil {
		b.Advance(l.TTL + time.Millisecond)
		wantFree(t, s, l.Key)
		return
	}
	limit := time.Now().Add(l.TTL + 10*time.Second)
	tick := time.NewTicker(l.TTL / 20)
	defer tick.Stop()
	for {
		st := inspect(t, s, l.Key)
		if st.Lease == nil || st.Lease.Token != l.Token {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("lease %+v still live 10s after its TTL", l)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("test context ended while waiting for expiry")
		}
	}
}

func testGrantThenRefuse(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "payout:acct-1", "worker-a", longTTL)
	_, err := s.Acquire(ctxT(t), "payout:acct-1", "worker-b", longTTL)
	wantErr(t, "second Acquire while held", err, store.ErrLockHeld)
	// The holder itself is refused too: leases are not reentrant.
	_, err = s.Acquire(ctxT(t), "payout:acct-1", "worker-a", longTTL)
	wantErr(t, "reentrant Acquire", err, store.ErrLockHeld)
	wantHeldBy(t, s, "payout:acct-1", a)
	// Another key is independent.
	mustAcquire(t, s, "payout:acct-2", "worker-b", longTTL)
}

func testReleaseFreesKey(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	if err := s.Release(ctxT(t), "k", "worker-a", a.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantFree(t, s, "k")
	wantErr(t, "second Release", s.Release(ctxT(t), "k", "worker-a", a.Token), store.ErrNotHeld)
	_, err := s.Renew(ctxT(t), "k", "worker-a", a.Token)
	wantErr(t, "Renew after Release", err, store.ErrNotHeld)
	b2 := mustAcquire(t, s, "k", "worker-b", longTTL)
	if b2.Token <= a.Token {
		t.Fatalf("token after release = %d; want > %d", b2.Token, a.Token)
	}
}

func testInspectUnknownKey(t *testing.T, b Backend) {
	s := open(t, b)
	st := inspect(t, s, "never-granted")
	if st.Lease != nil || st.LastToken != 0 || st.Key != "never-granted" {
		t.Fatalf("Inspect(never-granted) = %+v; want key echoed, no lease, LastToken 0", st)
	}
}

func testExpiry(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "payout:acct-7", "worker-a", b.ShortTTL)
	_, err := s.Acquire(ctxT(t), "payout:acct-7", "worker-b", b.ShortTTL)
	wantErr(t, "Acquire before expiry", err, store.ErrLockHeld)
	awaitExpiry(t, b, s, a)
	_, err = s.Renew(ctxT(t), "payout:acct-7", "worker-a", a.Token)
	wantErr(t, "Renew after expiry", err, store.ErrNotHeld)
	bl := mustAcquire(t, s, "payout:acct-7", "worker-b", longTTL)
	if bl.Token <= a.Token {
		t.Fatalf("token after expiry = %d; want > %d", bl.Token, a.Token)
	}
}

func testRenewExtends(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "k", "worker-a", b.ShortTTL)
	// Renew at a quarter of the TTL until two whole TTLs have passed: the
	// lease must still be ours, with the same token.
	start := time.Now()
	for i := 0; i < 8; i++ {
		if b.Advance != nil {
			b.Advance(a.TTL / 4)
		} else {
			select {
			case <-time.After(a.TTL / 4):
			case <-t.Context().Done():
				t.Fatal("test context ended")
			}
		}
		r, err := s.Renew(ctxT(t), "k", "worker-a", a.Token)
		if err != nil {
			t.Fatalf("Renew #%d after %v: %v", i+1, time.Since(start), err)
		}
		if r.Token != a.Token || r.Owner != "worker-a" || r.TTL != a.TTL {
			t.Fatalf("Renew = %+v; want the same token %d, owner and TTL %v", r, a.Token, a.TTL)
		}
	}
	wantHeldBy(t, s, "k", a)
	_, err := s.Acquire(ctxT(t), "k", "worker-b", b.ShortTTL)
	wantErr(t, "Acquire of a renewed lease", err, store.ErrLockHeld)
}

func testStaleRenewRelease(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "k", "worker-a", b.ShortTTL)
	awaitExpiry(t, b, s, a)
	bl := mustAcquire(t, s, "k", "worker-b", longTTL)
	_, err := s.Renew(ctxT(t), "k", "worker-a", a.Token)
	wantErr(t, "stale Renew", err, store.ErrStaleToken)
	wantErr(t, "stale Release", s.Release(ctxT(t), "k", "worker-a", a.Token), store.ErrStaleToken)
	// The late release of the old holder must not have removed the new lease.
	wantHeldBy(t, s, "k", bl)
	_, err = s.Acquire(ctxT(t), "k", "worker-c", longTTL)
	wantErr(t, "Acquire after a stale release", err, store.ErrLockHeld)
}

func testWrongOwner(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	_, err := s.Renew(ctxT(t), "k", "mallory", a.Token)
	wantErr(t, "Renew by another owner", err, store.ErrNotHeld)
	wantErr(t, "Release by another owner", s.Release(ctxT(t), "k", "mallory", a.Token), store.ErrNotHeld)
	wantErr(t, "Release of a token never granted", s.Release(ctxT(t), "k", "worker-a", a.Token+1_000_000), store.ErrNotHeld)
	wantHeldBy(t, s, "k", a)
}

func testRevoke(t *testing.T, b Backend) {
	s := open(t, b)
	_, err := s.Revoke(ctxT(t), "k", 0)
	wantErr(t, "Revoke of a free key", err, store.ErrNotHeld)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	got, err := s.Revoke(ctxT(t), "k", 0)
	if err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if got.Token != a.Token || got.Owner != "worker-a" {
		t.Fatalf("Revoke returned %+v; want the revoked lease of worker-a with token %d", got, a.Token)
	}
	wantFree(t, s, "k")
	_, err = s.Renew(ctxT(t), "k", "worker-a", a.Token)
	wantErr(t, "Renew of a revoked lease", err, store.ErrNotHeld)
	bl := mustAcquire(t, s, "k", "worker-b", longTTL)
	if bl.Token <= a.Token {
		t.Fatalf("token after revoke = %d; want > %d", bl.Token, a.Token)
	}
	_, err = s.Revoke(ctxT(t), "k", a.Token)
	wantErr(t, "conditional Revoke with an old token", err, store.ErrStaleToken)
	wantHeldBy(t, s, "k", bl)
	if _, err := s.Revoke(ctxT(t), "k", bl.Token); err != nil {
		t.Fatalf("conditional Revoke with the live token: %v", err)
	}
	wantFree(t, s, "k")
}

func testReopen(t *testing.T, b Backend) {
	s := b.Open(t)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	s = b.Reopen(t, s)
	t.Cleanup(func() { _ = s.Close() })
	// The lease outlives lock-server: it lives in the backend.
	wantHeldBy(t, s, "k", a)
	if err := s.Release(ctxT(t), "k", "worker-a", a.Token); err != nil {
		t.Fatalf("Release after restart: %v", err)
	}
	bl := mustAcquire(t, s, "k", "worker-b", longTTL)
	if bl.Token <= a.Token {
		t.Fatalf("token after lock-server restart = %d; want > %d", bl.Token, a.Token)
	}
}

func testBackendRestart(t *testing.T, b Backend) {
	if b.RestartBackend == nil {
		t.Skipf("%s: backend restart not supported", b.Name)
	}
	s, restart := b.RestartBackend(t)
	t.Cleanup(func() { _ = s.Close() })
	var last int64
	for round := 0; round < 3; round++ {
		l := acquireAfterRestart(t, s, "k", fmt.Sprintf("worker-%d", round))
		if l.Token <= last {
			t.Fatalf("round %d: token %d after backend restart; want > %d", round, l.Token, last)
		}
		last = l.Token
		for attempt := 1; ; attempt++ {
			err := s.Release(ctxT(t), "k", l.Owner, l.Token)
			if err == nil {
				break
			}
			if !errors.Is(err, store.ErrUnavailable) || attempt == 20 {
				t.Fatalf("round %d: Release: %v", round, err)
			}
		}
		// Another key is granted too, so the next round cannot pass merely
		// because nothing else moved the counter.
		other := acquireAfterRestart(t, s, fmt.Sprintf("other-%d", round), "worker-x")
		if other.Token <= last {
			t.Fatalf("round %d: token of another key %d; want > %d", round, other.Token, last)
		}
		restart()
		// The first call after a restart may meet a reconnecting client: retry
		// on ErrUnavailable only, for a bounded time.
		awaitAvailable(t, s)
	}
}

// acquireAfterRestart is mustAcquire for the first calls after a backend
// restart: a pooled connection the restart killed fails one call with
// ErrUnavailable and is discarded, so such failures are retried (a bounded
// number of times); any other error fails the test.
func acquireAfterRestart(t *testing.T, s store.LockStore, key, owner string) store.Lease {
	t.Helper()
	for attempt := 1; ; attempt++ {
		l, err := s.Acquire(ctxT(t), key, owner, longTTL)
		if err == nil {
			return l
		}
		if !errors.Is(err, store.ErrUnavailable) || attempt == 20 {
			t.Fatalf("Acquire(%q, %q) after a backend restart, attempt %d: %v", key, owner, attempt, err)
		}
	}
}

func awaitAvailable(t *testing.T, s store.LockStore) {
	t.Helper()
	if err := waitAvailable(t.Context(), s); err != nil {
		t.Fatal(err)
	}
}

// waitAvailable polls s.Ping until it answers, for at most 30 s; it may be
// called from any goroutine.
func waitAvailable(ctx context.Context, s store.LockStore) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.Ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("backend not available after 30s: %w", err)
		}
	}
}

func testConcurrent(t *testing.T, b Backend) {
	const workers, rounds = 32, 3
	s := open(t, b)
	// A bound on the whole race, so that a lost wake-up or a leaked lease
	// fails with a message instead of hanging the suite.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var (
		mu       sync.Mutex
		holders  int
		tokens   []int64
		failures []string
		wg       sync.WaitGroup
	)
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("worker-%02d", w)
			pause := time.Millisecond
			for done := 0; done < rounds; {
				l, err := s.Acquire(ctx, "payout:hot", owner, longTTL)
				if errors.Is(err, store.ErrLockHeld) {
					// Barging with a short, growing pause: contention, not a
					// busy loop that starves the holder's release.
					select {
					case <-time.After(pause):
					case <-ctx.Done():
						failf("%s: gave up after %d of %d grants: %v", owner, done, rounds, ctx.Err())
						return
					}
					pause = min(2*pause, 20*time.Millisecond)
					continue
				}
				if err != nil {
					failf("%s: Acquire: %v", owner, err)
					return
				}
				pause = time.Millisecond
				mu.Lock()
				holders++
				if holders > 1 {
					failures = append(failures, fmt.Sprintf("%s: %d holders at once", owner, holders))
				}
				if n := len(tokens); n > 0 && l.Token <= tokens[n-1] {
					failures = append(failures, fmt.Sprintf("%s: token %d granted after %d", owner, l.Token, tokens[n-1]))
				}
				tokens = append(tokens, l.Token)
				mu.Unlock()
				runtime.Gosched() // the critical section: let others try to overlap it
				mu.Lock()
				holders--
				mu.Unlock()
				if err := s.Release(ctx, "payout:hot", owner, l.Token); err != nil {
					failf("%s: Release: %v", owner, err)
					return
				}
				done++
			}
		}()
	}
	wg.Wait()
	for _, msg := range failures {
		t.Error(msg)
	}
	if len(tokens) != workers*rounds {
		t.Fatalf("%d grants; want %d", len(tokens), workers*rounds)
	}
}

func testBadInput(t *testing.T, b Backend) {
	s := open(t, b)
	a := mustAcquire(t, s, "k", "worker-a", longTTL)
	before := inspect(t, s, "k")
	long := string(make([]byte, 200))
	for _, tc := range []struct {
		what string
		call func(ctx context.Context) error
	}{
		{"empty key", func(ctx context.Context) error { _, err := s.Acquire(ctx, "", "w", longTTL); return err }},
		{"key with a slash", func(ctx context.Context) error { _, err := s.Acquire(ctx, "a/b", "w", longTTL); return err }},
		{"key too long", func(ctx context.Context) error { _, err := s.Acquire(ctx, "k"+long, "w", longTTL); return err }},
		{"empty owner", func(ctx context.Context) error { _, err := s.Acquire(ctx, "k2", "", longTTL); return err }},
		{"owner with a space", func(ctx context.Context) error { _, err := s.Acquire(ctx, "k2", "a b", longTTL); return err }},
		{"ttl too short", func(ctx context.Context) error { _, err := s.Acquire(ctx, "k2", "w", time.Millisecond); return err }},
		{"ttl too long", func(ctx context.Context) error { _, err := s.Acquire(ctx, "k2", "w", time.Hour); return err }},
		{"ttl not whole ms", func(ctx context.Context) error { _, err := s.Acquire(ctx, "k2", "w", time.Second+1); return err }},
		{"renew token 0", func(ctx context.Context) error { _, err := s.Renew(ctx, "k", "worker-a", 0); return err }},
		{"release negative token", func(ctx context.Context) error { return s.Release(ctx, "k", "worker-a", -a.Token) }},
		{"release empty owner", func(ctx context.Context) error { return s.Release(ctx, "k", "", a.Token) }},
		{"revoke negative token", func(ctx context.Context) error { _, err := s.Revoke(ctx, "k", -1); return err }},
		{"inspect bad key", func(ctx context.Context) error { _, err := s.Inspect(ctx, "-k"); return err }},
	} {
		wantErr(t, tc.what, tc.call(ctxT(t)), store.ErrInvalidArgument)
	}
	after := inspect(t, s, "k")
	// ExpiresAt is left out: etcd re-estimates it on every read from the
	// whole seconds a lease has left.
	sameGrant := func(x, y store.Lease) bool {
		x.ExpiresAt, y.ExpiresAt = time.Time{}, time.Time{}
		return x == y
	}
	if after.Lease == nil || !sameGrant(*after.Lease, *before.Lease) || after.LastToken != before.LastToken {
		t.Fatalf("state changed by bad input: before %+v %+v, after %+v %+v", before, before.Lease, after, after.Lease)
	}
	wantFree(t, s, "k2")
}
