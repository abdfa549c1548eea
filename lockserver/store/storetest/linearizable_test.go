package storetest

import (
	"context"
	"math"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
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
		{"stale after a grant nobody saw was revoked unseen", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(1, 4, never, acq("b"), unknown),
			op(2, 6, 7, acq("c"), lockResult{Outcome: "held"}),
			op(3, 8, never, lockOp{Op: "revoke", Key: "k"}, unknown),
			op(2, 10, 11, lockOp{Op: "inspect", Key: "k"}, lockResult{Outcome: "ok"}),
			op(0, 12, 13, ren("a", 5), lockResult{Outcome: "stale"}),
		}, true},
		{"stale with no newer grant at all", []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(0, 2, 3, rel("a", 5), ok(0)),
			op(0, 4, 5, ren("a", 5), lockResult{Outcome: "stale"}),
		}, false},
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

// tokenBlindRelease is a broken store: its Release ends whatever grant the
// owner holds on the key, whatever token it is given, as a store that
// forgot to compare the token would.
type tokenBlindRelease struct{ store.LockStore }

func (s tokenBlindRelease) Release(ctx context.Context, key, owner string, token int64) error {
	st, err := s.Inspect(ctx, key)
	if err != nil {
		return err
	}
	if st.Lease != nil && st.Lease.Owner == owner {
		token = st.Lease.Token
	}
	return s.LockStore.Release(ctx, key, owner, token)
}

// TestTheCheckCatchesATokenBlindRelease: the workload, run against a store
// whose release ignores the token, records a history the checker rejects
// (its clients release with old tokens of their own all the time).
func TestTheCheckCatchesATokenBlindRelease(t *testing.T) {
	history := recordHistory(t, tokenBlindRelease{memstore.New(nil)}, nil)
	if t.Failed() {
		return
	}
	if porcupine.CheckOperations(lockModel, history) {
		t.Fatalf("%d operations against a token-blind release judged linearizable", len(history))
	}
	if !porcupine.CheckOperations(lockModel, recordHistory(t, memstore.New(nil), nil)) {
		t.Fatal("the same workload against the correct store judged not linearizable")
	}
}
