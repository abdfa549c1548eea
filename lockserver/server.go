// Package lockserver is lock-server: the HTTP handler that serves the API
// of package lockserver/api over a store.LockStore (NewServer), and the
// coordination in front of the store: group grant (batcher.go), the wait
// queue and handoff (waitqueue.go), abandoned grants (abandon.go), the
// token floor (floor.go) and overload answers (overload.go). It mints tokens
// through the store and never checks them for a resource: see
// docs/lock-service.md.
package lockserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// ServerConfig configures the HTTP handler. The zero value is not valid; start
// from DefaultServerConfig.
type ServerConfig struct {
	// RequestTimeout bounds each backend call made for one request. A call
	// that runs out of time is answered 503 BACKEND_UNAVAILABLE; its outcome
	// is unknown. Default 5s: well under the shortest sensible lease, so a
	// client learns of trouble while its lease can still be renewed.
	RequestTimeout time.Duration

	// ReadyTimeout bounds the backend ping of GET /readyz: a probe is
	// answered 503 BACKEND_UNAVAILABLE once it runs out, without marking
	// the backend stalled. Default 1s: a readiness probe (Kubernetes'
	// default timeout is 1 s) must learn quickly, and a backend slower
	// than that to answer a ping is not ready. Positive; a RequestTimeout
	// shorter than it bounds the ping instead.
	ReadyTimeout time.Duration

	// Registry, when not nil, receives the Server's request metrics
	// (lockserver_requests_total{op,code} and
	// lockserver_request_duration_seconds{op}; see metrics.go) and is served
	// at PathMetrics. Nil: no metrics and no PathMetrics route.
	Registry *prometheus.Registry

	// ProofKey, when set, signs every grant that acquire and renew answer
	// (api.Grant.Proof): a fence point holding its public half can then
	// check that a token was issued for the lock key that guards its
	// resource (package fenceproof). Default: the zero key, no proofs.
	// Inspect and revoke never carry a proof: only the holder gets one.
	ProofKey fenceproof.SigningKey

	// MaxInFlight bounds the lock and readiness requests served at once;
	// one more is answered 503 OVERLOADED with Retry-After at once
	// (internal/overload; at most overload.MaxMaxInFlight). Default 256: far above what one lock-server's backend
	// pool (16 connections by default) can serve in parallel.
	MaxInFlight int
	// StallProbeInterval is how often, while the backend is marked stalled,
	// one request is let through to probe it; the others get 503 at once.
	// Default 500ms.
	StallProbeInterval time.Duration
	// StallProbeTimeout bounds the backend calls of the one request let
	// through to probe a stalled backend (StallProbeInterval): it is
	// answered 503 BACKEND_UNAVAILABLE with Retry-After once this runs
	// out, and the backend stays marked stalled. Default
	// DefaultStallProbeTimeout (1s): a backend that answered nothing for
	// a whole RequestTimeout and does not answer a probe within a second
	// is still stalled, and the probe's caller (the executor and the SDK
	// give a request 5 s) hears the 503 instead of its own timeout. A
	// RequestTimeout shorter than it bounds the probe instead. Positive,
	// at most overload.MaxStallProbeInterval.
	StallProbeTimeout time.Duration
	// Now is the clock of the stall probes; nil means time.Now. For tests.
	Now func() time.Time

	// Batching coalesces concurrent acquires, releases and renewals into
	// one backend round trip each (group grant, batcher.go) when the store
	// can (BatchStore, BatchRenewer); other stores are called once per
	// request whatever this says. Default true.
	Batching bool
	// Batch configures the batching; its Timeout is replaced by
	// RequestTimeout. Default DefaultBatchConfig.
	Batch BatchConfig

	// MaxWaiters bounds the acquires waiting in the wait queues
	// (api.AcquireRequest.WaitMs; waitqueue.go) at once, over all keys.
	// A waiter holds its in-flight slot while it waits, so at most half
	// of MaxInFlight wait, whatever MaxWaiters says: the other slots stay
	// free for the releases that end the waits. One more waiting acquire
	// is asked once, like a plain acquire. 0 turns waiting off. Default
	// DefaultMaxWaiters; at most overload.MaxMaxInFlight.
	MaxWaiters int
	// WaitPoll is the longest a head waiter sleeps between two asks when
	// nothing on this lock-server wakes it: how late it notices a release
	// through another lock-server. Default DefaultWaitPoll; at most
	// MaxWaitPoll.
	WaitPoll time.Duration
	// Handoff lets a release hand its key to this lock-server's parked
	// head waiter in the same backend transaction (Handoffer;
	// waitqueue.go): one round trip from the release to the waiter's
	// grant instead of two. It takes effect only over a store with the
	// capability (pgstore, etcdstore, memstore) and with waiting on
	// (MaxWaiters > 0); false releases and wakes the head, which asks
	// itself, as before. Default true. Any value is valid.
	Handoff bool
}

