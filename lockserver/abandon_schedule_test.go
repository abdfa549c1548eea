package lockserver_test

// Seeded random schedules of acquires whose requests end at chosen points
// (review of the release of abandoned grants, abandon.go): plain and
// waiting acquires of two keys, some of them cancelled inside the store
// just after it granted them, some at a random moment, each store call
// delayed by its client's own latency. Whatever the schedule:
//
//   - a client answered 200 is the key's only holder, its token above
//     every earlier 200 of the key, and its renewal and release succeed
//     (no background release ended its lease);
//   - a request cancelled in the store after its grant is never answered
//     200;
//   - every waiter whose request did not end is granted, and well before
//     WaitPoll (10 s here): every release, abandoned ones included, woke
//     or handed off to the key's next waiter;
//   - Close returns nil, no release failed, and both keys are free at the
//     end although every grant had a TTL of a minute (no abandoned grant
//     was left to its TTL).

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// schedStore is a memstore whose calls wait their owner's latency first,
// and which ends an owner's request (cancelAfterGrant) right after a
// call granted it the key: Acquire, AcquireMany or Handoff.
type schedStore struct {
	*memstore.Store

	mu          sync.Mutex
	latency     map[string]time.Duration
	cancelAfter map[string]context.CancelFunc
}

func newSchedStore() *schedStore {
	return &schedStore{Store: memstore.New(nil), latency: map[string]time.Duration{}, cancelAfter: map[string]context.CancelFunc{}}
}

func (s *schedStore) wait(owner string) {
	s.mu.Lock()
	d := s.latency[owner]
	s.mu.Unlock()
	time.Sleep(d)
}

// granted ends owner's request if the schedule says so.
func (s *schedStore) granted(owner string) {
	s.mu.Lock()
	cancel := s.cancelAfter[owner]
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (s *schedStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	s.wait(owner)
	l, err := s.Store.Acquire(ctx, key, owner, ttl)
	if err == nil {
		s.granted(owner)
	}
	return l, err
}

func (s *schedStore) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	s.wait(reqs[0].Owner)
	res := s.Store.AcquireMany(ctx, reqs)
	for i, r := range res {
		if r.Err == nil {
			s.granted(reqs[i].Owner)
		}
	}
	return res
}

func (s *schedStore) Release(ctx context.Context, key, owner string, token int64) error {
	s.wait(owner)
	return s.Store.Release(ctx, key, owner, token)
}

func (s *schedStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	s.wait(from.Owner)
	l, err := s.Store.Handoff(ctx, from, to)
	if err == nil {
		s.granted(to.Owner)
	}
	return l, err
}

// How a scheduled client's acquire ends.
const (
	endNever      = iota // answered, whatever the answer
	endAfterGrant        // cancelled in the store right after its grant
	endAtRandom          // cancelled after a random delay
)

type schedClient struct {
	owner, key string
	waitMs     int64
	end        int
	start      time.Duration // after the test's start
	cancelAt   time.Duration // endAtRandom: after its start
	hold       time.Duration // between the 200 and the release
	latency    time.Duration // of each of its store calls
}

func schedule(seed uint64, n int) []schedClient {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	cs := make([]schedClient, n)
	for i := range cs {
		c := schedClient{
			owner:    fmt.Sprintf("c%02d", i),
			key:      fmt.Sprintf("payout:acct-%d", r.IntN(2)),
			end:      r.IntN(3),
			start:    time.Duration(r.IntN(12)) * time.Millisecond,
			cancelAt: time.Duration(r.IntN(30)) * time.Millisecond,
			hold:     time.Duration(r.IntN(15)) * time.Millisecond,
			latency:  time.Duration(1+r.IntN(4)) * time.Millisecond,
		}
		if r.IntN(3) > 0 {
			c.waitMs = api.MaxWaitMs
		}
		cs[i] = c
	}
	return cs
}

// holders checks that at most one client answered 200 holds each key and
// that tokens of a key's 200s increase.
type holders struct {
	mu   sync.Mutex
	now  map[string]string // key -> owner told 200, not yet releasing
	last map[string]int64  // key -> token of its latest 200
}

func (h *holders) granted(t *testing.T, key, owner string, token int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if other, ok := h.now[key]; ok {
		t.Errorf("%s told 200 for %q (token %d) while %s holds it: two holders", owner, key, token, other)
	}
	if token <= h.last[key] {
		t.Errorf("%s told 200 for %q with token %d, not above the previous 200's %d", owner, key, token, h.last[key])
	}
	h.now[key], h.last[key] = owner, token
}

func (h *holders) releasing(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.now, key)
}

// schedPost serves lockRequest(ctx, key, op, body) on h.
func schedPost(ctx context.Context, h http.Handler, key, op string, body any) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, lockRequest(ctx, key, op, body))
	return rec
}

