// Package client is the Go SDK of lock-server: it takes, renews and
// releases leases on lock keys, and hands out each lease's fencing token.
// It is a Go module of its own that imports only the standard library and
// lockserver/api (docs/lock-api.md says how it is versioned):
//
//	go get github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client@vX.Y.Z
//
// Safety model. A Lease reports itself held until a local deadline computed
// conservatively: from the moment the acquire (or renew) request was sent,
// plus the TTL the server granted, minus a drift allowance (a fraction of the
// TTL for clock-rate drift, plus a fixed margin). Because the server starts
// counting the TTL no earlier than it receives the request, the local
// deadline is never later than the server's expiry, provided the local clock
// runs no slower than the server's by more than the drift rate; no agreement
// between the two clocks' absolute values is assumed. What is NOT
// guaranteed: that the holder still holds the lease when its next write
// lands. A process can be paused (GC, SIGSTOP, a VM migration, a slow disk)
// between checking Held and writing, for longer than the TTL. The deadline
// is a liveness device that makes a healthy holder stop early; the safety of
// the protected resource comes only from the fencing token, which the
// resource must check on every write (see Lease.Token).
//
// Acquire retries a held lock with jittered backoff, or with WithWait
// waits in lock-server's queue. An acquire whose answer was lost may have
// been granted: the key then answers LOCK_HELD for one TTL.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// Errors of the SDK. Errors from the server are *Error values that match the
// sentinel of their code under errors.Is.
var (
	// ErrLockHeld: another holder has the lock (code LOCK_HELD).
	ErrLockHeld = errors.New("client: lock held")
	// ErrNotHeld: the server does not know the presented lease as live
	// (code LEASE_NOT_HELD).
	ErrNotHeld = errors.New("client: lease not held")
	// ErrStaleToken: a newer grant of the key exists (code STALE_TOKEN).
	ErrStaleToken = errors.New("client: stale fencing token")
	// ErrInvalidRequest: the server refused the request as malformed
	// (codes INVALID_REQUEST, BODY_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE), or the
	// SDK refused it before sending.
	ErrInvalidRequest = errors.New("client: invalid request")
	// ErrUnavailable: the server or its backend did not answer; the outcome
	// of the operation is unknown (code BACKEND_UNAVAILABLE, or a transport
	// error).
	ErrUnavailable = errors.New("client: unavailable")
	// ErrBackendRestored: the server refused a grant because its backend
	// may have been restored from a backup, so a new token could repeat an
	// old one (code BACKEND_RESTORED). Not retryable until an operator has
	// advanced the tokens.
	ErrBackendRestored = errors.New("client: backend restored")
	// ErrLeaseLost: the Lease is no longer held. Lease.Err wraps it together
	// with the cause: ErrDeadlinePassed, ErrReleased, or the server's refusal
	// of a renewal (ErrNotHeld, ErrStaleToken).
	ErrLeaseLost = errors.New("client: lease lost")
	// ErrDeadlinePassed: the local deadline passed before a renewal extended
	// it; the server may have expired the lease.
	ErrDeadlinePassed = errors.New("client: local lease deadline passed")
	// ErrReleased: the holder released the lease.
	ErrReleased = errors.New("client: lease released")
	// ErrBadAnswer: a 2xx answer that does not describe what was asked: a
	// body that does not decode, or a grant or lock state of another key,
	// owner or token, with a token or TTL out of the api's bounds. The SDK
	// never builds a Lease from such an answer (its token would reach the
	// fence points of another resource), and a renewal answered so loses
	// the Lease. The server is broken or is not lock-server.
	ErrBadAnswer = errors.New("client: malformed answer")
)

// Error is a refusal by the server: the decoded error envelope and the HTTP
// status. errors.Is(err, ErrLockHeld) and friends match on Code.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Code is the stable error code; empty when the body was not an envelope.
	Code api.Code
	// Message is the server's human-readable message.
	Message string
	// Retryable is the server's hint that the same request may succeed later.
	Retryable bool
	// RetryAfter is the server's Retry-After (whole seconds), 0 when absent.
	// Acquire waits at least this long before asking again.
	RetryAfter time.Duration
}

