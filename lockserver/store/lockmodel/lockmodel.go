// Package lockmodel is the sequential model of a lease lock, for checking
// recorded histories of lock calls with porcupine: acquire, renew,
// release, handoff, revoke and inspect of keys, each grant with a fencing
// token, a call whose answer was lost recorded with the outcome Unknown.
//
// Record each call as an Operation (In.Call and Out.Return are its times,
// in nanoseconds from one origin; a History does that), then Check the
// history. A grant with a TTL may end at any moment from its call plus its
// TTL on; a grant without one ends only by a call.
package lockmodel

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is what a call does.
type Op string

// The calls of a lock.
const (
	Acquire Op = "acquire"
	Renew   Op = "renew"
	Release Op = "release"
	// Handoff is the holder's release and a new grant to Owner in one
	// call, with nothing between.
	Handoff Op = "handoff"
	Revoke  Op = "revoke" // of whatever grant is live, as an operator would
	Inspect Op = "inspect"
	// Abandon is lock-server releasing the grant of an acquire of unknown
	// outcome whose request ended; it may fail and leave the grant to
	// end otherwise. Recorded beside such an acquire, with outcome OK.
	Abandon Op = "abandon"
)

// Outcome is how a call was answered.
type Outcome string

// The outcomes of a call.
const (
	OK   Outcome = "ok"
	Held Outcome = "held" // the key is held by another grant
	// HeldWaited: an acquire that waited and was refused; a waiter can be
	// refused while the key is free, so any state allows it.
	HeldWaited Outcome = "held-waited"
	NotHeld    Outcome = "not-held" // no grant is live for that owner and token
	Stale      Outcome = "stale"    // a newer grant than the token's was made
	// Unknown: the answer was lost; the call may or may not have taken
	// effect, at any moment from its call on.
	Unknown Outcome = "unknown"
	// Restored: the restore guard refused a grant; nothing changed.
	Restored Outcome = "restored"
)

// Input is one call.
type Input struct {
	Op    Op
	Key   string
	Owner string        // acquire, renew, release, handoff (from and to)
	Token int64         // renew, release, handoff (from)
	TTL   time.Duration // acquire, renew, handoff; 0: the grant ends only by a call
	Call  int64         // when it was sent, ns from the history's origin
}

// Output is one answer. For an OK acquire or handoff Token is the token
// granted; for inspect and revoke, Owner and Token describe the grant seen
// ("" and 0 when free).
type Output struct {
	Outcome Outcome
	Owner   string
	Token   int64
	// Return is when the answer came, ns from the history's origin;
	// math.MaxInt64 when the outcome is Unknown.
	Return int64
	// Outside, for inspect: Owner is a holder whose calls the history
	// does not record (a process of the system under test).
	Outside bool
}

// Operation is the porcupine operation of one call of client, timed by
// in.Call and out.Return.
func Operation(client int, in Input, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: in.Call, Output: out, Return: out.Return}
}

const (
	// unknownToken marks a live grant made by a call of unknown outcome:
	// its token is larger than Last, and nobody has seen it yet.
	unknownToken = -1
	// forever is the end of a grant without a TTL.
	forever = math.MaxInt64
)

// state is one key of the sequential lock: its live grant, if any, and the
// largest token seen granted on it.
type state struct {
	Owner string // "" when free
	Token int64  // 0 when free; unknownToken when not yet seen
	// Until: the grant cannot have ended by its TTL before this (ns).
	Until int64
	Last  int64
	// Unseen: a grant whose token nobody saw was made and has ended, so a
	// token larger than Last has been granted since the last one seen.
	Unseen bool
	// Orphan: the live grant was made by an acquire of unknown outcome
	// (see Abandon).
	Orphan bool
}

// olderThanLive reports whether token is older than the live grant's.
func (s state) olderThanLive(token int64) bool {
	return s.Owner != "" && (s.Token == unknownToken || token < s.Token)
}

// newerGranted reports whether a grant newer than token has been made,
// live or not: the condition under which Stale is a correct answer.
func (s state) newerGranted(token int64) bool {
	return token < s.Last || s.olderThanLive(token) || s.Unseen && token <= s.Last
}

