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
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// DeadlineMargin is what lock-server keeps of a caller's announced budget
// (api.HeaderTimeoutMs) for its own answer to travel back: the backend gets
// the budget minus this.
const DeadlineMargin = 100 * time.Millisecond

// RetryAfterSeconds is the Retry-After of every retryable 503
// (overload.RetryAfterSeconds).
const RetryAfterSeconds = overload.RetryAfterSeconds

// minBackendSlice is the least time a backend call made within a
// caller's budget gets: api.MinRequestTimeoutMs less DeadlineMargin. A
// waiting acquire stops asking when less than this is left of the
// budget, rather than start a call that would be cut (and might commit
// after its 503).
const minBackendSlice = time.Duration(api.MinRequestTimeoutMs)*time.Millisecond - DeadlineMargin

// errBadBudget: api.HeaderTimeoutMs is given but is not one decimal
// integer in api.MinRequestTimeoutMs..api.MaxRequestTimeoutMs (400
// INVALID_REQUEST).
var errBadBudget = fmt.Errorf("header %s must be sent once, as milliseconds %d..%d without sign or leading zero (below %d ms the backend call cannot finish in time: do not send the request)",
	api.HeaderTimeoutMs, api.MinRequestTimeoutMs, api.MaxRequestTimeoutMs, api.MinRequestTimeoutMs)

// budget reads the caller's remaining time from api.HeaderTimeoutMs: ok is
// false when the header is absent; err is errBadBudget when it is sent but
// malformed (repeated, signed, a leading zero, not decimal, below
// api.MinRequestTimeoutMs, or above api.MaxRequestTimeoutMs): serve
// refuses such a request before anything.
func budget(r *http.Request) (d time.Duration, ok bool, err error) {
	vs := r.Header.Values(api.HeaderTimeoutMs)
	if len(vs) == 0 {
		return 0, false, nil
	}
	if len(vs) > 1 || len(vs[0]) > len(strconv.Itoa(api.MaxRequestTimeoutMs)) {
		return 0, false, errBadBudget
	}
	v := vs[0]
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' || (i == 0 && v[i] == '0') {
			return 0, false, errBadBudget
		}
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if v == "" || err != nil || ms < api.MinRequestTimeoutMs || ms > api.MaxRequestTimeoutMs {
		return 0, false, errBadBudget
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}

// DefaultStallProbeTimeout is DefaultServerConfig's StallProbeTimeout:
// the stall threshold of payment-resource and rail-proxy
// (overload.DefaultStallAfter), well under the callers' 5 s budget.
const DefaultStallProbeTimeout = overload.DefaultStallAfter

// probeKey marks the context of the request let through to probe a
// stalled backend (begin).
type probeKey struct{}

// callTimeout is the time one backend call made for the request of ctx is
// given: RequestTimeout, or for the probe of a stalled backend (begin)
// StallProbeTimeout when that is shorter. Before, the probe waited out
// the whole RequestTimeout, 5 s, which is the callers' own budget: its
// caller mostly heard its own timeout instead of the 503.
//
// A shorter deadline changes no semantics. A probe that is an acquire,
// renew or revoke and runs out its deadline may still have committed in
// the backend; it is answered 503 BACKEND_UNAVAILABLE, which for a write
// already means "outcome unknown" (exactly as after RequestTimeout), and
// the caller must find out (inspect) or retry as it does today. Running
// the probe's deadline out counts as a stall (full deadline, unless the
// caller's budget was shorter), so the backend stays marked stalled and
// the next probe is one StallProbeInterval away; an answer clears the
// mark as before.
func (s *Server) callTimeout(ctx context.Context) time.Duration {
	if ctx.Value(probeKey{}) != nil {
		return min(s.cfg.StallProbeTimeout, s.cfg.RequestTimeout)
	}
	return s.cfg.RequestTimeout
}

// backendCtx is the context of the backend calls of r: the request's,
// with a deadline of callTimeout (marked full: overload.MarkFull), or
// of the caller's budget minus DeadlineMargin when that is shorter (at
// least 1 ms). serve has already refused a malformed budget.
func (s *Server) backendCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return s.boundedCtx(r, s.callTimeout(r.Context()), true)
}

// boundedCtx is backendCtx with the limit d; full says whether running
// out d counts as a stall (overload.MarkFull).
func (s *Server) boundedCtx(r *http.Request, d time.Duration, full bool) (context.Context, context.CancelFunc) {
	ctx := r.Context()
	if b, ok, _ := budget(r); ok && b-DeadlineMargin < d {
		d = max(b-DeadlineMargin, time.Millisecond)
	} else if full {
		ctx = overload.MarkFull(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// observe records the outcome of one backend call made with ctx.
func (s *Server) observe(ctx context.Context, err error) {
	s.adm.Observe(overload.Classify(ctx, err, store.ErrUnavailable), err)
}