// Error describes the refusal in one line.
func (e *Error) Error() string {
	return fmt.Sprintf("client: server answered %d %s: %s", e.Status, e.Code, e.Message)
}

// Is matches e against the sentinel of its code.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case api.CodeLockHeld:
		return target == ErrLockHeld
	case api.CodeLeaseNotHeld:
		return target == ErrNotHeld
	case api.CodeStaleToken:
		return target == ErrStaleToken
	case api.CodeInvalidRequest, api.CodeBodyTooLarge, api.CodeUnsupportedMediaType:
		return target == ErrInvalidRequest
	case api.CodeBackendUnavailable, api.CodeOverloaded:
		return target == ErrUnavailable
	case api.CodeBackendRestored:
		return target == ErrBackendRestored
	}
	return e.Code == "" && e.Status >= 500 && target == ErrUnavailable
}

// Doer sends one HTTP request; *http.Client implements it. Tests and the
// simulation inject a Doer that delays, drops or reorders messages.
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// Clock is the SDK's time source. The deadline, the renewal schedule and the
// backoff all read it, never the time package directly, so a test can run
// the SDK under a virtual clock.
type Clock interface {
	// Now returns the current local time; only differences are used.
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d; Stop cancels it.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

type wallClock struct{}

func (wallClock) Now() time.Time                            { return time.Now() }
func (wallClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Client talks to one lock-server. It is safe for concurrent use.
type Client struct {
	base   string
	doer   Doer
	clock  Clock
	owner  string
	rate   float64
	margin time.Duration
	reqTO  time.Duration
	bbase  time.Duration
	bmax   time.Duration

	rngMu sync.Mutex
	rng   *mrand.Rand
}

// Defaults of the options below.
const (
	// DefaultDriftRate is the assumed bound on how much slower the local
	// clock may run than the server's, as a fraction of the TTL (2%).
	DefaultDriftRate = 0.02
	// DefaultSafetyMargin is subtracted from every deadline on top of the
	// drift (50ms): it covers timer latency between the deadline and Done.
	DefaultSafetyMargin = 50 * time.Millisecond
	// DefaultTTL is the lease duration asked for when WithTTL is not given.
	DefaultTTL = 10 * time.Second
	// DefaultRequestTimeout bounds each HTTP call (10s). It is longer than
	// lock-server's backend deadline (5s by default, LOCK_REQUEST_TIMEOUT_MS)
	// so that a stalled backend reaches the caller as lock-server's 503, a
	// known "not done", rather than as a timeout with an unknown outcome;
	// the SDK also tells lock-server its remaining time
	// (api.HeaderTimeoutMs) on every call, so a shorter timeout keeps that
	// property. One budget: SDK timeout > lock-server's deadline + margin.
	DefaultRequestTimeout = 10 * time.Second
	// DefaultBackoffBase and DefaultBackoffMax bound the jittered exponential
	// backoff between attempts of Acquire on a held lock. The base avoids
	// hot-looping against the server; the cap keeps a waiter responsive once
	// the lock frees.
	DefaultBackoffBase = 20 * time.Millisecond
	DefaultBackoffMax  = 1 * time.Second
)

// Option configures a Client.
type Option func(*Client) error

// WithHTTPClient sends requests through d instead of the default: an
// *http.Client over a transport shared by every Client of the process,
// like http.DefaultTransport but keeping up to DefaultIdleConnsPerHost idle
// connections per lock-server (http.DefaultTransport keeps 2, so a process
// with more leases in flight than that would open a TCP connection for
// most requests). The SDK makes no trace spans; a d whose transport does
// puts every call, background renewals included, in the caller's trace.
func WithHTTPClient(d Doer) Option {
	return func(c *Client) error {
		if d == nil {
			return errors.New("client: WithHTTPClient(nil)")
		}
		c.doer = d
		return nil
	}
}

// WithClock reads time from clk instead of the wall clock.
func WithClock(clk Clock) Option {
	return func(c *Client) error {
		if clk == nil {
			return errors.New("client: WithClock(nil)")
		}
		c.clock = clk
		return nil
	}
}

// WithOwner sets the owner id sent with every acquire (see api.ValidateOwner).
// The default is the host name, the process id and 8 random hex digits.
func WithOwner(owner string) Option {
	return func(c *Client) error {
		if err := api.ValidateOwner(owner); err != nil {
			return fmt.Errorf("client: WithOwner: %w", err)
		}
		c.owner = owner
		return nil
	}
}

// WithDriftAllowance sets the clock-drift rate (a fraction in [0, 0.5)) and
// the fixed safety margin (>= 0) subtracted from every deadline:
// deadline = sent + ttl - ttl*rate - margin. Defaults: DefaultDriftRate,
// DefaultSafetyMargin.
func WithDriftAllowance(rate float64, margin time.Duration) Option {
	return func(c *Client) error {
		if rate < 0 || rate >= 0.5 || margin < 0 {
			return fmt.Errorf("client: WithDriftAllowance(%v, %v): rate must be in [0, 0.5) and margin >= 0", rate, margin)
		}
		c.rate, c.margin = rate, margin
		return nil
	}
}

// WithRequestTimeout bounds each HTTP call (default DefaultRequestTimeout).
// It must be at least api.MinRequestTimeoutMs: the SDK sends no call with
// less time than that left (lock-server would refuse the budget), so a
// shorter timeout could never send anything.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *Client) error {
		if d < time.Duration(api.MinRequestTimeoutMs)*time.Millisecond {
			return fmt.Errorf("client: WithRequestTimeout(%v): must be at least %d ms (api.MinRequestTimeoutMs)", d, api.MinRequestTimeoutMs)
		}
		c.reqTO = d
		return nil
	}
}

