package memstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// fakeClock is a manually advanced clock shared by every store of one test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestContract(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	storetest.Run(t, storetest.Backend{
		Name:     "memstore",
		Open:     func(*testing.T) store.LockStore { return memstore.New(clock) },
		Reopen:   func(_ *testing.T, s store.LockStore) store.LockStore { return s },
		ShortTTL: time.Second,
		Advance:  clock.Advance,
	})
}

func TestContractOverHTTP(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	storetest.Run(t, servertest.OverHTTP(storetest.Backend{
		Name:     "memstore",
		Open:     func(*testing.T) store.LockStore { return memstore.New(clock) },
		Reopen:   func(_ *testing.T, s store.LockStore) store.LockStore { return s },
		ShortTTL: time.Second,
		Advance:  clock.Advance,
	}))
}

func TestContractBatched(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	storetest.Run(t, servertest.Batched(storetest.Backend{
		Name:     "memstore",
		Open:     func(*testing.T) store.LockStore { return memstore.New(clock) },
		Reopen:   func(_ *testing.T, s store.LockStore) store.LockStore { return s },
		ShortTTL: time.Second,
		Advance:  clock.Advance,
	}))
}

// TestLinearizableWaiting: the linearizability workload through a
// lock-server whose acquires all wait (handoffs to parked waiters).
func TestLinearizableWaiting(t *testing.T) {
	servertest.CheckLinearizableWaiting(t, "memstore", memstore.New(nil), false)
}

// TestLinearizableWaitingCancelled: the same with some waiting acquires
// cancelled mid-wait.
func TestLinearizableWaitingCancelled(t *testing.T) {
	servertest.CheckLinearizableWaiting(t, "memstore", memstore.New(nil), true)
}
