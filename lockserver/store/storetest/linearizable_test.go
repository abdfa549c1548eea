package storetest

import (
	"context"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/lockmodel"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

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
	if porcupine.CheckOperations(lockmodel.Model, history) {
		t.Fatalf("%d operations against a token-blind release judged linearizable", len(history))
	}
	if !porcupine.CheckOperations(lockmodel.Model, recordHistory(t, memstore.New(nil), nil)) {
		t.Fatal("the same workload against the correct store judged not linearizable")
	}
}
