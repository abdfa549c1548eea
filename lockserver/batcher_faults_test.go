package lockserver_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// lateCancelCtx is a context whose first Err call answers as the context
// was at that instant, then cancels it and waits until its caller has
// returned: the interleaving in which the caller's context ends just
// after the Batcher looked at it.
type lateCancelCtx struct {
	context.Context
	cancel   context.CancelFunc
	returned chan struct{}
	fired    atomic.Bool
}

func (c *lateCancelCtx) Err() error {
	if !c.fired.CompareAndSwap(false, true) {
		return c.Context.Err()
	}
	err := c.Context.Err()
	c.cancel()
	<-c.returned
	return err
}

// TestARepeatWhoseCallerLeftAsItWasRequeuedDoesNotStallTheLane: a repeated
// acquire of a key whose first acquire failed (not held) goes back to the
// queue for the next batch. If its context ends just after the Batcher
// checked it, its caller returns (outcome unknown) while the Batcher puts
// it back in the queue and hands it the lead: nobody is there to take
// the lead, and every later acquire waited until its deadline, for ever
// (found by the adversarial review of group grant). The caller that left
// must never be queued again, and the next acquire is served.
func TestARepeatWhoseCallerLeftAsItWasRequeuedDoesNotStallTheLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		s.fail["k"] = fmt.Errorf("%w: injected", store.ErrUnavailable)
		b := newBatcher(t, s)
		var wg sync.WaitGroup
		var first, k1, k2 answer
		wg.Go(func() { first.lease, first.err = b.Acquire(t.Context(), "first", "w", time.Minute) })
		synctest.Wait() // in the store, behind the gate
		wg.Go(func() { k1.lease, k1.err = b.Acquire(t.Context(), "k", "w1", time.Minute) })
		synctest.Wait()
		inner, cancel := context.WithCancel(t.Context())
		late := &lateCancelCtx{Context: inner, cancel: cancel, returned: make(chan struct{})}
		wg.Go(func() {
			defer close(late.returned)
			k2.lease, k2.err = b.Acquire(late, "k", "w2", time.Minute)
		})
		synctest.Wait()
		close(s.gate)
		wg.Wait()
		if !errors.Is(k2.err, store.ErrUnavailable) {
			t.Fatalf("the repeat whose context ended: %+v, %v; want ErrUnavailable", k2.lease, k2.err)
		}

		ctx, cancelNext := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancelNext()
		l, err := b.Acquire(ctx, "next", "w3", time.Minute)
		if err != nil {
			t.Fatalf("the next acquire, on an idle Batcher: %v; want granted (the lane was handed to a caller that had left)", err)
		}
		if l.Owner != "w3" {
			t.Fatalf("next: %+v; want held by w3", l)
		}
		if st, _ := s.Inspect(t.Context(), "k"); st.Lease != nil && st.Lease.Owner == "w2" {
			t.Fatalf("key k granted to w2, whose caller had gone: %+v", *st.Lease)
		}
	})
}

// faultyBatchStore is a memstore whose single and batched acquires fail
// some members with ErrUnavailable (before the member is attempted) and
// yield the processor at random, from one seeded source, and which
// records every owner an acquire was sent for.
type faultyBatchStore struct {
	*memstore.Store
	mu   sync.Mutex
	rnd  *rand.Rand
	sent map[string]bool // owners whose acquire reached the store
}

func (s *faultyBatchStore) fault(owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent[owner] = true
	if s.rnd.IntN(4) == 0 {
		return fmt.Errorf("%w: injected", store.ErrUnavailable)
	}
	return nil
}

func (s *faultyBatchStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	runtime.Gosched()
	if err := s.fault(owner); err != nil {
		return store.Lease{}, err
	}
	return s.Store.Acquire(ctx, key, owner, ttl)
}

func (s *faultyBatchStore) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	runtime.Gosched()
	out := make([]store.Result, len(reqs))
	for i, r := range reqs {
		if err := s.fault(r.Owner); err != nil {
			out[i].Err = err
			continue
		}
		out[i].Lease, out[i].Err = s.Store.Acquire(ctx, r.Key, r.Owner, r.TTL)
	}
	return out
}

func (s *faultyBatchStore) wasSent(owner string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[owner]
}

