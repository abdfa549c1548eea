package partition_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

// TestSDKDeadlineUnderLatencySpikes measures the SDK's promise (INV-06)
// on real TCP with latency spikes: holders take, renew (in the
// background) and release leases on two contended keys through a proxy
// that delays each chunk, either way, by a seeded random amount with
// spikes of several hundred milliseconds, longer than the drift allowance
// (2% of the TTL plus 50 ms). lock-server runs over lockdb, whose clock
// decides expiry; both run on this machine, so they share its clock, and
// the promise is then exact: a lease's local deadline is never later than
// the expiry lockdb gave its latest grant or renewal (ExpiresAt, from
// lockdb's own statement).
//
// netem is not available on every machine (this one lacks sch_netem), so
// the delay is the proxy's, in this process.
func TestSDKDeadlineUnderLatencySpikes(t *testing.T) {
	run := 4 * time.Second
	if *full {
		run = 30 * time.Second
	}
	ctx := t.Context()
	st, err := pgstore.Open(ctx, func() pgstore.Config {
		c := pgstore.DefaultConfig()
		c.DSN = pgtest.NewDatabase(t)
		return c
	}(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h, err := lockserver.NewServer(st, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	p := newDelayProxy(t, srv.Listener.Addr().String(), 20261205)

	const ttl = time.Second
	var (
		mu                sync.Mutex
		samples, renewals int
		worst             = -time.Hour // latest deadline minus expiry seen
		wg                sync.WaitGroup
	)
	end := time.Now().Add(run)
	for h := range 4 {
		wg.Go(func() {
			c, err := client.New("http://"+p.addr, client.WithRand(rand.New(rand.NewPCG(7, uint64(h)))))
			if err != nil {
				t.Error(err)
				return
			}
			rng := rand.New(rand.NewPCG(11, uint64(h)))
			key := []string{"latency-a", "latency-b"}[h%2]
			for time.Now().Before(end) {
				actx, cancel := context.WithDeadline(ctx, end)
				l, err := c.Acquire(actx, key, client.WithTTL(ttl), client.WithWait(time.Second), client.WithAutoRenew(0))
				cancel()
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, client.ErrUnavailable) {
						t.Errorf("holder %d: %v", h, err)
					}
					continue
				}
				hold := time.NewTimer(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
				tick := time.NewTicker(5 * time.Millisecond)
				last, reported := l.Grant().ExpiresAt, false
			holding:
				for {
					select {
					case <-hold.C:
						break holding
					case <-l.Done():
						break holding
					case <-tick.C:
					}
					d1 := l.Deadline()
					g := l.Grant()
					if d2 := l.Deadline(); !d1.Equal(d2) {
						continue // renewed between the reads
					}
					mu.Lock()
					samples++
					if !g.ExpiresAt.Equal(last) {
						renewals++
						last = g.ExpiresAt
					}
					if over := d1.Sub(g.ExpiresAt); over > worst {
						worst = over
					}
					if d1.After(g.ExpiresAt) && !reported {
						reported = true
						t.Errorf("holder %d, %s token %d: local deadline %v is %v after lockdb's expiry %v",
							h, key, l.Token(), d1.Format(time.RFC3339Nano), d1.Sub(g.ExpiresAt), g.ExpiresAt.Format(time.RFC3339Nano))
					}
					mu.Unlock()
				}
				hold.Stop()
				tick.Stop()
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = l.Release(rctx)
				cancel()
			}
		})
	}
	wg.Wait()
	if samples < 100 || renewals < 5 || p.spikes() < 5 {
		t.Fatalf("%d samples, %d renewals, %d spikes: the run did not exercise the promise", samples, renewals, p.spikes())
	}
	t.Logf("%d samples over %d renewals, %d latency spikes: the local deadline was at worst %v before lockdb's expiry",
		samples, renewals, p.spikes(), -worst)
}

// delayProxy forwards TCP connections to a target, holding each chunk,
// either way, for a seeded random delay: 1 ms mostly, a spike of 100 to
// 600 ms one time in four. Order within a connection is kept.
type delayProxy struct {
	addr string

	mu  sync.Mutex
	rng *rand.Rand
	n   int // spikes so far
	wg  sync.WaitGroup
}

func newDelayProxy(t *testing.T, target string, seed uint64) *delayProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{addr: ln.Addr().String(), rng: rand.New(rand.NewPCG(seed, seed))}
	var conns []net.Conn
	var cmu sync.Mutex
	// Ends when the listener is closed (cleanup below).
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			cmu.Lock()
			conns = append(conns, in, out)
			cmu.Unlock()
			p.wg.Go(func() { p.pipe(out, in) })
			p.wg.Go(func() { p.pipe(in, out) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *delayProxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rng.IntN(4) == 0 {
		p.n++
		return time.Duration(100+p.rng.IntN(500)) * time.Millisecond
	}
	return time.Millisecond
}

func (p *delayProxy) spikes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// pipe copies src to dst, each chunk delivered no earlier than its delay
// after it was read and after the chunk before it; it ends when either side
// closes.
func (p *delayProxy) pipe(dst, src net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 64)
	var wg sync.WaitGroup
	// Ends when the reader below closes q.
	wg.Go(func() {
		defer dst.Close()
		for c := range q {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d) // the link's latency, not a wait for a condition
			}
			if _, err := dst.Write(c.b); err != nil {
				for range q {
				}
				return
			}
		}
	})
	var last time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			at := time.Now().Add(p.delay())
			if at.Before(last) {
				at = last
			}
			last = at
			q <- chunk{append([]byte(nil), buf[:n]...), at}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			break
		}
	}
	close(q)
	wg.Wait()
}
