package lockserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// gateStore is a memstore whose Acquire, while held, waits for the gate
// (or its context, then answering like a real store that timed out).
type gateStore struct {
	lockserver.LockStore
	held    atomic.Bool
	gate    chan struct{}
	entered chan time.Duration // each held Acquire sends the time its ctx had left
	calls   atomic.Int64
}

func newGateStore() *gateStore {
	return &gateStore{LockStore: memstore.New(nil), gate: make(chan struct{}), entered: make(chan time.Duration, 64)}
}

func (g *gateStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (lockserver.Lease, error) {
	g.calls.Add(1)
	if g.held.Load() {
		left := time.Duration(-1)
		if dl, ok := ctx.Deadline(); ok {
			left = time.Until(dl)
		}
		g.entered <- left
		select {
		case <-g.gate:
		case <-ctx.Done():
			return lockserver.Lease{}, fmt.Errorf("%w: %w", lockserver.ErrUnavailable, ctx.Err())
		}
	}
	return g.LockStore.Acquire(ctx, key, owner, ttl)
}

type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

func acquireReq(h http.Handler, key string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", api.PathLockPrefix+key+api.SuffixAcquire, strings.NewReader(`{"owner":"w","ttlMs":60000}`))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func wantRefused(t *testing.T, what string, rec *httptest.ResponseRecorder, code api.Code) {
	t.Helper()
	var env api.ErrorEnvelope
	if rec.Code != http.StatusServiceUnavailable || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != code || !env.Error.Retryable {
		t.Fatalf("%s: %d %s; want 503 %s, retryable", what, rec.Code, rec.Body, code)
	}
	if ra := rec.Header().Get("Retry-After"); ra != "1" {
		t.Fatalf("%s: Retry-After %q; want 1", what, ra)
	}
}

// Issue #15, finding 5: with the backend frozen every request waited the
// whole backend deadline. Now the first timeout marks the backend stalled,
// later requests get 503 with Retry-After without calling the backend, one
// probe per interval is let through, and the first answer clears the mark.
func TestAStalledBackendGetsFast503sAndRecovers(t *testing.T) {
	store := newGateStore()
	clock := &fakeNow{t: time.Unix(1_790_000_000, 0)}
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout, cfg.StallProbeInterval, cfg.Now = 100*time.Millisecond, time.Minute, clock.now
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	store.held.Store(true)
	wantRefused(t, "the request that meets the frozen backend", acquireReq(h, "k1"), api.CodeBackendUnavailable)
	<-store.entered
	for i := range 5 {
		wantRefused(t, fmt.Sprintf("request %d while stalled", i), acquireReq(h, "k1"), api.CodeBackendUnavailable)
	}
	if n := store.calls.Load(); n != 1 {
		t.Fatalf("the backend was called %d times while stalled; want only the first request", n)
	}
	// The backend returns; the next probe finds it and clears the mark.
	store.held.Store(false)
	wantRefused(t, "before the probe interval", acquireReq(h, "k1"), api.CodeBackendUnavailable)
	clock.add(time.Minute)
	if rec := acquireReq(h, "k1"); rec.Code != http.StatusOK {
		t.Fatalf("the probe: %d %s; want the grant", rec.Code, rec.Body)
	}
	if rec := acquireReq(h, "k2"); rec.Code != http.StatusOK {
		t.Fatalf("after recovery: %d %s", rec.Code, rec.Body)
	}
	if n := store.calls.Load(); n != 3 {
		t.Fatalf("backend calls %d; want 3 (the stall, the probe, one after)", n)
	}
}

// The in-flight bound: one request more than MaxInFlight is refused at once
// with OVERLOADED, liveness still answers, and the server serves again as
// soon as slots free.
func TestRequestsBeyondMaxInFlightAreRefusedAtOnce(t *testing.T) {
	store := newGateStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout, cfg.MaxInFlight = time.Minute, 2
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	store.held.Store(true)
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for i := range 2 {
		wg.Go(func() { codes <- acquireReq(h, fmt.Sprintf("busy-%d", i)).Code })
	}
	<-store.entered
	<-store.entered
	wantRefused(t, "the third request", acquireReq(h, "k3"), api.CodeOverloaded)
	if n := store.calls.Load(); n != 2 {
		t.Fatalf("backend calls %d; want 2: the refused request must not reach it", n)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", api.PathHealth, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("liveness while full: %d", rec.Code)
	}
	store.held.Store(false)
	close(store.gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("a held request ended %d", c)
		}
	}
	if rec := acquireReq(h, "k3"); rec.Code != http.StatusOK {
		t.Fatalf("after the slots freed: %d %s", rec.Code, rec.Body)
	}
}

// One budget: a caller that will wait 300 ms gives the backend at most
// 200 ms (DeadlineMargin kept for the answer), and a timeout inside the
// caller's shorter budget does not mark the backend stalled.
func TestTheCallersBudgetBoundsTheBackendDeadline(t *testing.T) {
	store := newGateStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout = time.Minute
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	store.held.Store(true)
	wantRefused(t, "a caller with 300 ms", acquireReq(h, "k", api.HeaderTimeoutMs, "300"), api.CodeBackendUnavailable)
	if left := <-store.entered; left <= 0 || left > 300*time.Millisecond-lockserver.DeadlineMargin {
		t.Fatalf("the backend had %v; want at most %v", left, 300*time.Millisecond-lockserver.DeadlineMargin)
	}
	store.held.Store(false)
	if rec := acquireReq(h, "k"); rec.Code != http.StatusOK {
		t.Fatalf("after a caller's own short budget ran out, the backend was treated as stalled: %d %s", rec.Code, rec.Body)
	}
	// A malformed budget is ignored: the backend gets the whole deadline.
	store.held.Store(true)
	var wg sync.WaitGroup
	bad := []string{"abc", "-5", "0", "99999999999999", "1e3"}
	for i, v := range bad {
		wg.Go(func() { acquireReq(h, fmt.Sprintf("bad-%d", i), api.HeaderTimeoutMs, v) })
	}
	for range bad {
		if left := <-store.entered; left < 50*time.Second {
			t.Errorf("a malformed budget shortened the backend deadline to %v", left)
		}
	}
	close(store.gate)
	wg.Wait()
}