// DefaultServerConfig returns the defaults documented on ServerConfig.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{RequestTimeout: 5 * time.Second, ReadyTimeout: time.Second, MaxInFlight: 256, StallProbeInterval: 500 * time.Millisecond,
		StallProbeTimeout: DefaultStallProbeTimeout,
		Batching:          true, Batch: DefaultBatchConfig(), MaxWaiters: DefaultMaxWaiters, WaitPoll: DefaultWaitPoll, Handoff: true}
}

// Validate returns nil or one error per invalid field, joined.
func (c ServerConfig) Validate() error {
	var errs []error
	if c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("lockserver: RequestTimeout must be positive, got %v", c.RequestTimeout))
	}
	if c.ReadyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("lockserver: ReadyTimeout must be positive, got %v", c.ReadyTimeout))
	}
	if c.MaxInFlight <= 0 || c.MaxInFlight > overload.MaxMaxInFlight {
		errs = append(errs, fmt.Errorf("lockserver: MaxInFlight must be in 1..%d, got %d", overload.MaxMaxInFlight, c.MaxInFlight))
	}
	if c.StallProbeInterval <= 0 || c.StallProbeInterval > overload.MaxStallProbeInterval {
		errs = append(errs, fmt.Errorf("lockserver: StallProbeInterval must be in (0, %v], got %v", overload.MaxStallProbeInterval, c.StallProbeInterval))
	}
	if c.StallProbeTimeout <= 0 || c.StallProbeTimeout > overload.MaxStallProbeInterval {
		errs = append(errs, fmt.Errorf("lockserver: StallProbeTimeout must be in (0, %v], got %v", overload.MaxStallProbeInterval, c.StallProbeTimeout))
	}
	if c.MaxWaiters < 0 || c.MaxWaiters > overload.MaxMaxInFlight {
		errs = append(errs, fmt.Errorf("lockserver: MaxWaiters must be in 0..%d, got %d", overload.MaxMaxInFlight, c.MaxWaiters))
	}
	if c.WaitPoll <= 0 || c.WaitPoll > MaxWaitPoll {
		errs = append(errs, fmt.Errorf("lockserver: WaitPoll must be in (0, %v], got %v", MaxWaitPoll, c.WaitPoll))
	}
	if c.Batching {
		b := c.Batch
		b.Timeout = c.RequestTimeout
		if b.Timeout <= 0 {
			b.Timeout = time.Second // reported above
		}
		errs = append(errs, b.Validate())
	}
	return errors.Join(errs...)
}

