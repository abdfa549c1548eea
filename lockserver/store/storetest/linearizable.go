package storetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The linearizability check: several clients run a seeded random mix of
// acquire, renew, release (their own and stale ones), handoff (when the
// store is a store.Handoffer: the holder's release and a new grant to
// itself in one call, with its live token or a stale one), revoke and
// inspect on a few keys at once; every call is recorded with the times it was sent and
// answered; porcupine then searches for one sequential order, consistent
// with those times, in which every answer is what a single correct lock
// would have given. The sequential lock is lockModel below.

// lockOp is one call as the model sees it.
type lockOp struct {
	Op    string // "acquire", "renew", "release", "handoff", "revoke", "inspect"
	Key   string
	Owner string // acquire, renew, release, handoff (from and to)
	Token int64  // renew, release, handoff (from)
}

// lockResult is one answer. Outcome is "ok", "held" (ErrLockHeld),
// "not-held" (ErrNotHeld), "stale" (ErrStaleToken) or "unknown" (the store
// could not tell: ErrUnavailable, the call may or may not have taken
// effect). For an "ok" acquire or handoff Token is the token granted; for inspect and
// revoke, Owner and Token describe the lease seen ("" and 0 when free).
type lockResult struct {
	Outcome string
	Owner   string
	Token   int64
}

// unknownToken marks a live grant whose acquire had an unknown outcome:
// its token is larger than Last, and nobody has seen it yet.
const unknownToken = -1

// lockState is one key of the sequential lock: its live grant, if any, and
// the largest token seen granted on it.
type lockState struct {
	Owner string // "" when free
	Token int64  // 0 when free; unknownToken when not yet seen
	Last  int64
	// Unseen: a grant whose token nobody saw was made and has ended, so a
	// token larger than Last has been granted since the last one seen.
	Unseen bool
	// Orphan: the live grant was made by an acquire of unknown outcome
	// (probe: lock-server releases such a grant itself when the waiter's
	// request ended; see the "abandon" op).
	Orphan bool
}

// olderThanLive reports whether token is older than the live grant's.
func (s lockState) olderThanLive(token int64) bool {
	return s.Owner != "" && (s.Token == unknownToken || token < s.Token)
}

// newerGranted reports whether a grant newer than token has been made,
// live or not: the condition under which stale is a correct answer.
func (s lockState) newerGranted(token int64) bool {
	return token < s.Last || s.olderThanLive(token) || s.Unseen && token <= s.Last
}

