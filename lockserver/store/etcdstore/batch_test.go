package etcdstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// TestABatchSharesOneRevisionAndEachTokenIsItsKeysModRevisionPlusOffset:
// the members granted in one transaction carry its revision plus the one
// offset it was made with, which is each key's ModRevision plus its
// record's offset (the token a release or renewal is checked against).
func TestABatchSharesOneRevisionAndEachTokenIsItsKeysModRevisionPlusOffset(t *testing.T) {
	s := openT(t, shared, newPrefix(t))
	defer s.Close()
	res := s.AcquireMany(ctxT(t), []store.AcquireRequest{
		{Key: "a", Owner: "w1", TTL: 10 * time.Second},
		{Key: "b", Owner: "w2", TTL: 10 * time.Second},
	})
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("member %d: %v", i, r.Err)
		}
		got, err := s.cli.Get(ctxT(t), s.prefix+r.Lease.Key)
		if err != nil || len(got.Kvs) != 1 {
			t.Fatalf("Get %q: %v, %d kvs", r.Lease.Key, err, len(got.Kvs))
		}
		if mr, off := got.Kvs[0].ModRevision, recordT(t, got.Kvs[0]).Offset; mr+off != r.Lease.Token || off == 0 {
			t.Fatalf("member %d: token %d, key's ModRevision %d, offset %d", i, r.Lease.Token, mr, off)
		}
		if lid := leaseID(got.Kvs[0].Lease); lid != r.Lease.LeaseID {
			t.Fatalf("member %d: lease id %s, key's lease %s", i, r.Lease.LeaseID, lid)
		}
	}
	if res[0].Lease.Token != res[1].Lease.Token {
		t.Fatalf("tokens %d and %d; one transaction has one revision", res[0].Lease.Token, res[1].Lease.Token)
	}
	if res[0].Lease.LeaseID == res[1].Lease.LeaseID {
		t.Fatalf("both members on lease %s; each grant needs a lease of its own", res[0].Lease.LeaseID)
	}
}

// TestBatchFailureAnswersEveryMember: a transaction etcd refuses as a
// whole (more operations than its --max-txn-ops, 128, once the store's
// own cap is lifted) answers every member with the error, and no key is
// granted.
func TestBatchFailureAnswersEveryMember(t *testing.T) {
	s := openT(t, shared, newPrefix(t))
	defer s.Close()
	s.maxTxnMembers = 1000
	var reqs []store.AcquireRequest
	for i := range 130 {
		reqs = append(reqs, store.AcquireRequest{Key: fmt.Sprintf("k-%03d", i), Owner: "w", TTL: 10 * time.Second})
	}
	res := s.AcquireMany(ctxT(t), reqs)
	for i, r := range res {
		if r.Err == nil {
			t.Errorf("member %d (%s) granted %+v in a refused transaction", i, reqs[i].Key, r.Lease)
		}
	}
	t.Logf("member 0's answer: %v", res[0].Err)
	for _, r := range reqs {
		st, err := s.Inspect(ctxT(t), r.Key)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", r.Key, err)
		}
		if st.Lease != nil {
			t.Errorf("key %s held by %+v after a refused transaction", r.Key, *st.Lease)
		}
	}
	// With the store's cap, the same batch is granted in full.
	s.maxTxnMembers = defaultMaxTxnMembers
	for i, r := range s.AcquireMany(ctxT(t), reqs) {
		if r.Err != nil {
			t.Fatalf("member %d with the cap: %v", i, r.Err)
		}
	}
}
