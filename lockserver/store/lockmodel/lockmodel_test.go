package lockmodel_test

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/lockmodel"
)

// op builds a recorded call from call to ret (arbitrary time units).
func op(client int, call, ret int64, in lockmodel.Input, out lockmodel.Output) porcupine.Operation {
	in.Call, out.Return = call, ret
	return lockmodel.Operation(client, in, out)
}

func acq(owner string) lockmodel.Input {
	return lockmodel.Input{Op: lockmodel.Acquire, Key: "k", Owner: owner}
}
func rel(owner string, tok int64) lockmodel.Input {
	return lockmodel.Input{Op: lockmodel.Release, Key: "k", Owner: owner, Token: tok}
}
func ren(owner string, tok int64) lockmodel.Input {
	return lockmodel.Input{Op: lockmodel.Renew, Key: "k", Owner: owner, Token: tok}
}
func ok(tok int64) lockmodel.Output { return lockmodel.Output{Outcome: lockmodel.OK, Token: tok} }

// never is the return time of a call whose outcome is unknown.
const never = math.MaxInt64

var unknown = lockmodel.Output{Outcome: lockmodel.Unknown}

// TestModelRejectsBrokenHistories: histories a broken lock could
// produce are not linearizable, and their correct counterparts are, so a check
// with Model can fail.
func TestModelRejectsBrokenHistories(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history []porcupine.Operation
		want    bool
	}{
		{"two holders at once", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 3, acq("b"), ok(6)),
		}, false},
		{"second grant after a release", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, 5, acq("b"), ok(6)),
		}, true},
		{"token goes backwards", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, 5, acq("b"), ok(4)),
		}, false},
		{"concurrent acquires, either may win", []porcupine.Operation{
			op(0, 0, 10, acq("a"), lockmodel.Output{Outcome: lockmodel.Held}),
			op(1, 1, 9, acq("b"), ok(7)),
		}, true},
		{"refused on a free key", []porcupine.Operation{
			op(0, 0, 1, acq("a"), lockmodel.Output{Outcome: lockmodel.Held}),
		}, false},
		{"stale release succeeds", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, 5, acq("a"), ok(6)),
			op(0, 6, 7, rel("a", 5), ok(0)),
		}, false},
		{"stale renew answered stale", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, 5, acq("b"), ok(6)),
			op(0, 6, 7, ren("a", 5), lockmodel.Output{Outcome: lockmodel.Stale}),
		}, true},
		{"stale renew answered not-held while the newer grant lives", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, 5, acq("b"), ok(6)),
			op(0, 6, 7, ren("a", 5), lockmodel.Output{Outcome: lockmodel.NotHeld}),
		}, false},
		{"inspect misses the holder", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 3, lockmodel.Input{Op: lockmodel.Inspect, Key: "k"}, lockmodel.Output{Outcome: lockmodel.OK}),
		}, false},
		{"revoke then the old holder renews", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 3, lockmodel.Input{Op: lockmodel.Revoke, Key: "k"}, lockmodel.Output{Outcome: lockmodel.OK, Owner: "a", Token: 5}),
			op(0, 4, 5, ren("a", 5), ok(0)),
		}, false},
		{"unknown acquire that took effect, seen by inspect", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, never, acq("b"), unknown),
			op(2, 6, 7, lockmodel.Input{Op: lockmodel.Inspect, Key: "k"}, lockmodel.Output{Outcome: lockmodel.OK, Owner: "b", Token: 9}),
			op(0, 8, 9, acq("a"), lockmodel.Output{Outcome: lockmodel.Held}),
			op(0, 10, 11, ren("a", 5), lockmodel.Output{Outcome: lockmodel.Stale}),
		}, true},
		{"unknown acquire that did not take effect", []porcupine.Operation{
			op(1, 0, never, acq("b"), unknown),
			op(0, 2, 3, acq("a"), ok(5)),
		}, true},
		{"unknown acquire seen with an old token", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, never, acq("b"), unknown),
			op(2, 6, 7, lockmodel.Input{Op: lockmodel.Inspect, Key: "k"}, lockmodel.Output{Outcome: lockmodel.OK, Owner: "b", Token: 4}),
		}, false},
		{"unknown release, then the holder's grant is gone", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, never, rel("a", 5), unknown),
			op(1, 4, 5, acq("b"), ok(6)),
		}, true},
		{"stale after a grant nobody saw was revoked unseen", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, never, acq("b"), unknown),
			op(2, 6, 7, acq("c"), lockmodel.Output{Outcome: lockmodel.Held}),
			op(3, 8, never, lockmodel.Input{Op: lockmodel.Revoke, Key: "k"}, unknown),
			op(2, 10, 11, lockmodel.Input{Op: lockmodel.Inspect, Key: "k"}, lockmodel.Output{Outcome: lockmodel.OK}),
			op(0, 12, 13, ren("a", 5), lockmodel.Output{Outcome: lockmodel.Stale}),
		}, true},
		{"stale with no newer grant at all", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(0, 4, 5, ren("a", 5), lockmodel.Output{Outcome: lockmodel.Stale}),
		}, false},
		{"acknowledged grant lost", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, never, acq("b"), unknown),
			op(2, 4, 5, lockmodel.Input{Op: lockmodel.Inspect, Key: "k"}, lockmodel.Output{Outcome: lockmodel.OK}),
		}, false},
	} {
		if got := porcupine.CheckOperations(lockmodel.Model, tc.history); got != tc.want {
			t.Errorf("%s: linearizable = %v; want %v", tc.name, got, tc.want)
		}
	}
}

