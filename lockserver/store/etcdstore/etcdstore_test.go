package etcdstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// shared is the one-member cluster every test of this binary uses, each
// through a key prefix of its own. Tests that stop members start their own.
var shared *embedded.Cluster

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	c, err := embedded.Start(ctx, embedded.Config{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdstore tests: start embedded etcd:", err)
		os.Exit(1)
	}
	shared = c
	// Closed, and its data removed, after the tests or on Ctrl-C.
	pgtest.AtExit(c.Close)
	pgtest.Main(m)
}

var prefixSeq atomic.Int64

// newPrefix returns a key prefix no other store of this test binary uses.
func newPrefix(t testing.TB) string {
	return fmt.Sprintf("/test/%s/%d/", t.Name(), prefixSeq.Add(1))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openT(t testing.TB, c *embedded.Cluster, prefix string) *Store {
	t.Helper()
	s, err := Open(ctxT(t), conf(func(cfg *Config) { cfg.Endpoints, cfg.Prefix = c.Endpoints(), prefix }), nil)
	if err != nil {
		t.Fatalf("Open(%v, %q): %v", c.Endpoints(), prefix, err)
	}
	return s
}

func startT(t testing.TB, cfg embedded.Config) *embedded.Cluster {
	t.Helper()
	c, err := embedded.Start(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("embedded.Start(%+v): %v", cfg, err)
	}
	pgtest.Cleanup(t, c.Close)
	return c
}

// backend is the etcd Backend of the contract suite: every store gets a
// key prefix of its own on the shared cluster; Reopen opens a new client on
// the same prefix; RestartBackend uses a one-member cluster of its own and
// restarts its member on the same data directory and URLs.
func backend(t *testing.T) storetest.Backend {
	if got := shared.MinLeaseTTL(); got > time.Second {
		t.Fatalf("embedded etcd lease floor is %v; the expiry tests need 1s", got)
	}
	var mu sync.Mutex
	prefixes := map[store.LockStore]string{}
	remember := func(s store.LockStore, p string) store.LockStore {
		mu.Lock()
		defer mu.Unlock()
		prefixes[s] = p
		return s
	}
	return storetest.Backend{
		Name: "etcd",
		Open: func(t *testing.T) store.LockStore {
			p := newPrefix(t)
			return remember(openT(t, shared, p), p)
		},
		Reopen: func(t *testing.T, old store.LockStore) store.LockStore {
			mu.Lock()
			p, ok := prefixes[old]
			mu.Unlock()
			if !ok {
				t.Fatalf("Reopen of a store this backend did not open: %T", old)
			}
			if err := old.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return remember(openT(t, shared, p), p)
		},
		RestartBackend: func(t *testing.T) (store.LockStore, func()) {
			c := startT(t, embedded.Config{})
			s := openT(t, c, newPrefix(t))
			// The restart may run on a goroutine of its own (the
			// linearizability check's fault): t.Errorf, never t.Fatalf.
			return s, func() {
				if err := c.StopMember(0); err != nil {
					t.Errorf("stop etcd: %v", err)
					return
				}
				if err := c.RestartMember(ctxT(t), 0); err != nil {
					t.Errorf("restart etcd: %v", err)
				}
			}
		},
		// The embedded cluster's lease floor is 1 s (etcd's default timing
		// would make it 2 s).
		ShortTTL: time.Second,
	}
}

func TestContract(t *testing.T) {
	storetest.Run(t, backend(t))
}

// TestContractOverHTTP runs the contract through lock-server with its
// defaults, which batch: concurrent acquires reach etcd through the
// Batcher as one transaction of nested per-key transactions. (The Batcher
// alone, without the server, runs the contract in memstore.) make test
// runs half of it here and the other half on PostgreSQL.
func TestContractOverHTTP(t *testing.T) {
	storetest.Run(t, servertest.OverHTTP(serverHalf(backend(t))))
}

var fullMatrix = flag.Bool("matrix.full", false, "run the suites through lock-server whole (make test-full), not the half make test runs on etcd")

// serverHalf is b for the suites through lock-server: in make test their
// odd cases (storetest.Backend.Half), pgstore's tests running the even
// ones; every case with -matrix.full. The direct contract runs whole.
func serverHalf(b storetest.Backend) storetest.Backend {
	if !*fullMatrix {
		b.Half = 1
	}
	return b
}

// TestTokenIsTheKeysModRevisionPlusItsOffset: a grant's token is the
// key's ModRevision (which is also its CreateRevision) plus the offset
// its record carries, which is the offset in etcd.
func TestTokenIsTheKeysModRevisionPlusItsOffset(t *testing.T) {
	prefix := newPrefix(t)
	s := openT(t, shared, prefix)
	defer s.Close()
	var last int64
	for i := 0; i < 3; i++ {
		l, err := s.Acquire(ctxT(t), "payout:acct-1", "worker-a", 10*time.Second)
		if err != nil {
			t.Fatalf("Acquire #%d: %v", i, err)
		}
		resp, err := s.cli.Get(ctxT(t), prefix+"payout:acct-1")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("read back key: %v %v", resp, err)
		}
		kv, rec := resp.Kvs[0], recordT(t, resp.Kvs[0])
		if kv.ModRevision+rec.Offset != l.Token || kv.CreateRevision != kv.ModRevision {
			t.Fatalf("grant #%d: token %d; key has ModRevision %d, CreateRevision %d, offset %d; want token = ModRevision + offset, CreateRevision = ModRevision",
				i, l.Token, kv.ModRevision, kv.CreateRevision, rec.Offset)
		}
		if off := offsetT(t, s); rec.Offset != off || off == 0 {
			t.Fatalf("grant #%d: record's offset %d; the offset in etcd is %d; want equal and above 0", i, rec.Offset, off)
		}
		if got := leaseID(kv.Lease); got != l.LeaseID {
			t.Fatalf("grant #%d: LeaseID %s; key is attached to lease %s", i, l.LeaseID, got)
		}
		if l.Token <= last {
			t.Fatalf("grant #%d: token %d; want > %d", i, l.Token, last)
		}
		last = l.Token
		if err := s.Release(ctxT(t), "payout:acct-1", "worker-a", l.Token); err != nil {
			t.Fatalf("Release #%d: %v", i, err)
		}
	}
}

