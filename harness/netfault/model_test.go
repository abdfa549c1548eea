package netfault_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock as seen from its clients, with expiry: a grant may end at any
// moment from its call plus its TTL on (the server's clock starts the
// lease no earlier than the call), never before. A second grant whose
// answer came before the first could have ended is two holders at once.
// An answer lost on the way (outcome "unknown") may or may not have
// taken effect.

// lockIn is one call: acquire, renew or inspect of one key.
type lockIn struct {
	Op    string // "acquire", "renew", "inspect"
	Key   string
	Owner string        // acquire, renew
	Token int64         // renew
	TTL   time.Duration // acquire, renew
	Call  int64         // ns since the history's start
}

// lockOut is its answer: Outcome "ok", "held", "stale" or "unknown"; for
// an ok acquire the token granted; for inspect the holder seen ("" free).
type lockOut struct {
	Outcome string
	Owner   string
	Token   int64
	Return  int64 // ns since the history's start; math.MaxInt64 when unknown
	// Outside, for inspect: Owner is a holder whose calls the history
	// does not record (an executor process).
	Outside bool
}

// lockState is one key: the grant that may be live, and the largest
// token granted.
type lockState struct {
	Owner string
	Token int64 // -1: granted by a call whose answer was lost
	Until int64 // the grant cannot have ended before this (ns)
	Last  int64
}

func lockStep(s lockState, in lockIn, out lockOut) []lockState {
	mayHaveEnded := s.Owner == "" || out.Return >= s.Until
	switch in.Op {
	case "acquire":
		switch out.Outcome {
		case "ok":
			if mayHaveEnded && out.Token > s.Last {
				return []lockState{{Owner: in.Owner, Token: out.Token, Until: in.Call + int64(in.TTL), Last: out.Token}}
			}
		case "held":
			return []lockState{s}
		case "unknown":
			next := []lockState{s}
			if mayHaveEnded {
				next = append(next, lockState{Owner: in.Owner, Token: -1, Until: in.Call + int64(in.TTL), Last: s.Last})
			}
			return next
		}
	case "renew":
		live := s.Owner == in.Owner && s.Token == in.Token
		switch out.Outcome {
		case "ok":
			if live {
				return []lockState{{Owner: s.Owner, Token: s.Token, Until: max(s.Until, in.Call+int64(in.TTL)), Last: s.Last}}
			}
		case "stale":
			return []lockState{s}
		case "unknown":
			next := []lockState{s}
			if live {
				next = append(next, lockState{Owner: s.Owner, Token: s.Token, Until: max(s.Until, in.Call+int64(in.TTL)), Last: s.Last})
			}
			return next
		}
	case "inspect":
		if out.Owner == "" {
			if mayHaveEnded {
				return []lockState{{Last: s.Last}}
			}
			return nil
		}
		if out.Owner == s.Owner && (out.Token == s.Token || s.Token == -1 && out.Token > s.Last) {
			return []lockState{{Owner: s.Owner, Token: out.Token, Until: s.Until, Last: max(s.Last, out.Token)}}
		}
		// A holder whose acquires the history does not record (Outside:
		// an executor process): legal once the recorded grant may have ended, with a
		// larger token. It was live at the inspect, so it cannot have
		// ended before the inspect's call.
		if out.Outside && out.Owner != s.Owner && mayHaveEnded && out.Token > s.Last {
			return []lockState{{Owner: out.Owner, Token: out.Token, Until: in.Call, Last: out.Token}}
		}
	}
	return nil
}

var lockModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{lockState{}} },
	Step: func(state, input, output any) []any {
		var out []any
		for _, s := range lockStep(state.(lockState), input.(lockIn), output.(lockOut)) {
			out = append(out, s)
		}
		return out
	},
	Equal: func(a, b any) bool { return a.(lockState) == b.(lockState) },
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(lockIn).Key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockIn), output.(lockOut)
		switch in.Op {
		case "acquire":
			return fmt.Sprintf("%s acquire ttl %v -> %s %d", in.Owner, in.TTL, out.Outcome, out.Token)
		case "renew":
			return fmt.Sprintf("%s renew %d -> %s", in.Owner, in.Token, out.Outcome)
		}
		return fmt.Sprintf("inspect -> %q %d", out.Owner, out.Token)
	},
}).ToModel()

