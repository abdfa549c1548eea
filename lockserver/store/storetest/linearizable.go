package storetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/lockmodel"
)

// The linearizability check: several clients run a seeded random mix of
// acquire, renew, release (their own and stale ones), handoff (when the
// store is a store.Handoffer: the holder's release and a new grant to
// itself in one call, with its live token or a stale one), revoke and
// inspect on a few keys at once; every call is recorded with the times it was sent and
// answered; porcupine then searches for one sequential order, consistent
// with those times, in which every answer is what a single correct lock
// would have given. The sequential lock is lockmodel.Model.

// outcomeOf maps a store error to the model's outcome; ok is false for an
// error the model does not describe (the test then fails).
func outcomeOf(err error) (lockmodel.Outcome, bool) {
	switch {
	case err == nil:
		return lockmodel.OK, true
	case errors.Is(err, ErrWaitedHeld):
		return lockmodel.HeldWaited, true
	case errors.Is(err, store.ErrLockHeld):
		return lockmodel.Held, true
	case errors.Is(err, store.ErrStaleToken):
		return lockmodel.Stale, true
	case errors.Is(err, store.ErrNotHeld):
		return lockmodel.NotHeld, true
	case errors.Is(err, store.ErrUnavailable):
		return lockmodel.Unknown, true
	case errors.Is(err, store.ErrBackendRestored):
		return lockmodel.Restored, true
	}
	return "", false
}

// Sizes of the linearizability workload. Its grants must not expire during
// a run, since the model has no clock: linTTL is the longest TTL the API
// allows, well past any run, restarts and -race included.
const (
	linTTL     = 10 * time.Minute
	linClients = 6
	linOps     = 120 // per client
	linSeed    = 20261129
)

var linKeys = []string{"lin-a", "lin-b"}

// Seed is the seed of the linearizability workloads: LIN_SEED when set
// (to run them with other seeds), else a fixed one.
func Seed() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("LIN_SEED"), 10, 64); err == nil {
		return v
	}
	return linSeed
}

// ErrWaitedHeld, wrapped by an Acquire's error, marks a waiting acquire
// answered LOCK_HELD: a waiter can be refused while the key is free, so
// the model accepts it in any state.
var ErrWaitedHeld = errors.New("storetest: waited and refused")

func testLinearizable(t *testing.T, b Backend) {
	CheckLinearizable(t, b.Name, open(t, b), nil)
}

// testLinearizableAcrossBackendRestart is the same check while the backend
// is stopped and started again under the clients: calls answered
// ErrUnavailable are recorded with an unknown outcome, and nothing
// acknowledged may be lost.
func testLinearizableAcrossBackendRestart(t *testing.T, b Backend) {
	if b.RestartBackend == nil {
		t.Skipf("%s: backend restart not supported", b.Name)
	}
	s, restart := b.RestartBackend(t)
	t.Cleanup(func() { _ = s.Close() })
	CheckLinearizable(t, b.Name, s, restart)
}

// CheckLinearizable runs the suite's linearizability workload on s (six
// clients, 120 calls each, on the keys "lin-a" and "lin-b", which must be
// free) and fails t unless porcupine finds the history linearizable
// against the LockStore contract's sequential lock. When fault is not nil
// it is called once, from a goroutine of its own, after a third of the
// calls, while the clients go on; calls answered ErrUnavailable are then
// recorded with an unknown outcome. fault must report its own failures
// with t.Error, not t.Fatal. name labels the visualisation written to the
// temporary directory when the check fails.
func CheckLinearizable(t *testing.T, name string, s store.LockStore, fault func()) {
	t.Helper()
	history := recordHistory(t, s, fault)
	if t.Failed() {
		return
	}
	grants, handoffs, unknown := 0, 0, 0
	for _, op := range history {
		in, out := op.Input.(lockmodel.Input), op.Output.(lockmodel.Output)
		if in.Op == lockmodel.Acquire && out.Outcome == lockmodel.OK {
			grants++
		}
		if in.Op == lockmodel.Handoff && out.Outcome == lockmodel.OK {
			handoffs++
		}
		if out.Outcome == lockmodel.Unknown {
			unknown++
		}
	}
	if grants < 10 {
		t.Fatalf("only %d grants in %d operations: the workload did not exercise the lock", grants, len(history))
	}
	if err := lockmodel.Check(name, history, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations (%d grants, %d handoffs, %d with unknown outcome) by %d clients on %d keys: linearizable",
		len(history), grants, handoffs, unknown, linClients, len(linKeys))
}