// Server serves the lock API of package api over a LockStore. It keeps no
// lease state: every decision is the store's, so any number of Servers may
// share one backend. The only work it runs beyond its requests is the
// release of grants their requests abandoned (abandon.go): Close waits
// for it, once the Server serves no more requests and before the store
// is closed.
type Server struct {
	store   store.LockStore // the Batcher over the store when batching
	batcher *Batcher        // nil without batching
	cfg     ServerConfig
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics // nil without a Registry

	// issued is the largest token this Server has handed out: the token
	// floor (floor.go).
	issued atomic.Int64

	adm *overload.Guard // in-flight bound and stall tracking (overload.go)

	waitq *waitQueues // the waiting acquires (waitqueue.go)
	// handoffer is the store's Handoffer capability, traced, taken from
	// the store NewServer was given (beneath the Batcher); nil when the
	// store has none.
	handoffer store.Handoffer
	// askDuringRelease: the store is a ReleaseOrderer that orders an
	// acquire after a release in flight, so a waiting head asks during a
	// release of its key instead of parking until its answer.
	askDuringRelease bool
	// handoffs counts the handoffs by outcome (lockserver_handoffs_total);
	// nil without a Registry.
	handoffs *prometheus.CounterVec

	// The background releases of abandoned grants (abandon.go): bg counts
	// those running; closing (under bgMu) is set by Close, after which
	// none starts. abandonedGrants counts them by outcome
	// (lockserver_abandoned_grants_total); nil without a Registry.
	bg              sync.WaitGroup
	bgMu            sync.Mutex
	closing         bool
	closeOnce       sync.Once
	closeErr        error
	abandonedGrants *prometheus.CounterVec
}

// NewServer returns a Server over store. It returns an error if cfg is
// invalid or store or logger is nil.
func NewServer(lockStore store.LockStore, cfg ServerConfig, logger *slog.Logger) (*Server, error) {
	if lockStore == nil || logger == nil {
		return nil, errors.New("lockserver: NewServer needs a store and a logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	adm, err := overload.New(overload.Config{MaxInFlight: cfg.MaxInFlight, StallProbeInterval: cfg.StallProbeInterval, Now: cfg.Now}, logger)
	if err != nil {
		return nil, fmt.Errorf("lockserver: %w", err)
	}
	s := &Server{store: lockStore, cfg: cfg, log: logger, mux: http.NewServeMux(), adm: adm, waitq: newWaitQueues(min(cfg.MaxWaiters, cfg.MaxInFlight/2), logger)}
	if cfg.Batching {
		bc := cfg.Batch
		bc.Timeout = cfg.RequestTimeout
		b, err := NewBatcher(lockStore, bc)
		if err != nil {
			return nil, err
		}
		// A member's grant whose caller left mid-batch is released by
		// the Server, which wakes the key's waiters and which Close
		// waits for (abandon.go).
		b.onAbandon = func(ctx context.Context, l store.Lease) { s.releaseAbandoned(ctx, l, abandonedInBatch) }
		// A batch's grants raise the floor before the next batch is sent
		// (floor.go), not only when each caller returns.
		b.onGrant = s.noteIssued
		s.store, s.batcher = b, b
	}
	if cfg.Registry != nil {
		m, err := newMetrics(cfg.Registry)
		if err != nil {
			return nil, fmt.Errorf("lockserver: register metrics: %w", err)
		}
		s.metrics = m
		if err := cfg.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockserver_acquire_waiters",
			Help: "Acquires waiting in lock-server's wait queues (a long-poll acquire with waitMs), over all keys.",
		}, func() float64 { return float64(s.waitq.waiting()) })); err != nil {
			return nil, fmt.Errorf("lockserver: register metrics: %w", err)
		}
		s.handoffs = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockserver_handoffs_total",
			Help: "Releases handed to a parked head waiter in one backend call (the wait queue's handoff), by outcome: granted, refused (the release was refused; nothing changed), unknown (the backend did not answer), withdrawn (the token floor withdrew the grant), restored (the restore guard refused the grant).",
		}, []string{"outcome"})
		if err := cfg.Registry.Register(s.handoffs); err != nil {
			return nil, fmt.Errorf("lockserver: register metrics: %w", err)
		}
		s.abandonedGrants = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockserver_abandoned_grants_total",
			Help: "Grants made for an acquire whose request had ended before lock-server answered it (a plain acquire or batch leader before its answer was written, or a batch member whose caller left mid-batch), released in the background, by outcome: released, failed (the lease expires after its TTL).",
		}, []string{"outcome"})
		if err := cfg.Registry.Register(s.abandonedGrants); err != nil {
			return nil, fmt.Errorf("lockserver: register metrics: %w", err)
		}
		if err := s.registerFloor(cfg.Registry); err != nil {
			return nil, fmt.Errorf("lockserver: register metrics: %w", err)
		}
		if err := s.adm.Register(cfg.Registry, overload.Metrics{
			Stalled:     "lockserver_backend_stalled",
			StalledHelp: "1 while the backend is marked stalled (a call ran out its whole request timeout) and requests are refused at once; 0 otherwise.",
		}); err != nil {
			return nil, fmt.Errorf("lockserver: register metrics: %w", err)
		}
		s.mux.Handle(PathMetrics, metricsHandler(cfg.Registry))
	}
	s.mux.HandleFunc(api.PathLockPrefix+"{key}", s.handleLock)
	s.mux.HandleFunc(api.PathLockPrefix+"{key}/{op}", s.handleOp)
	s.mux.HandleFunc(api.PathHealth, s.handleHealth)
	s.mux.HandleFunc(api.PathReady, s.handleReady)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	// Outermost, so that each request's store call is a span of its own
	// (TraceStore), whatever sits between it and the backend.
	s.store = TraceStore(s.store, fmt.Sprintf("%T", lockStore))
	if h, ok := lockStore.(store.Handoffer); ok {
		s.handoffer = TraceHandoff(h, fmt.Sprintf("%T", lockStore))
	}
	if o, ok := lockStore.(store.ReleaseOrderer); ok {
		s.askDuringRelease = o.OrdersAfterRelease()
	}
	return s, nil
}