// ended is s once its grant has ended: a grant ending unseen leaves a
// token larger than Last behind it.
func (s state) ended() state {
	return state{Last: s.Last, Unseen: s.Unseen || s.Token == unknownToken}
}

// until is when a grant made by in may end by its TTL.
func until(in Input) int64 {
	if in.TTL == 0 {
		return forever
	}
	return in.Call + int64(in.TTL)
}

// renewed is s after in renewed its grant.
func renewed(s state, in Input) state {
	if s.Until != forever && in.TTL != 0 {
		s.Until = max(s.Until, in.Call+int64(in.TTL))
	}
	return s
}

// step is the sequential specification, as the set of states a key can be
// in after the call (none: the answer is impossible). A grant whose TTL
// may have run out by the answer may have ended before the call took
// effect: both are tried.
func step(s state, in Input, out Output) []state {
	next := stepLive(s, in, out)
	if s.Owner != "" && s.Until != forever && out.Return >= s.Until {
		next = append(next, stepLive(s.ended(), in, out)...)
	}
	return next
}

// stepLive is step with no grant ending by its TTL:
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
//   - inspect reports exactly the live grant, or, on a free key, a grant
//     of a holder outside the history with a larger token;
//   - a call whose outcome is unknown either took effect or did not; a
//     grant made that way has a token nobody has seen, larger than every
//     earlier one, until an inspect or a revoke shows it.
func stepLive(s state, in Input, out Output) []state {
	live := s.Owner != ""
	mine := live && s.Owner == in.Owner && s.Token == in.Token
	free := s.ended()
	yes := func(ok bool, next state) []state {
		if ok {
			return []state{next}
		}
		return nil
	}
	if in.Op == Abandon {
		if live && s.Owner == in.Owner && s.Orphan {
			return []state{s, free}
		}
		return []state{s}
	}
	if out.Outcome == Unknown {
		switch {
		case in.Op == Acquire && !live:
			return []state{s, {Owner: in.Owner, Token: unknownToken, Until: until(in), Last: s.Last, Orphan: true}}
		case in.Op == Renew && mine:
			return []state{s, renewed(s, in)}
		case in.Op == Release && mine, in.Op == Revoke && live:
			return []state{s, free}
		case in.Op == Handoff && mine:
			return []state{s, {Owner: in.Owner, Token: unknownToken, Until: until(in), Last: s.Last}}
		}
		return []state{s}
	}
	if out.Outcome == Restored {
		return yes(in.Op == Acquire || in.Op == Handoff, s)
	}
	refusalOK := func() bool {
		switch out.Outcome {
		case Stale:
			return s.newerGranted(in.Token)
		case NotHeld:
			return !s.olderThanLive(in.Token)
		}
		return false
	}
	// seen reports whether (owner, token), read from the store, is the live
	// grant, which pins an unseen token.
	seen := func(owner string, token int64) (bool, state) {
		if s.Token == unknownToken {
			return owner == s.Owner && token > s.Last, state{Owner: owner, Token: token, Until: s.Until, Last: token, Orphan: s.Orphan}
		}
		return owner == s.Owner && token == s.Token, s
	}
	switch in.Op {
	case Acquire:
		switch out.Outcome {
		case HeldWaited:
			return []state{s}
		case OK:
			return yes(!live && out.Token > s.Last, state{Owner: in.Owner, Token: out.Token, Until: until(in), Last: out.Token})
		}
		return yes(out.Outcome == Held && live, s)
	case Renew:
		if out.Outcome == OK {
			return yes(mine, renewed(s, in))
		}
		return yes(!mine && refusalOK(), s)
	case Release:
		if out.Outcome == OK {
			return yes(mine, free)
		}
		return yes(!mine && refusalOK(), s)
	case Handoff:
		if out.Outcome == OK {
			return yes(mine && out.Token > s.Last, state{Owner: in.Owner, Token: out.Token, Until: until(in), Last: out.Token})
		}
		return yes(!mine && refusalOK(), s)
	case Revoke:
		if out.Outcome == OK {
			ok, now := seen(out.Owner, out.Token)
			return yes(live && ok, state{Last: now.Last}) // the newest grant, now seen
		}
		return yes(out.Outcome == NotHeld && !live, s)
	case Inspect:
		switch {
		case out.Outcome != OK:
			return nil
		case live:
			ok, now := seen(out.Owner, out.Token)
			return yes(ok, now)
		case out.Owner == "":
			return yes(out.Token == 0, s)
		}
		// A holder the history does not record: it was live at the
		// inspect, so it cannot have ended before the inspect's call.
		return yes(out.Outside && out.Token > s.Last, state{Owner: out.Owner, Token: out.Token, Until: in.Call, Last: out.Token})
	}
	return nil
}

