package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

func TestOptionsAreValidated(t *testing.T) {
	for name, opt := range map[string]client.Option{
		"nil http client":  client.WithHTTPClient(nil),
		"bad owner":        client.WithOwner("a b"),
		"drift rate 0.5":   client.WithDriftAllowance(0.5, 0),
		"negative margin":  client.WithDriftAllowance(0.01, -time.Second),
		"zero timeout":     client.WithRequestTimeout(0),
		"backoff max<base": client.WithBackoff(time.Second, time.Millisecond),
	} {
		if _, err := client.New("http://x", opt); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	for _, u := range []string{"", "x", "ftp://host", "http://", "http://h:1?x=1", "http://h:1/#frag", "http://user:pw@h:1"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted it", u)
		}
	}
	c, err := client.New("http://127.0.0.1:1", client.WithDriftAllowance(0.1, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// 2s of margin leaves nothing of a 2s lease: refused before sending.
	if _, err := c.TryAcquire(context.Background(), "k", client.WithTTL(2*time.Second)); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("TryAcquire with an unusable TTL: %v; want ErrInvalidRequest", err)
	}
	if _, err := c.TryAcquire(context.Background(), "k", client.WithTTL(10*time.Second), client.WithAutoRenew(10*time.Second)); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("TryAcquire renewing every TTL: %v; want ErrInvalidRequest", err)
	}
	if _, err := c.TryAcquire(context.Background(), "bad key", client.WithTTL(10*time.Second)); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("TryAcquire with a bad key: %v; want ErrInvalidRequest", err)
	}
}

// stuckClock is a clock whose timers never fire: only reading it can tell
// that a deadline passed.
type stuckClock struct {
	mu  sync.Mutex
	now time.Time
}

type noTimer struct{}

func (noTimer) Stop() bool { return true }

func (c *stuckClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stuckClock) AfterFunc(time.Duration, func()) client.Timer { return noTimer{} }

func (c *stuckClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Err and Check agree: both read the clock, so a passed deadline is lost
// for both even when the deadline timer has not fired.
func TestErrReadsTheClockLikeCheck(t *testing.T) {
	ts := httptest.NewServer(newLockServer())
	defer ts.Close()
	clk := &stuckClock{now: time.Unix(1_000_000, 0)}
	c, err := client.New(ts.URL, client.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.Acquire(t.Context(), "k", client.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err right after the grant = %v", err)
	}
	clk.advance(2 * time.Second)
	if err := lease.Err(); !errors.Is(err, client.ErrDeadlinePassed) {
		t.Fatalf("Err after the deadline, timer not fired = %v; want ErrDeadlinePassed", err)
	}
}

func TestWithWaitBounds(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	// Each is refused before it is sent: sent, it would meet ErrUnavailable
	// (nothing listens at that address).
	for _, d := range []time.Duration{0, time.Millisecond, 61 * time.Second, 1500 * time.Microsecond} {
		if _, err := c.TryAcquire(t.Context(), "k", client.WithWait(d)); !errors.Is(err, client.ErrInvalidRequest) {
			t.Errorf("WithWait(%v): %v, want ErrInvalidRequest", d, err)
		}
	}
}