// BatchStats returns the counts of the Server's batched store calls
// (Batcher.Stats); zero without batching.
func (s *Server) BatchStats() (acquire, release, renew BatchStats) {
	if s.batcher == nil {
		return
	}
	return s.batcher.Stats()
}

// Waiting returns the number of acquires waiting in the Server's wait
// queues (api.AcquireRequest.WaitMs), over all keys; also published as
// the gauge lockserver_acquire_waiters.
func (s *Server) Waiting() int { return s.waitq.waiting() }

// ServeHTTP implements http.Handler. A path that is not in canonical form
// ("..", ".", "//"; httpserve.CanonicalPath) is refused with the envelope
// here, counted by the request metrics, even when the Server is not served
// through httpserve: http.ServeMux would answer it with a bodiless
// redirect.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.metrics != nil && r.URL.Path != PathMetrics {
		s.metrics.observe(w, r, http.HandlerFunc(s.serve))
		return
	}
	s.serve(w, r)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.Path; !httpserve.CanonicalPath(p) {
		writeError(w, http.StatusBadRequest, api.CodeInvalidRequest, fmt.Sprintf("path %q is not in canonical form", p))
		return
	}
	if r.URL.Path == api.PathHealth || r.URL.Path == PathMetrics {
		s.mux.ServeHTTP(w, r) // liveness and metrics never touch the backend
		return
	}
	if _, _, err := budget(r); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalidRequest, err.Error())
		return
	}
	// No route of the lock API takes a query parameter: one sent anyway is
	// refused, never ignored (the client may have meant something by it).
	if _, err := jsonhandler.Query(r); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalidRequest, err.Error())
		return
	}
	s.mux.ServeHTTP(w, r)
}

