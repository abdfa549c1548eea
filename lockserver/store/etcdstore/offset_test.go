package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// slackMicros bounds how far a token may run ahead of the clock the
// offset was last raised to: one microsecond per revision made since, by
// this test and the others sharing the cluster.
const slackMicros = 100_000

// TestTokensFollowTheClockAndAClockSteppedBackLowersNothing: the first
// grant raises the offset so that its token is just above lock-server's
// clock in microseconds; a clock ten seconds later moves tokens with it;
// within a second no raise is needed; a clock stepped back an hour lowers
// neither the offset nor the tokens, through this store or a new one; a
// clock past 2^53 - 1 microseconds grants nothing.
func TestTokensFollowTheClockAndAClockSteppedBackLowersNothing(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	us0 := t0.UnixMicro()
	clk := &fakeClock{now: t0}
	s := openCfgT(t, func(cfg *Config) { cfg.Clock, cfg.IdleLeases = clk, 0 })
	const key = "payout:acct-clock"

	t1 := grantRelease(t, s, key, 1)
	if t1 <= us0 || t1 > us0+slackMicros {
		t.Fatalf("first grant at %v: token %d; want just above the clock, %d", t0, t1, us0)
	}
	clk.advance(10 * time.Second)
	t2 := grantRelease(t, s, key, 1)
	if t2 <= us0+10_000_000 || t2 > us0+10_000_000+slackMicros {
		t.Fatalf("grant ten seconds later: token %d; want just above %d", t2, us0+10_000_000)
	}
	raised := offsetT(t, s)
	clk.advance(500 * time.Millisecond)
	t3 := grantRelease(t, s, key, 1)
	if t3 <= t2 || t3 >= us0+10_500_000 || offsetT(t, s) != raised {
		t.Fatalf("grant half a second later: token %d, offset %d; want above %d, below the clock (%d), offset still %d (no raise within a second)",
			t3, offsetT(t, s), t2, us0+10_500_000, raised)
	}

	clk.advance(-time.Hour)
	t4 := grantRelease(t, s, key, 1)
	if t4 <= t3 || offsetT(t, s) != raised {
		t.Fatalf("grant with the clock stepped back an hour: token %d, offset %d; want above %d, offset still %d", t4, offsetT(t, s), t3, raised)
	}
	restarted := openCfgT(t, func(cfg *Config) { cfg.Prefix, cfg.Clock, cfg.IdleLeases = s.prefix, clk, 0 })
	t5 := grantRelease(t, restarted, key, 1)
	if t5 <= t4 || offsetT(t, s) != raised {
		t.Fatalf("a new store's grant with the clock stepped back: token %d, offset %d; want above %d, offset still %d", t5, offsetT(t, s), t4, raised)
	}

	clk.set(time.UnixMicro(store.MaxAdvancePast + 1))
	if l, err := s.Acquire(ctxT(t), key, "worker-a", 2*shared.MinLeaseTTL()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with the clock past 2^53 - 1 us: %+v, %v; want ErrUnavailable", l, err)
	}
	if st, err := s.Inspect(ctxT(t), key); err != nil || st.Lease != nil || offsetT(t, s) != raised {
		t.Fatalf("after the refusal: %+v, %v, offset %d; want no lease and offset still %d", st.Lease, err, offsetT(t, s), raised)
	}
}

func (c *fakeClock) set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = at
}

// TestAGrantOnAnOffsetRaisedSinceItsReadIsAboveTheRaise: store a's clock
// is five seconds behind b's, so a never raises the offset itself and
// keeps using the version it read while b raises it. Each of a's grants
// (Acquire, Handoff, group grant) is sent after b has raised the offset
// and granted: its compare on the offset fails, and it is sent again with
// the new offset, above b's grant, as the revision order says it must.
func TestAGrantOnAnOffsetRaisedSinceItsReadIsAboveTheRaise(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	clkA, clkB := &fakeClock{now: t0}, &fakeClock{now: t0}
	a := openCfgT(t, func(cfg *Config) { cfg.Clock, cfg.IdleLeases = clkA, 0 })
	b := openCfgT(t, func(cfg *Config) { cfg.Prefix, cfg.Clock, cfg.IdleLeases = a.prefix, clkB, 0 })
	ttl := 10 * time.Second
	last := grantRelease(t, a, "payout:acct-a", 1)
	bGrants := func() {
		t.Helper()
		clkB.advance(5 * time.Second)
		tb := grantRelease(t, b, "payout:acct-b", 1)
		if tb <= last {
			t.Fatalf("b's grant after its raise: token %d; want above %d", tb, last)
		}
		last = tb
	}
	above := func(what string, token int64) {
		t.Helper()
		if token <= last {
			t.Fatalf("%s after b raised the offset and granted %d: token %d", what, last, token)
		}
		last = token
	}

	bGrants()
	held := mustAcquire(t, a, "payout:acct-a", "worker-a", ttl)
	above("a's Acquire", held.Token)

	bGrants()
	handed, err := a.Handoff(ctxT(t), store.LeaseRef{Key: held.Key, Owner: held.Owner, Token: held.Token},
		store.AcquireRequest{Key: held.Key, Owner: "worker-c", TTL: ttl})
	if err != nil {
		t.Fatalf("a's Handoff of a grant made with an older offset: %v", err)
	}
	above("a's Handoff", handed.Token)
	if err := a.Release(ctxT(t), handed.Key, handed.Owner, handed.Token); err != nil {
		t.Fatalf("Release of the handed-off grant: %v", err)
	}

	bGrants()
	res := a.AcquireMany(ctxT(t), []store.AcquireRequest{{Key: "payout:acct-x", Owner: "worker-a", TTL: ttl}, {Key: "payout:acct-y", Owner: "worker-a", TTL: ttl}})
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("a's group grant, member %d: %v", i, r.Err)
		}
		if r.Lease.Token <= last {
			t.Fatalf("a's group grant after b raised the offset and granted %d: member %d has token %d", last, i, r.Lease.Token)
		}
	}
}