// WithBackoff sets the base and cap of Acquire's jittered exponential backoff.
func WithBackoff(base, max time.Duration) Option {
	return func(c *Client) error {
		if base <= 0 || max < base {
			return fmt.Errorf("client: WithBackoff(%v, %v): need 0 < base <= max", base, max)
		}
		c.bbase, c.bmax = base, max
		return nil
	}
}

// WithRand draws backoff jitter from r (guarded by the Client; r must not be
// used elsewhere). The default is seeded from crypto/rand. A simulation
// passes a seeded source to make runs reproducible.
func WithRand(r *mrand.Rand) Option {
	return func(c *Client) error {
		if r == nil {
			return errors.New("client: WithRand(nil)")
		}
		c.rng = r
		return nil
	}
}

// DefaultIdleConnsPerHost is how many idle connections to one lock-server
// the default transport keeps for reuse.
const DefaultIdleConnsPerHost = 64

// sharedTransport is the default transport: a clone of
// http.DefaultTransport (proxy from the environment, dial and TLS
// timeouts) keeping DefaultIdleConnsPerHost idle connections per host.
var sharedTransport = sync.OnceValue(func() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport // replaced by the program: respect it
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = DefaultIdleConnsPerHost
	if t.MaxIdleConns < DefaultIdleConnsPerHost {
		t.MaxIdleConns = DefaultIdleConnsPerHost
	}
	return t
})

// New returns a Client for the lock-server at baseURL (for example
// "http://127.0.0.1:8080"). It returns an error for a URL that is not
// absolute http(s) or for an invalid option.
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q is not an absolute http(s) URL", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("client: base URL %q has a query, fragment or user info; give scheme, host and an optional path only", baseURL)
	}
	c := &Client{
		base:  strings.TrimRight(u.String(), "/"),
		doer:  &http.Client{Transport: sharedTransport()},
		clock: wallClock{},
		rate:  DefaultDriftRate, margin: DefaultSafetyMargin,
		reqTO: DefaultRequestTimeout,
		bbase: DefaultBackoffBase, bmax: DefaultBackoffMax,
	}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.owner == "" {
		c.owner = defaultOwner()
	}
	if c.rng == nil {
		var seed [32]byte
		_, _ = rand.Read(seed[:])
		c.rng = mrand.New(mrand.NewChaCha8(seed))
	}
	return c, nil
}

