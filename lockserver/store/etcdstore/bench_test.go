package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// BenchmarkCycle compares one uncontended lock-and-unlock cycle of etcd's
// own mutex with the Store's, its sub-benchmarks named so that benchstat
// sets them side by side, the raw mutex as the base:
//
//	go test -run '^$' -bench Cycle -count 6 ./lockserver/store/etcdstore/ > cycle.txt
//	go tool benchstat -col '/impl@(raw-mutex store-pool-on store-pool-off)' cycle.txt
func BenchmarkCycle(b *testing.B) {
	benchRawMutex(b)
	benchStore(b)
}

// benchRawMutex measures etcd's own recipe, concurrency.NewSession +
// concurrency.NewMutex Lock/Unlock, on the shared embedded one-member
// cluster: the raw baseline that the store and the SDK are compared with.
// Each of the N clients has its own client connection, session (one lease
// kept alive in the background) and key, so there is no contention: the
// numbers are the cost of one uncontended lock/unlock cycle. ns/op is per
// cycle across all clients (b.N cycles in total).
func benchRawMutex(b *testing.B) {
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("impl=raw-mutex/clients=%d", clients), func(b *testing.B) {
			prefix := newPrefix(b)
			type worker struct {
				cli     *clientv3.Client
				session *concurrency.Session
				mutex   *concurrency.Mutex
			}
			ws := make([]worker, clients)
			for i := range ws {
				cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
				if err != nil {
					b.Fatalf("client: %v", err)
				}
				b.Cleanup(func() { _ = cli.Close() })
				sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
				if err != nil {
					b.Fatalf("session: %v", err)
				}
				b.Cleanup(func() { _ = sess.Close() })
				ws[i] = worker{cli, sess, concurrency.NewMutex(sess, fmt.Sprintf("%skey-%d", prefix, i))}
			}

			runCycles(b, clients, func(ctx context.Context, i int) error {
				if err := ws[i].mutex.Lock(ctx); err != nil {
					return err
				}
				return ws[i].mutex.Unlock(ctx)
			})
		})
	}
}

// benchStore is the same uncontended cycle through this
// Store (acquire: a lease and the create-if-absent transaction; release:
// the conditional delete, and the lease's revocation in the background),
// for comparison with benchRawMutex,
// with the pool of idle leases on (the default: a lease granted ahead of
// time, reset by a keep-alive sent with the transaction) and off (a lease
// granted by each acquire, inline). Either way every grant has a lease of
// its own. pooled/op is the share of grants made on an idle lease.
func benchStore(b *testing.B) {
	for _, pool := range []struct {
		name string
		idle int
	}{{"on", DefaultIdleLeases}, {"off", 0}} {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("impl=store-pool-%s/clients=%d", pool.name, clients), func(b *testing.B) {
				s, err := Open(b.Context(), conf(func(cfg *Config) {
					cfg.Endpoints, cfg.Prefix, cfg.IdleLeases = shared.Endpoints(), newPrefix(b), pool.idle
				}), nil)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				runCycles(b, clients, func(ctx context.Context, i int) error {
					key := fmt.Sprintf("key-%d", i)
					l, err := s.Acquire(ctx, key, "bench", 10*time.Second)
					if err != nil {
						return err
					}
					return s.Release(ctx, key, "bench", l.Token)
				})
				// The share of grants made on a lease granted ahead.
				b.ReportMetric(float64(s.LeaseStats().FromPool)/float64(b.N), "pooled/op")
			})
		}
	}
}

// runCycles runs b.N calls of cycle spread over clients goroutines (client
// i always passes i) and fails the benchmark at the first error.
func runCycles(b *testing.B, clients int, cycle func(ctx context.Context, i int) error) {
	ctx := b.Context()
	var (
		next     = make(chan struct{})
		failed   = make(chan struct{})
		failOnce sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	b.ResetTimer()
	for i := 0; i < clients; i++ {
		wg.Add(1)
		// Exits when next is closed, or at its first error.
		go func() {
			defer wg.Done()
			for range next {
				if err := cycle(ctx, i); err != nil {
					failOnce.Do(func() { firstErr = err; close(failed) })
					return
				}
			}
		}()
	}
feed:
	for n := 0; n < b.N; n++ {
		select {
		case next <- struct{}{}:
		case <-failed:
			break feed
		}
	}
	close(next)
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatalf("client cycle: %v", firstErr)
	}
}

// BenchmarkRelease measures Release alone, on the shared one-member
// cluster: each iteration's grant is made with the timer stopped.
//
//	go test -run '^$' -bench Release -count 6 ./lockserver/store/etcdstore/
func BenchmarkRelease(b *testing.B) {
	s, err := Open(b.Context(), conf(func(cfg *Config) { cfg.Endpoints, cfg.Prefix = shared.Endpoints(), newPrefix(b) }), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		l, err := s.Acquire(b.Context(), "key", "bench", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := s.Release(b.Context(), "key", "bench", l.Token); err != nil {
			b.Fatal(err)
		}
	}
}
