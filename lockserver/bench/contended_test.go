package bench

// The contended rows: every client takes the same
// key, so each iteration is one handoff, from one holder to the next.
// BenchmarkContended/backend=B/path=P/clients=N, with the paths
//
//	etcd-mutex      etcd's concurrency.Mutex (waiters queued by revision, woken by a watch), one session per client
//	wait            client.Acquire with client.WithWait (lock-server's FIFO wait queue, a long-poll per
//	                request), lock-server's defaults: a release hands the key to the parked head waiter in
//	                the same store call (ServerConfig.Handoff)
//	wait-nohandoff  the same with ServerConfig.Handoff off: the release, then the head's own acquire
//	barging         client.Acquire without a wait (LOCK_HELD, then jittered backoff: 20 ms base, 1 s cap)
//	redsync     go-redsync on Redis (backend=redis; redis_test.go): no token, no durability
//
// on the backends memory, etcd and postgres (no etcd-mutex row there),
// and the metrics, besides ns/op (wall time over handoffs: the inverse of
// handoffs/s):
//
//	handoffs/s      handoffs per second
//	handoff-us      mean time from a holder's release call to the next grant's return to its caller, µs
//	handoff-p99-us  its 99th percentile, µs
//	max-wait-ms     the longest time one client spent in one acquire call, ms
//	etcd-commits/op on etcd only: the embedded member's backend (bbolt) commits per handoff
//	etcd-fsyncs/op  on etcd only: its raft log (WAL) fsyncs per handoff
//
// The hold is empty (acquire, then release at once), so a handoff is all
// waiting and the figures are the queue's, not the critical section's.
// Run alone (about two minutes):
//
//	go test -run '^$' -bench Contended -benchtime 2s ./lockserver/bench/

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

// contendedClients are the client counts of the contended rows.
var contendedClients = []int{8, 64}

// locker takes the benchmark's one key and returns its release.
type locker func(ctx context.Context) (release func() error, err error)

// handoffs runs `clients` goroutines taking one key in turn until b.N
// grants are done, and reports the handoff metrics; an etcd row adds the
// embedded etcd member's disk flushes per handoff (meterEtcdDisk).
func handoffs(b *testing.B, clients int, setup func(c int) (locker, func())) {
	lockers := make([]locker, clients)
	dones := make([]func(), clients)
	for c := range clients {
		lockers[c], dones[c] = setup(c)
	}
	defer func() {
		for _, d := range dones {
			d()
		}
	}()
	var (
		next        atomic.Int64
		lastRelease atomic.Int64 // unix ns of the latest release call's start
		mu          sync.Mutex
		latencies   []time.Duration
		longest     time.Duration
		wg          sync.WaitGroup
	)
	disk := meterEtcdDisk(b)
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			var mine []time.Duration
			var worst time.Duration
			defer func() {
				mu.Lock()
				latencies = append(latencies, mine...)
				longest = max(longest, worst)
				mu.Unlock()
			}()
			for next.Add(1) <= int64(b.N) {
				asked := time.Now()
				release, err := lockers[c](context.Background())
				if err != nil {
					b.Error(err)
					return
				}
				got := time.Now()
				worst = max(worst, got.Sub(asked))
				if lr := lastRelease.Load(); lr != 0 {
					mine = append(mine, got.Sub(time.Unix(0, lr)))
				}
				lastRelease.Store(time.Now().UnixNano())
				if err := release(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	disk.report()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "handoffs/s")
	b.ReportMetric(float64(longest.Milliseconds()), "max-wait-ms")
	if len(latencies) > 0 {
		slices.Sort(latencies)
		var sum time.Duration
		for _, l := range latencies {
			sum += l
		}
		b.ReportMetric(float64(sum.Microseconds())/float64(len(latencies)), "handoff-us")
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "handoff-p99-us")
	}
}

// etcdDisk counts the disk flushes of the embedded etcd member
// (sharedEtcd) so far, from the metrics it registers with Prometheus'
// default registry: the raft log's fsyncs, and the backend's (bbolt)
// commits, two flushes each. etcd commits its backend at once when a
// request it applies has deleted a record, as a lease's revocation does
// (a key's deletion is a tombstone, written like a put), and otherwise in
// batches (docs/benchmarks.md, "Where the handoff's tail comes from on
// etcd"). The member is shared by every etcd row of the process, so a row
// also counts what earlier rows left behind (an idle lease of a closed
// store expiring during it): a few hundredths per handoff.
type etcdDisk struct{ walFsyncs, commits uint64 }

// readEtcdDisk reads etcdDisk now; it fails the benchmark if the member's
// metrics are missing.
func readEtcdDisk(b *testing.B) etcdDisk {
	mfs, err := prometheus.DefaultGatherer.Gather()
	var d etcdDisk
	found := 0
	for _, mf := range mfs {
		var n uint64
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
		switch mf.GetName() {
		case "etcd_disk_wal_fsync_duration_seconds":
			d.walFsyncs, found = n, found+1
		case "etcd_disk_backend_commit_duration_seconds":
			d.commits, found = n, found+1
		}
	}
	if found != 2 {
		b.Fatalf("the embedded etcd's disk metrics are missing from the default registry (gather: %v)", err)
	}
	return d
}