func TestGrantedTTLIsWholeSecondsAndExpiresAtIsALowerBound(t *testing.T) {
	s := openT(t, shared, newPrefix(t))
	defer s.Close()
	before := time.Now()
	l, err := s.Acquire(ctxT(t), "k", "worker-a", 1500*time.Millisecond)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.TTL != 2*time.Second {
		t.Fatalf("TTL for 1.5s = %v; want 2s (rounded up to whole seconds)", l.TTL)
	}
	if l.ExpiresAt.Before(before.Add(l.TTL)) || l.ExpiresAt.After(time.Now().Add(l.TTL)) {
		t.Fatalf("ExpiresAt %v; want between %v and %v", l.ExpiresAt, before.Add(l.TTL), time.Now().Add(l.TTL))
	}
	st, err := s.Inspect(ctxT(t), "k")
	if err != nil || st.Lease == nil {
		t.Fatalf("Inspect = %+v, %v; want the live lease", st, err)
	}
	if st.Lease.ExpiresAt.After(l.ExpiresAt.Add(time.Second)) {
		t.Fatalf("Inspect ExpiresAt %v later than the grant's %v by more than etcd's rounding", st.Lease.ExpiresAt, l.ExpiresAt)
	}
}

// TestTokensIncreaseAfterTheLeaderStops stops the member that leads a
// 3-member cluster while leases are held, gracefully (it hands leadership
// over) and abruptly (the others must time out and elect): grants made
// through the new leader carry larger tokens, the lease granted by the old
// leader is still honoured, and its token still identifies it.
func TestTokensIncreaseAfterTheLeaderStops(t *testing.T) {
	for _, how := range []string{"stop", "kill"} {
		t.Run(how, func(t *testing.T) {
			c := startT(t, embedded.Config{Members: 3})
			s := openT(t, c, newPrefix(t))
			defer s.Close()

			held, err := s.Acquire(ctxT(t), "payout:acct-9", "worker-a", 30*time.Second)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			other, err := s.Acquire(ctxT(t), "payout:acct-10", "worker-a", 30*time.Second)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			leader, err := c.Leader()
			if err != nil {
				t.Fatalf("Leader: %v", err)
			}
			stop := c.StopMember
			if how == "kill" {
				stop = c.KillMember
			}
			if err := stop(leader); err != nil {
				t.Fatalf("%s member %d (the leader): %v", how, leader, err)
			}

			// The first calls may meet the election; retry only ErrUnavailable.
			var next store.Lease
			retryUnavailable(t, func() error {
				var err error
				next, err = s.Acquire(ctxT(t), "payout:acct-11", "worker-b", 30*time.Second)
				return err
			})
			if next.Token <= other.Token {
				t.Fatalf("token after the leader stopped = %d; want > %d", next.Token, other.Token)
			}
			retryUnavailable(t, func() error {
				_, err := s.Acquire(ctxT(t), "payout:acct-9", "worker-b", 30*time.Second)
				if errors.Is(err, store.ErrLockHeld) {
					return nil
				}
				return fmt.Errorf("Acquire of a held key after the leader stopped: %w", err)
			})
			retryUnavailable(t, func() error {
				_, err := s.Renew(ctxT(t), "payout:acct-9", "worker-a", held.Token)
				return err
			})
			if err := s.Release(ctxT(t), "payout:acct-9", "worker-a", held.Token); err != nil {
				t.Fatalf("Release after the leader stopped: %v", err)
			}
			again, err := s.Acquire(ctxT(t), "payout:acct-9", "worker-b", 30*time.Second)
			if err != nil {
				t.Fatalf("Acquire after release: %v", err)
			}
			if again.Token <= next.Token {
				t.Fatalf("token = %d; want > %d", again.Token, next.Token)
			}
			if err := c.RestartMember(ctxT(t), leader); err != nil {
				t.Fatalf("RestartMember(%d): %v", leader, err)
			}
		})
	}
}

