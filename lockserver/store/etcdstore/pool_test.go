package etcdstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// The tests below are about lease reuse (Leases in the package doc): what
// an old holder can and cannot do once its lease carries another grant.

func openCfgT(t *testing.T, cfg Config) *Store {
	t.Helper()
	cfg.Endpoints = shared.Endpoints()
	if cfg.Prefix == "" {
		cfg.Prefix = newPrefix(t)
	}
	s, err := Open(ctxT(t), cfg, nil)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// leaseAlive asks etcd whether lease id (as Lease.LeaseID prints it) exists.
func leaseAlive(t *testing.T, s *Store, id string) bool {
	t.Helper()
	r, err := s.cli.TimeToLive(ctxT(t), parseLeaseID(t, id))
	if err != nil {
		t.Fatalf("TimeToLive(%s): %v", id, err)
	}
	return r.TTL > 0
}

// parseLeaseID reads a Lease.LeaseID back into an etcd lease id.
func parseLeaseID(t *testing.T, id string) clientv3.LeaseID {
	t.Helper()
	n, err := strconv.ParseUint(id, 16, 64)
	if err != nil {
		t.Fatalf("lease id %q: %v", id, err)
	}
	return clientv3.LeaseID(n)
}

func mustAcquire(t *testing.T, s *Store, key, owner string, ttl time.Duration) lockserver.Lease {
	t.Helper()
	l, err := s.Acquire(ctxT(t), key, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", key, owner, err)
	}
	return l
}

func TestAReleasedLeaseCarriesTheNextGrant(t *testing.T) {
	s := openCfgT(t, Config{})
	a := mustAcquire(t, s, "payout:acct-1", "worker-a", 10*time.Second)
	if err := s.Release(ctxT(t), a.Key, a.Owner, a.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := s.pool.len(); n != 1 {
		t.Fatalf("idle leases after a release: %d; want 1", n)
	}
	b := mustAcquire(t, s, "payout:acct-2", "worker-b", 10*time.Second)
	if b.LeaseID != a.LeaseID {
		t.Fatalf("second grant on lease %s; want the released lease %s reused", b.LeaseID, a.LeaseID)
	}
	if b.Token <= a.Token {
		t.Fatalf("token %d after %d; want larger", b.Token, a.Token)
	}
	if b.TTL != 10*time.Second {
		t.Fatalf("TTL of the reused lease %v; want 10s", b.TTL)
	}
	// worker-a's grant is gone; nothing it sends may touch worker-b's.
	if _, err := s.Renew(ctxT(t), a.Key, a.Owner, a.Token); !errors.Is(err, lockserver.ErrNotHeld) {
		t.Errorf("old holder's renew = %v; want ErrNotHeld", err)
	}
	if err := s.Release(ctxT(t), a.Key, a.Owner, a.Token); !errors.Is(err, lockserver.ErrNotHeld) {
		t.Errorf("old holder's second release = %v; want ErrNotHeld", err)
	}
	if _, err := s.Revoke(ctxT(t), a.Key, 0); !errors.Is(err, lockserver.ErrNotHeld) {
		t.Errorf("revoke of the released key = %v; want ErrNotHeld", err)
	}
	st, err := s.Inspect(ctxT(t), b.Key)
	if err != nil || st.Lease == nil || st.Lease.Token != b.Token || st.Lease.Owner != "worker-b" {
		t.Fatalf("Inspect(%q) = %+v, %v; want worker-b's grant %d live", b.Key, st.Lease, err, b.Token)
	}
	if !leaseAlive(t, s, b.LeaseID) {
		t.Fatalf("lease %s of the live grant has ended", b.LeaseID)
	}
}

func TestAStaleHolderCannotTouchTheGrantOnItsOldLease(t *testing.T) {
	s := openCfgT(t, Config{})
	old := mustAcquire(t, s, "k", "worker-a", 10*time.Second)
	if err := s.Release(ctxT(t), "k", "worker-a", old.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Same key, same owner id, same lease: only the token differs.
	cur := mustAcquire(t, s, "k", "worker-a", 10*time.Second)
	if cur.LeaseID != old.LeaseID {
		t.Fatalf("regrant on lease %s; want %s reused", cur.LeaseID, old.LeaseID)
	}
	if _, err := s.Renew(ctxT(t), "k", "worker-a", old.Token); !errors.Is(err, lockserver.ErrStaleToken) {
		t.Errorf("stale renew = %v; want ErrStaleToken", err)
	}
	if err := s.Release(ctxT(t), "k", "worker-a", old.Token); !errors.Is(err, lockserver.ErrStaleToken) {
		t.Errorf("stale release = %v; want ErrStaleToken", err)
	}
	if _, err := s.Revoke(ctxT(t), "k", old.Token); !errors.Is(err, lockserver.ErrStaleToken) {
		t.Errorf("revoke naming the stale token = %v; want ErrStaleToken", err)
	}
	st, err := s.Inspect(ctxT(t), "k")
	if err != nil || st.Lease == nil || st.Lease.Token != cur.Token {
		t.Fatalf("Inspect = %+v, %v; want grant %d still live", st.Lease, err, cur.Token)
	}
}

func TestReleaseComparesTheWholeOwner(t *testing.T) {
	s := openCfgT(t, Config{})
	for _, c := range []struct{ holder, other string }{
		{"worker", "worker-1"},
		{"worker-1", "worker"},
		{"a/b", "a"},
		{"a", "a:"},
	} {
		l := mustAcquire(t, s, "k", c.holder, 5*time.Second)
		if err := s.Release(ctxT(t), "k", c.other, l.Token); !errors.Is(err, lockserver.ErrNotHeld) {
			t.Errorf("release of %q's grant by %q = %v; want ErrNotHeld", c.holder, c.other, err)
		}
		if err := s.Release(ctxT(t), "k", c.holder, l.Token); err != nil {
			t.Fatalf("release by the holder %q: %v", c.holder, err)
		}
	}
}

func TestAnIdleLeaseThatEndedIsReplaced(t *testing.T) {
	s := openCfgT(t, Config{})
	a := mustAcquire(t, s, "k", "worker-a", 5*time.Second)
	if err := s.Release(ctxT(t), "k", "worker-a", a.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// End the idle lease behind the pool's back, as its TTL running out
	// would.
	if _, err := s.cli.Revoke(ctxT(t), parseLeaseID(t, a.LeaseID)); err != nil {
		t.Fatalf("revoke idle lease: %v", err)
	}
	b := mustAcquire(t, s, "k", "worker-b", 5*time.Second)
	if b.LeaseID == a.LeaseID {
		t.Fatalf("granted on the ended lease %s", a.LeaseID)
	}
	if !leaseAlive(t, s, b.LeaseID) {
		t.Fatalf("lease %s of the new grant is not alive", b.LeaseID)
	}
	st, err := s.Inspect(ctxT(t), "k")
	if err != nil || st.Lease == nil || st.Lease.Token != b.Token {
		t.Fatalf("Inspect = %+v, %v; want grant %d", st.Lease, err, b.Token)
	}
}

func TestALosingAcquireKeepsItsLeaseForTheNext(t *testing.T) {
	s := openCfgT(t, Config{})
	mustAcquire(t, s, "k", "worker-a", 5*time.Second)
	if _, err := s.Acquire(ctxT(t), "k", "worker-b", 5*time.Second); !errors.Is(err, lockserver.ErrLockHeld) {
		t.Fatalf("second acquire = %v; want ErrLockHeld", err)
	}
	if n := s.pool.len(); n != 1 {
		t.Fatalf("idle leases after a refused acquire: %d; want 1", n)
	}
	mustAcquire(t, s, "other", "worker-b", 5*time.Second)
	if n := s.pool.len(); n != 0 {
		t.Fatalf("idle leases after the next acquire: %d; want 0 (reused)", n)
	}
}

func TestRevokeEndsTheLeaseAndDoesNotPoolIt(t *testing.T) {
	s := openCfgT(t, Config{})
	l := mustAcquire(t, s, "k", "worker-a", 5*time.Second)
	if _, err := s.Revoke(ctxT(t), "k", 0); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if leaseAlive(t, s, l.LeaseID) {
		t.Errorf("lease %s still alive after its grant was revoked", l.LeaseID)
	}
	if n := s.pool.len(); n != 0 {
		t.Errorf("idle leases after a revoke: %d; want 0", n)
	}
}

func TestWithoutReuseAReleaseRevokesTheLeaseAndAFullPoolKeepsTheNewest(t *testing.T) {
	off := openCfgT(t, Config{IdleLeases: -1})
	l := mustAcquire(t, off, "k", "worker-a", 5*time.Second)
	if err := off.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if leaseAlive(t, off, l.LeaseID) {
		t.Errorf("reuse off: lease %s alive after release", l.LeaseID)
	}

	one := openCfgT(t, Config{IdleLeases: 1})
	a := mustAcquire(t, one, "a", "worker-a", 5*time.Second)
	b := mustAcquire(t, one, "b", "worker-b", 5*time.Second)
	for _, g := range []lockserver.Lease{a, b} {
		if err := one.Release(ctxT(t), g.Key, g.Owner, g.Token); err != nil {
			t.Fatalf("Release(%q): %v", g.Key, err)
		}
	}
	if n := one.pool.len(); n != 1 {
		t.Fatalf("pool of 1 holds %d leases", n)
	}
	c := mustAcquire(t, one, "c", "worker-c", 5*time.Second)
	if c.LeaseID != b.LeaseID {
		t.Errorf("pool of 1 gave lease %s; want %s, reset last (a's %s was evicted)", c.LeaseID, b.LeaseID, a.LeaseID)
	}
}

// fakeClock is a store clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestALeaseNearItsExpiryIsNotReused: a lease released when, by the
// store's lower bound, less than margin(TTL) of its life is left is not
// pooled, so no acquire can attach a key to a lease etcd may already have
// expired (it would write a grant that etcd then deletes with the lease).
func TestALeaseNearItsExpiryIsNotReused(t *testing.T) {
	clk := &fakeClock{now: time.Now()}
	s := openCfgT(t, Config{Clock: clk})
	l := mustAcquire(t, s, "k", "worker-a", 4*time.Second)
	clk.advance(4*time.Second - margin(4*time.Second))
	if err := s.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := s.pool.len(); n != 0 {
		t.Fatalf("pool holds %d leases after a release %v before the lease's expiry; want 0", n, margin(4*time.Second))
	}
	// A renewal resets the bound: released just after one, it is pooled.
	l = mustAcquire(t, s, "k", "worker-a", 4*time.Second)
	clk.advance(3 * time.Second)
	if _, err := s.Renew(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	clk.advance(time.Second)
	if err := s.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := s.pool.len(); n != 1 {
		t.Fatalf("pool holds %d leases after a release 1s after a renewal; want 1", n)
	}
}

// TestALeaseGrantedElsewhereIsNotPooled: a store pools only leases whose
// last reset it knows.
func TestALeaseGrantedElsewhereIsNotPooled(t *testing.T) {
	prefix := newPrefix(t)
	a := openCfgT(t, Config{Prefix: prefix})
	b := openCfgT(t, Config{Prefix: prefix})
	l := mustAcquire(t, a, "k", "worker-a", 5*time.Second)
	if err := b.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Release through the other store: %v", err)
	}
	if n := b.pool.len(); n != 0 {
		t.Fatalf("the releasing store pooled a lease it did not grant (%d idle)", n)
	}
}

func TestACanceledAcquireSpendsNoIdleLease(t *testing.T) {
	s := openCfgT(t, Config{})
	l := mustAcquire(t, s, "k", "worker-a", 5*time.Second)
	if err := s.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Acquire(ctx, "k", "worker-b", 5*time.Second); !errors.Is(err, lockserver.ErrUnavailable) {
		t.Fatalf("Acquire with a canceled context = %v; want ErrUnavailable", err)
	}
	if n := s.pool.len(); n != 1 || !leaseAlive(t, s, l.LeaseID) {
		t.Fatalf("after a canceled acquire: %d idle, lease alive %v; want the idle lease kept", n, leaseAlive(t, s, l.LeaseID))
	}
}

func TestPoolHandsOutOnlyLeasesWithLifeLeft(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	ten := 10 * time.Second // margin 5s
	p := newLeasePool(3)
	if p.putReleased(1, t0) {
		t.Fatal("pooled a released lease whose reset is unknown")
	}
	p.noteReset(1, ten, t0)
	if !p.putReleased(1, t0.Add(time.Second)) {
		t.Fatal("a released lease with 9s left was not pooled")
	}
	if p.putUnused(2, ten, t0, t0.Add(5*time.Second)) {
		t.Fatal("pooled a lease with exactly its margin left")
	}
	if !p.putUnused(3, ten, t0.Add(2*time.Second), t0.Add(2*time.Second)) {
		t.Fatal("a fresh unused lease was not pooled")
	}
	if l, ok := p.take(10, t0.Add(3*time.Second)); !ok || l.id != 3 {
		t.Fatalf("take = %v, %v; want the newest lease 3", l.id, ok)
	}
	// Lease 1 may be handed out until t0 + 10s - 5s.
	if l, ok := p.take(10, t0.Add(5*time.Second)); ok {
		t.Fatalf("take at lease 1's margin = %v; want none", l.id)
	}
	if n := p.len(); n != 0 {
		t.Fatalf("len = %d after the expired lease was forgotten; want 0", n)
	}

	// Full: the lease that expires first is left out, the newcomer included.
	for id, at := range map[clientv3.LeaseID]time.Duration{10: 3 * time.Second, 11: time.Second, 12: 2 * time.Second} {
		p.putUnused(id, ten, t0.Add(at), t0)
	}
	if p.putUnused(14, ten, t0.Add(time.Second/2), t0) {
		t.Fatal("a full pool took a lease with less life left than any of its own")
	}
	if !p.putUnused(13, ten, t0.Add(4*time.Second), t0) {
		t.Fatal("a full pool refused a lease with more life left than one of its own")
	}
	var got []clientv3.LeaseID
	for {
		l, ok := p.take(10, t0)
		if !ok {
			break
		}
		got = append(got, l.id)
	}
	if len(got) != 3 || slices.Contains(got, 11) || slices.Contains(got, 14) {
		t.Fatalf("after eviction the pool held %v; want 10, 12, 13 (11 expires first, 14 sooner still)", got)
	}

	// A request below etcd's floor finds leases of the granted TTL.
	p.learnFloor(1, 2)
	p.putUnused(20, 2*time.Second, t0, t0)
	if l, ok := p.take(1, t0); !ok || l.id != 20 {
		t.Fatalf("take(1s) after learning a 2s floor = %v, %v; want lease 20", l.id, ok)
	}

	off := newLeasePool(0)
	off.noteReset(1, ten, t0)
	if off.putReleased(1, t0) || off.putUnused(2, ten, t0, t0) {
		t.Fatal("a pool of 0 kept a lease")
	}
}

func TestResetRecordsOfEndedGrantsAreBounded(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	p := newLeasePool(8)
	for i := range minPrune {
		p.noteReset(clientv3.LeaseID(i+1), time.Second, t0) // all ended by t0+1s
	}
	p.noteReset(minPrune+1, time.Second, t0.Add(time.Minute))
	if n := len(p.resets); n != 1 {
		t.Fatalf("%d reset records kept; want 1 (the others' leases have surely ended)", n)
	}
	// With every record live, a pass drops nothing and the next is put off
	// until twice as many: not a full scan per grant.
	for i := range 2 * minPrune {
		p.noteReset(clientv3.LeaseID(10_000+i), time.Hour, t0.Add(time.Minute))
	}
	if p.prune < 2*minPrune {
		t.Fatalf("prune threshold %d with %d live records; want it raised to at least %d", p.prune, len(p.resets), 2*minPrune)
	}
}
