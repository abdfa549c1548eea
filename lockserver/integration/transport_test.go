package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// barrier holds each request until n requests are in the handler at once,
// so that n connections are busy together; it gives up waiting after a
// second (a worker that failed), letting the test report the failure.
type barrier struct {
	h   http.Handler
	n   int
	mu  sync.Mutex
	gen int
	in  int
	c   *sync.Cond
}

func newBarrier(h http.Handler, n int) *barrier {
	b := &barrier{h: h, n: n}
	b.c = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	gen := b.gen
	b.in++
	if b.in == b.n {
		b.gen, b.in = b.gen+1, 0
		b.c.Broadcast()
	} else {
		stop := time.AfterFunc(time.Second, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.gen == gen {
				b.gen, b.in = b.gen+1, 0
				b.c.Broadcast()
			}
		})
		for b.gen == gen {
			b.c.Wait()
		}
		stop.Stop()
	}
	b.mu.Unlock()
	b.h.ServeHTTP(w, r)
}

// TestConcurrentLeasesReuseConnections: clients of one process with leases
// in flight at once keep their connections to lock-server. Eight workers
// make every request at the same moment and wait for all the answers
// before the next; over http.DefaultTransport (2 idle connections per host)
// six of the eight connections would be closed after each phase and
// dialled again.
func TestConcurrentLeasesReuseConnections(t *testing.T) {
	h, err := lockserver.NewServer(memstore.New(nil), lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 8, 20
	srv := httptest.NewUnstartedServer(newBarrier(h, workers))
	var dialled atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	clients := make([]*client.Client, workers)
	for w := range clients {
		if clients[w], err = client.New(srv.URL, client.WithOwner(fmt.Sprintf("worker-%d", w))); err != nil {
			t.Fatal(err)
		}
	}
	leases := make([]*client.Lease, workers)
	// Each phase: every worker's request in flight at once (the barrier),
	// then every connection idle at once before the next phase.
	phase := func(do func(w int) error) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				if err := do(w); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	for range rounds {
		phase(func(w int) (err error) {
			leases[w], err = clients[w].TryAcquire(context.Background(), fmt.Sprintf("k-%d", w), client.WithTTL(10*time.Second))
			return err
		})
		phase(func(w int) error { return leases[w].Release(context.Background()) })
		if t.Failed() {
			return
		}
	}
	// Each worker needs one connection at a time.
	t.Logf("%d connections dialled", dialled.Load())
	if n := dialled.Load(); n > 2*workers {
		t.Fatalf("%d connections dialled for %d requests by %d concurrent workers; want at most %d", n, 2*workers*rounds, workers, 2*workers)
	}
}