// TestBatcherUnderRandomFaultsAndCancellations: many callers acquire and
// release a few keys at once through a Batcher (with and without a
// batching window) whose store fails a quarter of the members, some with
// contexts that end at random moments. Every
// call returns; a call told "nothing was done" never reached the store; a
// grant is the caller's own and is the key's live lease until released;
// and afterwards the Batcher still serves a new acquire (no lane is left
// waiting for a leader that is gone).
func TestBatcherUnderRandomFaultsAndCancellations(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			s := &faultyBatchStore{Store: memstore.New(nil), rnd: rand.New(rand.NewPCG(seed, 0)), sent: map[string]bool{}}
			cfg := lockserver.DefaultBatchConfig()
			if seed%2 == 0 {
				cfg.Window = 100 * time.Microsecond // even seeds: the first call of a batch waits for others
			}
			b, err := lockserver.NewBatcher(s, cfg)
			if err != nil {
				t.Fatal(err)
			}
			rnd := rand.New(rand.NewPCG(seed, 1))
			type plan struct {
				key    string
				cancel time.Duration // 0: never
			}
			const callers, each = 16, 40
			plans := make([][]plan, callers)
			for c := range plans {
				for range each {
					p := plan{key: fmt.Sprint("k", rnd.IntN(4))}
					if rnd.IntN(3) == 0 {
						p.cancel = time.Duration(rnd.IntN(200)) * time.Microsecond
					}
					plans[c] = append(plans[c], p)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, callers*each)
			for c := range callers {
				wg.Go(func() {
					for i, p := range plans[c] {
						owner := fmt.Sprintf("w%d-%d", c, i)
						ctx, cancel := context.WithCancel(t.Context())
						if p.cancel > 0 {
							time.AfterFunc(p.cancel, cancel)
						}
						l, err := b.Acquire(ctx, p.key, owner, time.Minute)
						cancel()
						switch {
						case err == nil:
							if l.Owner != owner || l.Key != p.key {
								errs <- fmt.Errorf("%s: granted %+v; want its own lease of %s", owner, l, p.key)
								continue
							}
							if st, _ := s.Inspect(t.Context(), p.key); st.Lease == nil || st.Lease.Token != l.Token {
								errs <- fmt.Errorf("%s: granted token %d of %s, but the key's lease is %+v", owner, l.Token, p.key, st.Lease)
							}
							if err := b.Release(t.Context(), p.key, owner, l.Token); err != nil {
								errs <- fmt.Errorf("%s: release of its grant: %v", owner, err)
							}
						case strings.Contains(err.Error(), "nothing was done") && s.wasSent(owner):
							errs <- fmt.Errorf("%s: answered %v, but its acquire reached the store", owner, err)
						}
					}
				})
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("callers still waiting after 30 s: a lane is stuck")
			}
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// The lanes are idle: a new acquire is served at once.
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			for {
				_, err := b.Acquire(ctx, "after", "last", time.Minute)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("an acquire after the storm: %v; want granted (a lane is stuck)", err)
				}
			}
		})
	}
}

// TestALeaderWhoseContextEndsInTheWindowIsNeverSent: with a batching
// window, the first acquire waits for others before it is sent. If its
// context ends during that wait, nothing has been sent for it: it must be
// answered ErrUnavailable, nothing done, and never reach the store, while
// the acquires that joined it in the window are still served. Sent in the
// batch anyway (on a context without its cancellation), it was granted a
// lease that its caller, gone, would never use or release, and the key
// was held for the whole TTL (found by the adversarial review).
func TestALeaderWhoseContextEndsInTheWindowIsNeverSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		close(s.gate)
		cfg := lockserver.DefaultBatchConfig()
		cfg.Window = 50 * time.Millisecond
		b, err := lockserver.NewBatcher(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var leader, joined answer
		wg.Go(func() { leader.lease, leader.err = b.Acquire(ctx, "gone", "w1", time.Minute) })
		synctest.Wait() // in its window
		wg.Go(func() { joined.lease, joined.err = b.Acquire(t.Context(), "other", "w2", time.Minute) })
		synctest.Wait()
		cancel()
		wg.Wait()
		if !errors.Is(leader.err, store.ErrUnavailable) || !strings.Contains(leader.err.Error(), "nothing was done") {
			t.Errorf("the leader whose context ended in the window: %+v, %v; want ErrUnavailable, nothing done", leader.lease, leader.err)
		}
		if st, _ := s.Inspect(t.Context(), "gone"); st.Lease != nil {
			t.Errorf("key gone is held by %+v, granted to a caller that had left before anything was sent", *st.Lease)
		}
		if joined.err != nil || joined.lease.Owner != "w2" {
			t.Errorf("the acquire that joined in the window: %+v, %v; want granted", joined.lease, joined.err)
		}
	})
}