func retryUnavailable(t *testing.T, call func() error) {
	t.Helper()
	limit := time.Now().Add(20 * time.Second)
	for {
		err := call()
		if err == nil {
			return
		}
		if !errors.Is(err, store.ErrUnavailable) || time.Now().After(limit) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestUnreachableClusterIsUnavailable(t *testing.T) {
	c := startT(t, embedded.Config{})
	s, err := Open(ctxT(t), conf(func(cfg *Config) {
		cfg.Endpoints, cfg.Prefix, cfg.RequestTimeout = c.Endpoints(), newPrefix(t), 500*time.Millisecond
	}), nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	if err := c.StopMember(0); err != nil {
		t.Fatalf("StopMember: %v", err)
	}
	_, err = s.Acquire(ctxT(t), "k", "worker-a", time.Second)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with etcd down = %v; want ErrUnavailable", err)
	}
	if err := s.Ping(ctxT(t)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping with etcd down = %v; want ErrUnavailable", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Open(ctx, conf(func(cfg *Config) { cfg.Endpoints = c.Endpoints() }), nil); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open with etcd down = %v; want ErrUnavailable", err)
	} else if !strings.Contains(err.Error(), c.Endpoints()[0]) {
		t.Fatalf("Open with etcd down = %v; want the endpoint %s named", err, c.Endpoints()[0])
	}
}

func TestConfigValidate(t *testing.T) {
	ok := conf(func(cfg *Config) { cfg.Endpoints = []string{"http://127.0.0.1:2379"} })
	if err := ok.Validate(); err != nil {
		t.Fatalf("%+v: %v", ok, err)
	}
	for _, bad := range []Config{
		{},
		conf(func(cfg *Config) { cfg.Endpoints = []string{""} }),
		conf(func(cfg *Config) { cfg.Endpoints, cfg.Prefix = ok.Endpoints, "/no-slash" }),
		conf(func(cfg *Config) { cfg.Endpoints, cfg.RequestTimeout = ok.Endpoints, -time.Second }),
		conf(func(cfg *Config) { cfg.Endpoints, cfg.IdleLeases = ok.Endpoints, -1 }),
		{Endpoints: ok.Endpoints}, // the zero value is not the defaults
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v.Validate() = %v; want ErrInvalidConfig", bad, err)
		}
	}
	if _, err := New(nil, conf(nil), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(nil client) = %v; want ErrInvalidConfig", err)
	}
	// Every invalid field at once, not only the first.
	err := (Config{IdleLeases: -1}).Validate()
	for _, want := range []string{"prefix", "dial timeout", "request timeout", "reconnect max delay", "idle leases", "no endpoints"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(zero Config, IdleLeases -1) = %v; want it to name %s", err, want)
		}
	}
}

