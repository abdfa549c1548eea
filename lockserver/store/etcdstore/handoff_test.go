package etcdstore

import (
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// TestHandoffMovesTheKeyToAFreshLease: after a Handoff the key's
// ModRevision plus its record's offset is the new token and the key is
// attached to the new grant's lease, not the old one; revoking the old
// lease by id (as an operator with etcdctl might, and as Handoff does in
// the background) ends no grant: the key stays held by the new owner;
// revoking the new lease ends the new grant.
func TestHandoffMovesTheKeyToAFreshLease(t *testing.T) {
	for _, idle := range []int{0, DefaultIdleLeases} {
		t.Run("idle="+strconv.Itoa(idle), func(t *testing.T) {
			prefix := newPrefix(t)
			s, err := Open(ctxT(t), conf(func(cfg *Config) {
				cfg.Endpoints, cfg.Prefix, cfg.IdleLeases = shared.Endpoints(), prefix, idle
			}), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const key = "payout:acct-handoff"
			a, err := s.Acquire(ctxT(t), key, "worker-a", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			first, err := s.cli.Get(ctxT(t), prefix+key)
			if err != nil || len(first.Kvs) != 1 {
				t.Fatalf("read back key: %v %v", first, err)
			}
			b, err := s.Handoff(ctxT(t), store.LeaseRef{Key: key, Owner: "worker-a", Token: a.Token},
				store.AcquireRequest{Key: key, Owner: "worker-b", TTL: 10 * time.Second})
			if err != nil {
				t.Fatalf("Handoff: %v", err)
			}
			resp, err := s.cli.Get(ctxT(t), prefix+key)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("read back key: %v %v", resp, err)
			}
			kv := resp.Kvs[0]
			off := recordT(t, kv).Offset
			if kv.ModRevision+off != b.Token || leaseID(kv.Lease) != b.LeaseID || b.LeaseID == a.LeaseID || kv.CreateRevision != first.Kvs[0].ModRevision {
				t.Fatalf("after the handoff: key ModRevision %d, CreateRevision %d, offset %d, lease %s; want ModRevision + offset = token %d, lease %s (not %s), CreateRevision %d (the first grant's)",
					kv.ModRevision, kv.CreateRevision, off, leaseID(kv.Lease), b.Token, b.LeaseID, a.LeaseID, first.Kvs[0].ModRevision)
			}
			old, err := strconv.ParseInt(a.LeaseID, 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = s.cli.Revoke(ctxT(t), clientv3.LeaseID(old)) // may have been revoked already
			st, err := s.Inspect(ctxT(t), key)
			if err != nil || st.Lease == nil || st.Lease.Owner != "worker-b" || st.Lease.Token != b.Token {
				t.Fatalf("after revoking the old lease: %+v %v; want held by worker-b with token %d", st.Lease, err, b.Token)
			}
			if _, err := s.Renew(ctxT(t), key, "worker-b", b.Token); err != nil {
				t.Fatalf("Renew of the handed lease: %v", err)
			}
			if _, err := s.Revoke(ctxT(t), key, b.Token); err != nil {
				t.Fatalf("Revoke of the handed lease: %v", err)
			}
			if st, err := s.Inspect(ctxT(t), key); err != nil || st.Lease != nil {
				t.Fatalf("after revoking the new grant: %+v %v; want free", st.Lease, err)
			}
		})
	}
}