// lockStep is the sequential specification, from the LockStore contract,
// as the set of states a key can be in after the call (none: the answer
// is impossible):
//   - acquire succeeds exactly when the key is free, with a token larger than
//     every earlier grant of the key; otherwise it answers held;
//   - renew and release succeed exactly for the live grant (owner, token);
//     otherwise they answer stale, allowed only when a newer grant has been
//     made, or not-held, allowed unless a newer grant is live;
//   - handoff is release then acquire with nothing between: it succeeds
//     exactly for the live grant, with a token larger than every earlier
//     grant, and then the key is held by the new owner; it is refused as
//     release is refused, and then nothing changed; of unknown outcome, it
//     took effect entirely or not at all;
//   - revoke (of whatever is live) succeeds exactly when a grant is live;
//   - inspect reports exactly the live grant;
//   - a call whose outcome is unknown either took effect or did not; a
//     grant made that way has a token nobody has seen, larger than every
//     earlier one, until an inspect or a revoke shows it.
func lockStep(s lockState, in lockOp, out lockResult) []lockState {
	live := s.Owner != ""
	mine := live && s.Owner == in.Owner && s.Token == in.Token
	// A grant ending unseen leaves a token larger than Last behind it.
	free := lockState{Last: s.Last, Unseen: s.Unseen || s.Token == unknownToken}
	yes := func(ok bool, next lockState) []lockState {
		if ok {
			return []lockState{next}
		}
		return nil
	}
	if in.Op == "abandon" {
		// Lock-server releasing the grant of an acquire whose request
		// ended (it may fail, leaving the grant to expire).
		if live && s.Owner == in.Owner && s.Orphan {
			return []lockState{s, free}
		}
		return []lockState{s}
	}
	if out.Outcome == "unknown" {
		switch {
		case in.Op == "acquire" && !live:
			return []lockState{s, {Owner: in.Owner, Token: unknownToken, Last: s.Last, Orphan: true}}
		case in.Op == "release" && mine, in.Op == "revoke" && live:
			return []lockState{s, free}
		case in.Op == "handoff" && mine:
			return []lockState{s, {Owner: in.Owner, Token: unknownToken, Last: s.Last}}
		}
		return []lockState{s}
	}
	if out.Outcome == "restored" {
		// The restore guard refused a grant: nothing changed.
		return yes(in.Op == "acquire" || in.Op == "handoff", s)
	}
	refusalOK := func() bool {
		switch out.Outcome {
		case "stale":
			return s.newerGranted(in.Token)
		case "not-held":
			return !s.olderThanLive(in.Token)
		}
		return false
	}
	// seen reports whether (owner, token), read from the store, is the live
	// grant, which pins an unseen token.
	seen := func(owner string, token int64) (bool, lockState) {
		if s.Token == unknownToken {
			return owner == s.Owner && token > s.Last, lockState{Owner: owner, Token: token, Last: token, Orphan: s.Orphan}
		}
		return owner == s.Owner && token == s.Token, s
	}
	switch in.Op {
	case "acquire":
		if out.Outcome == "held-waited" {
			return []lockState{s}
		}
		if out.Outcome == "ok" {
			return yes(!live && out.Token > s.Last, lockState{Owner: in.Owner, Token: out.Token, Last: out.Token})
		}
		return yes(out.Outcome == "held" && live, s)
	case "renew":
		if out.Outcome == "ok" {
			return yes(mine, s)
		}
		return yes(!mine && refusalOK(), s)
	case "release":
		if out.Outcome == "ok" {
			return yes(mine, free)
		}
		return yes(!mine && refusalOK(), s)
	case "handoff":
		if out.Outcome == "ok" {
			return yes(mine && out.Token > s.Last, lockState{Owner: in.Owner, Token: out.Token, Last: out.Token})
		}
		return yes(!mine && refusalOK(), s)
	case "revoke":
		if out.Outcome == "ok" {
			ok, now := seen(out.Owner, out.Token)
			return yes(live && ok, lockState{Last: now.Last}) // the newest grant, now seen
		}
		return yes(out.Outcome == "not-held" && !live, s)
	case "inspect":
		if out.Outcome != "ok" {
			return nil
		}
		if !live {
			return yes(out.Owner == "" && out.Token == 0, s)
		}
		ok, now := seen(out.Owner, out.Token)
		return yes(ok, now)
	}
	return nil
}

var lockModel = (&porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(lockOp).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{lockState{}} },
	Step: func(state, input, output any) []any {
		next := lockStep(state.(lockState), input.(lockOp), output.(lockResult))
		out := make([]any, len(next))
		for i, n := range next {
			out[i] = n
		}
		return out
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockOp), output.(lockResult)
		switch in.Op {
		case "acquire":
			return fmt.Sprintf("%s acquire %s -> %s %d", in.Owner, in.Key, out.Outcome, out.Token)
		case "handoff":
			return fmt.Sprintf("%s handoff %s token %d to itself -> %s %d", in.Owner, in.Key, in.Token, out.Outcome, out.Token)
		case "inspect", "revoke":
			return fmt.Sprintf("%s %s -> %s %s %d", in.Op, in.Key, out.Outcome, out.Owner, out.Token)
		}
		return fmt.Sprintf("%s %s %s token %d -> %s", in.Owner, in.Op, in.Key, in.Token, out.Outcome)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		switch {
		case s.Owner == "":
			return fmt.Sprintf("free (last token %d)", s.Last)
		case s.Token == unknownToken:
			return fmt.Sprintf("held by %s with a token > %d not yet seen", s.Owner, s.Last)
		}
		return fmt.Sprintf("held by %s with %d", s.Owner, s.Token)
	},
}).ToModel()

