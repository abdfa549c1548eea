package integration_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// overloadedFirst answers the first n requests 503 OVERLOADED with
// Retry-After, then passes requests to h; it records when each arrived and
// the budget header each carried.
type overloadedFirst struct {
	h     http.Handler
	n     int
	after int // Retry-After, seconds

	mu      sync.Mutex
	arrived []time.Time
	budgets []string
}

func (o *overloadedFirst) Do(req *http.Request) (*http.Response, error) {
	o.mu.Lock()
	o.arrived = append(o.arrived, time.Now())
	o.budgets = append(o.budgets, req.Header.Get(api.HeaderTimeoutMs))
	refuse := len(o.arrived) <= o.n
	o.mu.Unlock()
	rec := httptest.NewRecorder()
	if refuse {
		rec.Header().Set("Retry-After", strconv.Itoa(o.after))
		rec.Header().Set("Content-Type", "application/json")
		rec.WriteHeader(http.StatusServiceUnavailable)
		_, _ = rec.WriteString(`{"error":{"code":"OVERLOADED","message":"busy","retryable":true}}`)
	} else {
		o.h.ServeHTTP(rec, req)
	}
	return rec.Result(), nil
}

// Acquire honours the server's Retry-After (plus jitter, never less) before
// asking again, and tells the server its remaining time on every call.
func TestAcquireWaitsRetryAfterAndSendsItsBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, err := lockserver.NewServer(memstore.New(nil), lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		o := &overloadedFirst{h: srv, n: 2, after: 3}
		c, err := client.New("http://lock.invalid", client.WithHTTPClient(o), client.WithBackoff(10*time.Millisecond, 20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		l, err := c.Acquire(ctx, "k", client.WithTTL(time.Minute), client.WithAutoRenew(0))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(context.Background()) }()
		if len(o.arrived) != 3 {
			t.Fatalf("%d requests; want 2 refused and the grant", len(o.arrived))
		}
		for i := 1; i < 3; i++ {
			if gap := o.arrived[i].Sub(o.arrived[i-1]); gap < 3*time.Second || gap > 4500*time.Millisecond {
				t.Errorf("gap %d was %v; want Retry-After 3s plus at most half of it", i, gap)
			}
		}
		for i, b := range o.budgets {
			ms, err := strconv.Atoi(b)
			if err != nil || ms <= 0 || ms > int(client.DefaultRequestTimeout/time.Millisecond) {
				t.Errorf("request %d sent budget %q; want its remaining milliseconds", i, b)
			}
		}
	})
}

// The SDK's default timeout leaves room for lock-server's own deadline, so
// that a stalled backend reaches the caller as a 503 (nothing done), not as
// a client timeout (outcome unknown).
func TestTheSDKsTimeoutExceedsLockServersDeadline(t *testing.T) {
	if srv := lockserver.DefaultServerConfig().RequestTimeout + lockserver.DeadlineMargin; client.DefaultRequestTimeout <= srv {
		t.Fatalf("SDK timeout %v <= lock-server deadline + margin %v", client.DefaultRequestTimeout, srv)
	}
}

// The SDK never sends a budget below api.MinRequestTimeoutMs: with less
// time left it sends nothing (lock-server would refuse the budget, and a
// backend call that short runs out and may commit after its 503) and
// returns the context's deadline. Before, it sent whatever was left.
func TestNoCallIsSentWithLessThanTheMinimumBudget(t *testing.T) {
	srv, err := lockserver.NewServer(memstore.New(nil), lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	o := &overloadedFirst{h: srv}
	c, err := client.New("http://lock.invalid", client.WithHTTPClient(o))
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), time.Duration(api.MinRequestTimeoutMs/2)*time.Millisecond)
	defer cancel()
	if l, err := c.TryAcquire(short, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TryAcquire with %d ms left: %v, %v; want context.DeadlineExceeded", api.MinRequestTimeoutMs/2, l, err)
	}
	o.mu.Lock()
	sent := len(o.budgets)
	o.mu.Unlock()
	if sent != 0 {
		t.Fatalf("%d requests were sent with less than the minimum budget (%v)", sent, o.budgets)
	}
	if _, err := c.TryAcquire(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.budgets {
		if ms, err := strconv.Atoi(b); err != nil || ms < api.MinRequestTimeoutMs {
			t.Errorf("budget %q sent; want at least %d", b, api.MinRequestTimeoutMs)
		}
	}
	if _, err := client.New("http://lock.invalid", client.WithRequestTimeout(time.Duration(api.MinRequestTimeoutMs-1)*time.Millisecond)); err == nil {
		t.Errorf("WithRequestTimeout below the minimum budget was accepted: no call could ever be sent")
	}
}
