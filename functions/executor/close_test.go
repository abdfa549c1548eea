package executor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// TestCloseRacingDeliveriesLeavesNoLeaseHeld: deliveries of one account's
// payout run at once (they queue for its lease at lock-server) while
// lock-server answers each release after a seeded random delay, and Close
// is called while some deliveries are still executing and some releases
// are still in flight. Close returns nil once the releases it waits for
// have ended; a delivery answered after Close released before it
// answered; so once every delivery has been answered and Close has
// returned, no lease is held, and the next delivery is granted at once.
func TestCloseRacingDeliveriesLeavesNoLeaseHeld(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
			var mu sync.Mutex
			rnd := rand.New(rand.NewPCG(seed, 3))
			delay := func() time.Duration {
				mu.Lock()
				defer mu.Unlock()
				return time.Duration(rnd.IntN(20)) * time.Millisecond
			}
			slowRelease := func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if lockOp(r) == "release" {
						time.Sleep(delay()) // lock-server's answer takes a while: what is raced, not awaited
					}
					next.ServeHTTP(w, r)
				})
			}
			rig := newChainRig(t, deps, rigConfig{ttl: time.Minute, acquireWait: 10 * time.Second, lock: slowRelease})
			body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
			const deliveries = 6
			var wg sync.WaitGroup
			answered := make(chan int, deliveries)
			for range deliveries {
				wg.Go(func() { answered <- push(t, rig.x, body).Code })
			}
			first := <-answered // one delivery answered: its release is in flight, others still run
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			closed := make(chan error, 1)
			go func() { closed <- rig.x.Close(ctx) }()
			wg.Wait()
			if err := <-closed; err != nil {
				t.Fatalf("Close: %v", err)
			}
			close(answered)
			if first != http.StatusOK {
				t.Errorf("the first delivery answered %d; want 200", first)
			}
			for code := range answered {
				if code != http.StatusOK {
					t.Errorf("a delivery answered %d; want 200", code)
				}
			}
			if st, err := rig.store.Inspect(t.Context(), event.LockKey()); err != nil || st.Lease != nil {
				t.Fatalf("after Close and every answer: lease %+v, %v; want none held", st.Lease, err)
			}
			if rec := push(t, rig.x, body); rec.Code != http.StatusOK {
				t.Fatalf("the next delivery: %d %s; want 200", rec.Code, rec.Body)
			}
		})
	}
}

// TestAFailedReleaseLeavesTheLeaseToExpire: lock-server refuses every
// release (503). The push is answered all the same, the lease's
// background renewal has stopped (no renewal reaches lock-server after the
// release was sent, for that lease's token), so the lease ends by its
// TTL, and the account's next delivery, waiting in lock-server's queue, is
// granted once it has.
func TestAFailedReleaseLeavesTheLeaseToExpire(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	var (
		mu               sync.Mutex
		released         int64 // the token of the release refused, 0 before it
		renewalsAfter    int   // renewals of that token after its release
		releaseAttempted = make(chan struct{})
		once             sync.Once
	)
	refuseRelease := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch lockOp(r) {
			case "release":
				var req lockapi.ReleaseRequest
				r.Body = readBack(t, r, &req)
				mu.Lock()
				released = req.Token
				mu.Unlock()
				once.Do(func() { close(releaseAttempted) })
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":{"code":"BACKEND_UNAVAILABLE","message":"injected","retryable":true}}`))
				return
			case "renew":
				var req lockapi.RenewRequest
				r.Body = readBack(t, r, &req)
				mu.Lock()
				if released != 0 && req.Token == released {
					renewalsAfter++
				}
				mu.Unlock()
			}
			next.ServeHTTP(w, r)
		})
	}
	const ttl = 1500 * time.Millisecond
	rig := newChainRig(t, deps, rigConfig{ttl: ttl, acquireWait: 10 * time.Second, lock: refuseRelease})
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	if rec := push(t, rig.x, body); rec.Code != http.StatusOK {
		t.Fatalf("first delivery: %d %s; want 200", rec.Code, rec.Body)
	}
	<-releaseAttempted
	first, err := rig.store.Inspect(t.Context(), event.LockKey())
	if err != nil || first.Lease == nil {
		t.Fatalf("after the refused release: %+v, %v; want the lease still held", first.Lease, err)
	}
	// The next delivery waits up to AcquireWait (10 s) in lock-server's
	// queue: granted only if the first lease ended by its TTL meanwhile.
	if rec := push(t, rig.x, body); rec.Code != http.StatusOK {
		t.Fatalf("next delivery: %d %s; want 200 once the first lease expired", rec.Code, rec.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if renewalsAfter != 0 {
		t.Errorf("%d renewals of token %d reached lock-server after its release was sent: a lease whose release failed is kept alive", renewalsAfter, released)
	}
}
