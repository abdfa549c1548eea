// Package storetest is the contract test suite of store.LockStore, written
// once and run against every backend (pgstore, etcdstore, memstore): a
// backend's test calls Run with a Backend that says how to open and
// restart its stores. Package lockserver/servertest runs the same suite
// through lock-server.
package storetest

import (
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Backend tells the suite how to drive one LockStore implementation.
type Backend struct {
	// Name labels subtests and failure messages ("postgres", "etcd", ...).
	Name string

	// Open returns a store over a fresh, empty namespace (a new database, a
	// new key prefix) that no other test touches. The suite closes it.
	Open func(t *testing.T) store.LockStore

	// Reopen closes s and returns a new store over the same namespace, as a
	// restarted lock-server process would open it. Required.
	Reopen func(t *testing.T, s store.LockStore) store.LockStore

	// RestartBackend, when set, opens a store over a backend that no test
	// running at the same time uses, and returns it with a function that stops the
	// backend and starts it again with its data intact; after that function
	// returns, the store must work again (reconnecting if it must). The suite
	// uses it to show tokens keep increasing across a backend restart, and
	// calls restart from a goroutine of its own in the linearizability
	// check: it must report failures with t.Errorf, never t.Fatalf.
	RestartBackend func(t *testing.T) (s store.LockStore, restart func())

	// Replica, when set, opens a second store over the namespace of s
	// without closing s, as the other replica of lock-server would. The
	// suite closes it. When nil, the two-replica check is skipped.
	Replica func(t *testing.T, s store.LockStore) store.LockStore

	// ShortTTL is the TTL the expiry tests ask for: the shortest the backend
	// honours without rounding much (PostgreSQL: exact; etcd: whole seconds
	// above its floor).
	ShortTTL time.Duration

	// Advance, when set, moves the backend's clock forward by d (fake-clock
	// backends). When nil, the suite waits for real time to pass, polling
	// Inspect until the backend itself reports the lease expired.
	Advance func(d time.Duration)

	// StepClock, when set, steps the wall clock by which the backend of s
	// decides expiry by d at once (forward when d > 0, backward when d < 0),
	// as an NTP step of the backend host's clock would, and leaves it
	// running from there. Only s's namespace may see the step. When nil,
	// the clock-step tests are skipped (etcd and memstore expire leases by
	// clocks that cannot step: etcd's monotonic clock, memstore's Clock).
	StepClock func(t *testing.T, s store.LockStore, d time.Duration)

	// Half, when 1 or 2, runs only the cases at odd (1) or even (2)
	// positions of a suite (Run, servertest.AbandonedGrants), counted from
	// 1, and skips the others: two backends given one half each run every
	// case once between them. Zero, the default, runs every case. make
	// test splits the suites through lock-server this way between
	// PostgreSQL (even) and etcd (odd); -matrix.full (make test-full) runs
	// them whole on both.
	Half int
}

// SkipOtherHalf skips t, case i (from 1) of a suite, when it is not in
// b's Half.
func (b Backend) SkipOtherHalf(t *testing.T, i int) {
	t.Helper()
	if b.Half != 0 && (i-b.Half)%2 != 0 {
		t.Skipf("case %d is in the other half (Backend.Half %d): the other backend runs it in make test; -matrix.full runs every case on both", i, b.Half)
	}
}
