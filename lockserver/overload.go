package lockserver

// Overload and stalls: what lock-server does when more requests arrive
// than it should hold at once, or when its backend stops answering.
//
//   - In-flight bound. At most ServerConfig.MaxInFlight lock requests are
//     in flight; one more is answered at once with 503 OVERLOADED and
//     Retry-After, and nothing is done for it. Without the bound, a backend
//     that slows down makes requests pile up until memory or file
//     descriptors run out.
//   - Fail fast on a stalled backend. When a backend call runs out its full
//     RequestTimeout (the backend, not the caller, was slow), the backend
//     is marked stalled: later requests get 503 BACKEND_UNAVAILABLE at once,
//     with Retry-After, instead of each waiting the full timeout. One
//     request per StallProbeInterval is let through as a probe; the first
//     backend call that answers (a grant, a refusal, anything but a
//     timeout) clears the mark. The log has backend_stalled and
//     backend_recovered; lockserver_backend_stalled is 1 while it lasts.
//   - One deadline budget. A caller may send its remaining time in
//     X-Request-Timeout-Ms (the SDK does); lock-server then gives the backend
//     at most that minus DeadlineMargin, so its 503 reaches the caller
//     before the caller gives up and the outcome becomes unknown to it.

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// DeadlineMargin is what lock-server keeps of a caller's announced budget
// (api.HeaderTimeoutMs) for its own answer to travel back: the backend gets
// the budget minus this.
const DeadlineMargin = 100 * time.Millisecond

// RetryAfterSeconds is the Retry-After of every retryable 503.
const RetryAfterSeconds = 1

// admission bounds the requests in flight and tracks a stalled backend.
type admission struct {
	slots      chan struct{}
	probeEvery time.Duration
	now        func() time.Time
	log        *slog.Logger
	gauge      prometheus.Gauge // nil without a Registry

	mu        sync.Mutex
	stalled   bool
	probing   bool
	nextProbe time.Time
}

func newAdmission(cfg ServerConfig, log *slog.Logger) *admission {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &admission{slots: make(chan struct{}, cfg.MaxInFlight), probeEvery: cfg.StallProbeInterval, now: now, log: log}
}

// admit takes a slot for one request. It returns release (to call when
// the request is done) and ok, or the code to answer at once: OVERLOADED
// when every slot is taken, BACKEND_UNAVAILABLE while the backend is
// stalled and it is not this request's turn to probe.
func (a *admission) admit() (release func(), code api.Code, ok bool) {
	select {
	case a.slots <- struct{}{}:
	default:
		return nil, api.CodeOverloaded, false
	}
	free := func() { <-a.slots }
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.stalled {
		return free, "", true
	}
	if a.probing || a.now().Before(a.nextProbe) {
		free()
		return nil, api.CodeBackendUnavailable, false
	}
	a.probing = true // this request's backend call decides
	return func() {
		a.mu.Lock()
		a.probing = false
		a.mu.Unlock()
		free()
	}, "", true
}

// fullDeadline marks a backend context whose deadline is the whole
// RequestTimeout (not shortened by the caller's budget): running it out
// means the backend, not the caller, was slow.
type fullDeadline struct{}

// observe records the outcome of one backend call made with ctx.
func (a *admission) observe(ctx context.Context, err error) {
	timedOut := err != nil && (errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) &&
		errors.Is(ctx.Err(), context.DeadlineExceeded)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case timedOut && ctx.Value(fullDeadline{}) != nil:
		a.nextProbe = a.now().Add(a.probeEvery)
		if !a.stalled {
			a.stalled = true
			a.setGauge(1)
			a.log.Error("backend stalled: answering 503 at once until a probe succeeds", "event", "backend_stalled",
				"error", err.Error(), "probeEveryMs", a.probeEvery.Milliseconds())
		}
	case err == nil || !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
		// The backend answered (a grant, or a refusal of its own).
		if a.stalled {
			a.stalled = false
			a.setGauge(0)
			a.log.Info("backend answered again", "event", "backend_recovered")
		}
	}
}

func (a *admission) setGauge(v float64) {
	if a.gauge != nil {
		a.gauge.Set(v)
	}
}

// budget reads the caller's remaining time from api.HeaderTimeoutMs: ok is
// false when the header is absent or not a positive integer (then ignored).
func budget(r *http.Request) (time.Duration, bool) {
	v := strings.TrimSpace(r.Header.Get(api.HeaderTimeoutMs))
	ms, err := strconv.ParseInt(v, 10, 64)
	if v == "" || err != nil || ms <= 0 || ms > int64(time.Hour/time.Millisecond) {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// backendCtx is the context of the backend calls of r: the request's,
// with a deadline of RequestTimeout, or of the caller's budget minus
// DeadlineMargin when that is shorter (at least 1 ms).
func (s *Server) backendCtx(r *http.Request) (context.Context, context.CancelFunc) {
	d := s.cfg.RequestTimeout
	ctx := r.Context()
	if b, ok := budget(r); ok && b-DeadlineMargin < d {
		d = max(b-DeadlineMargin, time.Millisecond)
	} else {
		ctx = context.WithValue(ctx, fullDeadline{}, true)
	}
	return context.WithTimeout(ctx, d)
}
