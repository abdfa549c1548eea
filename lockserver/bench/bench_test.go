// Package bench measures what lock-server and the SDK cost on top of the raw
// backend primitives, side by side in one process on one machine, so the
// ratios are meaningful even where absolute figures are noisy. `make bench`
// builds the test binary, runs it in six whole rounds (each a pass over
// every benchmark at GOMAXPROCS 1 and 2), and compares the paths with
//
//	go tool benchstat -filter '.name:AcquireRelease' -col '/path@(raw raw-lease-per-lock sdk sdk-nobatch store-batched redsync)' bin/bench.txt
//
// (the explicit column order makes raw the base; the memory rows, which
// have no raw, would otherwise make sdk the base).
//
// Each iteration is one acquire and one release of a key of the client's
// own (no contention: this measures overhead, not waiting). With 8 and 64
// clients, ns/op is wall time divided by all pairs completed, the inverse
// of throughput. Benchmarks are named backend=B/path=P/clients=N, so that
// benchstat puts the paths of one backend side by side, the first (raw)
// as the base of the comparison:
//
//	backend=memory/path=sdk          client + lock-server over an in-memory store: the HTTP cost alone
//	backend=memory/path=sdk-nobatch  the same with group grant off
//	backend=etcd/path=raw            etcd's own concurrency.Mutex Lock/Unlock, one session per client
//	backend=etcd/path=raw-lease-per-lock  the same with a session (a lease) granted and revoked per lock
//	backend=etcd/path=sdk            client.TryAcquire + Lease.Release via lock-server (HTTP, loopback) on etcdstore, group grant on
//	backend=etcd/path=sdk-nobatch    the same with group grant off (LOCK_BATCH_ENABLED=false)
//	backend=postgres/path=raw        pgstore called directly: one SQL statement per acquire and per release
//	backend=postgres/path=sdk        client.TryAcquire + Lease.Release via lock-server on pgstore, group grant on
//	backend=postgres/path=sdk-nobatch  the same with group grant off
//	backend=B/path=store-batched     lockserver.Batcher over the store, called directly (no HTTP): group grant alone
//	backend=redis/path=redsync       go-redsync on a local Redis (redis_test.go): no fencing token, no durability;
//	                                 skipped with one line without redis-server
//
// The etcd rows also report the embedded member's disk flushes per pair
// (etcd-fsyncs/op, etcd-commits/op: see etcdDisk in contended_test.go).
package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	etcdOnce    sync.Once
	etcdCluster *embedded.Cluster
	etcdErr     error
)

// sharedEtcd starts one embedded etcd member for the whole benchmark run;
// pgtest.Main closes it (and removes its data) when the run ends.
func sharedEtcd(b *testing.B) []string {
	etcdOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		etcdCluster, etcdErr = embedded.Start(ctx, embedded.Config{})
		if etcdErr == nil {
			pgtest.AtExit(etcdCluster.Close)
		}
	})
	if etcdErr != nil {
		b.Fatalf("start etcd: %v", etcdErr)
	}
	return etcdCluster.Endpoints()
}