// TestNewDoesNotOwnTheClient: Close of a Store made by New leaves the
// caller's client usable.
func TestNewDoesNotOwnTheClient(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	s, err := New(cli, conf(func(cfg *Config) { cfg.Prefix = newPrefix(t) }), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := s.Acquire(ctxT(t), "k", "worker-a", time.Second); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := cli.Get(ctxT(t), "x"); err != nil {
		t.Fatalf("client after Store.Close: %v", err)
	}
}

// TestLinearizableAcrossLeaderKill runs the contract's linearizability
// check on a three-member cluster whose leader is killed (and later
// restarted) while the clients run: leases, those granted ahead included,
// must survive the election, and no acknowledged call may be lost.
func TestLinearizableAcrossLeaderKill(t *testing.T) {
	c := startT(t, embedded.Config{Members: 3})
	s := openT(t, c, newPrefix(t))
	defer s.Close()
	storetest.CheckLinearizable(t, "etcd-leader-kill", s, func() {
		leader, err := c.Leader()
		if err != nil {
			t.Errorf("Leader: %v", err)
			return
		}
		if err := c.KillMember(leader); err != nil {
			t.Errorf("KillMember(%d): %v", leader, err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.RestartMember(ctx, leader); err != nil {
			t.Errorf("RestartMember(%d): %v", leader, err)
		}
	})
}

func TestIsUnavailableClassifiesUnknownOutcomes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.DeadlineExceeded, true},
		{status.Error(codes.Unavailable, "etcdserver: leader changed"), true},
		// A member killed while it handled the request (seen in
		// TestLinearizableAcrossLeaderKill).
		{status.Error(codes.Unknown, "raft: stopped"), true},
		{status.Error(codes.Unknown, "something else"), false},
		{status.Error(codes.InvalidArgument, "etcdserver: key is not provided"), false},
		{rpctypes.ErrLeaseNotFound, false},
	} {
		if got := IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v; want %v", tc.err, got, tc.want)
		}
	}
}

// TestLinearizableWaiting: the linearizability workload through a
// lock-server whose acquires all wait (handoffs to parked waiters).
func TestLinearizableWaiting(t *testing.T) {
	b := backend(t)
	s := b.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	servertest.CheckLinearizableWaiting(t, "etcd", s, false)
}

// TestLinearizableWaitingCancelled: the same with some waiting acquires
// cancelled mid-wait.
func TestLinearizableWaitingCancelled(t *testing.T) {
	b := backend(t)
	s := b.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	servertest.CheckLinearizableWaiting(t, "etcd", s, true)
}
