package etcdstore

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The tests below are about leases (Leases in the package doc): a lease id
// names one grant for its whole life, so nothing done to an old grant's
// lease, by an old holder or by an operator holding its id, reaches a
// later grant.

// conf returns DefaultConfig changed by set (nil: unchanged).
func conf(set func(*Config)) Config {
	c := DefaultConfig()
	if set != nil {
		set(&c)
	}
	return c
}

// openCfgT opens a Store on the shared cluster under a fresh prefix, from
// DefaultConfig changed by set (nil: unchanged).
func openCfgT(t *testing.T, set func(*Config)) *Store {
	t.Helper()
	cfg := conf(func(c *Config) { c.Endpoints, c.Prefix = shared.Endpoints(), newPrefix(t) })
	if set != nil {
		set(&cfg)
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

func mustAcquire(t *testing.T, s *Store, key, owner string, ttl time.Duration) store.Lease {
	t.Helper()
	l, err := s.Acquire(ctxT(t), key, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", key, owner, err)
	}
	return l
}

// await polls cond until it holds, failing the test after 10 s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	limit := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(limit) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// awaitIdle waits until s's pool holds idle leases and no grant for it is
// in flight, and returns their ids.
func awaitIdle(t *testing.T, s *Store) []string {
	t.Helper()
	await(t, "leases granted ahead", func() bool {
		s.pool.mu.Lock()
		defer s.pool.mu.Unlock()
		return s.pool.n > 0 && s.pool.inFlight == 0
	})
	return idleIDs(s)
}

// idleIDs lists the leases in s's pool, as Lease.LeaseID prints them.
func idleIDs(s *Store) []string {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	var ids []string
	for _, list := range s.pool.idle {
		for _, l := range list {
			ids = append(ids, leaseID(int64(l.id)))
		}
	}
	return ids
}

func TestAStaleHolderCannotTouchTheGrantAfterIt(t *testing.T) {
	s := openCfgT(t, nil)
	old := mustAcquire(t, s, "k", "worker-a", 10*time.Second)
	if err := s.Release(ctxT(t), "k", "worker-a", old.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Same key, same owner id: only the token (and the lease) differ.
	cur := mustAcquire(t, s, "k", "worker-a", 10*time.Second)
	if cur.LeaseID == old.LeaseID {
		t.Fatalf("regrant on lease %s of the released grant", old.LeaseID)
	}
	if _, err := s.Renew(ctxT(t), "k", "worker-a", old.Token); !errors.Is(err, store.ErrStaleToken) {
		t.Errorf("stale renew = %v; want ErrStaleToken", err)
	}
	if err := s.Release(ctxT(t), "k", "worker-a", old.Token); !errors.Is(err, store.ErrStaleToken) {
		t.Errorf("stale release = %v; want ErrStaleToken", err)
	}
	if _, err := s.Revoke(ctxT(t), "k", old.Token); !errors.Is(err, store.ErrStaleToken) {
		t.Errorf("revoke naming the stale token = %v; want ErrStaleToken", err)
	}
	st, err := s.Inspect(ctxT(t), "k")
	if err != nil || st.Lease == nil || st.Lease.Token != cur.Token {
		t.Fatalf("Inspect = %+v, %v; want grant %d still live", st.Lease, err, cur.Token)
	}
}

func TestReleaseComparesTheWholeOwner(t *testing.T) {
	s := openCfgT(t, nil)
	for _, c := range []struct{ holder, other string }{
		{"worker", "worker-1"},
		{"worker-1", "worker"},
		{"a/b", "a"},
		{"a", "a:"},
	} {
		l := mustAcquire(t, s, "k", c.holder, 5*time.Second)
		if err := s.Release(ctxT(t), "k", c.other, l.Token); !errors.Is(err, store.ErrNotHeld) {
			t.Errorf("release of %q's grant by %q = %v; want ErrNotHeld", c.holder, c.other, err)
		}
		if err := s.Release(ctxT(t), "k", c.holder, l.Token); err != nil {
			t.Fatalf("release by the holder %q: %v", c.holder, err)
		}
	}
}

// TestAnAcquireTakesALeaseGrantedAhead: the first acquire asks for a lease
// to be granted ahead, and the next one takes it.
func TestAnAcquireTakesALeaseGrantedAhead(t *testing.T) {
	s := openCfgT(t, nil)
	a := mustAcquire(t, s, "a", "worker-a", 5*time.Second)
	idle := awaitIdle(t, s)
	b := mustAcquire(t, s, "b", "worker-b", 5*time.Second)
	if !slices.Contains(idle, b.LeaseID) || b.LeaseID == a.LeaseID {
		t.Fatalf("second grant on lease %s; want one of the idle leases %v (the first grant's is %s)", b.LeaseID, idle, a.LeaseID)
	}
	if b.TTL != 5*time.Second {
		t.Fatalf("TTL of a grant on an idle lease %v; want 5s", b.TTL)
	}
	if st := s.LeaseStats(); st.FromPool != 1 || st.Granted < 2 {
		t.Fatalf("LeaseStats = %+v; want 1 grant from the pool, at least 2 leases granted", st)
	}
}

func TestAnIdleLeaseThatEndedIsReplaced(t *testing.T) {
	s := openCfgT(t, nil)
	mustAcquire(t, s, "a", "worker-a", 5*time.Second)
	idle := awaitIdle(t, s)
	// End the idle leases behind the pool's back, as an operator might.
	for _, id := range idle {
		revokeByID(t, id)
	}
	b := mustAcquire(t, s, "k", "worker-b", 5*time.Second)
	if slices.Contains(idle, b.LeaseID) {
		t.Fatalf("granted on the ended lease %s", b.LeaseID)
	}
	if !leaseAlive(t, s, b.LeaseID) {
		t.Fatalf("lease %s of the new grant is not alive", b.LeaseID)
	}
	st, err := s.Inspect(ctxT(t), "k")
	if err != nil || st.Lease == nil || st.Lease.Token != b.Token {
		t.Fatalf("Inspect = %+v, %v; want grant %d", st.Lease, err, b.Token)
	}
}

// TestAReleasedGrantsLeaseIsRevoked, with the pool on and off: Release and
// Revoke end a grant by deleting its key (conditional on the grant), and
// then revoke its lease in the background (waited for here).
func TestAReleasedGrantsLeaseIsRevoked(t *testing.T) {
	for _, c := range []struct {
		name string
		idle int
	}{{"pool-on", DefaultIdleLeases}, {"pool-off", 0}} {
		t.Run(c.name, func(t *testing.T) {
			s := openCfgT(t, func(cfg *Config) { cfg.IdleLeases = c.idle })
			l := mustAcquire(t, s, "k", "worker-a", 5*time.Second)
			if err := s.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if st, err := s.Inspect(ctxT(t), "k"); err != nil || st.Lease != nil || st.LastToken != 0 {
				t.Fatalf("after Release returned: %+v, %v; want the key deleted", st, err)
			}
			s.bg.Wait() // the background revocation
			if leaseAlive(t, s, l.LeaseID) {
				t.Fatalf("lease %s alive after Release returned", l.LeaseID)
			}
			if slices.Contains(idleIDs(s), l.LeaseID) {
				t.Fatalf("lease %s of a released grant is in the pool", l.LeaseID)
			}

			l = mustAcquire(t, s, "k", "worker-a", 5*time.Second)
			if _, err := s.Revoke(ctxT(t), "k", 0); err != nil {
				t.Fatalf("Revoke: %v", err)
			}
			s.bg.Wait()
			if leaseAlive(t, s, l.LeaseID) {
				t.Errorf("lease %s still alive after its grant was revoked", l.LeaseID)
			}
		})
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

// TestALeaseNearItsExpiryIsNotHandedOut: an idle lease with less than
// margin(TTL) of its life left, by the store's lower bound, is not handed
// out, so no acquire can attach a key to a lease etcd may already have
// expired (it would write a grant that etcd then deletes with the lease).
func TestALeaseNearItsExpiryIsNotHandedOut(t *testing.T) {
	clk := &fakeClock{now: time.Now()}
	s := openCfgT(t, func(cfg *Config) { cfg.Clock = clk })
	mustAcquire(t, s, "a", "worker-a", 4*time.Second)
	idle := awaitIdle(t, s)
	clk.advance(4*time.Second - margin(4*time.Second))
	l := mustAcquire(t, s, "b", "worker-a", 4*time.Second)
	if slices.Contains(idle, l.LeaseID) {
		t.Fatalf("grant on idle lease %s, %v before its expiry by the store's bound", l.LeaseID, margin(4*time.Second))
	}
	for _, id := range idleIDs(s) {
		if slices.Contains(idle, id) {
			t.Fatalf("the pool still holds lease %s past its margin", id)
		}
	}
}

func TestACanceledAcquireSpendsNoIdleLease(t *testing.T) {
	s := openCfgT(t, nil)
	mustAcquire(t, s, "a", "worker-a", 5*time.Second)
	idle := awaitIdle(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Acquire(ctx, "k", "worker-b", 5*time.Second); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with a canceled context = %v; want ErrUnavailable", err)
	}
	if got := idleIDs(s); !slices.Equal(got, idle) {
		t.Fatalf("after a canceled acquire: idle %v; want %v kept", got, idle)
	}
	for _, id := range idle {
		if !leaseAlive(t, s, id) {
			t.Fatalf("idle lease %s ended after a canceled acquire", id)
		}
	}
}

// storeGoroutines counts the goroutines running a Store's background loops.
func storeGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "etcdstore.(*Store).grantAhead")
}

// TestCloseWaitsForTheStoresGoroutines: with the pool on a Store runs
// the granter; with it off, nothing; Close ends it before it returns.
func TestCloseWaitsForTheStoresGoroutines(t *testing.T) {
	before := storeGoroutines()
	on := openCfgT(t, nil)
	if got := storeGoroutines() - before; got != 1 {
		t.Fatalf("%d background goroutines with the pool on; want 1 (the granter)", got)
	}
	l := mustAcquire(t, on, "k", "worker-a", 5*time.Second)
	if err := on.Release(ctxT(t), "k", "worker-a", l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := on.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := storeGoroutines(); got != before {
		t.Fatalf("%d background goroutines after Close; want %d", got, before)
	}
	for range 2 * DefaultIdleLeases {
		on.askAhead(1) // never blocks, with no granter left
	}
	off := openCfgT(t, func(cfg *Config) { cfg.IdleLeases = 0 })
	mustAcquire(t, off, "k", "worker-a", 5*time.Second)
	if got := storeGoroutines(); got != before {
		t.Fatalf("%d background goroutines with the pool off; want none", got-before)
	}
}

func TestPoolHandsOutOnlyLeasesWithLifeLeft(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	ten := 10 * time.Second // margin 5s
	p := newLeasePool(3)
	if k := p.topUp(10); k != 2 {
		t.Fatalf("first top-up = %d; want 2 (the batch of 1 doubled)", k)
	}
	if !p.granted(10, 1, ten, t0, t0.Add(time.Second)) {
		t.Fatal("a lease granted with 9s left was not pooled")
	}
	p.ungranted(10)
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
	// Lease 1 expired unused: the batch went back from 2 to 1, and the
	// next top-up does not double it.
	if k := p.topUp(10); k != 1 {
		t.Fatalf("top-up after a lease expired unused = %d; want 1", k)
	}
	// Leases held and being granted together stay within the cap, and a
	// TTL with enough leases in flight gets no more.
	if k := p.topUp(10); k != 0 {
		t.Fatalf("top-up with the batch in flight = %d; want 0", k)
	}
	if k := p.topUp(20); k != 2 {
		t.Fatalf("top-up of another TTL = %d; want 2", k)
	}
	if k := p.topUp(30); k != 0 {
		t.Fatalf("top-up with 3 grants in flight in a pool of 3 = %d; want 0", k)
	}
	p.ungranted(10)
	p.ungranted(20)
	p.ungranted(20)

	// Full: the lease that expires first is left out, the newcomer included.
	for id, at := range map[clientv3.LeaseID]time.Duration{10: 3 * time.Second, 11: time.Second, 12: 2 * time.Second} {
		p.putUnused(id, ten, t0.Add(at), t0)
	}
	if k := p.topUp(10); k != 0 {
		t.Fatalf("top-up of a full pool = %d; want 0", k)
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
	if off.topUp(10) != 0 || off.putUnused(2, ten, t0, t0) {
		t.Fatal("a pool of 0 kept a lease")
	}
}

// TestABatchGrowsWithSteadyDemand: while no lease expires unused, each
// top-up doubles the batch, up to maxAhead.
func TestABatchGrowsWithSteadyDemand(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	p := newLeasePool(64)
	var sizes []int
	id := clientv3.LeaseID(1)
	for range 6 {
		k := p.topUp(10)
		sizes = append(sizes, k)
		for range k {
			p.granted(10, id, 10*time.Second, t0, t0)
			id++
		}
		for p.n > 0 { // every lease taken before the next top-up
			if _, ok := p.take(10, t0); !ok {
				t.Fatal("take found no lease in a pool holding some")
			}
		}
	}
	if want := []int{2, 4, 8, 16, 16, 16}; !slices.Equal(sizes, want) {
		t.Fatalf("batches %v; want %v", sizes, want)
	}
}

// racingTxn passes the client's KV calls through, except that the first
// transaction committed after armed is set runs between after it, then
// returns.
type racingTxn struct {
	clientv3.KV
	armed   atomic.Bool
	between func()
}

func (r *racingTxn) Txn(ctx context.Context) clientv3.Txn { return &txnThen{r.KV.Txn(ctx), r} }

type txnThen struct {
	clientv3.Txn
	r *racingTxn
}

func (t *txnThen) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *txnThen) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *txnThen) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *txnThen) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if t.r.armed.CompareAndSwap(true, false) {
		t.r.between()
	}
	return resp, err
}

// TestAReleaseRacingAForceRevokeEndsTheGrantOnce: a release through a
// lock-server that has seen no token offset yet guesses the grant's
// offset wrong, reads the key in its first transaction, and sends a
// second; a force-revoke lands between the two. Exactly one of them ends
// the grant, and the other is told the grant was not held.
func TestAReleaseRacingAForceRevokeEndsTheGrantOnce(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	race := &racingTxn{KV: cli.KV}
	cli.KV = race
	prefix := newPrefix(t)
	s, err := New(cli, conf(func(cfg *Config) { cfg.Prefix = prefix }), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	operator := openCfgT(t, func(cfg *Config) { cfg.Prefix = prefix })

	l := mustAcquire(t, operator, "k", "worker-a", 10*time.Second)
	var revokeErr error
	race.between = func() { _, revokeErr = operator.Revoke(ctxT(t), "k", l.Token) }
	race.armed.Store(true)
	err = s.Release(ctxT(t), "k", "worker-a", l.Token)
	if race.armed.Load() {
		t.Fatal("the release sent no transaction")
	}
	if revokeErr != nil {
		t.Fatalf("the force-revoke that came first: %v", revokeErr)
	}
	if !errors.Is(err, store.ErrNotHeld) {
		t.Fatalf("the release that came second = %v; want ErrNotHeld", err)
	}
	if st, err := s.Inspect(ctxT(t), "k"); err != nil || st.Lease != nil {
		t.Fatalf("Inspect = %+v, %v; want no grant", st.Lease, err)
	}
}