// runSchedule plays cs on a Server configured by mod and checks the
// properties listed at the top of this file.
func runSchedule(t *testing.T, cs []schedClient, mod func(*lockserver.ServerConfig)) {
	store := newSchedStore()
	h, logs := abandonServer(t, store, func(c *lockserver.ServerConfig) {
		c.WaitPoll = lockserver.MaxWaitPoll
		mod(c)
	})
	hs := &holders{now: map[string]string{}, last: map[string]int64{}}
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range cs {
		ctx, cancel := context.WithCancel(t.Context())
		store.mu.Lock()
		store.latency[c.owner] = c.latency
		if c.end == endAfterGrant {
			store.cancelAfter[c.owner] = cancel
		}
		store.mu.Unlock()
		switch c.end {
		case endAtRandom:
			time.AfterFunc(c.start+c.cancelAt, cancel)
		}
		wg.Go(func() {
			defer cancel()
			time.Sleep(c.start)
			rec := schedPost(ctx, h, c.key, api.SuffixAcquire, api.AcquireRequest{Owner: c.owner, TTLMs: 60_000, WaitMs: c.waitMs})
			switch {
			case rec.Code == http.StatusOK:
			case c.end == endNever && c.waitMs > 0:
				t.Errorf("%s, a waiter whose request never ended: %d %s; want granted", c.owner, rec.Code, rec.Body)
				return
			case c.end == endNever && rec.Code != http.StatusConflict:
				t.Errorf("%s, a plain acquire whose request never ended: %d %s; want 200 or 409", c.owner, rec.Code, rec.Body)
				return
			default:
				return
			}
			if c.end == endAfterGrant {
				t.Errorf("%s was answered its grant although its request ended in the store right after it: %s", c.owner, rec.Body)
			}
			var g api.Grant
			if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil {
				t.Errorf("%s: %v", c.owner, err)
				return
			}
			if time.Since(start) >= lockserver.MaxWaitPoll {
				t.Errorf("%s granted %v after the start: a waiter was not woken by a release, WaitPoll found the key", c.owner, time.Since(start))
			}
			hs.granted(t, c.key, c.owner, g.Token)
			time.Sleep(c.hold / 2)
			if rec := schedPost(t.Context(), h, c.key, api.SuffixRenew, api.RenewRequest{Owner: c.owner, Token: g.Token}); rec.Code != http.StatusOK {
				t.Errorf("%s renewing its lease (token %d): %d %s; want 200: its lease was ended under it", c.owner, g.Token, rec.Code, rec.Body)
			}
			time.Sleep(c.hold / 2)
			hs.releasing(c.key)
			if rec := schedPost(t.Context(), h, c.key, api.SuffixRelease, api.ReleaseRequest{Owner: c.owner, Token: g.Token}); rec.Code != http.StatusNoContent {
				t.Errorf("%s releasing its lease (token %d): %d %s; want 204: its lease was ended under it", c.owner, g.Token, rec.Code, rec.Body)
			}
		})
	}
	wg.Wait()
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, key := range []string{"payout:acct-0", "payout:acct-1"} {
		if l := liveLease(t, store, key); l != nil {
			t.Errorf("key %q still held by %+v after every client released or left: a grant left to its TTL", key, *l)
		}
	}
	if got := testutil.ToFloat64(h.AbandonedCounter().WithLabelValues("failed")); got != 0 {
		t.Errorf("lockserver_abandoned_grants_total{outcome=failed} = %v, want 0", got)
	}
	if ev := logs.Events(t, lockserver.EventWaitReleaseFailed); len(ev) != 0 {
		t.Errorf("%s lines: %v", lockserver.EventWaitReleaseFailed, ev)
	}
}

// TestSchedulesOfAbandonedGrantsKeepOneHolderAndLeakNothing plays 50
// seeded schedules of 20 clients on each configuration (batching, with or
// without a window, or none; handoff on or off). A failing seed is named
// in the subtest.
func TestSchedulesOfAbandonedGrantsKeepOneHolderAndLeakNothing(t *testing.T) {
	for _, cfg := range []struct {
		name              string
		batching, handoff bool
		window            time.Duration
	}{
		{"batched-handoff", true, true, 0}, {"batched", true, false, 0},
		{"batch-window-handoff", true, true, 3 * time.Millisecond}, {"batch-window", true, false, 3 * time.Millisecond},
		{"single-handoff", false, true, 0}, {"single", false, false, 0},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			for seed := range uint64(50) {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						runSchedule(t, schedule(seed, 20), func(c *lockserver.ServerConfig) {
							c.Batching, c.Handoff, c.Batch.Window = cfg.batching, cfg.handoff, cfg.window
						})
					})
				})
			}
		})
	}
}