// outcomeOf maps a store error to the model's outcome; ok is false for an
// error the model does not describe (the test then fails).
func outcomeOf(err error) (string, bool) {
	switch {
	case err == nil:
		return "ok", true
	case errors.Is(err, ErrWaitedHeld):
		return "held-waited", true
	case errors.Is(err, store.ErrLockHeld):
		return "held", true
	case errors.Is(err, store.ErrStaleToken):
		return "stale", true
	case errors.Is(err, store.ErrNotHeld):
		return "not-held", true
	case errors.Is(err, store.ErrUnavailable):
		return "unknown", true
	case errors.Is(err, store.ErrBackendRestored):
		return "restored", true
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
		out := op.Output.(lockResult)
		if op.Input.(lockOp).Op == "acquire" && out.Outcome == "ok" {
			grants++
		}
		if op.Input.(lockOp).Op == "handoff" && out.Outcome == "ok" {
			handoffs++
		}
		if out.Outcome == "unknown" {
			unknown++
		}
	}
	if grants < 10 {
		t.Fatalf("only %d grants in %d operations: the workload did not exercise the lock", grants, len(history))
	}
	res, info := porcupine.CheckOperationsVerbose(lockModel, history, time.Minute)
	switch res {
	case porcupine.Ok:
		t.Logf("%d operations (%d grants, %d handoffs, %d with unknown outcome) by %d clients on %d keys: linearizable",
			len(history), grants, handoffs, unknown, linClients, len(linKeys))
	case porcupine.Unknown:
		t.Fatalf("linearizability check of %d operations timed out", len(history))
	default:
		safe := strings.Map(func(r rune) rune {
			if r == '/' || r == '+' || r == ' ' {
				return '-'
			}
			return r
		}, name)
		path := filepath.Join(os.TempDir(), fmt.Sprintf("lin-%s-%d.html", safe, time.Now().UnixNano()))
		if err := porcupine.VisualizePath(lockModel, info, path); err != nil {
			t.Logf("visualize: %v", err)
		}
		t.Fatalf("history of %d operations is not linearizable; see %s", len(history), path)
	}
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
				in := lockOp{Key: key, Owner: owner}
				r := rng.IntN(100)
				switch tok, holds := held[key]; {
				case r < 15:
					in.Op = "inspect"
				case r < 20 && c == 0:
					in.Op = "revoke" // the operator
				case r < 35 && len(tokens[key]) > 0:
					// A holder that lost track: an old token of its own.
					in.Op = []string{"renew", "release", "handoff"}[rng.IntN(2+btoi(hand != nil))]
					in.Token = tokens[key][rng.IntN(len(tokens[key]))]
				case holds && r < 65:
					in.Op, in.Token = "renew", tok
				case holds && r < 80 && hand != nil:
					in.Op, in.Token = "handoff", tok
				case holds:
					in.Op, in.Token = "release", tok
				default:
					in.Op = "acquire"
				}

				ctx := ctxT(t)
				call := now()
				var out lockResult
				var err error
				switch in.Op {
				case "acquire":
					var l store.Lease
					l, err = s.Acquire(ctx, key, owner, linTTL)
					out.Token = l.Token
					if err == nil {
						held[key] = l.Token
						tokens[key] = append(tokens[key], l.Token)
					}
				case "renew":
					_, err = s.Renew(ctx, key, owner, in.Token)
				case "release":
					err = s.Release(ctx, key, owner, in.Token)
					if err == nil || in.Token == held[key] {
						delete(held, key)
					}
				case "handoff":
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
				case "revoke":
					var l store.Lease
					l, err = s.Revoke(ctx, key, 0)
					out.Owner, out.Token = l.Owner, l.Token
				case "inspect":
					var st store.State
					st, err = s.Inspect(ctx, key)
					if st.Lease != nil {
						out.Owner, out.Token = st.Lease.Owner, st.Lease.Token
					}
				}
				ret := now()
				outcome, known := outcomeOf(err)
				if !known || (outcome == "unknown" && fault == nil) {
					t.Errorf("%s %s by %s: unexpected error %v", in.Op, key, owner, err)
					return
				}
				out.Outcome = outcome
				if outcome == "unknown" {
					// It may take effect at any moment from its call on.
					ret = math.MaxInt64
					out.Owner, out.Token = "", 0
					if in.Op == "renew" || in.Op == "release" || in.Op == "handoff" {
						delete(held, key) // it cannot tell; it stops using the lease
					}
				} else if in.Op == "renew" && err != nil && in.Token == held[key] {
					delete(held, key) // revoked behind its back
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				if _, ok := s.(interface{ AbandonsUnknownGrants() }); ok && in.Op == "acquire" && outcome == "unknown" {
					history = append(history, porcupine.Operation{ClientId: c, Input: lockOp{Op: "abandon", Key: key, Owner: owner},
						Call: call, Output: lockResult{Outcome: "ok"}, Return: math.MaxInt64})
				}
				mu.Unlock()
				done.Add(1)
				if outcome == "unknown" {
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
