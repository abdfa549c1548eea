package servertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// waitingStore is httpStore whose Acquire is a waiting acquire (a seeded
// random wait of 10..200 ms), so that the workload's releases find parked
// head waiters and hand the key to them (lock-server's wait queue and
// Handoffer). With cancel, a few acquires have their request cancelled
// after a random short time, so that a waiter's request ends while its
// grant or a handoff to it is in flight (the outcome is then unknown).
type waitingStore struct {
	*httpStore
	mu     sync.Mutex
	rng    *rand.Rand
	cancel bool
}

// AbandonsUnknownGrants tells storetest.CheckLinearizable that lock-server
// itself may grant and then release an acquire whose request ended.
func (w *waitingStore) AbandonsUnknownGrants() {}

func (w *waitingStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	w.mu.Lock()
	wait := time.Duration(10+w.rng.IntN(190)) * time.Millisecond
	cut := w.cancel && w.rng.IntN(100) < 4
	after := time.Duration(w.rng.IntN(int(wait/time.Microsecond))) * time.Microsecond
	w.mu.Unlock()
	if cut {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := time.AfterFunc(after, cancel) // a perturbation, not a wait for a condition
		defer stop.Stop()
	}
	l, err := w.c.TryAcquire(ctx, key, client.WithTTL(ttl), client.WithLeaseOwner(owner), client.WithWait(wait))
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return store.Lease{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		if errors.Is(err, client.ErrLockHeld) {
			// A waiting acquire's LOCK_HELD does not say the key was held
			// at some moment of the wait: a waiter behind the head, or a
			// head whose wait ends mid-ask, is refused while the key may
			// be free (see the probe report). The model accepts it in any
			// state.
			return store.Lease{}, fmt.Errorf("%w: %w", storetest.ErrWaitedHeld, err)
		}
		return store.Lease{}, fromSDK(err)
	}
	return leaseOf(l.Grant()), nil
}

// CheckLinearizableWaiting runs the linearizability workload through a
// lock-server (handoff on) over inner, every acquire a waiting one, and
// fails t unless the history is linearizable and some releases handed
// the key to a parked waiter. With cancel, some waiting acquires are
// cancelled mid-wait (their outcome is unknown to the model).
func CheckLinearizableWaiting(t *testing.T, name string, inner store.LockStore, cancel bool) {
	t.Helper()
	cfg := lockserver.DefaultServerConfig()
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	log := slog.New(slog.DiscardHandler)
	h, err := lockserver.NewServer(inner, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithDriftAllowance(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	seed := storetest.Seed()
	ws := &waitingStore{httpStore: &httpStore{inner: inner, srv: srv, c: c}, rng: rand.New(rand.NewPCG(seed, 99)), cancel: cancel}
	var fault func()
	if cancel {
		fault = func() {} // allows the unknown outcomes of cancelled acquires
	}
	storetest.CheckLinearizable(t, name+"/waiting", ws, fault)
	by := handoffsByOutcome(t, reg)
	granted := by["granted"]
	t.Logf("seed %d: handoffs by outcome %v", seed, by)
	if granted == 0 && cfg.Handoff {
		t.Errorf("no release handed the key to a waiter: the check did not exercise the handoff")
	}
}

// handoffsByOutcome reads lockserver_handoffs_total from reg.
func handoffsByOutcome(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "lockserver_handoffs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" {
					out[lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
