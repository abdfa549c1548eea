package lockserver

// Overload and stalls: the in-flight bound and the stall breaker are
// package internal/overload (shared with payment-resource and rail-proxy);
// lock-server answers its refusals with 503 OVERLOADED and 503
// BACKEND_UNAVAILABLE, both with Retry-After, and publishes
// lockserver_backend_stalled. What is lock-server's own is one deadline
// budget: a caller may send its remaining time in X-Request-Timeout-Ms (the
// SDK does); lock-server then gives the backend at most that minus
// DeadlineMargin, so its 503 reaches the caller before the caller gives up
// and the outcome becomes unknown to it. A timeout inside such a shortened
// budget does not mark the backend stalled.

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// DeadlineMargin is what lock-server keeps of a caller's announced budget
// (api.HeaderTimeoutMs) for its own answer to travel back: the backend gets
// the budget minus this.
const DeadlineMargin = 100 * time.Millisecond

// RetryAfterSeconds is the Retry-After of every retryable 503
// (overload.RetryAfterSeconds).
const RetryAfterSeconds = overload.RetryAfterSeconds

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
// with a deadline of RequestTimeout (marked full: overload.MarkFull), or
// of the caller's budget minus DeadlineMargin when that is shorter (at
// least 1 ms).
func (s *Server) backendCtx(r *http.Request) (context.Context, context.CancelFunc) {
	d := s.cfg.RequestTimeout
	ctx := r.Context()
	if b, ok := budget(r); ok && b-DeadlineMargin < d {
		d = max(b-DeadlineMargin, time.Millisecond)
	} else {
		ctx = overload.MarkFull(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// observe records the outcome of one backend call made with ctx.
func (s *Server) observe(ctx context.Context, err error) {
	s.adm.Observe(overload.Classify(ctx, err, ErrUnavailable), err)
}