func defaultOwner() string {
	host, _ := os.Hostname()
	var b strings.Builder
	for _, r := range host {
		if r < 128 && (api.ValidateOwner(string(r)) == nil) {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 || b.Len() > 64 {
		b.Reset()
		b.WriteString("client")
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("%s-%d-%s", b.String(), os.Getpid(), hex.EncodeToString(rnd[:]))
}

// Owner returns the owner id this Client acquires leases as.
func (c *Client) Owner() string { return c.owner }

// AcquireOption configures one Acquire or TryAcquire.
type AcquireOption func(*acquireConfig) error

type acquireConfig struct {
	wait      time.Duration
	ttl       time.Duration
	owner     string
	autoRenew bool
	renewEach time.Duration
}

// WithTTL asks for a lease of ttl, a whole number of milliseconds within
// [api.MinTTLMs, api.MaxTTLMs] (default DefaultTTL).
func WithTTL(ttl time.Duration) AcquireOption {
	return func(a *acquireConfig) error {
		if ttl%time.Millisecond != 0 {
			return fmt.Errorf("%w: ttl %v is not whole milliseconds", ErrInvalidRequest, ttl)
		}
		if err := api.ValidateTTLMs(ttl.Milliseconds()); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		a.ttl = ttl
		return nil
	}
}

// WithWait makes each acquire request a long-poll of up to d: lock-server
// queues it behind the earlier waiters of the key and grants it when its
// turn comes, or answers LOCK_HELD after d (api.AcquireRequest.WaitMs).
// d is a whole number of milliseconds within [api.MinWaitMs,
// api.MaxWaitMs]. TryAcquire makes one such request; Acquire makes one
// after another until ctx ends, at once after a wait that ran its course
// and with its backoff otherwise (a lock-server without room for more
// waiters answers at once). A waiter keeps its place in the queue for one
// request only, so a d longer than the expected wait is fairer. Each HTTP
// call then has d on top of WithRequestTimeout. Default: no wait.
func WithWait(d time.Duration) AcquireOption {
	return func(a *acquireConfig) error {
		if d%time.Millisecond != 0 {
			return fmt.Errorf("%w: wait %v is not whole milliseconds", ErrInvalidRequest, d)
		}
		if err := api.ValidateWaitMs(d.Milliseconds()); err != nil || d == 0 {
			return fmt.Errorf("%w: wait %v: must be between %d and %d milliseconds", ErrInvalidRequest, d, api.MinWaitMs, api.MaxWaitMs)
		}
		a.wait = d
		return nil
	}
}

// WithLeaseOwner overrides the Client's owner id for this lease.
func WithLeaseOwner(owner string) AcquireOption {
	return func(a *acquireConfig) error {
		if err := api.ValidateOwner(owner); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		a.owner = owner
		return nil
	}
}

// WithAutoRenew renews the lease in the background every interval (0 means
// a third of the granted TTL) until it is released or lost. An interval not
// shorter than the lease's usable time (TTL minus the drift allowance) is
// refused with ErrInvalidRequest. A refused
// renewal loses the lease at once; a failed one is retried until the local
// deadline passes.
func WithAutoRenew(interval time.Duration) AcquireOption {
	return func(a *acquireConfig) error {
		if interval < 0 {
			return fmt.Errorf("%w: renew interval %v is negative", ErrInvalidRequest, interval)
		}
		a.autoRenew, a.renewEach = true, interval
		return nil
	}
}

func (c *Client) acquireConfig(opts []AcquireOption) (acquireConfig, error) {
	a := acquireConfig{ttl: DefaultTTL, owner: c.owner}
	for _, o := range opts {
		if err := o(&a); err != nil {
			return a, err
		}
	}
	if c.usable(a.ttl) <= 0 {
		return a, fmt.Errorf("%w: ttl %v leaves no time once the drift allowance (%.0f%% + %v) is taken off", ErrInvalidRequest, a.ttl, c.rate*100, c.margin)
	}
	if a.autoRenew && a.renewEach >= c.usable(a.ttl) {
		return a, fmt.Errorf("%w: renew interval %v is not shorter than the lease's usable time %v; it would never renew in time", ErrInvalidRequest, a.renewEach, c.usable(a.ttl))
	}
	return a, nil
}

// usable is how long after sending a request a lease of ttl is reported held.
func (c *Client) usable(ttl time.Duration) time.Duration {
	return ttl - time.Duration(float64(ttl)*c.rate) - c.margin
}

// TryAcquire makes one attempt to acquire key. It returns ErrLockHeld (as
// an *Error) when another holder has it, ErrInvalidRequest for a bad key or
// option, ErrUnavailable when the outcome is unknown.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	a, err := c.acquireConfig(opts)
	if err != nil {
		return nil, err
	}
	return c.tryAcquire(ctx, key, a)
}

func (c *Client) tryAcquire(ctx context.Context, key string, a acquireConfig) (*Lease, error) {
	if err := api.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	sent := c.clock.Now()
	var g api.Grant
	req := api.AcquireRequest{Owner: a.owner, TTLMs: a.ttl.Milliseconds(), WaitMs: a.wait.Milliseconds()}
	if err := c.callWithin(ctx, c.reqTO+a.wait, http.MethodPost, api.PathLockPrefix+key+api.SuffixAcquire, req, &g); err != nil {
		return nil, err
	}
	if err := checkGrant(g, key, a.owner, 0); err != nil {
		return nil, fmt.Errorf("%w: acquire %q: %v", ErrBadAnswer, key, err)
	}
	if a.wait > 0 {
		sent = sent.Add(c.waitCredit(g.WaitedMs, c.clock.Now().Sub(sent)))
	}
	l := newLease(c, g, sent)
	if l.Check() != nil {
		// The answer took longer than the lease's usable time: it is useless.
		// Give it back so the next attempt need not wait out its TTL.
		_ = c.ReleaseLease(ctx, key, g.Owner, g.Token)
		return nil, fmt.Errorf("%w: the grant of %q (token %d) arrived after its local deadline: %w", ErrUnavailable, key, g.Token, ErrDeadlinePassed)
	}
	if a.autoRenew {
		every := a.renewEach
		if every == 0 {
			every = time.Duration(g.TTLMs) * time.Millisecond / 3
		}
		l.startRenewing(ctx, every)
	}
	return l, nil
}

// Acquire acquires key, retrying with jittered exponential backoff while it
// is held by another or the server is unavailable, until ctx ends. It
// returns ctx's error (wrapped, with the last refusal) when ctx ends first,
// and ErrInvalidRequest at once for a bad key or option.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	a, err := c.acquireConfig(opts)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		asked := c.clock.Now()
		l, err := c.tryAcquire(ctx, key, a)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, ErrLockHeld) && !errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		if a.wait > 0 && errors.Is(err, ErrLockHeld) && c.clock.Now().Sub(asked) >= a.wait {
			// The long-poll ran its course: ask again at once, at the
			// tail of the queue.
			attempt = -1
			if ctx.Err() != nil {
				return nil, fmt.Errorf("client: acquire %q: %w (last answer: %v)", key, ctx.Err(), err)
			}
			continue
		}
		pause := c.backoff(attempt)
		var refusal *Error
		if errors.As(err, &refusal) && refusal.RetryAfter > pause {
			// The server said when: wait that, plus up to half again, so
			// that the callers it refused together do not return together.
			pause = refusal.RetryAfter + c.jitter(refusal.RetryAfter/2)
		}
		if werr := c.wait(ctx, pause); werr != nil {
			return nil, fmt.Errorf("client: acquire %q: %w (last answer: %v)", key, werr, err)
		}
	}
}

