package integration_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// wire is an in-memory transport to a lock-server handler that can delay
// each request on its way in and each answer on its way out, or fail. Under
// synctest the delays run on the bubble's fake clock.
type wire struct {
	h http.Handler

	mu        sync.Mutex
	inDelay   time.Duration
	outDelay  time.Duration
	down      bool
	delivered int
}

func (w *wire) set(in, out time.Duration, down bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inDelay, w.outDelay, w.down = in, out, down
}

func (w *wire) Do(r *http.Request) (*http.Response, error) {
	w.mu.Lock()
	in, out, down := w.inDelay, w.outDelay, w.down
	w.mu.Unlock()
	if down {
		return nil, errors.New("wire: connection refused")
	}
	time.Sleep(in)
	rec := httptest.NewRecorder()
	w.h.ServeHTTP(rec, r)
	w.mu.Lock()
	w.delivered++
	w.mu.Unlock()
	time.Sleep(out)
	return rec.Result(), nil
}

// newStack returns a memstore behind a lock-server handler behind a wire,
// and a Client over that wire. Call it inside a synctest bubble: the store
// reads the bubble's clock through time.Now.
func newStack(t *testing.T, opts ...client.Option) (*memstore.Store, *wire, *client.Client) {
	t.Helper()
	store := memstore.New(nil)
	h, err := lockserver.NewServer(store, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{h: h}
	opts = append([]client.Option{client.WithHTTPClient(w), client.WithOwner("worker-a"), client.WithRand(rand.New(rand.NewPCG(1, 2)))}, opts...)
	c, err := client.New("http://lock-server.test", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return store, w, c
}

// serverExpiry reads the live lease's expiry from the store: the instant the
// server's clock would expire it.
func serverExpiry(t *testing.T, s *memstore.Store, key string) time.Time {
	t.Helper()
	st, err := s.Inspect(context.Background(), key)
	if err != nil || st.Lease == nil {
		t.Fatalf("Inspect(%q) = %+v, %v; want a live lease", key, st, err)
	}
	return st.Lease.ExpiresAt
}

func TestDeadlineIsNeverLaterThanServerExpiry(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in, out time.Duration
	}{
		{"no delay", 0, 0},
		{"slow request", 700 * time.Millisecond, 0},
		{"slow answer", 0, 1500 * time.Millisecond},
		{"both slow", 400 * time.Millisecond, 900 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, w, c := newStack(t)
				w.set(tc.in, tc.out, false)
				sent := time.Now()
				l, err := c.TryAcquire(t.Context(), "payout:acct-7", client.WithTTL(2*time.Second))
				if err != nil {
					t.Fatalf("TryAcquire: %v", err)
				}
				expiry := serverExpiry(t, store, "payout:acct-7")
				want := sent.Add(2*time.Second - 2*time.Second*2/100 - client.DefaultSafetyMargin)
				if got := l.Deadline(); !got.Equal(want) {
					t.Errorf("Deadline = sent+%v; want sent+%v (measured from the send, not the answer)", got.Sub(sent), want.Sub(sent))
				}
				if !l.Deadline().Before(expiry) {
					t.Fatalf("Deadline %v is not before the server's expiry %v", l.Deadline(), expiry)
				}
				// Held until the deadline, lost from it on, with Done closed by then.
				time.Sleep(time.Until(l.Deadline()) - time.Nanosecond)
				if !l.Held() {
					t.Fatalf("not held 1ns before the deadline: %v", l.Err())
				}
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				select {
				case <-l.Done():
				default:
					t.Fatal("Done not closed at the deadline")
				}
				if !errors.Is(l.Err(), client.ErrLeaseLost) || !errors.Is(l.Err(), client.ErrDeadlinePassed) {
					t.Fatalf("Err = %v; want ErrLeaseLost wrapping ErrDeadlinePassed", l.Err())
				}
				if time.Now().After(expiry) {
					t.Fatalf("lease reported lost at %v, after the server's expiry %v", time.Now(), expiry)
				}
			})
		})
	}
}

func TestGrantArrivingAfterItsDeadlineIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, w, c := newStack(t)
		w.set(0, 3*time.Second, false)
		_, err := c.TryAcquire(t.Context(), "k", client.WithTTL(2*time.Second))
		if !errors.Is(err, client.ErrDeadlinePassed) || !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("TryAcquire with a 3s answer delay and a 2s TTL: %v; want ErrDeadlinePassed, ErrUnavailable", err)
		}
		// The late grant was given back: the key is free again.
		w.set(0, 0, false)
		st, _ := store.Inspect(context.Background(), "k")
		if st.Lease != nil {
			t.Fatalf("the useless grant was not released: %+v", *st.Lease)
		}
	})
}