// recordHistory runs the workload on s, calls fault (when not nil) once a
// third of the calls are done, and returns every call made. It reports
// calls it cannot model (and a fault never injected) on t.
func recordHistory(t *testing.T, s store.LockStore, fault func()) []porcupine.Operation {
	t.Helper()
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	hand, _ := s.(store.Handoffer) // a Batcher hides it: no handoffs then
	var (
		mu       sync.Mutex
		history  []porcupine.Operation
		wg       sync.WaitGroup
		done     atomic.Int64
		faultOne sync.Once
		faultWG  sync.WaitGroup
		faulted  atomic.Bool
	)
	for c := range linClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(Seed(), uint64(c)))
			owner := fmt.Sprintf("client-%d", c)
			held := map[string]int64{}     // live grants this client believes it holds
			tokens := map[string][]int64{} // every token it was granted, per key
			for range linOps {
				if fault != nil && done.Load() >= linClients*linOps/3 {
					faultOne.Do(func() { faultWG.Go(func() { fault(); faulted.Store(true) }) })
				}
				key := linKeys[rng.IntN(len(linKeys))]
				in := lockmodel.Input{Key: key, Owner: owner}
				r := rng.IntN(100)
				switch tok, holds := held[key]; {
				case r < 15:
					in.Op = lockmodel.Inspect
				case r < 20 && c == 0:
					in.Op = lockmodel.Revoke // the operator
				case r < 35 && len(tokens[key]) > 0:
					// A holder that lost track: an old token of its own.
					in.Op = []lockmodel.Op{lockmodel.Renew, lockmodel.Release, lockmodel.Handoff}[rng.IntN(2+btoi(hand != nil))]
					in.Token = tokens[key][rng.IntN(len(tokens[key]))]
				case holds && r < 65:
					in.Op, in.Token = lockmodel.Renew, tok
				case holds && r < 80 && hand != nil:
					in.Op, in.Token = lockmodel.Handoff, tok
				case holds:
					in.Op, in.Token = lockmodel.Release, tok
				default:
					in.Op = lockmodel.Acquire
				}

				ctx := ctxT(t)
				call := now()
				var out lockmodel.Output
				var err error
				switch in.Op {
				case lockmodel.Acquire:
					var l store.Lease
					l, err = s.Acquire(ctx, key, owner, linTTL)
					out.Token = l.Token
					if err == nil {
						held[key] = l.Token
						tokens[key] = append(tokens[key], l.Token)
					}
				case lockmodel.Renew:
					_, err = s.Renew(ctx, key, owner, in.Token)
				case lockmodel.Release:
					err = s.Release(ctx, key, owner, in.Token)
					if err == nil || in.Token == held[key] {
						delete(held, key)
					}
				case lockmodel.Handoff:
					var l store.Lease
					l, err = hand.Handoff(ctx, store.LeaseRef{Key: key, Owner: owner, Token: in.Token},
						store.AcquireRequest{Key: key, Owner: owner, TTL: linTTL})
					out.Token = l.Token
					if err == nil {
						held[key] = l.Token
						tokens[key] = append(tokens[key], l.Token)
					} else if in.Token == held[key] {
						delete(held, key)
					}
				case lockmodel.Revoke:
					var l store.Lease
					l, err = s.Revoke(ctx, key, 0)
					out.Owner, out.Token = l.Owner, l.Token
				case lockmodel.Inspect:
					var st store.State
					st, err = s.Inspect(ctx, key)
					if st.Lease != nil {
						out.Owner, out.Token = st.Lease.Owner, st.Lease.Token
					}
				}
				ret := now()
				outcome, known := outcomeOf(err)
				if !known || (outcome == lockmodel.Unknown && fault == nil) {
					t.Errorf("%s %s by %s: unexpected error %v", in.Op, key, owner, err)
					return
				}
				out.Outcome = outcome
				if outcome == lockmodel.Unknown {
					// It may take effect at any moment from its call on.
					ret = math.MaxInt64
					out.Owner, out.Token = "", 0
					if in.Op == lockmodel.Renew || in.Op == lockmodel.Release || in.Op == lockmodel.Handoff {
						delete(held, key) // it cannot tell; it stops using the lease
					}
				} else if in.Op == lockmodel.Renew && err != nil && in.Token == held[key] {
					delete(held, key) // revoked behind its back
				}
				mu.Lock()
				in.Call, out.Return = call, ret
				history = append(history, lockmodel.Operation(c, in, out))
				if _, ok := s.(interface{ AbandonsUnknownGrants() }); ok && in.Op == lockmodel.Acquire && outcome == lockmodel.Unknown {
					history = append(history, lockmodel.Operation(c, lockmodel.Input{Op: lockmodel.Abandon, Key: key, Owner: owner, Call: call},
						lockmodel.Output{Outcome: lockmodel.OK, Return: math.MaxInt64}))
				}
				mu.Unlock()
				done.Add(1)
				if outcome == lockmodel.Unknown {
					// Wait for the backend rather than spin on it, so that
					// few calls end unknown (each one widens the search).
					if err := waitAvailable(t.Context(), s); err != nil {
						t.Errorf("client %d: %v", c, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	faultWG.Wait()
	if fault != nil && !faulted.Load() {
		t.Fatal("the clients finished before the fault was injected")
	}
	return history
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