// etcdDiskMeter reports an etcd row's disk flushes per operation, from
// its start (meterEtcdDisk) to report: etcd-commits/op and
// etcd-fsyncs/op. It does nothing on a row of another backend.
type etcdDiskMeter struct {
	b     *testing.B
	start etcdDisk
	on    bool
}

// meterEtcdDisk starts an etcdDiskMeter for b: on when b's name has
// backend=etcd.
func meterEtcdDisk(b *testing.B) etcdDiskMeter {
	if !strings.Contains(b.Name(), "backend=etcd") {
		return etcdDiskMeter{}
	}
	return etcdDiskMeter{b: b, start: readEtcdDisk(b), on: true}
}

func (m etcdDiskMeter) report() {
	if !m.on {
		return
	}
	d := readEtcdDisk(m.b)
	m.b.ReportMetric(float64(d.commits-m.start.commits)/float64(m.b.N), "etcd-commits/op")
	m.b.ReportMetric(float64(d.walFsyncs-m.start.walFsyncs)/float64(m.b.N), "etcd-fsyncs/op")
}

// sdkLocker returns lockers going through one lock-server over store
// (group grant off, as lock-server runs on etcd by default, so that the
// backends compare alike): with a wait (the wait queue, with or without
// handoff) or without (barging).
func sdkLocker(b *testing.B, store store.LockStore, key string, wait, handoff bool) (func(c int) (locker, func()), func()) {
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching, cfg.Handoff = false, handoff
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	opts := []client.AcquireOption{client.WithTTL(30 * time.Second)}
	if wait {
		opts = append(opts, client.WithWait(30*time.Second))
	}
	return func(c int) (locker, func()) {
		cl, err := client.New(srv.URL, client.WithOwner(fmt.Sprintf("contender-%d", c)))
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context) (func() error, error) {
			l, err := cl.Acquire(ctx, key, opts...)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}, func() {}
	}, srv.Close
}

// sdkContendedPaths are the lock-server paths of the contended rows.
var sdkContendedPaths = []struct {
	name          string
	wait, handoff bool
}{{"wait", true, true}, {"wait-nohandoff", true, false}, {"barging", false, true}}

func BenchmarkContended(b *testing.B) {
	b.Run("backend=memory", func(b *testing.B) {
		for _, n := range contendedClients {
			for _, p := range sdkContendedPaths {
				b.Run(fmt.Sprintf("path=%s/clients=%d", p.name, n), func(b *testing.B) {
					setup, stop := sdkLocker(b, memstore.New(nil), "contended", p.wait, p.handoff)
					defer stop()
					handoffs(b, n, setup)
				})
			}
		}
	})
	b.Run("backend=etcd", func(b *testing.B) {
		eps := sharedEtcd(b)
		for _, n := range contendedClients {
			b.Run(fmt.Sprintf("path=etcd-mutex/clients=%d", n), func(b *testing.B) {
				handoffs(b, n, func(c int) (locker, func()) {
					cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
					if err != nil {
						b.Fatal(err)
					}
					sess, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
					if err != nil {
						b.Fatal(err)
					}
					return func(ctx context.Context) (func() error, error) {
							m := concurrency.NewMutex(sess, "/bench-contended-mutex/")
							if err := m.Lock(ctx); err != nil {
								return nil, err
							}
							return func() error { return m.Unlock(ctx) }, nil
						}, func() {
							_ = sess.Close()
							_ = cli.Close()
						}
				})
			})
			for _, p := range sdkContendedPaths {
				b.Run(fmt.Sprintf("path=%s/clients=%d", p.name, n), func(b *testing.B) {
					store, err := etcdstore.Open(context.Background(), etcdConfig(eps, fmt.Sprintf("/bench-contended-%s-%d/", p.name, n)), slog.New(slog.DiscardHandler))
					if err != nil {
						b.Fatal(err)
					}
					defer store.Close()
					setup, stop := sdkLocker(b, store, "contended", p.wait, p.handoff)
					defer stop()
					handoffs(b, n, setup)
				})
			}
		}
	})
	b.Run("backend=postgres", func(b *testing.B) {
		dsn := pgtest.NewDatabase(b)
		store, err := pgstore.Open(context.Background(), pgConfig(dsn), slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		for _, n := range contendedClients {
			for _, p := range sdkContendedPaths {
				b.Run(fmt.Sprintf("path=%s/clients=%d", p.name, n), func(b *testing.B) {
					setup, stop := sdkLocker(b, store, fmt.Sprintf("contended-%s-%d", p.name, n), p.wait, p.handoff)
					defer stop()
					handoffs(b, n, setup)
				})
			}
		}
	})
	redisContended(b)
}
