package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// TestEndingAGrantIsOneRequest: a release, a batch of releases and a
// force-revoke naming a token each send etcd one request (the emptied
// lease's revocation, in the background, is a lease request, not counted).
// A release is one request also when the token offset was raised since the
// grant; a force-revoke naming a token then reads the key too, as it
// checks the grant's offset on the offset key.
func TestEndingAGrantIsOneRequest(t *testing.T) {
	var kv atomic.Int64 // KV requests: reads and transactions
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasPrefix(method, "/etcdserverpb.KV/") {
			kv.Add(1)
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	clk := &fakeClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	s, err := New(cli, conf(func(cfg *Config) { cfg.Prefix, cfg.Clock, cfg.IdleLeases = newPrefix(t), clk, 0 }), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()

	for i, c := range []struct {
		name       string
		end        func(ls []store.Lease) error
		afterRaise int64 // requests when the offset was raised since the grant
	}{
		{"release", func(ls []store.Lease) error { return s.Release(ctxT(t), ls[0].Key, ls[0].Owner, ls[0].Token) }, 1},
		{"release of three", func(ls []store.Lease) error {
			var refs []store.LeaseRef
			for _, l := range ls {
				refs = append(refs, store.LeaseRef{Key: l.Key, Owner: l.Owner, Token: l.Token})
			}
			return errors.Join(s.ReleaseMany(ctxT(t), refs)...)
		}, 1},
		{"revoke naming a token", func(ls []store.Lease) error { _, err := s.Revoke(ctxT(t), ls[0].Key, ls[0].Token); return err }, 2},
	} {
		for _, raised := range []bool{false, true} {
			want := int64(1)
			if raised {
				want = c.afterRaise
			}
			var ls []store.Lease
			for j := range 3 {
				ls = append(ls, mustAcquire(t, s, fmt.Sprintf("payout:acct-%d-%d-%v", i, j, raised), "worker-a", 10*time.Second))
			}
			if raised {
				clk.advance(10 * time.Second)
				mustAcquire(t, s, fmt.Sprintf("payout:acct-%d-raise", i), "worker-a", 10*time.Second) // raises the offset
			}
			kv.Store(0)
			if err := c.end(ls); err != nil {
				t.Fatalf("%s (offset raised since the grant: %v): %v", c.name, raised, err)
			}
			if n := kv.Load(); n != want {
				t.Errorf("%s (offset raised since the grant: %v): %d etcd requests; want %d", c.name, raised, n, want)
			}
		}
	}
}

// TestARevokeNamingATokenEndsThatGrantOnly: a force-revoke names a token
// and no owner, so its transaction checks the grant's offset on the
// offset key, unchanged since before the grant. Once the offset is
// raised, the token the grant's revision would have with the new offset
// is not the grant's: it is refused, and the grant lives on; the grant's
// own token revokes it, and a release of a grant made before the raise
// ends it.
func TestARevokeNamingATokenEndsThatGrantOnly(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	s := openCfgT(t, func(cfg *Config) { cfg.Clock, cfg.IdleLeases = clk, 0 })
	a := mustAcquire(t, s, "payout:acct-a", "worker-a", 10*time.Second)
	b := mustAcquire(t, s, "payout:acct-b", "worker-b", 10*time.Second)
	before := offsetT(t, s)
	clk.advance(10 * time.Second)
	mustAcquire(t, s, "payout:acct-c", "worker-c", 10*time.Second) // raises the offset
	after := offsetT(t, s)
	if after == before {
		t.Fatalf("the offset is still %d ten seconds later", before)
	}

	forged := a.Token - before + after
	if l, err := s.Revoke(ctxT(t), a.Key, forged); !errors.Is(err, store.ErrNotHeld) {
		t.Fatalf("Revoke(%d) of grant %d made with offset %d, now %d: %+v, %v; want ErrNotHeld", forged, a.Token, before, after, l, err)
	}
	if st, err := s.Inspect(ctxT(t), a.Key); err != nil || st.Lease == nil || st.Lease.Token != a.Token {
		t.Fatalf("Inspect after the refused revoke: %+v, %v; want grant %d live", st.Lease, err, a.Token)
	}
	if l, err := s.Revoke(ctxT(t), a.Key, a.Token); err != nil || l.Token != a.Token || l.Owner != a.Owner || l.LeaseID != a.LeaseID {
		t.Fatalf("Revoke(%d): %+v, %v; want grant %d of %s on lease %s", a.Token, l, err, a.Token, a.Owner, a.LeaseID)
	}
	if err := s.Release(ctxT(t), b.Key, b.Owner, b.Token); err != nil {
		t.Fatalf("Release of grant %d made before the raise: %v", b.Token, err)
	}
}

// TestARevokeNamingATokenLeavesAForeignValueAlone: a value under the
// store's prefix that no grant wrote (not a record, or a record on no
// lease) is refused by a force-revoke naming the token its revision would
// have, and left as it was.
func TestARevokeNamingATokenLeavesAForeignValueAlone(t *testing.T) {
	s := openCfgT(t, func(cfg *Config) { cfg.IdleLeases = 0 })
	mustAcquire(t, s, "payout:acct-a", "worker-a", 10*time.Second) // writes the offset
	x := offsetT(t, s)
	g, err := s.cli.Grant(ctxT(t), 60)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	for i, c := range []struct {
		name, value string
		opts        []clientv3.OpOption
	}{
		{"text, no lease", "written by hand", nil},
		{"text on a lease", "written by hand", []clientv3.OpOption{clientv3.WithLease(g.ID)}},
		{"a record with no lease", encodeRecord("worker-b", 10*time.Second, x), nil},
	} {
		k := fmt.Sprintf("payout:acct-%d", i)
		put, err := s.cli.Put(ctxT(t), s.prefix+k, c.value, c.opts...)
		if err != nil {
			t.Fatalf("Put: %v", err)
		}
		if _, err := s.Revoke(ctxT(t), k, put.Header.Revision+x); err == nil {
			t.Errorf("%s: Revoke of a value that is not a grant record: nil error; want an error", c.name)
		}
		got, err := s.cli.Get(ctxT(t), s.prefix+k)
		if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != c.value {
			t.Errorf("%s: after the revoke the foreign key reads %+v, %v; want it unchanged", c.name, got.Kvs, err)
		}
	}
}

// TestABareRevisionEndsNoGrantOnceTheOffsetKeyIsGone: an operator deletes
// the token offset key by hand. A release or a force-revoke naming the
// grant's bare revision (its token less its offset) is not the grant's
// token, from a store that knows the offset and from one that never saw
// it: both are refused and the grant lives on.
func TestABareRevisionEndsNoGrantOnceTheOffsetKeyIsGone(t *testing.T) {
	prefix := newPrefix(t)
	s := openCfgT(t, func(cfg *Config) { cfg.Prefix, cfg.IdleLeases = prefix, 0 })
	l := mustAcquire(t, s, "payout:acct-a", "worker-a", 10*time.Second)
	x := offsetT(t, s)
	if x == 0 {
		t.Fatal("the token offset is 0; the test needs one")
	}
	if _, err := s.cli.Delete(ctxT(t), s.offsetKey()); err != nil {
		t.Fatalf("delete the offset key: %v", err)
	}
	fresh := openCfgT(t, func(cfg *Config) { cfg.Prefix, cfg.IdleLeases = prefix, 0 })
	bare := l.Token - x
	for _, st := range []struct {
		name string
		s    *Store
	}{{"the granting store", s}, {"a new store", fresh}} {
		if err := st.s.Release(ctxT(t), l.Key, l.Owner, bare); !errors.Is(err, store.ErrStaleToken) {
			t.Errorf("%s: Release(%d) of grant %d: %v; want ErrStaleToken", st.name, bare, l.Token, err)
		}
		if r, err := st.s.Revoke(ctxT(t), l.Key, bare); !errors.Is(err, store.ErrStaleToken) {
			t.Errorf("%s: Revoke(%d) of grant %d: %+v, %v; want ErrStaleToken", st.name, bare, l.Token, r, err)
		}
		if got, err := s.Inspect(ctxT(t), l.Key); err != nil || got.Lease == nil || got.Lease.Token != l.Token {
			t.Fatalf("%s: Inspect after the refusals: %+v, %v; want grant %d live", st.name, got.Lease, err, l.Token)
		}
	}
	if err := fresh.Release(ctxT(t), l.Key, l.Owner, l.Token); err != nil {
		t.Fatalf("Release of the grant's own token: %v", err)
	}
}
