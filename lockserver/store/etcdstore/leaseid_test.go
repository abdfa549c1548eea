package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The tests in this file hold "a lease id names one grant": an
// operator acting on a leaseId from the logs or the API, or a renewal that
// races its own release, must reach that grant and no other. They use only
// the Store's methods and an etcd client, so they run unchanged against
// the version that reused leases (and fail there).

// revokeByID revokes lease id as an operator would with "etcdctl lease
// revoke": by the id a grant reported, through a client of its own. A lease
// that has ended already is no error.
func revokeByID(t *testing.T, id string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	if _, err := cli.Revoke(ctxT(t), parseLeaseID(t, id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("revoke lease %s: %v", id, err)
	}
}

// TestRevokingAnOldGrantsLeaseIDEndsNoOtherGrant: an operator who revokes
// the lease id an ended grant reported (etcdctl lease revoke, with a
// leaseId read from the logs) must not end a later grant, of another key,
// that the SDK of its holder still reports as held.
func TestRevokingAnOldGrantsLeaseIDEndsNoOtherGrant(t *testing.T) {
	s := openCfgT(t, nil)
	k1 := mustAcquire(t, s, "payout:acct-1", "worker-a", 10*time.Second)
	if err := s.Release(ctxT(t), k1.Key, k1.Owner, k1.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	k2 := mustAcquire(t, s, "payout:acct-2", "worker-b", 10*time.Second)

	revokeByID(t, k1.LeaseID)

	st, err := s.Inspect(ctxT(t), k2.Key)
	if err != nil || st.Lease == nil || st.Lease.Token != k2.Token || st.Lease.Owner != "worker-b" {
		t.Fatalf("after revoking lease %s (of %q's ended grant): Inspect(%q) = %+v, %v; want worker-b's grant %d on lease %s live",
			k1.LeaseID, k1.Key, k2.Key, st.Lease, err, k2.Token, k2.LeaseID)
	}
	if _, err := s.Acquire(ctxT(t), k2.Key, "worker-c", 10*time.Second); !errors.Is(err, store.ErrLockHeld) {
		t.Fatalf("a third owner's acquire of %q after revoking lease %s = %v; want ErrLockHeld", k2.Key, k1.LeaseID, err)
	}
	if _, err := s.Renew(ctxT(t), k2.Key, k2.Owner, k2.Token); err != nil {
		t.Fatalf("the holder's renew of %q: %v", k2.Key, err)
	}
}

// TestNoTwoGrantsReportTheSameLeaseID runs many acquire, renew and release
// cycles, contended (so acquires lose and hand their idle lease back) and
// not, and checks that no two grants ever report the same lease id.
func TestNoTwoGrantsReportTheSameLeaseID(t *testing.T) {
	s := openCfgT(t, nil)
	const workers, cycles = 4, 60
	var (
		mu    sync.Mutex
		seen  = map[string]int64{} // lease id -> token of the grant that reported it
		lost  atomic.Int64
		wg    sync.WaitGroup
		fails = make(chan error, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(1, uint64(w)))
			owner := fmt.Sprintf("worker-%d", w)
			for range cycles {
				key := fmt.Sprintf("k%d", rng.IntN(3))
				l, err := s.Acquire(context.Background(), key, owner, 5*time.Second)
				if errors.Is(err, store.ErrLockHeld) {
					lost.Add(1)
					continue
				}
				if err != nil {
					fails <- fmt.Errorf("Acquire(%q): %w", key, err)
					return
				}
				mu.Lock()
				prev, dup := seen[l.LeaseID]
				seen[l.LeaseID] = l.Token
				mu.Unlock()
				if dup {
					fails <- fmt.Errorf("grant %d of %q reports lease %s, already reported by grant %d", l.Token, key, l.LeaseID, prev)
					return
				}
				r, err := s.Renew(context.Background(), key, owner, l.Token)
				if err != nil || r.LeaseID != l.LeaseID {
					fails <- fmt.Errorf("Renew(%q, %d) = lease %s, %v; want lease %s", key, l.Token, r.LeaseID, err, l.LeaseID)
					return
				}
				if err := s.Release(context.Background(), key, owner, l.Token); err != nil {
					fails <- fmt.Errorf("Release(%q, %d): %w", key, l.Token, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(fails)
	for err := range fails {
		t.Error(err)
	}
	if len(seen) < workers*cycles/4 || lost.Load() == 0 {
		t.Fatalf("%d grants and %d lost acquires; the run did not exercise what it should", len(seen), lost.Load())
	}
	t.Logf("%d grants, %d lost acquires", len(seen), lost.Load())
}

// racingLease passes the client's lease calls through, except that the
// first keep-alive for lease armed runs between first, then goes on.
type racingLease struct {
	clientv3.Lease
	armed   atomic.Int64 // lease id; 0 when disarmed
	between func(id clientv3.LeaseID)
}

func (r *racingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	if id != 0 && r.armed.CompareAndSwap(int64(id), 0) {
		r.between(id)
	}
	return r.Lease.KeepAliveOnce(ctx, id)
}

// TestARenewRacingItsReleaseExtendsNoOtherGrant: a renew has checked its
// grant and is about to send the keep-alive when its own holder releases
// and another grant is made. The keep-alive must not reset a lease that
// carries that grant (or any key): it would let the later grant outlive
// its TTL.
func TestARenewRacingItsReleaseExtendsNoOtherGrant(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	race := &racingLease{Lease: cli.Lease}
	cli.Lease = race
	s, err := New(cli, conf(func(cfg *Config) { cfg.Prefix = newPrefix(t) }), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()

	a := mustAcquire(t, s, "payout:acct-1", "worker-a", 10*time.Second)
	var (
		b       store.Lease
		carries []string // keys on the lease the racing keep-alive resets
	)
	race.between = func(id clientv3.LeaseID) {
		if err := s.Release(ctxT(t), a.Key, a.Owner, a.Token); err != nil {
			t.Errorf("the holder's release: %v", err)
		}
		b = mustAcquire(t, s, "payout:acct-2", "worker-b", 10*time.Second)
		ttl, err := race.Lease.TimeToLive(ctxT(t), id, clientv3.WithAttachedKeys())
		if err != nil {
			t.Errorf("TimeToLive(%x): %v", id, err)
			return
		}
		for _, k := range ttl.Keys {
			carries = append(carries, string(k))
		}
	}
	race.armed.Store(int64(parseLeaseID(t, a.LeaseID)))
	r, err := s.Renew(ctxT(t), a.Key, a.Owner, a.Token)
	if race.armed.Load() != 0 {
		t.Fatal("the renew sent no keep-alive for its grant's lease")
	}
	if len(carries) > 0 {
		t.Fatalf("the renew of released grant %d reset lease %s, which carries %v (grant %d of %q on lease %s)",
			a.Token, a.LeaseID, carries, b.Token, b.Key, b.LeaseID)
	}
	switch {
	case err == nil && (r.Token != a.Token || r.LeaseID != a.LeaseID):
		t.Fatalf("racing renew = %+v; want grant %d on lease %s (linearized before its release)", r, a.Token, a.LeaseID)
	case err != nil && !errors.Is(err, store.ErrNotHeld):
		t.Fatalf("racing renew: %v; want success or ErrNotHeld", err)
	}
	if b.LeaseID == a.LeaseID {
		t.Fatalf("grant %d of %q made on lease %s of the released grant", b.Token, b.Key, a.LeaseID)
	}
	if _, err := s.Renew(ctxT(t), a.Key, a.Owner, a.Token); !errors.Is(err, store.ErrNotHeld) {
		t.Fatalf("renew after the release = %v; want ErrNotHeld", err)
	}
}
