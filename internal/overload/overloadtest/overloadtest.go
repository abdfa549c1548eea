// Package overloadtest holds what the stalled-database tests of the
// services that use internal/overload share (payment-resource's frozen
// paydb, rail-proxy's frozen raildb): a clock the test moves, a wave of
// concurrent requests and its answers, a handler that times the service,
// the value of a gauge and a wait for goroutines to end. Test code only.
package overloadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Clock is a stall breaker's clock (overload.Config.Now): it stands still
// until the test moves it, so no probe is due before the test says so. It
// is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock that reads t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Add moves the clock forward by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Answer is one answer of a wave: the status, the error envelope's code
// (C is the service's api.Code type), Retry-After, or the caller's own
// error (no answer before its timeout), and how long it took at the caller.
type Answer[C ~string] struct {
	Status     int
	Code       C
	RetryAfter string
	Err        error
	Took       time.Duration
}

// Wave sends n requests at once through caller, request i made by
// newRequest(i), and returns every answer, in the order of i.
func Wave[C ~string](caller *http.Client, n int, newRequest func(i int) *http.Request) []Answer[C] {
	out := make([]Answer[C], n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req := newRequest(i)
			start := time.Now()
			resp, err := caller.Do(req)
			if err != nil {
				out[i] = Answer[C]{Err: err, Took: time.Since(start)}
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var env struct {
				Error struct {
					Code C `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(raw, &env)
			out[i] = Answer[C]{Status: resp.StatusCode, Code: env.Error.Code, RetryAfter: resp.Header.Get("Retry-After"), Took: time.Since(start)}
		})
	}
	wg.Wait()
	return out
}

// Spread summarises the latencies of a wave at the caller: min, median,
// 90th percentile, max.
func Spread[C ~string](as []Answer[C]) string {
	d := make([]time.Duration, len(as))
	for i, a := range as {
		d[i] = a.Took
	}
	slices.Sort(d)
	return fmt.Sprintf("min %v, median %v, p90 %v, max %v", d[0].Round(time.Millisecond), d[len(d)/2].Round(time.Millisecond),
		d[len(d)*9/10].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
}

// TimedHandler serves through Next and keeps the longest time a request
// spent in it, from the moment it had the request to its answer: what
// must beat a caller's timeout is the service's answer, not the time a
// loaded machine takes to accept connections.
type TimedHandler struct {
	// Next serves the requests.
	Next    http.Handler
	mu      sync.Mutex
	slowest time.Duration
}

// ServeHTTP serves r through Next and notes how long it took.
func (h *TimedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h.Next.ServeHTTP(w, r)
	d := time.Since(start)
	h.mu.Lock()
	h.slowest = max(h.slowest, d)
	h.mu.Unlock()
}

// Reset returns the longest time so far and starts again.
func (h *TimedHandler) Reset() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.slowest
	h.slowest = 0
	return d
}

// Gauge returns the value of the label-free gauge name in reg, or fails t.
func Gauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// AwaitGoroutines waits until at most n goroutines run, or fails t after
// limit with the count and every goroutine's stack.
func AwaitGoroutines(t testing.TB, n int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the stall; want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
	}
}

// Peak samples the label-free gauge name in reg every 5 ms until the
// returned function is called; that function stops the sampling and
// returns the highest value seen.
func Peak(t testing.TB, reg *prometheus.Registry, name string) (stop func() int64) {
	var peak int64
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if v := int64(Gauge(t, reg, name)); v > peak {
				peak = v
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-sampled
		return peak
	}
}