// pairs runs `clients` goroutines, each doing acquire+release pairs on its
// own key until b.N pairs are done in total.
func pairs(b *testing.B, clients int, setup func(c int) (pair func(key string) error, done func())) {
	var next atomic.Int64
	var wg sync.WaitGroup
	fns := make([]func(string) error, clients)
	dones := make([]func(), clients)
	for c := range clients {
		fns[c], dones[c] = setup(c)
	}
	// The etcd rows also report the member's disk flushes per pair,
	// background writes included (the pool's lease grants, the
	// revocations of ended grants' leases).
	disk := meterEtcdDisk(b)
	b.ResetTimer()
	for c := range clients {
		wg.Go(func() {
			key := fmt.Sprintf("bench-%d", c)
			for next.Add(1) <= int64(b.N) {
				if err := fns[c](key); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	disk.report()
	for _, d := range dones {
		d()
	}
}

// sdkPair returns a pair function going through a lock-server over store,
// with group grant on (ServerConfig's default, and lock-server's on
// PostgreSQL; its binary turns it off on etcd) or off. With batching, stop
// reports the mean number of requests per acquire and per release store
// call (acquires/call, releases/call).
func sdkPair(b *testing.B, store store.LockStore, batching bool) (func(c int) (func(string) error, func()), func()) {
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching = batching
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	stop := func() {
		srv.Close()
		if acq, rel, _ := h.BatchStats(); batching && acq.Calls > 0 && rel.Calls > 0 {
			b.ReportMetric(float64(acq.Requests)/float64(acq.Calls), "acquires/call")
			b.ReportMetric(float64(rel.Requests)/float64(rel.Calls), "releases/call")
		}
	}
	return func(c int) (func(string) error, func()) {
		cl, err := client.New(srv.URL, client.WithOwner(fmt.Sprintf("bench-%d", c)))
		if err != nil {
			b.Fatal(err)
		}
		return func(key string) error {
			l, err := cl.TryAcquire(context.Background(), key, client.WithTTL(30*time.Second))
			if err != nil {
				return err
			}
			return l.Release(context.Background())
		}, func() {}
	}, stop
}

var clientCounts = []int{1, 8, 64}

// sdkPaths are the lock-server paths of every backend: group grant on
// (the default) and off.
var sdkPaths = []struct {
	name     string
	batching bool
}{{"sdk", true}, {"sdk-nobatch", false}}

func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("backend=memory", func(b *testing.B) {
		// The floor: lock-server and the SDK over an in-memory store, so the
		// figure is the HTTP round trips and JSON alone.
		for _, n := range clientCounts {
			for _, p := range sdkPaths {
				b.Run(fmt.Sprintf("path=%s/clients=%d", p.name, n), func(b *testing.B) {
					setup, stop := sdkPair(b, memstore.New(nil), p.batching)
					defer stop()
					pairs(b, n, setup)
				})
			}
		}
	})
	b.Run("backend=etcd", func(b *testing.B) {
		eps := sharedEtcd(b)
		for _, n := range clientCounts {
			b.Run(fmt.Sprintf("path=raw/clients=%d", n), func(b *testing.B) {
				pairs(b, n, func(c int) (func(string) error, func()) {
					cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
					if err != nil {
						b.Fatal(err)
					}
					sess, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
					if err != nil {
						b.Fatal(err)
					}
					return func(key string) error {
							m := concurrency.NewMutex(sess, "/bench-raw/"+key)
							if err := m.Lock(context.Background()); err != nil {
								return err
							}
							return m.Unlock(context.Background())
						}, func() {
							_ = sess.Close()
							_ = cli.Close()
						}
				})
			})
			// The same primitive with a lease per lock, granted and revoked
			// with it, so each lock has a TTL of its own as lock-server's
			// grants do: what a client of etcd pays for per-lock TTLs
			// without lock-server's pool of leases granted ahead.
			b.Run(fmt.Sprintf("path=raw-lease-per-lock/clients=%d", n), func(b *testing.B) {
				pairs(b, n, func(c int) (func(string) error, func()) {
					cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
					if err != nil {
						b.Fatal(err)
					}
					return func(key string) error {
						sess, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
						if err != nil {
							return err
						}
						m := concurrency.NewMutex(sess, "/bench-raw-own/"+key)
						if err := m.Lock(context.Background()); err != nil {
							return err
						}
						if err := m.Unlock(context.Background()); err != nil {
							return err
						}
						return sess.Close() // revokes the session's lease
					}, func() { _ = cli.Close() }
				})
			})
			for _, p := range sdkPaths {
				b.Run(fmt.Sprintf("path=%s/clients=%d", p.name, n), func(b *testing.B) {
					store, err := etcdstore.Open(context.Background(), etcdConfig(eps, fmt.Sprintf("/bench-%s-%d/", p.name, n)), slog.New(slog.DiscardHandler))
					if err != nil {
						b.Fatal(err)
					}
					defer store.Close()
					setup, stop := sdkPair(b, store, p.batching)
					defer stop()
					pairs(b, n, setup)
				})
			}
			b.Run(fmt.Sprintf("path=store-batched/clients=%d", n), func(b *testing.B) {
				store, err := etcdstore.Open(context.Background(), etcdConfig(eps, fmt.Sprintf("/bench-store-batched-%d/", n)), slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				defer store.Close()
				pairs(b, n, storePair(b, store))
			})
		}
	})
	b.Run("backend=postgres", func(b *testing.B) {
		dsn := pgtest.NewDatabase(b)
		store, err := pgstore.Open(context.Background(), pgConfig(dsn), slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		for _, n := range clientCounts {
			b.Run(fmt.Sprintf("path=raw/clients=%d", n), func(b *testing.B) {
				pairs(b, n, func(c int) (func(string) error, func()) {
					owner := fmt.Sprintf("raw-%d", c)
					return func(key string) error {
						l, err := store.Acquire(context.Background(), "raw-"+key, owner, 30*time.Second)
						if err != nil {
							return err
						}
						return store.Release(context.Background(), l.Key, owner, l.Token)
					}, func() {}
				})
			})
			for _, p := range sdkPaths {
				b.Run(fmt.Sprintf("path=%s/clients=%d", p.name, n), func(b *testing.B) {
					setup, stop := sdkPair(b, store, p.batching)
					defer stop()
					pairs(b, n, setup)
				})
			}
			b.Run(fmt.Sprintf("path=store-batched/clients=%d", n), func(b *testing.B) {
				pairs(b, n, storePair(b, store))
			})
		}
	})
	redisAcquireRelease(b)
}

// storePair returns a pair function calling a lockserver.Batcher over
// store directly, without HTTP: what group grant does for the store alone.
func storePair(b *testing.B, store store.LockStore) func(c int) (func(string) error, func()) {
	bs, err := lockserver.NewBatcher(store, lockserver.DefaultBatchConfig())
	if err != nil {
		b.Fatal(err)
	}
	return func(c int) (func(string) error, func()) {
		owner := fmt.Sprintf("batched-%d", c)
		return func(key string) error {
			l, err := bs.Acquire(context.Background(), "batched-"+key, owner, 30*time.Second)
			if err != nil {
				return err
			}
			return bs.Release(context.Background(), l.Key, owner, l.Token)
		}, func() {}
	}
}

// etcdConfig is etcdstore's defaults on endpoints eps under prefix.
func etcdConfig(eps []string, prefix string) etcdstore.Config {
	c := etcdstore.DefaultConfig()
	c.Endpoints, c.Prefix = eps, prefix
	return c
}

// pgConfig is pgstore's defaults (lock-server's pool size) on dsn.
func pgConfig(dsn string) pgstore.Config {
	c := pgstore.DefaultConfig()
	c.DSN = dsn
	return c
}