// TestAGrantOfAnEarlierVersionIsReleasedHandedOffAndInspectedByItsRevision:
// a key written as lock-servers before the token offset wrote it (a
// record without an offset) is the grant whose token is its ModRevision:
// Inspect reports it, Renew and Handoff accept it, and the grant after it
// is above it.
func TestAGrantOfAnEarlierVersionIsReleasedHandedOffAndInspectedByItsRevision(t *testing.T) {
	s := openCfgT(t, func(cfg *Config) { cfg.IdleLeases = 0 })
	const key = "payout:acct-old"
	g, err := s.cli.Grant(ctxT(t), 10)
	if err != nil {
		t.Fatal(err)
	}
	put, err := s.cli.Put(ctxT(t), s.prefix+key, `{"owner":"worker-a","ttlMs":10000}`, clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	old := put.Header.Revision
	st, err := s.Inspect(ctxT(t), key)
	if err != nil || st.Lease == nil || st.LastToken != old || st.Lease.Token != old {
		t.Fatalf("Inspect of an earlier version's grant: %+v, %v; want token %d, its revision", st, err, old)
	}
	if _, err := s.Renew(ctxT(t), key, "worker-a", old); err != nil {
		t.Fatalf("Renew(%d): %v", old, err)
	}
	l, err := s.Handoff(ctxT(t), store.LeaseRef{Key: key, Owner: "worker-a", Token: old},
		store.AcquireRequest{Key: key, Owner: "worker-b", TTL: 10 * time.Second})
	if err != nil || l.Token <= old {
		t.Fatalf("Handoff of an earlier version's grant: %+v, %v; want a token above %d", l, err, old)
	}
	if err := s.Release(ctxT(t), key, "worker-b", l.Token); err != nil {
		t.Fatalf("Release(%d): %v", l.Token, err)
	}
}

// tickingClock is a store clock that moves by step at every reading, from
// its own start: lock-servers whose clocks run fast and apart, so that
// raises of the offset are frequent and race every grant.
type tickingClock struct {
	start time.Time
	step  time.Duration
	n     atomic.Int64
}

func (c *tickingClock) Now() time.Time { return c.start.Add(time.Duration(c.n.Add(1)) * c.step) }

// TestTokensFollowRevisionOrderWhileRaisesRaceGrants: three lock-servers,
// whose clocks run fast and apart, grant, hand off and group-grant four
// keys from twelve goroutines, raising the offset as they go. Read back in
// revision order (a watch on the prefix), every grant's token, its key's
// ModRevision plus its record's offset, is above the previous grant's
// (equal only within one group grant's revision); every token a caller
// was given is one of them; and each key's grants strictly increase.
func TestTokensFollowRevisionOrderWhileRaisesRaceGrants(t *testing.T) {
	const seed = 20261205
	t.Logf("seed %d", seed)
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	var stores []*Store
	for i := range 3 {
		clk := &tickingClock{start: t0.Add(time.Duration(i) * 700 * time.Millisecond), step: time.Duration(40*(i+1)) * time.Millisecond}
		stores = append(stores, openCfgT(t, func(cfg *Config) {
			cfg.Clock, cfg.IdleLeases = clk, 0
			if i > 0 {
				cfg.Prefix = stores[0].prefix
			}
		}))
	}
	prefix := stores[0].prefix
	for _, s := range stores { // each stamps or reads the restore guard's stamp first, one at a time
		grantRelease(t, s, "payout:warm-up", 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	at, err := stores[0].cli.Get(ctx, prefix, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	w := stores[0].cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(at.Header.Revision+1))

	keys := []string{"payout:acct-1", "payout:acct-2", "payout:acct-3", "payout:acct-4"}
	var (
		mu      sync.Mutex
		perKey  = map[string][]int64{} // each key's tokens, in grant order
		given   = map[string]bool{}    // key + token, as callers were told
		wg      sync.WaitGroup
		failure = make(chan error, 12)
	)
	// note records a grant while it is held, so a key's order is its
	// grants' order.
	note := func(l store.Lease) {
		mu.Lock()
		defer mu.Unlock()
		perKey[l.Key] = append(perKey[l.Key], l.Token)
		given[l.Key+"@"+strconv.FormatInt(l.Token, 10)] = true
	}
	for g := range 12 {
		s := stores[g%3]
		rng := rand.New(rand.NewPCG(seed, uint64(g)))
		owner := "worker-" + strconv.Itoa(g)
		wg.Go(func() {
			for range 25 {
				if err := oneRound(ctx, s, rng, keys, owner, note); err != nil {
					failure <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(failure)
	for err := range failure {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	end, err := stores[0].cli.Put(ctx, prefix+"~end", "")
	if err != nil {
		t.Fatal(err)
	}

	var lastRev, lastToken int64
	raises, grants := 0, 0
	seen := map[string]bool{}
	for resp := range w {
		if err := resp.Err(); err != nil {
			t.Fatalf("watch: %v", err)
		}
		for _, ev := range resp.Events {
			name := strings.TrimPrefix(string(ev.Kv.Key), prefix)
			switch {
			case ev.Type != clientv3.EventTypePut || name == guardName:
				continue
			case name == offsetName:
				raises++
				continue
			case ev.Kv.ModRevision == end.Header.Revision:
				if raises < 5 {
					t.Errorf("%d raises of the offset during the run; want several racing the grants", raises)
				}
				for k := range given {
					if !seen[k] {
						t.Errorf("grant %s was reported to its caller but is not in etcd's history", k)
					}
				}
				for key, toks := range perKey {
					for i := 1; i < len(toks); i++ {
						if toks[i] <= toks[i-1] {
							t.Errorf("key %s: grant %d has token %d, not above the previous grant's %d", key, i, toks[i], toks[i-1])
						}
					}
				}
				t.Logf("%d grants in revision order, %d raises of the offset, last token %d", grants, raises, lastToken)
				return
			}
			var rec record
			if err := json.Unmarshal(ev.Kv.Value, &rec); err != nil {
				t.Fatalf("key %s holds %q: %v", name, ev.Kv.Value, err)
			}
			token := ev.Kv.ModRevision + rec.Offset
			if token < lastToken || (token == lastToken && ev.Kv.ModRevision != lastRev) {
				t.Fatalf("revision %d (%s) has token %d; revision %d before it has %d", ev.Kv.ModRevision, name, token, lastRev, lastToken)
			}
			lastRev, lastToken = ev.Kv.ModRevision, token
			seen[name+"@"+strconv.FormatInt(token, 10)] = true
			grants++
		}
	}
	t.Fatal("the watch ended before the end marker")
}

// oneRound is one goroutine's step of the race: acquire a key (and at
// times hand it off once, or group-grant two keys), record each grant
// while it is held, then release it.
func oneRound(ctx context.Context, s *Store, rng *rand.Rand, keys []string, owner string, note func(store.Lease)) error {
	ttl := 10 * time.Second
	switch op := rng.IntN(10); {
	case op < 2:
		i := rng.IntN(len(keys))
		reqs := []store.AcquireRequest{{Key: keys[i], Owner: owner, TTL: ttl}, {Key: keys[(i+1)%len(keys)], Owner: owner, TTL: ttl}}
		var refs []store.LeaseRef
		for _, r := range s.AcquireMany(ctx, reqs) {
			if errors.Is(r.Err, store.ErrLockHeld) {
				continue
			}
			if r.Err != nil {
				return r.Err
			}
			note(r.Lease)
			refs = append(refs, store.LeaseRef{Key: r.Lease.Key, Owner: r.Lease.Owner, Token: r.Lease.Token})
		}
		return errors.Join(s.ReleaseMany(ctx, refs)...)
	default:
		l, err := s.Acquire(ctx, keys[rng.IntN(len(keys))], owner, ttl)
		if errors.Is(err, store.ErrLockHeld) {
			return nil
		}
		if err != nil {
			return err
		}
		note(l)
		if op < 4 {
			if l, err = s.Handoff(ctx, store.LeaseRef{Key: l.Key, Owner: l.Owner, Token: l.Token},
				store.AcquireRequest{Key: l.Key, Owner: owner + "-next", TTL: ttl}); err != nil {
				return err
			}
			note(l)
		}
		return s.Release(ctx, l.Key, l.Owner, l.Token)
	}
}