// Model is the lock for porcupine, partitioned by key.
var Model = (&porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(Input).Key
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
	Init: func() []any { return []any{state{}} },
	Step: func(st, input, output any) []any {
		next := step(st.(state), input.(Input), output.(Output))
		out := make([]any, len(next))
		for i, n := range next {
			out[i] = n
		}
		return out
	},
	Equal: func(a, b any) bool { return a.(state) == b.(state) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		switch in.Op {
		case Acquire:
			return fmt.Sprintf("%s acquire %s ttl %v -> %s %d", in.Owner, in.Key, in.TTL, out.Outcome, out.Token)
		case Handoff:
			return fmt.Sprintf("%s handoff %s token %d to itself -> %s %d", in.Owner, in.Key, in.Token, out.Outcome, out.Token)
		case Inspect, Revoke:
			return fmt.Sprintf("%s %s -> %s %s %d", in.Op, in.Key, out.Outcome, out.Owner, out.Token)
		}
		return fmt.Sprintf("%s %s %s token %d -> %s", in.Owner, in.Op, in.Key, in.Token, out.Outcome)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		switch {
		case s.Owner == "":
			return fmt.Sprintf("free (last token %d)", s.Last)
		case s.Token == unknownToken:
			return fmt.Sprintf("held by %s with a token > %d not yet seen", s.Owner, s.Last)
		}
		return fmt.Sprintf("held by %s with %d", s.Owner, s.Token)
	},
}).ToModel()

// Sentinel errors of Check.
var (
	// ErrNotLinearizable: no order of the operations agrees with Model.
	ErrNotLinearizable = errors.New("lockmodel: history is not linearizable")
	// ErrCheckTimedOut: the search ended at its timeout without a verdict.
	ErrCheckTimedOut = errors.New("lockmodel: linearizability check timed out")
)

// Check returns nil if history is linearizable against Model, searched
// for at most timeout. Otherwise it writes porcupine's picture of the
// history to the temporary directory, in a file named after name, and
// returns ErrNotLinearizable or ErrCheckTimedOut naming that file.
func Check(name string, history []porcupine.Operation, timeout time.Duration) error {
	res, info := porcupine.CheckOperationsVerbose(Model, history, timeout)
	if res == porcupine.Ok {
		return nil
	}
	safe := strings.Map(func(r rune) rune {
		if r == '/' || r == '+' || r == ' ' {
			return '-'
		}
		return r
	}, name)
	path := filepath.Join(os.TempDir(), fmt.Sprintf("lin-%s-%d.html", safe, time.Now().UnixNano()))
	picture := "see " + path
	if err := porcupine.VisualizePath(Model, info, path); err != nil {
		picture = "no picture: " + err.Error()
	}
	if res == porcupine.Unknown {
		return fmt.Errorf("%w: %d operations; %s", ErrCheckTimedOut, len(history), picture)
	}
	return fmt.Errorf("%w: %d operations; %s", ErrNotLinearizable, len(history), picture)
}

// History records the calls of a test against one clock. It is safe for
// concurrent use.
type History struct {
	mu  sync.Mutex
	t0  time.Time
	ops []porcupine.Operation
}

// NewHistory starts a history whose origin is now.
func NewHistory() *History { return &History{t0: time.Now()} }

// Call notes in as sent now by client; the returned function records its
// answer (its Return is set then, or to math.MaxInt64 when Unknown).
func (h *History) Call(client int, in Input) func(Output) {
	in.Call = time.Since(h.t0).Nanoseconds()
	return func(out Output) {
		out.Return = time.Since(h.t0).Nanoseconds()
		if out.Outcome == Unknown {
			out.Return = math.MaxInt64
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.ops = append(h.ops, Operation(client, in, out))
	}
}

// Operations returns the calls recorded so far.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}