// TestProbeRenewNotHeldAcrossAHandoffIsNotLinearizable: a renewal that
// overlaps the holder's handoff (the key never free) may succeed or be
// refused as stale, never as not-held: the model rejects that history,
// which etcdstore's Renew produced (TestProbeRenewRacingAHandoffIsStale).
func TestProbeRenewNotHeldAcrossAHandoffIsNotLinearizable(t *testing.T) {
	hand := lockmodel.Input{Op: lockmodel.Handoff, Key: "k", Owner: "a", Token: 5}
	for _, tc := range []struct {
		outcome lockmodel.Outcome
		want    bool
	}{{lockmodel.NotHeld, false}, {lockmodel.Stale, true}, {lockmodel.OK, true}} {
		h := []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 10, ren("a", 5), lockmodel.Output{Outcome: tc.outcome}),
			op(0, 3, 4, hand, ok(6)),
		}
		if got := porcupine.CheckOperations(lockmodel.Model, h); got != tc.want {
			t.Errorf("renew answered %s across a handoff: linearizable %v, want %v", tc.outcome, got, tc.want)
		}
	}
}

// TestModelRefusesTwoHoldersOfExpiringGrants: with TTLs, a second grant
// whose answer came before the first could have ended is two holders at
// once.
func TestModelRefusesTwoHoldersOfExpiringGrants(t *testing.T) {
	sec := int64(time.Second)
	acqA := lockmodel.Input{Op: lockmodel.Acquire, Key: "k", Owner: "A", TTL: 2 * time.Second}
	acqB := lockmodel.Input{Op: lockmodel.Acquire, Key: "k", Owner: "B", TTL: 2 * time.Second}
	renA := lockmodel.Input{Op: lockmodel.Renew, Key: "k", Owner: "A", Token: 1, TTL: 2 * time.Second}
	inspect := lockmodel.Input{Op: lockmodel.Inspect, Key: "k"}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"B granted after A's lease could end", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(1, sec, 3*sec, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 2}),
		}, porcupine.Ok},
		{"B granted while A's lease runs", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(1, sec, sec+sec/10, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 2}),
		}, porcupine.Illegal},
		{"A's lost grant seen, B granted too soon", []porcupine.Operation{
			op(0, 0, math.MaxInt64, acqA, lockmodel.Output{Outcome: lockmodel.Unknown}),
			op(1, sec/2, sec/2+1, inspect, lockmodel.Output{Outcome: lockmodel.OK, Owner: "A", Token: 5}),
			op(1, sec, sec+sec/10, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 6}),
		}, porcupine.Illegal},
		{"A's lost grant seen, B granted after it ended", []porcupine.Operation{
			op(0, 0, math.MaxInt64, acqA, lockmodel.Output{Outcome: lockmodel.Unknown}),
			op(1, sec/2, sec/2+1, inspect, lockmodel.Output{Outcome: lockmodel.OK, Owner: "A", Token: 5}),
			op(1, sec, 3*sec, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 6}),
		}, porcupine.Ok},
		{"another holder seen while A's lease runs", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(1, sec, sec+1, inspect, lockmodel.Output{Outcome: lockmodel.OK, Owner: "C", Token: 2, Outside: true}),
		}, porcupine.Illegal},
		{"another holder seen after A's lease could end", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(1, 3*sec, 3*sec+1, inspect, lockmodel.Output{Outcome: lockmodel.OK, Owner: "C", Token: 2, Outside: true}),
		}, porcupine.Ok},
		{"B granted after A's first TTL, within its renewal's", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(0, sec, sec+1, renA, lockmodel.Output{Outcome: lockmodel.OK}),
			op(1, 5*sec/2, 5*sec/2+1, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 2}),
		}, porcupine.Illegal},
		{"B granted after A's renewal could end", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(0, sec, sec+1, renA, lockmodel.Output{Outcome: lockmodel.OK}),
			op(1, 3*sec, 3*sec+1, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 2}),
		}, porcupine.Ok},
		{"A renewed after B was granted", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 1}),
			op(1, 3*sec, 3*sec+1, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 2}),
			op(0, 4*sec, 4*sec+1, renA, lockmodel.Output{Outcome: lockmodel.OK}),
		}, porcupine.Illegal},
		{"a token granted twice", []porcupine.Operation{
			op(0, 0, sec/10, acqA, lockmodel.Output{Outcome: lockmodel.OK, Token: 3}),
			op(1, 3*sec, 3*sec+1, acqB, lockmodel.Output{Outcome: lockmodel.OK, Token: 3}),
		}, porcupine.Illegal},
	} {
		if got := porcupine.CheckOperations(lockmodel.Model, tc.ops); got != (tc.want == porcupine.Ok) {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.want == porcupine.Ok)
		}
	}
}

// TestCheckAnswersWithItsSentinel: Check returns nil for a linearizable
// history and ErrNotLinearizable, naming the picture it wrote, for two
// holders at once.
func TestCheckAnswersWithItsSentinel(t *testing.T) {
	good := []porcupine.Operation{
		op(0, 0, 1, acq("a"), ok(5)),
		op(0, 2, 3, rel("a", 5), ok(0)),
	}
	if err := lockmodel.Check(t.Name(), good, time.Second); err != nil {
		t.Fatalf("a grant and its release: %v", err)
	}
	bad := []porcupine.Operation{
		op(0, 0, 1, acq("a"), ok(5)),
		op(1, 2, 3, acq("b"), ok(6)),
	}
	err := lockmodel.Check(t.Name(), bad, time.Second)
	if !errors.Is(err, lockmodel.ErrNotLinearizable) || !strings.Contains(err.Error(), ".html") {
		t.Fatalf("two holders at once: %v; want ErrNotLinearizable naming its picture", err)
	}
	path := err.Error()[strings.Index(err.Error(), "see ")+4:]
	if err := os.Remove(path); err != nil {
		t.Errorf("the picture named in the error: %v", err)
	}
}
