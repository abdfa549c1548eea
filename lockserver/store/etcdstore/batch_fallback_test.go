package etcdstore

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// TestABatchOnEndedIdleLeasesGrantsOnLiveOnes: the pool's idle leases are
// ended behind its back, then a group grant takes them: free keys, and one
// key held by another worker. etcd refuses a transaction in which a member
// that would be granted has an ended lease, so the batch falls back to
// single grants. Every free key is granted on a lease that is alive (never
// on an ended one), its token is its key's live grant, the held key is
// refused ErrLockHeld and keeps its holder.
func TestABatchOnEndedIdleLeasesGrantsOnLiveOnes(t *testing.T) {
	s := openCfgT(t, nil)
	held := mustAcquire(t, s, "held", "worker-h", 5*time.Second)
	idle := awaitIdle(t, s)
	for _, id := range idle {
		revokeByID(t, id)
	}
	reqs := []store.AcquireRequest{
		{Key: "a", Owner: "worker-a", TTL: 5 * time.Second},
		{Key: "held", Owner: "worker-b", TTL: 5 * time.Second},
		{Key: "b", Owner: "worker-b", TTL: 5 * time.Second},
		{Key: "c", Owner: "worker-c", TTL: 5 * time.Second},
	}
	res := s.AcquireMany(ctxT(t), reqs)
	for i, r := range res {
		if reqs[i].Key == "held" {
			if !errors.Is(r.Err, store.ErrLockHeld) {
				t.Errorf("member held: %+v, %v; want ErrLockHeld", r.Lease, r.Err)
			}
			continue
		}
		if r.Err != nil {
			t.Errorf("member %s: %v; want granted", reqs[i].Key, r.Err)
			continue
		}
		if slices.Contains(idle, r.Lease.LeaseID) || !leaseAlive(t, s, r.Lease.LeaseID) {
			t.Errorf("member %s granted on lease %s, which has ended (ended idle leases %v)", reqs[i].Key, r.Lease.LeaseID, idle)
		}
		st, err := s.Inspect(ctxT(t), reqs[i].Key)
		if err != nil || st.Lease == nil || st.Lease.Token != r.Lease.Token || st.Lease.Owner != reqs[i].Owner {
			t.Errorf("member %s: granted %+v, but the key's lease is %+v, %v", reqs[i].Key, r.Lease, st.Lease, err)
		}
	}
	if st, err := s.Inspect(ctxT(t), "held"); err != nil || st.Lease == nil || st.Lease.Token != held.Token {
		t.Errorf("key held after the batch: %+v, %v; want still token %d", st.Lease, err, held.Token)
	}
}
