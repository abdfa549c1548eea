// Package servertest runs lock-server (package lockserver) over a store
// for the stores' own tests: the storetest suite through the Batcher
// (Batched) and over HTTP and the SDK (OverHTTP), the linearizability
// check with waiting acquires and handoffs (CheckLinearizableWaiting), and
// abandoned grants (AbandonedGrants). It is kept out of lockserver/store
// so that no store package imports the server.
package servertest

import (
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// Batched wraps b so that the suite reaches the store through
// lockserver.Batcher (batching on, lock-server's defaults): concurrent
// acquires, releases and renewals of the suite's tests (ConcurrentAcquirers,
// Linearizable) are coalesced into the store's BatchStore calls, so every
// contract, linearizability and token-order test runs with batching on.
// Reopen and StepClock reach the store inside.
func Batched(b storetest.Backend) storetest.Backend {
	wrapped := b
	wrapped.Name = b.Name + "/batched"
	wrapped.Open = func(t *testing.T) store.LockStore { return batch(t, b.Open(t)) }
	wrapped.Reopen = func(t *testing.T, s store.LockStore) store.LockStore {
		return batch(t, b.Reopen(t, s.(*lockserver.Batcher).Unwrap()))
	}
	if b.Replica != nil {
		wrapped.Replica = func(t *testing.T, s store.LockStore) store.LockStore {
			return batch(t, b.Replica(t, s.(*lockserver.Batcher).Unwrap()))
		}
	}
	if b.StepClock != nil {
		wrapped.StepClock = func(t *testing.T, s store.LockStore, d time.Duration) {
			b.StepClock(t, s.(*lockserver.Batcher).Unwrap(), d)
		}
	}
	if b.RestartBackend != nil {
		wrapped.RestartBackend = func(t *testing.T) (store.LockStore, func()) {
			inner, restart := b.RestartBackend(t)
			return batch(t, inner), restart
		}
	}
	return wrapped
}

func batch(t *testing.T, s store.LockStore) *lockserver.Batcher {
	t.Helper()
	if _, ok := s.(store.BatchStore); !ok {
		t.Fatalf("servertest.Batched: %T is not a store.BatchStore", s)
	}
	bs, err := lockserver.NewBatcher(s, lockserver.DefaultBatchConfig())
	if err != nil {
		t.Fatalf("NewBatcher: %v", err)
	}
	t.Cleanup(func() {
		a, r, n := bs.Stats()
		t.Logf("batched store calls (requests/calls): acquire %d/%d, release %d/%d, renew %d/%d",
			a.Requests, a.Calls, r.Requests, r.Calls, n.Requests, n.Calls)
	})
	return bs
}