// begin admits one request to backend work under the in-flight bound and
// the stall breaker. Handlers call it once the request's input has passed
// every check (key, body, fields), so that bad input is answered its own
// 4xx whatever the backend's state: a malformed body while the backend is
// stalled is 400, not 503. A request they refuse is answered here, 503
// OVERLOADED or 503 BACKEND_UNAVAILABLE at once with Retry-After, nothing
// done, and ok is false; otherwise release must be called once, when the
// request is done. The request it returns is r, or, when the request is
// let through to probe a stalled backend, r marked so that its backend
// calls are bounded by StallProbeTimeout (callTimeout); handlers go on
// with it.
func (s *Server) begin(w http.ResponseWriter, r *http.Request) (_ *http.Request, release func(), ok bool) {
	release, reason, ok := s.adm.Admit()
	if ok && s.adm.Stalled() {
		// Admitted while stalled: this request is the probe (or the mark
		// came just after its admission; bounding it too is harmless).
		r = r.WithContext(context.WithValue(r.Context(), probeKey{}, true))
	}
	if !ok {
		code, msg := api.CodeOverloaded, "too many requests in flight; nothing was done"
		if reason == overload.ReasonStalled {
			code, msg = api.CodeBackendUnavailable, "the backend is not answering (a recent call ran out its whole timeout); nothing was done"
		}
		writeError(w, http.StatusServiceUnavailable, code, msg)
		return r, nil, false
	}
	return r, release, true
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet)
		return
	}
	r, release, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer release()
	// Readiness has its own short bound (ReadyTimeout): a probe learns of
	// a backend that does not answer at once, not after RequestTimeout,
	// and running it out does not mark the backend stalled.
	ctx, cancel := s.boundedCtx(r, min(s.cfg.ReadyTimeout, s.callTimeout(r.Context())), false)
	defer cancel()
	err := s.store.Ping(ctx)
	s.observe(ctx, err)
	if err != nil {
		s.log.WarnContext(ctx, "backend not ready", "event", EventBackendUnready, "error", err.Error())
		writeError(w, http.StatusServiceUnavailable, api.CodeBackendUnavailable, "the backend did not answer a ping")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) handleLock(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet)
		return
	}
	key := r.PathValue("key")
	if err := store.ValidateKey(key); err != nil {
		s.fail(r.Context(), w, "inspect", key, err)
		return
	}
	r, release, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := s.backendCtx(r)
	defer cancel()
	st, err := s.store.Inspect(ctx, key)
	s.observe(ctx, err)
	if err != nil {
		s.fail(r.Context(), w, "inspect", key, err)
		return
	}
	out := api.LockState{Key: st.Key, Held: st.Lease != nil, LastToken: st.LastToken}
	if st.Lease != nil {
		g := grantOf(*st.Lease)
		out.Lease = &g
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleOp(w http.ResponseWriter, r *http.Request) {
	key, op := r.PathValue("key"), "/"+r.PathValue("op")
	switch op {
	case api.SuffixAcquire, api.SuffixRenew, api.SuffixRelease, api.SuffixRevoke:
	default:
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no lock operation %q", r.PathValue("op")))
		return
	}
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, http.MethodPost)
		return
	}
	// The key is checked before the body so that a bad key is reported as
	// such whatever the body holds.
	if err := store.ValidateKey(key); err != nil {
		s.fail(r.Context(), w, op[1:], key, err)
		return
	}
	switch op {
	case api.SuffixAcquire:
		s.acquire(w, r, key)
	case api.SuffixRenew:
		s.renew(w, r, key)
	case api.SuffixRelease:
		s.release(w, r, key)
	case api.SuffixRevoke:
		s.revoke(w, r, key)
	}
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request, key string) {
	start := time.Now()
	var req api.AcquireRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if err := api.ValidateTTLMs(req.TTLMs); err != nil {
		s.fail(r.Context(), w, "acquire", key, fmt.Errorf("%w: %v", store.ErrInvalidArgument, err))
		return
	}
	if err := api.ValidateWaitMs(req.WaitMs); err != nil {
		s.fail(r.Context(), w, "acquire", key, fmt.Errorf("%w: %v", store.ErrInvalidArgument, err))
		return
	}
	if err := store.ValidateAcquire(key, req.Owner, time.Duration(req.TTLMs)*time.Millisecond); err != nil {
		s.fail(r.Context(), w, "acquire", key, err, "owner", req.Owner)
		return
	}
	r, release, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer release()
	// The caller's budget, less the margin for the answer (overload.go).
	var budgetEnd time.Time
	if b, ok, _ := budget(r); ok { // a malformed budget was refused in ServeHTTP
		budgetEnd = start.Add(b - DeadlineMargin)
	}
	ttl := time.Duration(req.TTLMs) * time.Millisecond
	var l store.Lease
	var waited time.Duration
	var by string // which granting path minted the token: GrantedBy*
	var err error
	if req.WaitMs > 0 {
		noteOp(w, opAcquireWait)
	}
	waitEnd := start.Add(time.Duration(req.WaitMs) * time.Millisecond)
	// The last ask of a wait must still have minBackendSlice of the
	// budget: an ask cut by the budget may commit after its 503. A budget
	// that leaves no room to wait gets one ask, as a plain acquire.
	if lastAsk := budgetEnd.Add(-minBackendSlice); !budgetEnd.IsZero() && lastAsk.Before(waitEnd) {
		waitEnd = lastAsk
	}
	if req.WaitMs > 0 && s.waitq.max > 0 && waitEnd.After(start) {
		if err = store.ValidateAcquire(key, req.Owner, ttl); err == nil {
			l, by, waited, err = s.acquireWaiting(r.Context(), key, req.Owner, ttl, start, waitEnd, budgetEnd)
		}
	} else {
		l, by, err = s.grant(r.Context(), key, req.Owner, ttl, budgetEnd)
	}
	if err != nil {
		s.fail(r.Context(), w, "acquire", key, err, "owner", req.Owner)
		return
	}
	g := s.holderGrant(l)
	if req.WaitMs > 0 {
		g.WaitedMs = waited.Milliseconds()
	}
	// The last moment to take the grant back: once the 200 is written the
	// caller may hold it. A request that has ended by now (its caller
	// went away while the backend granted it) is answered an error
	// instead, so the grant is one nobody can have, and is released
	// (abandon.go) rather than left to its TTL.
	if cerr := r.Context().Err(); cerr != nil {
		s.releaseAbandoned(r.Context(), l, abandonedBeforeAnswer)
		s.fail(r.Context(), w, "acquire", key, fmt.Errorf("%w: the request ended before its grant (token %d) was answered; the grant is released: %w", store.ErrUnavailable, l.Token, cerr),
			"owner", req.Owner, "token", l.Token)
		return
	}
	s.logLease(r.Context(), slog.LevelInfo, "lock granted", EventLockGranted, l, "grantedBy", by)
	writeJSON(w, http.StatusOK, g)
}

