package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// The linearizability check: several clients run a seeded random mix of
// acquire, renew, release (their own and stale ones), revoke and inspect on
// a few keys at once; every call is recorded with the times it was sent and
// answered; porcupine then searches for one sequential order, consistent
// with those times, in which every answer is what a single correct lock
// would have given. The sequential lock is lockModel below.

// lockOp is one call as the model sees it.
type lockOp struct {
	Op    string // "acquire", "renew", "release", "revoke", "inspect"
	Key   string
	Owner string // acquire, renew, release
	Token int64  // renew, release
}

// lockResult is one answer. Outcome is "ok", "held" (ErrLockHeld),
// "not-held" (ErrNotHeld) or "stale" (ErrStaleToken). For an "ok" acquire
// Token is the token granted; for inspect, Owner and Token describe the
// live lease ("" and 0 when the key is free).
type lockResult struct {
	Outcome string
	Owner   string
	Token   int64
}

// lockState is one key of the sequential lock: its live grant, if any, and
// the largest token ever granted on it.
type lockState struct {
	Owner string // "" when free
	Token int64  // 0 when free
	Last  int64
}

// lockStep is the sequential specification, from the LockStore contract:
//   - acquire succeeds exactly when the key is free, with a token larger than
//     every earlier grant of the key; otherwise it answers held;
//   - renew and release succeed exactly for the live grant (owner, token);
//     otherwise they answer stale, allowed only when a newer grant has been
//     made, or not-held, allowed unless a newer grant is live;
//   - revoke (of whatever is live) succeeds exactly when a grant is live;
//   - inspect reports exactly the live grant.
func lockStep(s lockState, in lockOp, out lockResult) (bool, lockState) {
	live := s.Owner != ""
	mine := live && s.Owner == in.Owner && s.Token == in.Token
	refusalOK := func() bool {
		switch out.Outcome {
		case "stale":
			return in.Token < s.Last
		case "not-held":
			return !(live && in.Token < s.Token)
		}
		return false
	}
	switch in.Op {
	case "acquire":
		if out.Outcome == "ok" {
			return !live && out.Token > s.Last, lockState{Owner: in.Owner, Token: out.Token, Last: out.Token}
		}
		return out.Outcome == "held" && live, s
	case "renew":
		if out.Outcome == "ok" {
			return mine, s
		}
		return !mine && refusalOK(), s
	case "release":
		if out.Outcome == "ok" {
			return mine, lockState{Last: s.Last}
		}
		return !mine && refusalOK(), s
	case "revoke":
		if out.Outcome == "ok" {
			return live && out.Owner == s.Owner && out.Token == s.Token, lockState{Last: s.Last}
		}
		return out.Outcome == "not-held" && !live, s
	case "inspect":
		return out.Outcome == "ok" && out.Owner == s.Owner && out.Token == s.Token, s
	}
	return false, s
}

var lockModel = porcupine.Model{
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
	Init: func() any { return lockState{} },
	Step: func(state, input, output any) (bool, any) {
		return lockStep(state.(lockState), input.(lockOp), output.(lockResult))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockOp), output.(lockResult)
		switch in.Op {
		case "acquire":
			return fmt.Sprintf("%s acquire %s -> %s %d", in.Owner, in.Key, out.Outcome, out.Token)
		case "inspect", "revoke":
			return fmt.Sprintf("%s %s -> %s %s %d", in.Op, in.Key, out.Outcome, out.Owner, out.Token)
		}
		return fmt.Sprintf("%s %s %s token %d -> %s", in.Owner, in.Op, in.Key, in.Token, out.Outcome)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.Owner == "" {
			return fmt.Sprintf("free (last token %d)", s.Last)
		}
		return fmt.Sprintf("held by %s with %d", s.Owner, s.Token)
	},
}

// outcomeOf maps a store error to the model's outcome; ok is false for an
// error the model does not describe (the test then fails).
func outcomeOf(err error) (string, bool) {
	switch {
	case err == nil:
		return "ok", true
	case errors.Is(err, lockserver.ErrLockHeld):
		return "held", true
	case errors.Is(err, lockserver.ErrStaleToken):
		return "stale", true
	case errors.Is(err, lockserver.ErrNotHeld):
		return "not-held", true
	}
	return "", false
}

// Sizes of the linearizability workload.
const (
	linClients = 6
	linOps     = 120 // per client
	linSeed    = 20261129
)

var linKeys = []string{"lin-a", "lin-b"}

func testLinearizable(t *testing.T, b Backend) {
	s := open(t, b)
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	var (
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
	)
	for c := range linClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(linSeed, uint64(c)))
			owner := fmt.Sprintf("client-%d", c)
			held := map[string]int64{}     // live grants this client believes it holds
			tokens := map[string][]int64{} // every token it was granted, per key
			for range linOps {
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
					in.Op = []string{"renew", "release"}[rng.IntN(2)]
					in.Token = tokens[key][rng.IntN(len(tokens[key]))]
				case holds && r < 65:
					in.Op, in.Token = "renew", tok
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
					var l lockserver.Lease
					l, err = s.Acquire(ctx, key, owner, longTTL)
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
				case "revoke":
					var l lockserver.Lease
					l, err = s.Revoke(ctx, key, 0)
					out.Owner, out.Token = l.Owner, l.Token
				case "inspect":
					var st lockserver.State
					st, err = s.Inspect(ctx, key)
					if st.Lease != nil {
						out.Owner, out.Token = st.Lease.Owner, st.Lease.Token
					}
				}
				ret := now()
				outcome, known := outcomeOf(err)
				if !known {
					t.Errorf("%s %s by %s: unexpected error %v", in.Op, key, owner, err)
					return
				}
				out.Outcome = outcome
				if in.Op == "renew" && err != nil && in.Token == held[key] {
					delete(held, key) // revoked behind its back
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	grants := 0
	for _, op := range history {
		if op.Input.(lockOp).Op == "acquire" && op.Output.(lockResult).Outcome == "ok" {
			grants++
		}
	}
	if grants < 10 {
		t.Fatalf("only %d grants in %d operations: the workload did not exercise the lock", grants, len(history))
	}
	res, info := porcupine.CheckOperationsVerbose(lockModel, history, time.Minute)
	switch res {
	case porcupine.Ok:
		t.Logf("%d operations (%d grants) by %d clients on %d keys: linearizable", len(history), grants, linClients, len(linKeys))
	case porcupine.Unknown:
		t.Fatalf("linearizability check of %d operations timed out", len(history))
	default:
		path := filepath.Join(os.TempDir(), fmt.Sprintf("lin-%s-%d.html", b.Name, time.Now().UnixNano()))
		if err := porcupine.VisualizePath(lockModel, info, path); err != nil {
			t.Logf("visualize: %v", err)
		}
		t.Fatalf("history of %d operations is not linearizable; see %s", len(history), path)
	}
}