// waitCredit is how much later than the request was sent a waited grant's
// TTL can be counted from: the server's WaitedMs less the drift allowance
// (the local clock may run slower than the server's by the drift rate),
// and never more than the round trip measured locally, elapsed, so that a
// broken server's figure cannot move the deadline past the answer's
// arrival (INV-06).
func (c *Client) waitCredit(waitedMs int64, elapsed time.Duration) time.Duration {
	waited := time.Duration(waitedMs) * time.Millisecond
	credit := waited - time.Duration(float64(waited)*c.rate)
	return max(min(credit, elapsed), 0)
}

// backoff returns the pause before attempt+1: half of min(max, base*2^n)
// plus a uniformly random part of the other half ("equal jitter"), so
// waiters spread out but never hot-loop.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.bbase << min(attempt, 30)
	if d <= 0 || d > c.bmax {
		d = c.bmax
	}
	c.rngMu.Lock()
	j := time.Duration(c.rng.Int64N(int64(d/2) + 1))
	c.rngMu.Unlock()
	return d/2 + j
}

// jitter returns a uniformly random duration in [0, d].
func (c *Client) jitter(d time.Duration) time.Duration {
	c.rngMu.Lock()
	defer c.rngMu.Unlock()
	return time.Duration(c.rng.Int64N(int64(d) + 1))
}

