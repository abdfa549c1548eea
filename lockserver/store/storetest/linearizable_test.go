package storetest

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// op builds a recorded call from call to ret (arbitrary time units).
func op(client int, call, ret int64, in lockOp, out lockResult) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

func acq(owner string) lockOp { return lockOp{Op: "acquire", Key: "k", Owner: owner} }
func rel(owner string, tok int64) lockOp {
	return lockOp{Op: "release", Key: "k", Owner: owner, Token: tok}
}
func ren(owner string, tok int64) lockOp {
	return lockOp{Op: "renew", Key: "k", Owner: owner, Token: tok}
}
func ok(tok int64) lockResult { return lockResult{Outcome: "ok", Token: tok} }

// never is the return time of a call whose outcome is unknown.
const never = math.MaxInt64

var unknown = lockResult{Outcome: "unknown"}

// TestLockModelRejectsBrokenHistories: histories a broken lock could
// produce are not linearizable, and their correct counterparts are, so the
// check in testLinearizable can fail.
func TestLockModelRejectsBrokenHistories(t *testing.T) {
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
			op(0, 0, 10, acq("a"), lockResult{Outcome: "held"}),
			op(1, 1, 9, acq("b"), ok(7)),
		}, true},
		{"refused on a free key", []porcupine.Operation{
			op(0, 0, 1, acq("a"), lockResult{Outcome: "held"}),
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
			op(0, 6, 7, ren("a", 5), lockResult{Outcome: "stale"}),
		}, true},
		{"stale renew answered not-held while the newer grant lives", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, 5, acq("b"), ok(6)),
			op(0, 6, 7, ren("a", 5), lockResult{Outcome: "not-held"}),
		}, false},
		{"inspect misses the holder", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 3, lockOp{Op: "inspect", Key: "k"}, lockResult{Outcome: "ok"}),
		}, false},
		{"revoke then the old holder renews", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 3, lockOp{Op: "revoke", Key: "k"}, lockResult{Outcome: "ok", Owner: "a", Token: 5}),
			op(0, 4, 5, ren("a", 5), ok(0)),
		}, false},
		{"unknown acquire that took effect, seen by inspect", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, never, acq("b"), unknown),
			op(2, 6, 7, lockOp{Op: "inspect", Key: "k"}, lockResult{Outcome: "ok", Owner: "b", Token: 9}),
			op(0, 8, 9, acq("a"), lockResult{Outcome: "held"}),
			op(0, 10, 11, ren("a", 5), lockResult{Outcome: "stale"}),
		}, true},
		{"unknown acquire that did not take effect", []porcupine.Operation{
			op(1, 0, never, acq("b"), unknown),
			op(0, 2, 3, acq("a"), ok(5)),
		}, true},
		{"unknown acquire seen with an old token", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, never, acq("b"), unknown),
			op(2, 6, 7, lockOp{Op: "inspect", Key: "k"}, lockResult{Outcome: "ok", Owner: "b", Token: 4}),
		}, false},
		{"unknown release, then the holder's grant is gone", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, never, rel("a", 5), unknown),
			op(1, 4, 5, acq("b"), ok(6)),
		}, true},
		{"acknowledged grant lost", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, never, acq("b"), unknown),
			op(2, 4, 5, lockOp{Op: "inspect", Key: "k"}, lockResult{Outcome: "ok"}),
		}, false},
	} {
		if got := porcupine.CheckOperations(lockModel, tc.history); got != tc.want {
			t.Errorf("%s: linearizable = %v; want %v", tc.name, got, tc.want)
		}
	}
}