func TestAutoRenewKeepsTheLeaseAndStopsAtTheDeadlineWhenTheServerIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, w, c := newStack(t)
		l, err := c.TryAcquire(t.Context(), "k", client.WithTTL(time.Second), client.WithAutoRenew(0))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		if !l.Held() {
			t.Fatalf("auto-renewed lease lost after 10 TTLs: %v", l.Err())
		}
		// The server becomes unreachable: renewals fail, and the handle must
		// report the loss no later than the server expires the lease.
		w.set(0, 0, true)
		expiry := serverExpiry(t, store, "k")
		<-l.Done()
		if time.Now().After(expiry) {
			t.Fatalf("lost at %v, after the server's expiry %v", time.Now(), expiry)
		}
		if !errors.Is(l.Err(), client.ErrDeadlinePassed) {
			t.Fatalf("Err = %v; want ErrDeadlinePassed", l.Err())
		}
		// The local deadline comes first, so the server still has the lease
		// when the network heals: releasing it now frees the key early.
		w.set(0, 0, false)
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("Release after the local deadline, before the server's expiry: %v", err)
		}
		if st, _ := store.Inspect(context.Background(), "k"); st.Lease != nil {
			t.Fatalf("key still held after Release: %+v", *st.Lease)
		}
	})
}

func TestRevokedLeaseIsLostAtTheNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, c := newStack(t)
		l, err := c.TryAcquire(t.Context(), "k", client.WithTTL(3*time.Second), client.WithAutoRenew(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Revoke(t.Context(), "k", 0, "test"); err != nil {
			t.Fatal(err)
		}
		revokedAt := time.Now()
		<-l.Done()
		if waited := time.Since(revokedAt); waited > time.Second {
			t.Fatalf("lost %v after the revoke; want within one renew interval", waited)
		}
		if !errors.Is(l.Err(), client.ErrNotHeld) {
			t.Fatalf("Err = %v; want the server's LEASE_NOT_HELD", l.Err())
		}
	})
}

func TestAcquireWaitsWithBackoffUntilReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, w, c := newStack(t)
		a, err := c.TryAcquire(t.Context(), "k", client.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(2 * time.Second)
			_ = a.Release(context.Background())
		}()
		start := time.Now()
		b, err := c.Acquire(t.Context(), "k", client.WithTTL(5*time.Second), client.WithLeaseOwner("worker-b"))
		if err != nil {
			t.Fatal(err)
		}
		if b.Token() <= a.Token() {
			t.Fatalf("token %d after %d", b.Token(), a.Token())
		}
		waited := time.Since(start)
		if waited < 2*time.Second || waited > 2*time.Second+client.DefaultBackoffMax {
			t.Fatalf("acquired after %v; want between 2s and 2s + the backoff cap", waited)
		}
		// Backoff, not a hot loop: a handful of attempts over two seconds.
		if w.delivered > 20 {
			t.Fatalf("%d requests in 2s of waiting; backoff is not backing off", w.delivered)
		}
	})
}

func TestAcquireGivesUpWhenTheContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, c := newStack(t)
		if _, err := c.TryAcquire(t.Context(), "k", client.WithTTL(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err := c.Acquire(ctx, "k", client.WithLeaseOwner("worker-b"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire on a held key with a 3s context: %v; want DeadlineExceeded", err)
		}
	})
}

func TestStaleReleaseNeverRemovesTheNewerLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, _, c := newStack(t)
		a, err := c.TryAcquire(t.Context(), "k", client.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // A stalls past its lease
		b, err := c.TryAcquire(t.Context(), "k", client.WithTTL(10*time.Second), client.WithLeaseOwner("worker-b"))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(t.Context()); !errors.Is(err, client.ErrStaleToken) {
			t.Fatalf("A's late Release: %v; want ErrStaleToken", err)
		}
		st, _ := store.Inspect(context.Background(), "k")
		if st.Lease == nil || st.Lease.Token != b.Token() {
			t.Fatalf("after A's late release the key shows %+v; want B's lease %d", st.Lease, b.Token())
		}
	})
}

// traceKey stands for a tracing library's context key.
type traceKey struct{}

// carrying is a Doer that records, per request path, the traceKey value
// of the request's context (what a tracing transport would read).
type carrying struct {
	next client.Doer
	mu   sync.Mutex
	seen map[string][]any
}

func (c *carrying) Do(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.seen[r.URL.Path] = append(c.seen[r.URL.Path], r.Context().Value(traceKey{}))
	c.mu.Unlock()
	return c.next.Do(r)
}

// Background renewals carry the Acquire context's values (its trace
// context, for a tracing transport), never its cancellation: the
// acquire's context has ended long before the renewals run.
func TestBackgroundRenewalsCarryTheAcquireContextValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, w, _ := newStack(t)
		d := &carrying{next: w, seen: map[string][]any{}}
		c, err := client.New("http://lock-server.test", client.WithHTTPClient(d), client.WithOwner("worker-a"), client.WithRand(rand.New(rand.NewPCG(1, 2))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.WithValue(t.Context(), traceKey{}, "trace-1"))
		l, err := c.TryAcquire(ctx, "k", client.WithTTL(3*time.Second), client.WithAutoRenew(time.Second))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if !l.Held() {
			t.Fatalf("lease lost: %v", l.Err())
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		renewals := d.seen[api.PathLockPrefix+"k"+api.SuffixRenew]
		if len(renewals) < 3 {
			t.Fatalf("%d background renewals in 5 s at 1 s; want at least 3 (seen %v)", len(renewals), d.seen)
		}
		for i, v := range renewals {
			if v != "trace-1" {
				t.Fatalf("renewal %d carried %v; want the acquire context's value trace-1", i, v)
			}
		}
	})
}