// grant asks the store for key once, on ctx bounded by callTimeout or,
// when it is earlier, budgetEnd (the caller's budget less the margin;
// zero: none) but never less than minBackendSlice, and applies the token
// floor (floor.go). by is GrantedByGroup when a Batcher sent the ask
// with other keys' in one store call, else GrantedByAcquire.
func (s *Server) grant(ctx context.Context, key, owner string, ttl time.Duration, budgetEnd time.Time) (l store.Lease, by string, err error) {
	d := s.callTimeout(ctx)
	if left := time.Until(budgetEnd); !budgetEnd.IsZero() && left < d {
		d = min(max(left, minBackendSlice), d)
	} else {
		ctx = overload.MarkFull(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// The floor as the request is sent (floor.go): read now, and again by
	// a Batcher when it sends the request after a wait in its queue.
	var floor atomic.Int64
	var group atomic.Bool
	floor.Store(s.issued.Load())
	ctx = withSendNote(ctx, func(members int) {
		floor.Store(s.issued.Load())
		group.Store(members > 1)
	})
	l, err = s.store.Acquire(ctx, key, owner, ttl)
	s.observe(ctx, err)
	if err == nil && l.Token <= floor.Load() {
		err = s.withdraw(ctx, l, floor.Load())
	}
	if err != nil {
		return store.Lease{}, "", err
	}
	s.noteIssued(l.Token)
	if group.Load() {
		return l, GrantedByGroup, nil
	}
	return l, GrantedByAcquire, nil
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request, key string) {
	var req api.RenewRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if err := store.ValidateLease(key, req.Owner, req.Token); err != nil {
		s.fail(r.Context(), w, "renew", key, err, "owner", req.Owner, "token", req.Token)
		return
	}
	r, release, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := s.backendCtx(r)
	defer cancel()
	l, err := s.store.Renew(ctx, key, req.Owner, req.Token)
	s.observe(ctx, err)
	if err != nil {
		s.fail(r.Context(), w, "renew", key, err, "owner", req.Owner, "token", req.Token)
		return
	}
	s.logLease(r.Context(), slog.LevelDebug, "lease renewed", EventLeaseRenewed, l)
	writeJSON(w, http.StatusOK, s.holderGrant(l))
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, key string) {
	var req api.ReleaseRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if err := store.ValidateLease(key, req.Owner, req.Token); err != nil {
		s.fail(r.Context(), w, "release", key, err, "owner", req.Owner, "token", req.Token)
		return
	}
	r, release, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := s.backendCtx(r)
	defer cancel()
	err := s.releaseAndWake(ctx, store.LeaseRef{Key: key, Owner: req.Owner, Token: req.Token})
	if err != nil {
		s.fail(r.Context(), w, "release", key, err, "owner", req.Owner, "token", req.Token)
		return
	}
	s.log.DebugContext(ctx, "lease released", "event", EventLeaseReleased, "key", key, "owner", req.Owner, "token", req.Token)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request, key string) {
	var req api.RevokeRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Reason != "" && !jsonhandler.Text(req.Reason, api.MaxReasonLen) {
		// The one rule for stored free text (the reason goes to the log
		// and the operator's audit trail): no control characters.
		s.fail(r.Context(), w, "revoke", key, fmt.Errorf("%w: reason must be at most %d bytes of text without control characters (%d bytes given)",
			store.ErrInvalidArgument, api.MaxReasonLen, len(req.Reason)))
		return
	}
	if err := store.ValidateRevokeToken(req.Token); err != nil {
		s.fail(r.Context(), w, "revoke", key, err, "token", req.Token)
		return
	}
	r, release, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := s.backendCtx(r)
	defer cancel()
	l, err := s.store.Revoke(ctx, key, req.Token)
	s.observe(ctx, err)
	if err != nil {
		s.fail(r.Context(), w, "revoke", key, err, "token", req.Token)
		return
	}
	s.waitq.wake(key)
	s.log.WarnContext(ctx, "lease force-revoked", "event", EventLeaseRevoked, "key", l.Key, "owner", l.Owner, "token", l.Token, "reason", req.Reason)
	writeJSON(w, http.StatusOK, grantOf(l))
}

// fail maps err to the error envelope (the one place where errors become
// HTTP statuses) and logs it. A backend failure is logged with its cause
// and answered with a generic message: connection details stay in the log.
// Every line is written with ctx, the request's context, so that it carries
// the request's trace (internal/logjson).
func (s *Server) fail(ctx context.Context, w http.ResponseWriter, op, key string, err error, attrs ...any) {
	status, code := statusOf(err)
	if code == api.CodeBackendUnavailable && errors.Is(ctx.Err(), context.Canceled) {
		// The caller went away (its request was cancelled or its
		// connection closed) before the answer: not the backend's failure.
		status, code = api.StatusRequestCancelled, api.CodeRequestCancelled
	}
	if len(key) > api.MaxKeyLen {
		key = key[:api.MaxKeyLen] + "..."
	}
	attrs = append([]any{"op", op, "key", key, "code", string(code), "error", err.Error()}, attrs...)
	msg := jsonhandler.ClientMessage(err)
	switch {
	case code == api.CodeBackendRestored:
		s.log.ErrorContext(ctx, "grant refused: backend may have been restored", append([]any{"event", EventBackendRestored}, attrs...)...)
		msg = fmt.Sprintf("%s %q refused: the backend is not provably the one earlier tokens were issued on (restored or rolled back); "+
			"an operator must run \"lockctl advance --past N\" with N at least the largest token ever issued", op, key)
	case status >= 500:
		s.log.ErrorContext(ctx, "lock request failed", append([]any{"event", opEvents[op].failed}, attrs...)...)
		msg = fmt.Sprintf("%s %q: the backend did not answer in time; the outcome is unknown", op, key)
		if code == api.CodeInternal {
			msg = op + ": internal error"
		}
	case code == api.CodeLockHeld:
		s.log.DebugContext(ctx, "lock request refused", append([]any{"event", opEvents[op].refused}, attrs...)...)
	case code == api.CodeRequestCancelled:
		s.log.InfoContext(ctx, "lock request ended by its caller before the answer", append([]any{"event", opEvents[op].refused}, attrs...)...)
		msg = fmt.Sprintf("%s %q: the request ended before lock-server answered; the outcome is unknown", op, key)
	default:
		s.log.InfoContext(ctx, "lock request refused", append([]any{"event", opEvents[op].refused}, attrs...)...)
	}
	writeError(w, status, code, msg)
}

// opEvents names the events fail logs for each operation: refused (a 4xx)
// and failed (a 5xx).
var opEvents = map[string]struct{ refused, failed string }{
	"acquire": {EventAcquireRefused, EventAcquireFailed},
	"renew":   {EventRenewRefused, EventRenewFailed},
	"release": {EventReleaseRefused, EventReleaseFailed},
	"revoke":  {EventRevokeRefused, EventRevokeFailed},
	"inspect": {EventInspectRefused, EventInspectFailed},
}

// statusOf maps a store error to its HTTP status and stable code.
func statusOf(err error) (int, api.Code) {
	switch {
	case errors.Is(err, store.ErrInvalidArgument):
		return http.StatusBadRequest, api.CodeInvalidRequest
	case errors.Is(err, store.ErrLockHeld):
		return http.StatusConflict, api.CodeLockHeld
	case errors.Is(err, store.ErrStaleToken):
		return http.StatusConflict, api.CodeStaleToken
	case errors.Is(err, store.ErrNotHeld):
		return http.StatusConflict, api.CodeLeaseNotHeld
	case errors.Is(err, store.ErrBackendRestored):
		return http.StatusServiceUnavailable, api.CodeBackendRestored
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, api.CodeBackendUnavailable
	default:
		return http.StatusInternalServerError, api.CodeInternal
	}
}

func grantOf(l store.Lease) api.Grant {
	return api.Grant{
		Key: l.Key, Owner: l.Owner, Token: l.Token, LeaseID: l.LeaseID,
		TTLMs: l.TTL.Milliseconds(), ExpiresAt: l.ExpiresAt.UTC(),
	}
}

// holderGrant is grantOf(l) with the grant's proof when the Server has a
// ProofKey: the answer to the holder itself (acquire, renew).
func (s *Server) holderGrant(l store.Lease) api.Grant {
	g := grantOf(l)
	if !s.cfg.ProofKey.IsZero() {
		g.Proof = s.cfg.ProofKey.SignGrant(l.Key, l.Token, time.Now())
	}
	return g
}

// decodeBody decodes the request body into dst (see
// jsonhandler.DecodeRefusingNull: a field sent as null is refused, for every
// request of lockserver/api). It writes the error envelope and returns
// false when the body is refused.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any) bool {
	if err := jsonhandler.DecodeRefusingNull(w, r, dst, api.MaxBodyBytes); err != nil {
		e := err.(*jsonhandler.Error)
		writeError(w, e.Status, api.Code(e.Code), e.Message)
		return false
	}
	return true
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allowed string) {
	w.Header().Set("Allow", allowed)
	writeError(w, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s; use %s", r.Method, r.URL.Path, allowed))
}

// writeError writes the error envelope, telling the metrics recorder (if w
// is one) which code it sent.
func writeError(w http.ResponseWriter, status int, code api.Code, msg string) {
	if rec, ok := w.(*recorder); ok {
		rec.noteError(code)
	}
	if status == http.StatusServiceUnavailable && code.Retryable() {
		overload.SetRetryAfter(w.Header())
	}
	jsonhandler.WriteError(w, status, string(code), msg, code.Retryable())
}

func writeJSON(w http.ResponseWriter, status int, v any) { jsonhandler.WriteJSON(w, status, v) }

// logLease writes the events that let one token be traced from the grant
// to the fence points: lock_granted and lease_renewed carry key, owner and
// token, and lock_granted which path granted it (more: "grantedBy").
func (s *Server) logLease(ctx context.Context, level slog.Level, msg, event string, l store.Lease, more ...any) {
	s.log.Log(ctx, level, msg, append([]any{"event", event, "key", l.Key, "owner", l.Owner, "token", l.Token,
		"leaseId", l.LeaseID, "ttlMs", l.TTL.Milliseconds(), "expiresAt", l.ExpiresAt.UTC()}, more...)...)
}
