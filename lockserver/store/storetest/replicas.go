package storetest

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// testLinearizableAcrossReplicasAndRestart runs the linearizability
// workload through two stores over one namespace, as the two replicas of
// lock-server's Deployment share one backend: each client talks to one
// replica, and the first replica is restarted (Reopen) under the clients.
// Calls the restart cuts are recorded with an unknown outcome. The
// restarted replica remembers nothing of the tokens it issued, so the
// check holds only if the backend itself keeps tokens in order.
func testLinearizableAcrossReplicasAndRestart(t *testing.T, b Backend) {
	if b.Replica == nil {
		t.Skipf("%s: no second store over one namespace", b.Name)
	}
	first := open(t, b)
	second := b.Replica(t, first)
	t.Cleanup(func() { _ = second.Close() })
	CheckLinearizableAcrossReplicas(t, b.Name, first, second, func(old store.LockStore) store.LockStore {
		return b.Reopen(t, old)
	})
}

// CheckLinearizableAcrossReplicas is CheckLinearizable through two stores
// over one namespace, as two lock-server replicas: clients with an even
// number use first, the others second, and restart (called once, from a
// goroutine of its own, after a third of the calls) replaces first with
// the store it returns, as a restarted replica. restart may do more to the
// backend (a rollback); it must report failures with t.Error.
func CheckLinearizableAcrossReplicas(t *testing.T, name string, first, second store.LockStore, restart func(old store.LockStore) store.LockStore) {
	t.Helper()
	r := &replicas{stores: [2]store.LockStore{first, second}}
	var s store.LockStore = r
	if _, ok := first.(store.Handoffer); ok {
		s = handingReplicas{r}
	} else if _, ok := first.(interface{ AbandonsUnknownGrants() }); ok {
		s = abandoningReplicas{r}
	}
	CheckLinearizable(t, name+"/replicas", s, func() {
		r.mu.Lock()
		old := r.stores[0]
		r.mu.Unlock()
		restarted := restart(old)
		r.mu.Lock()
		r.stores[0] = restarted
		r.mu.Unlock()
	})
}

// replicas routes each call to one of two stores: by the client number
// at the end of the owner ("client-3": the second), by key for calls that
// name no owner.
type replicas struct {
	mu     sync.Mutex
	stores [2]store.LockStore
}

// abandoningReplicas is replicas over stores that abandon grants whose
// acquire ended with an unknown outcome (lock-server does).
type abandoningReplicas struct{ *replicas }

func (abandoningReplicas) AbandonsUnknownGrants() {}

func (r *replicas) pick(owner string) store.LockStore {
	n, _ := strconv.Atoi(owner[strings.LastIndexByte(owner, '-')+1:])
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stores[n%2]
}

func (r *replicas) byKey(key string) store.LockStore {
	return r.pick(strconv.Itoa(len(key)))
}

func (r *replicas) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	return r.pick(owner).Acquire(ctx, key, owner, ttl)
}

func (r *replicas) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	return r.pick(owner).Renew(ctx, key, owner, token)
}

func (r *replicas) Release(ctx context.Context, key, owner string, token int64) error {
	return r.pick(owner).Release(ctx, key, owner, token)
}

func (r *replicas) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	return r.byKey(key).Revoke(ctx, key, token)
}

func (r *replicas) Inspect(ctx context.Context, key string) (store.State, error) {
	return r.byKey(key).Inspect(ctx, key)
}

// Ping answers when both replicas do.
func (r *replicas) Ping(ctx context.Context) error {
	for _, owner := range []string{"-0", "-1"} {
		if err := r.pick(owner).Ping(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Close closes nothing: the test closes each store it opened.
func (r *replicas) Close() error { return nil }

// handingReplicas is replicas over stores that hand off
// (store.Handoffer), through the replica of from's owner.
type handingReplicas struct{ *replicas }

func (r handingReplicas) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	return r.pick(from.Owner).(store.Handoffer).Handoff(ctx, from, to)
}