// maxRetryAfter caps a Retry-After the SDK honours, in seconds; a larger
// one is ignored (a proxy's misconfiguration, not a plan).
const maxRetryAfter = 60

// wait pauses for d on the Client's clock, or until ctx ends.
func (c *Client) wait(ctx context.Context, d time.Duration) error {
	fired := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(fired) })
	defer t.Stop()
	select {
	case <-fired:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RenewLease is the wire-level renewal of the lease (key, owner, token),
// for callers that manage leases themselves (tools, tests of the server);
// Lease.Renew is the usual way. It returns the renewed grant, or ErrNotHeld,
// ErrStaleToken, ErrInvalidRequest, ErrUnavailable.
func (c *Client) RenewLease(ctx context.Context, key, owner string, token int64) (api.Grant, error) {
	var g api.Grant
	if err := api.ValidateKey(key); err != nil {
		return g, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := c.call(ctx, http.MethodPost, api.PathLockPrefix+key+api.SuffixRenew, api.RenewRequest{Owner: owner, Token: token}, &g); err != nil {
		return g, err
	}
	if err := checkGrant(g, key, owner, token); err != nil {
		return api.Grant{}, fmt.Errorf("%w: renew %q: %v", ErrBadAnswer, key, err)
	}
	return g, nil
}

// checkGrant returns an error unless g is a grant of key to owner with a
// positive token (exactly token, when token is not 0) and a TTL within
// (0, api.MaxTTLMs].
func checkGrant(g api.Grant, key, owner string, token int64) error {
	switch {
	case g.Key != key:
		return fmt.Errorf("the grant is of key %q", g.Key)
	case owner != "" && g.Owner != owner:
		return fmt.Errorf("the grant is to owner %q, not %q", g.Owner, owner)
	case g.Token <= 0:
		return fmt.Errorf("the grant has token %d", g.Token)
	case token != 0 && g.Token != token:
		return fmt.Errorf("the grant has token %d, not %d", g.Token, token)
	case g.TTLMs <= 0 || g.TTLMs > api.MaxTTLMs:
		return fmt.Errorf("the grant has ttlMs %d, outside 1..%d", g.TTLMs, api.MaxTTLMs)
	case g.WaitedMs < 0 || g.WaitedMs > api.MaxWaitMs:
		return fmt.Errorf("the grant has waitedMs %d, outside 0..%d", g.WaitedMs, api.MaxWaitMs)
	}
	return nil
}

// ReleaseLease is the wire-level release of the lease (key, owner, token);
// Lease.Release is the usual way. It returns nil when released, or
// ErrNotHeld, ErrStaleToken, ErrInvalidRequest, ErrUnavailable.
func (c *Client) ReleaseLease(ctx context.Context, key, owner string, token int64) error {
	if err := api.ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	return c.call(ctx, http.MethodPost, api.PathLockPrefix+key+api.SuffixRelease, api.ReleaseRequest{Owner: owner, Token: token}, nil)
}

// Ready returns nil when lock-server answers its readiness probe (its
// backend answered a ping), ErrUnavailable otherwise.
func (c *Client) Ready(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, api.PathReady, nil, nil)
}

// Inspect returns the server's view of key.
func (c *Client) Inspect(ctx context.Context, key string) (api.LockState, error) {
	var st api.LockState
	if err := api.ValidateKey(key); err != nil {
		return st, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := c.call(ctx, http.MethodGet, api.PathLockPrefix+key, nil, &st); err != nil {
		return st, err
	}
	switch {
	case st.Key != key:
		return api.LockState{}, fmt.Errorf("%w: inspect %q: the answer describes key %q", ErrBadAnswer, key, st.Key)
	case st.Held != (st.Lease != nil):
		return api.LockState{}, fmt.Errorf("%w: inspect %q: held is %v but the lease is %s", ErrBadAnswer, key, st.Held, map[bool]string{true: "present", false: "absent"}[st.Lease != nil])
	case st.Lease != nil:
		if err := checkGrant(*st.Lease, key, "", 0); err != nil {
			return api.LockState{}, fmt.Errorf("%w: inspect %q: %v", ErrBadAnswer, key, err)
		}
	}
	return st, nil
}

// Revoke force-revokes the live lease on key (an operator action; token 0
// revokes whatever lease is live) and returns the revoked lease. ErrNotHeld
// when none is live, ErrStaleToken when token is older than the live one.
func (c *Client) Revoke(ctx context.Context, key string, token int64, reason string) (api.Grant, error) {
	var g api.Grant
	if err := api.ValidateKey(key); err != nil {
		return g, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := c.call(ctx, http.MethodPost, api.PathLockPrefix+key+api.SuffixRevoke, api.RevokeRequest{Token: token, Reason: reason}, &g); err != nil {
		return g, err
	}
	if err := checkGrant(g, key, "", token); err != nil {
		return api.Grant{}, fmt.Errorf("%w: revoke %q: %v", ErrBadAnswer, key, err)
	}
	return g, nil
}

// call sends one request and decodes a 2xx body into out (when out is not
// nil) or a refusal into *Error.
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	return c.callWithin(ctx, c.reqTO, method, path, in, out)
}

// callWithin is call with a timeout of to instead of the Client's.
func (c *Client) callWithin(ctx context.Context, to time.Duration, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if dl, ok := ctx.Deadline(); ok {
		// Less than api.MinRequestTimeoutMs left: lock-server would refuse
		// the budget, and a backend call that short would run out and
		// might commit after its 503. Nothing is sent: the outcome is
		// known (not done), and the error is ctx's deadline.
		left := time.Until(dl).Milliseconds()
		if left < api.MinRequestTimeoutMs {
			return fmt.Errorf("client: %s %s not sent: %d ms left, less than lock-server's minimum budget of %d ms: %w",
				method, path, left, api.MinRequestTimeoutMs, context.DeadlineExceeded)
		}
		req.Header.Set(api.HeaderTimeoutMs, strconv.FormatInt(min(left, api.MaxRequestTimeoutMs), 10))
	}
	resp, err := c.doer.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: reading the answer to %s %s: %w", ErrUnavailable, method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		if out == nil || resp.StatusCode == http.StatusNoContent {
			return nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%w: decoding the answer to %s %s: %v", ErrBadAnswer, method, path, err)
		}
		return nil
	}
	var after time.Duration
	if secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && secs > 0 && secs <= maxRetryAfter {
		after = time.Duration(secs) * time.Second
	}
	var env api.ErrorEnvelope
	if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
		return &Error{Status: resp.StatusCode, Message: strings.TrimSpace(string(raw)), RetryAfter: after}
	}
	return &Error{Status: resp.StatusCode, Code: env.Error.Code, Message: env.Error.Message, Retryable: env.Error.Retryable, RetryAfter: after}
}