// history records the calls of a test, with one clock.
type history struct {
	mu  sync.Mutex
	t0  time.Time
	ops []porcupine.Operation
}

func newHistory() *history { return &history{t0: time.Now()} }

// call starts a call of client; the returned function records its answer.
func (h *history) call(client int, in lockIn) func(lockOut) {
	in.Call = time.Since(h.t0).Nanoseconds()
	return func(out lockOut) {
		ret := time.Since(h.t0).Nanoseconds()
		if out.Outcome == "unknown" {
			ret = math.MaxInt64
		}
		out.Return = ret
		h.mu.Lock()
		defer h.mu.Unlock()
		h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: in.Call, Output: out, Return: ret})
	}
}

// checkLinearizable fails t unless the history is linearizable, and saves
// porcupine's picture of it either way.
func checkLinearizable(t *testing.T, h *history) {
	t.Helper()
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(lockModel, ops, 10*time.Second)
	path := filepath.Join(os.TempDir(), fmt.Sprintf("netfault-%s-%d.html", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano()))
	if err := porcupine.VisualizePath(lockModel, info, path); err != nil {
		t.Logf("porcupine picture: %v", err)
	}
	if res != porcupine.Ok {
		t.Fatalf("lock history of %d calls: %v, want linearizable (picture: %s)", len(ops), res, path)
	}
	t.Logf("lock history of %d calls linearizable (picture: %s)", len(ops), path)
}

// The model must refuse what it is there to catch.
func TestLockModelRefusesTwoHolders(t *testing.T) {
	sec := int64(time.Second)
	op := func(c int, in lockIn, out lockOut, call, ret int64) porcupine.Operation {
		in.Call, out.Return = call, ret
		return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	}
	acqA := lockIn{Op: "acquire", Key: "k", Owner: "A", TTL: 2 * time.Second}
	acqB := lockIn{Op: "acquire", Key: "k", Owner: "B", TTL: 2 * time.Second}
	inspect := lockIn{Op: "inspect", Key: "k"}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"B granted after A's lease could end", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "ok", Token: 1}, 0, sec/10),
			op(1, acqB, lockOut{Outcome: "ok", Token: 2}, sec, 3*sec),
		}, porcupine.Ok},
		{"B granted while A's lease runs", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "ok", Token: 1}, 0, sec/10),
			op(1, acqB, lockOut{Outcome: "ok", Token: 2}, sec, sec+sec/10),
		}, porcupine.Illegal},
		{"A's lost grant seen, B granted too soon", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "unknown"}, 0, math.MaxInt64),
			op(1, inspect, lockOut{Outcome: "ok", Owner: "A", Token: 5}, sec/2, sec/2+1),
			op(1, acqB, lockOut{Outcome: "ok", Token: 6}, sec, sec+sec/10),
		}, porcupine.Illegal},
		{"A's lost grant seen, B granted after it ended", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "unknown"}, 0, math.MaxInt64),
			op(1, inspect, lockOut{Outcome: "ok", Owner: "A", Token: 5}, sec/2, sec/2+1),
			op(1, acqB, lockOut{Outcome: "ok", Token: 6}, sec, 3*sec),
		}, porcupine.Ok},
		{"another holder seen while A's lease runs", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "ok", Token: 1}, 0, sec/10),
			op(1, inspect, lockOut{Outcome: "ok", Owner: "C", Token: 2, Outside: true}, sec, sec+1),
		}, porcupine.Illegal},
		{"another holder seen after A's lease could end", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "ok", Token: 1}, 0, sec/10),
			op(1, inspect, lockOut{Outcome: "ok", Owner: "C", Token: 2, Outside: true}, 3*sec, 3*sec+1),
		}, porcupine.Ok},
		{"a token granted twice", []porcupine.Operation{
			op(0, acqA, lockOut{Outcome: "ok", Token: 3}, 0, sec/10),
			op(1, acqB, lockOut{Outcome: "ok", Token: 3}, 3*sec, 3*sec+1),
		}, porcupine.Illegal},
	} {
		if got := porcupine.CheckOperations(lockModel, tc.ops); got != (tc.want == porcupine.Ok) {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.want == porcupine.Ok)
		}
	}
}
