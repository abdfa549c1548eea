package lockserver_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// TestCloseRacingAbandonedGrantsLosesNoRelease: acquires of keys of their
// own, each cancelled in the store just after its grant (so each grant is
// abandoned and released in the background, every release taking its
// client's latency), start at seeded random moments while Close is
// called at another; some arrive after Close has returned. Whatever the
// order:
//
//   - every abandoned grant is accounted for once: released (its key
//     free) or, found after Close began, counted failed (its key held,
//     left to its TTL); none is lost or counted twice;
//   - once Close has returned nil, no release it started is still
//     running: a key held when it returned is never freed afterwards;
//   - no request is answered its grant, and nothing panics (a release
//     started while Close waits would reuse its WaitGroup).
func TestCloseRacingAbandonedGrantsLosesNoRelease(t *testing.T) {
	for seed := range uint64(100) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 0xc105e))
				batching := r.IntN(2) == 0
				store := newSchedStore()
				h, _ := abandonServer(t, store, func(c *lockserver.ServerConfig) { c.Batching = batching })
				const n = 12
				keys := make([]string, n)
				var wg sync.WaitGroup
				for i := range n {
					owner := fmt.Sprintf("a%02d", i)
					keys[i] = "payout:acct-close-" + owner
					ctx, cancel := context.WithCancel(t.Context())
					store.mu.Lock()
					store.latency[owner] = time.Duration(r.IntN(20)) * time.Millisecond
					store.cancelAfter[owner] = cancel
					store.mu.Unlock()
					start := time.Duration(r.IntN(60)) * time.Millisecond
					wg.Go(func() {
						defer cancel()
						time.Sleep(start)
						if rec := schedPost(ctx, h, keys[i], api.SuffixAcquire, api.AcquireRequest{Owner: owner, TTLMs: 60_000}); rec.Code == http.StatusOK {
							t.Errorf("%s answered its grant although its request ended in the store: %s", owner, rec.Body)
						}
					})
				}
				time.Sleep(time.Duration(r.IntN(60)) * time.Millisecond)
				if err := h.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				held := func() map[string]bool {
					m := map[string]bool{}
					for _, k := range keys {
						if liveLease(t, store, k) != nil {
							m[k] = true
						}
					}
					return m
				}
				atClose := held()
				wg.Wait() // every acquire answered; those after Close left their grants held
				synctest.Wait()
				end := held()
				for k := range atClose {
					if !end[k] {
						t.Errorf("key %q, held when Close returned, was released after: Close returned before a release it had to wait for ended", k)
					}
				}
				released := testutil.ToFloat64(h.AbandonedCounter().WithLabelValues("released"))
				failed := testutil.ToFloat64(h.AbandonedCounter().WithLabelValues("failed"))
				stillHeld := len(end)
				if int(released)+int(failed) != n || int(failed) != stillHeld {
					t.Errorf("%d abandoned grants: %v released, %v failed, %d keys still held; want released+failed = %d and failed = held", n, released, failed, stillHeld, n)
				}
			})
		})
	}
}
