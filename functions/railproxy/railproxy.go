// Package railproxy is fence point two of the payout pipeline: the only way
// to the payment rail, which has no fencing token and no idempotency key.
//
// New(ctx, cfg, logger) returns a Proxy, an http.Handler serving the routes
// of functions/railproxy/api (cfg from LoadConfig or DefaultConfig); Close
// it when done. Before calling the rail, in one raildb transaction, it
// raises the account's high-water mark to the presented token (409
// FENCED_OUT if the token is not above it), makes the attempt the payout's
// one forward (409 PAYOUT_ALREADY_SUBMITTED otherwise) and records it
// (attempt-before-forward). A refused submission never reaches the rail; a
// call whose outcome is unknown is 502 RAIL_AMBIGUOUS, left for
// reconciliation. RecoverRestore is the operator's step after raildb is
// restored. The design: docs/payout-pipeline.md.
package railproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/iso4217"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Defaults and bounds of Config. The bounds of requests are in package
// api.
const (
	// DefaultRailTimeout is the default of Config.RailTimeout.
	DefaultRailTimeout = 5 * time.Second
	// DefaultDBTimeout is the default of Config.DBTimeout.
	DefaultDBTimeout = 5 * time.Second
	// MaxTimeout bounds both timeouts of Config.
	MaxTimeout = 10 * time.Minute
)

// Errors of this package.
var (
	// ErrInvalidConfig: a Config field is out of bounds or an environment
	// variable does not parse.
	ErrInvalidConfig = errors.New("railproxy: invalid config")
	// ErrInvalidRequest: a request's token header, body or parameters are
	// malformed; nothing was recorded.
	ErrInvalidRequest = errors.New("railproxy: invalid request")
	// ErrInvalidToken: the X-Fencing-Token header is missing, repeated or
	// malformed (400 INVALID_TOKEN); nothing was recorded.
	ErrInvalidToken = errors.New("railproxy: invalid fencing token header")
	// ErrFencedOut: the token is not greater than the account's high-water.
	// The error also wraps a fencing.Refusal with both tokens.
	ErrFencedOut = errors.New("railproxy: stale fencing token")
	// ErrUnverifiedToken: the token has no proof that lock-server granted
	// it on payout:{accountId} (403; wraps fencing.ErrUnverified).
	ErrUnverifiedToken = errors.New("railproxy: fencing token not verified")
	// ErrAlreadySubmitted: the payout already has an attempt that went, or
	// may have gone, to the rail. The error also wraps an
	// *AlreadySubmitted with that attempt.
	ErrAlreadySubmitted = errors.New("railproxy: payout already submitted")
	// ErrRailAmbiguous: the rail was called and did not answer ACK or
	// DECLINE (timeout, connection failure, 5xx, anything else); the money
	// may have moved.
	ErrRailAmbiguous = errors.New("railproxy: rail outcome unknown")
	// ErrRailNotReached: the rail certainly did not take the submission
	// (the connection was never established, or the rail answered that it
	// recorded nothing); no money moved and the payout may be submitted
	// again (503 RAIL_NOT_REACHED, retryable).
	ErrRailNotReached = errors.New("railproxy: the rail did not take the submission")
	// ErrPayoutStopped: the rail refused the submission for a stop order
	// on the payout's reference (409 PAYOUT_STOPPED); no money moved.
	ErrPayoutStopped = errors.New("railproxy: the payout's reference is stopped at the rail")
	// ErrUnavailable: raildb could not be reached or did not answer in
	// time, or the proxy is closed.
	ErrUnavailable = errors.New("railproxy: unavailable")
	// ErrInFlight: a reconciliation of an attempt that is younger than the
	// abandon threshold: the original forward may still be running.
	ErrInFlight = errors.New("railproxy: submission still in flight")
	// ErrNotForwarded: a reconciliation of a payout that has no forwarded
	// attempt.
	ErrNotForwarded = errors.New("railproxy: payout never forwarded")
	// ErrRailSubmittedTwice: the rail's record holds more than one
	// submission of the payout (a safety violation).
	ErrRailSubmittedTwice = errors.New("railproxy: the rail holds more than one submission of the payout")
	// ErrNotFound: no such route, or no high-water for the account.
	ErrNotFound = errors.New("railproxy: not found")
	// errMethod is a request with a method the route does not serve.
	errMethod = errors.New("railproxy: method not allowed")
	// errOverloaded: the in-flight bound is reached (503 OVERLOADED).
	errOverloaded = errors.New("railproxy: too many requests in flight")
	// errReconciling marks the failures of a reconciliation, whose 503
	// message differs from a submission's (see fail).
	errReconciling = errors.New("railproxy: reconciliation")
	// errStalled: raildb is marked stalled and this request is not the
	// probe; always wrapped with ErrUnavailable (503 UNAVAILABLE).
	errStalled = errors.New("railproxy: raildb is marked stalled (a transaction ran out its whole timeout); not tried")
)

// Config configures a Proxy. Start from DefaultConfig or LoadConfig.
type Config struct {
	// DB locates raildb: DSN from RAILDB_URL (required), CloudSQLInstance
	// from RAILDB_INSTANCE (optional; dial through the Cloud SQL connector).
	DB pgpool.Config
	// RailURL is the rail's base URL (http or https); submissions are
	// POSTed to RailURL + rail.PathSubmit. Required. Env RAIL_URL.
	RailURL string
	// RailTimeout bounds one call to the rail, from dial to the end of the
	// answer. When it runs out the outcome is unknown: the attempt is
	// marked 'ambiguous'. Default 5s; at most MaxTimeout. Env
	// RAIL_TIMEOUT_MS.
	RailTimeout time.Duration
	// DBTimeout bounds each raildb transaction of a request (the fence, the
	// recording of the rail's answer, a read). Default 5s; at most
	// MaxTimeout. Env RAIL_PROXY_DB_TIMEOUT_MS.
	DBTimeout time.Duration
	// FencingDisabled switches the fence check off (the kill switch
	// rail.proxy.fencing.enabled, env RAIL_PROXY_FENCING_ENABLED=false).
	// The zero value keeps fencing on. Only for the fencing experiment: a
	// stale holder then reaches the rail.
	FencingDisabled bool
	// ProofKeys are the public keys of lock-server's grant proofs: a
	// submission passes the fence only with a proof that lock-server
	// granted its token on payout:{accountId} (fencing.Verify), so no
	// token it did not issue there can raise the account's high-water.
	// Required while fencing is on. Env LOCK_PROOF_KEYS.
	ProofKeys fenceproof.Keyring
	// WrapRailTransport, when set, wraps the transport of the calls to the
	// rail: cmd/rail-proxy adds Cloud Run ID tokens with it
	// (api.EnvRailIDTokens). Not read from the environment. Default nil:
	// the calls go out as they are.
	WrapRailTransport func(http.RoundTripper) http.RoundTripper
	// ReceiptKey signs rail-proxy's receipts (SubmitAnswer.Receipt,
	// Attempt.Receipt): payment-resource records an ACK or DECLINE only
	// with one. Required; a secret. Env RAIL_RECEIPT_SIGNING_KEY.
	ReceiptKey fenceproof.SigningKey
	// TermsKeys are the public keys of payment-resource's payout-terms
	// signatures: a submission is forwarded only when one of them signed
	// exactly its payout id, account, amount and currency (terms.go).
	// Required, fencing on or off: it is authenticity, not fencing. Env
	// PAYMENT_TERMS_KEYS.
	TermsKeys fenceproof.Keyring
	// TermsNotRequired lets a submission (or closing reconciliation) that
	// carries no terms signature at all through the terms check, logged
	// EventTermsUnsigned at WARN, instead of refusing it 403
	// TERMS_UNSIGNED; a signature that is sent is verified all the same.
	// The zero value requires the signature. Only for a rolling deploy
	// over executors that do not send it yet (docs/payout-pipeline.md).
	// Env RAIL_PROXY_TERMS_REQUIRED=false (rail.proxy.terms.required).
	TermsNotRequired bool
	// MaxInFlight bounds the requests served at once; one more is answered
	// 503 OVERLOADED with Retry-After at once, nothing recorded and the
	// rail not called (internal/overload). Default
	// overload.DefaultMaxInFlight (256); 1 to overload.MaxMaxInFlight. Env
	// RAIL_PROXY_MAX_IN_FLIGHT.
	MaxInFlight int
	// StallProbeInterval is how often, while raildb is marked stalled (a
	// transaction ran out its whole DBTimeout), one request is let through
	// to probe it; the others get 503 UNAVAILABLE with Retry-After at
	// once, before any transaction (nothing recorded, the rail not
	// called). A submission already past the fence is never cut by it.
	// Default overload.DefaultStallProbeInterval (500ms); at most
	// overload.MaxStallProbeInterval. Env RAIL_PROXY_STALL_PROBE_MS.
	StallProbeInterval time.Duration
	// StallAfter: when a raildb transaction before the rail call (the
	// fence, a read, a reconciliation) has run this long and no raildb
	// call has answered since it started, and a ping on a new connection
	// gets no answer within as long either (pgpool.PingOnNewConn), raildb
	// is marked stalled and every such transaction still running is cut (rolled back,
	// the rail not called; an admission already sent in one statement
	// only when raildb runs it past its deadline, at most half
	// StallAfter after its sending) and answered 503 UNAVAILABLE
	// (overload.Config.StallAfter). The recording of the rail's answer is
	// never cut: it runs its whole DBTimeout. Default
	// overload.DefaultStallAfter (1s); 0 turns it off; at most
	// overload.MaxStallProbeInterval. Env RAIL_PROXY_STALL_AFTER_MS.
	StallAfter time.Duration
	// Now is the clock of the stall probes; nil means time.Now. For tests;
	// not read from the environment.
	Now func() time.Time
}

// DefaultConfig returns the defaults documented on Config; DB.DSN and
// RailURL are left empty (required).
func DefaultConfig() Config {
	return Config{RailTimeout: DefaultRailTimeout, DBTimeout: DefaultDBTimeout,
		MaxInFlight: overload.DefaultMaxInFlight, StallProbeInterval: overload.DefaultStallProbeInterval, StallAfter: overload.DefaultStallAfter}
}

// EnvNames returns the environment variables LoadConfig reads (the
// constants of functions/railproxy/api), for envcheck.
func EnvNames() []string {
	return []string{api.EnvDatabaseURL, api.EnvDatabaseInstance, api.EnvRailURL, api.EnvRailTimeoutMs,
		api.EnvDBTimeoutMs, api.EnvFencingEnabled, api.EnvProofKeys, api.EnvReceiptSigningKey, api.EnvMaxInFlight, api.EnvStallProbeMs,
		api.EnvStallAfterMs, api.EnvTermsKeys, api.EnvTermsRequired}
}

// Validate returns nil or one error per invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig and naming the field and
// its environment variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.DB.DSN == "" {
		bad("DB.DSN (%s) is required: a PostgreSQL DSN of raildb", api.EnvDatabaseURL)
	} else if err := c.DB.Validate(); err != nil {
		bad("DB (%s, %s): %v", api.EnvDatabaseURL, api.EnvDatabaseInstance, err)
	}
	u, err := url.Parse(c.RailURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		bad("RailURL (%s) %q must be an http(s) URL without query", api.EnvRailURL, c.RailURL)
	}
	if c.RailTimeout <= 0 || c.RailTimeout > MaxTimeout {
		bad("RailTimeout (%s) %v must be in (0, %v]", api.EnvRailTimeoutMs, c.RailTimeout, MaxTimeout)
	}
	if c.DBTimeout <= 0 || c.DBTimeout > MaxTimeout {
		bad("DBTimeout (%s) %v must be in (0, %v]", api.EnvDBTimeoutMs, c.DBTimeout, MaxTimeout)
	}
	if c.ProofKeys.Len() == 0 && !c.FencingDisabled {
		bad("ProofKeys (%s) is required while fencing is on: lock-server's public keys (lockctl proof-key makes a pair)", api.EnvProofKeys)
	}
	if c.ReceiptKey.IsZero() {
		bad("ReceiptKey (%s) is required: the secret key rail-proxy signs its receipts with (lockctl proof-key makes one)", api.EnvReceiptSigningKey)
	}
	if c.TermsKeys.Len() == 0 {
		bad("TermsKeys (%s) is required: payment-resource's public payout-terms keys", api.EnvTermsKeys)
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > overload.MaxMaxInFlight {
		bad("MaxInFlight (%s) %d is outside 1..%d", api.EnvMaxInFlight, c.MaxInFlight, overload.MaxMaxInFlight)
	}
	if c.StallProbeInterval <= 0 || c.StallProbeInterval > overload.MaxStallProbeInterval {
		bad("StallProbeInterval (%s) %v is outside (0, %v]", api.EnvStallProbeMs, c.StallProbeInterval, overload.MaxStallProbeInterval)
	}
	if c.StallAfter < 0 || c.StallAfter > overload.MaxStallProbeInterval {
		bad("StallAfter (%s) %v is outside [0, %v]", api.EnvStallAfterMs, c.StallAfter, overload.MaxStallProbeInterval)
	}
	return errors.Join(errs...)
}

// LoadConfig returns DefaultConfig overridden by the variables of EnvNames
// (RAILDB_URL, RAILDB_INSTANCE, RAIL_URL, RAIL_TIMEOUT_MS,
// RAIL_PROXY_DB_TIMEOUT_MS, RAIL_PROXY_FENCING_ENABLED, LOCK_PROOF_KEYS,
// RAIL_RECEIPT_SIGNING_KEY, RAIL_PROXY_MAX_IN_FLIGHT,
// RAIL_PROXY_STALL_PROBE_MS, RAIL_PROXY_STALL_AFTER_MS, PAYMENT_TERMS_KEYS,
// RAIL_PROXY_TERMS_REQUIRED), read through
// getenv (an empty value keeps the default), then validated. It reports
// every unparsable variable and every invalid field at once, joined; each
// error wraps ErrInvalidConfig and names the variable to fix.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.DB.DSN = strings.TrimSpace(getenv(api.EnvDatabaseURL))
	c.DB.CloudSQLInstance = strings.TrimSpace(getenv(api.EnvDatabaseInstance))
	c.RailURL = strings.TrimSpace(getenv(api.EnvRailURL))
	var errs []error
	for _, d := range []struct {
		env string
		dst *time.Duration
	}{{api.EnvRailTimeoutMs, &c.RailTimeout}, {api.EnvDBTimeoutMs, &c.DBTimeout}} {
		v := strings.TrimSpace(getenv(d.env))
		if v == "" {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > MaxTimeout.Milliseconds() {
			errs = append(errs, fmt.Errorf("%w: %s=%q must be milliseconds in [1, %d]", ErrInvalidConfig, d.env, v, MaxTimeout.Milliseconds()))
			continue
		}
		*d.dst = time.Duration(ms) * time.Millisecond
	}
	for _, err := range (overload.Env{MaxInFlight: api.EnvMaxInFlight, StallProbeMs: api.EnvStallProbeMs, StallAfterMs: api.EnvStallAfterMs}).
		Load(getenv, &c.MaxInFlight, &c.StallProbeInterval, &c.StallAfter) {
		errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
	}
	on, err := fencing.Switch(api.EnvFencingEnabled, getenv(api.EnvFencingEnabled))
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
	}
	c.FencingDisabled = !on
	required, err := fencing.Switch(api.EnvTermsRequired, getenv(api.EnvTermsRequired))
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
	}
	c.TermsNotRequired = !required
	if v := strings.TrimSpace(getenv(api.EnvProofKeys)); v != "" {
		if c.ProofKeys, err = fencing.ParseKeys(api.EnvProofKeys, v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
		}
	}
	if v := strings.TrimSpace(getenv(api.EnvTermsKeys)); v != "" {
		if c.TermsKeys, err = fencing.ParseKeys(api.EnvTermsKeys, v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
		}
	}
	if v := strings.TrimSpace(getenv(api.EnvReceiptSigningKey)); v != "" {
		if c.ReceiptKey, err = fenceproof.ParseSigningKey(v); err != nil {
			// A secret: the error names the key id at most.
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, api.EnvReceiptSigningKey, err))
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// AlreadySubmitted is the refusal of a second submission of a payout: the
// attempt that went to the rail first. It is an error value, wrapped with
// ErrAlreadySubmitted by the submission path.
type AlreadySubmitted struct {
	// First is the payout's forwarded attempt, as locked by the refusing
	// transaction: acked, declined, ambiguous, or still forwarding.
	First api.Attempt
}

// Error describes the refusal.
func (a *AlreadySubmitted) Error() string {
	return fmt.Sprintf("payout %s already went to the rail with attempt %d (token %d, state %s)",
		a.First.PayoutID, a.First.AttemptID, a.First.Token, a.First.State)
}

// Proxy is the rail-proxy HTTP handler. It is safe for concurrent use and
// starts no goroutine of its own; Close waits for the requests in flight.
type Proxy struct {
	cfg       Config
	log       *slog.Logger
	pool      *pgxpool.Pool
	closePool func()
	rail      *http.Client
	transport *http.Transport
	submitURL string
	stopURL   string
	mux       *http.ServeMux
	metered   http.Handler // serve, counted by httpmetrics

	guard  *overload.Guard // in-flight bound and stall breaker
	detach func()          // from guardGauges

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
}

// guardGauges publishes the in-flight bound and the stall breaker of
// every Proxy of the process (one, in production).
var guardGauges = func() *overload.Gauges {
	g, err := overload.NewGauges(overload.Metrics{
		Stalled:      "railproxy_db_stalled",
		StalledHelp:  "1 while raildb is marked stalled (a transaction ran out its whole timeout) and requests are answered 503 " + string(api.CodeUnavailable) + " at once; 0 otherwise.",
		InFlight:     "railproxy_requests_in_flight",
		InFlightHelp: "Requests rail-proxy is serving past their input checks (at most " + api.EnvMaxInFlight + "; one more is answered 503 " + string(api.CodeOverloaded) + ").",
	})
	if err != nil {
		panic(err) // the names above are constants
	}
	return g
}()

// MetricForwards is the name of the counter of forwards by the state
// their attempt ended in (forwards).
const MetricForwards = "railproxy_forwards_total"

// forwards counts the submissions rail-proxy passed on to the rail, by the
// state the call left their attempt in: api.StateAcked or
// api.StateDeclined (the rail answered), api.StateAmbiguous (the rail was
// called and its outcome is unknown: answered RAIL_AMBIGUOUS),
// api.StateNotSent (the rail certainly did not take it) or
// api.StateNotAtRail (the rail refused a stopped reference). Every state
// is present at 0, so that the first one is an increase.
var forwards = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricForwards,
		Help: "Submissions forwarded to the rail, by the state the call left their attempt in: " + string(api.StateAcked) + ", " +
			string(api.StateDeclined) + ", " + string(api.StateAmbiguous) + " (outcome unknown, answered " + string(api.CodeRailAmbiguous) + "), " +
			string(api.StateNotSent) + " or " + string(api.StateNotAtRail) + ".",
	}, []string{"state"})
	for _, s := range []api.State{api.StateAcked, api.StateDeclined, api.StateAmbiguous, api.StateNotSent, api.StateNotAtRail} {
		c.WithLabelValues(string(s))
	}
	return c
}()

// Collectors returns rail-proxy's metrics, for the registry its process
// serves: railproxy_db_stalled (1 while raildb is marked stalled) and
// railproxy_requests_in_flight, over every Proxy of the process;
// railproxy_forwards_total{state}; and the fence point's
// fence_refusals_total and fence_unverified_tokens_total
// (fencing.Collectors).
func Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{guardGauges, forwards}, fencing.Collectors()...)
}

// New opens raildb (pgpool.Open), applies the pending migrations and
// returns the Proxy. ctx bounds the start only. It logs at WARN when
// fencing is disabled. Errors wrap ErrInvalidConfig (invalid cfg, nil
// logger) or describe the failed connection or migration.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Proxy, error) {
	if log == nil {
		return nil, fmt.Errorf("%w: nil logger", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pool, closePool, err := pgpool.Open(ctx, cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("railproxy: open raildb: %w", err)
	}
	guard, err := overload.New(overload.Config{MaxInFlight: cfg.MaxInFlight, StallProbeInterval: cfg.StallProbeInterval,
		StallAfter: cfg.StallAfter, Ping: pgpool.PingOnNewConn(pool), Now: cfg.Now}, log)
	if err != nil {
		closePool()
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if err := migrate(ctx, pool); err != nil {
		closePool()
		return nil, err
	}
	fencing.WarnIfOff(log, api.EnvFencingEnabled, !cfg.FencingDisabled)
	if cfg.TermsNotRequired {
		log.Warn("payout terms are NOT required: submissions without payment-resource's signature are forwarded; only during a rolling deploy",
			"event", api.EventTermsNotRequired, "switch", api.EnvTermsRequired)
	}
	tr := newRailTransport()
	var railTransport http.RoundTripper = tr
	if cfg.WrapRailTransport != nil {
		railTransport = cfg.WrapRailTransport(tr)
	}
	railTransport = tracing.Transport(railTransport) // a client span per rail call, traceparent sent
	p := &Proxy{
		cfg:       cfg,
		log:       log,
		pool:      pool,
		closePool: closePool,
		transport: tr,
		rail: &http.Client{
			Transport: railTransport,
			Timeout:   cfg.RailTimeout,
			// A redirect is not an answer: it ends as a non-200, ambiguous.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		submitURL: strings.TrimSuffix(cfg.RailURL, "/") + rail.PathSubmit,
		stopURL:   strings.TrimSuffix(cfg.RailURL, "/") + rail.PathStops,
		mux:       http.NewServeMux(),
		guard:     guard,
		detach:    guardGauges.Attach(guard),
	}
	p.mux.HandleFunc(api.PathSubmissions, p.handleSubmit)
	p.mux.HandleFunc(api.PathHighWater, p.handleHighWater)
	p.mux.HandleFunc(api.PathAttempts, p.handleAttempts)
	p.mux.HandleFunc(api.PathReconciliations, p.handleReconcile)
	p.mux.HandleFunc(api.PathUnsettled, p.handleUnsettled)
	p.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: no route for %s %s", ErrNotFound, r.Method, r.URL.Path))
	})
	p.metered = httpmetrics.Handler(MetricsFunction, httpmetrics.MuxRoutes(p.mux), http.HandlerFunc(p.serve))
	return p, nil
}

// ServeHTTP implements http.Handler. A request whose input passes (path,
// method, query, headers, body) and that arrives beyond
// Config.MaxInFlight is answered 503 OVERLOADED, and one that arrives
// while raildb is marked stalled (and is not the probe) 503 UNAVAILABLE,
// both at once, with Retry-After, before anything is recorded (begin).
// Bad input is answered its own 4xx whatever raildb's state.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.metered.ServeHTTP(w, r) }

// serve answers r; ServeHTTP counts and times it (package httpmetrics),
// refusals included.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: closing", ErrUnavailable))
		return
	}
	defer p.inflight.Done()
	p.mux.ServeHTTP(w, r)
}

// begin admits one request to raildb work: call it once the request's
// input has passed every check, so that bad input is answered its own 4xx
// whatever raildb's state (a malformed body during a stall is 400, not
// 503). It takes a slot of the in-flight bound and asks the stall breaker;
// a request they refuse is answered here (503 OVERLOADED, or 503
// UNAVAILABLE while raildb is marked stalled and this request is not the
// probe), with Retry-After, nothing recorded, and the refusal is
// returned. Otherwise release must be called once, when the request is
// done.
func (p *Proxy) begin(w http.ResponseWriter, r *http.Request) (release func(), refusal error) {
	release, reason, ok := p.guard.Admit()
	if !ok {
		err := fmt.Errorf("%w: %d requests in flight", errOverloaded, p.guard.InFlight())
		if reason == overload.ReasonStalled {
			err = fmt.Errorf("%w: %w", ErrUnavailable, errStalled)
		}
		p.fail(r.Context(), w, p.log, err)
		return nil, err
	}
	return release, nil
}

// noQuery refuses a query string on a route that takes none (400
// INVALID_REQUEST, as the routes that take some refuse an unknown one),
// answering itself; ok is false when it did. A parameter the client sent
// is never silently ignored: it may have meant something to the client.
func (p *Proxy) noQuery(w http.ResponseWriter, r *http.Request) (ok bool) {
	if _, err := jsonhandler.Query(r); err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return false
	}
	return true
}

// dbCall starts one raildb transaction before the rail call: ctx with
// DBTimeout, cut at once if raildb is marked stalled meanwhile
// (Config.StallAfter); done records its outcome for the stall breaker.
func (p *Proxy) dbCall(ctx context.Context) (context.Context, func(error)) {
	return p.guard.Call(ctx, p.cfg.DBTimeout, ErrUnavailable)
}

// dbCtx is the context of a raildb transaction that must not be cut (the
// recording of the rail's answer): ctx with DBTimeout, marked as raildb's
// full deadline for the stall breaker (observe).
func (p *Proxy) dbCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return overload.WithTimeout(ctx, p.cfg.DBTimeout)
}

// observe records the outcome of one raildb transaction made with ctx
// (from dbCtx) for the stall breaker.
func (p *Proxy) observe(ctx context.Context, err error) {
	p.guard.Observe(overload.Classify(ctx, err, ErrUnavailable), err)
}

// enter registers a request in flight; false once Close has begun.
func (p *Proxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.inflight.Add(1)
	return true
}

// Close refuses new requests (503 UNAVAILABLE), waits for those in flight
// (each is bounded by RailTimeout plus two DBTimeouts, since a forwarded
// submission finishes even when its caller has gone), then closes the
// rail client's idle connections and raildb's pool. It is idempotent and
// returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	p.inflight.Wait()
	p.transport.CloseIdleConnections()
	p.closePool()
	p.detach()
	return nil
}

// holder reads the lock holder's headers of a fenced request (token,
// proof, owner); it answers itself and returns ok=false when the token is
// malformed (400 INVALID_TOKEN), the owner is malformed (400
// INVALID_REQUEST), or, while fencing is on, the proof is sent more than
// once (403 UNVERIFIED_TOKEN, saying so). A malformed owner is
// refused like lock-server refuses it, never cut and stored: it would
// reach raildb.
func (p *Proxy) holder(w http.ResponseWriter, r *http.Request) (h fencewire.Holder, ok bool) {
	token, err := fencing.TokenFrom(r)
	if err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", ErrInvalidToken, err))
		return h, false
	}
	owner, err := fencing.OwnerFrom(r)
	if err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", ErrInvalidRequest, err))
		return h, false
	}
	proof, err := fencing.ProofFrom(r)
	if err != nil && !p.cfg.FencingDisabled {
		// Before the body is read: the account is not known yet.
		fencing.LogUnverified(r.Context(), p.log, "rail", "", token, owner, err)
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", ErrUnverifiedToken, err))
		return h, false
	}
	return fencewire.Holder{Token: token, Proof: proof, Owner: owner}, true
}

func (p *Proxy) handleSubmit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		p.methodNotAllowed(w, r, http.MethodPost)
		return
	}
	if !p.noQuery(w, r) {
		return
	}
	h, ok := p.holder(w, r)
	if !ok {
		return
	}
	token, owner := h.Token, h.Owner
	var req api.SubmitRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	if err := cmp.Or(req.Validate(), iso4217.Check(req.Currency)); err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	var err error
	if req.TermsSignature, err = termsSignature(r, req.BodyTermsSignature); err != nil {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	// Before the proof and the fence, fencing on or off: only terms
	// payment-resource signed go any further (terms.go).
	if err := p.verifyTerms(r.Context(), req, h); err != nil {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	// The fence span: the token presented, its verification and the
	// high-water mark's verdict.
	_, span := startFence(r.Context(), req, h, !p.cfg.FencingDisabled)
	if !p.cfg.FencingDisabled {
		// Before the fence: a token lock-server did not grant on this
		// account's lock must not raise its high-water mark.
		key := payoutevent.Event{AccountID: req.AccountID}.LockKey()
		if err := fencing.Verify(p.cfg.ProofKeys, h.Proof, key, token); err != nil {
			fencing.EndSpan(span, err)
			fencing.LogUnverified(r.Context(), p.log, "rail", req.AccountID, token, owner, err, "payoutId", req.PayoutID, "accountId", req.AccountID)
			p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", ErrUnverifiedToken, err))
			return
		}
	}
	// Every check of the input has passed: only now does raildb's state
	// (the in-flight bound, the stall breaker) decide.
	release, shed := p.begin(w, r)
	if shed != nil {
		fencing.EndSpan(span, shed)
		return
	}
	defer release()
	// From here on the submission does not depend on its caller staying:
	// once the fence has passed, the rail is called and its answer recorded
	// even if the caller hangs up, so that the audit learns the outcome.
	ctx := context.WithoutCancel(r.Context())
	lg := p.log.With("payoutId", req.PayoutID, "accountId", req.AccountID, "token", token, "ownerId", owner)

	attemptID, err := p.admit(trace.ContextWithSpan(ctx, span), req, token, owner, lg)
	endFence(span, attemptID, err)
	var (
		refusal fencing.Refusal
		dup     *AlreadySubmitted
	)
	switch {
	case errors.As(err, &refusal):
		refusal.Log(r.Context(), p.log, "payoutId", req.PayoutID, "accountId", req.AccountID, "token", token, "attemptId", attemptID)
		p.fail(r.Context(), w, lg, err)
		return
	case errors.As(err, &dup):
		lg.WarnContext(ctx, "payout already went to the rail; not forwarding it again", "event", api.EventSubmissionDuplicate,
			"attemptId", attemptID, "firstAttemptId", dup.First.AttemptID, "firstToken", dup.First.Token, "firstState", dup.First.State)
		status, code, _ := statusOf(err)
		dup.First.Receipt = p.receipt(dup.First.PayoutID, dup.First.AccountID, dup.First.AmountMinor, dup.First.Currency,
			dup.First.State, dup.First.RailRef, dup.First.Token)
		jsonhandler.WriteJSON(w, status, api.AlreadySubmittedAnswer{
			Error:   api.ErrorBody{Code: code, Message: jsonhandler.ClientMessage(err), Retryable: dup.First.State == api.StateForwarding},
			Attempt: dup.First,
		})
		return
	case err != nil:
		p.fail(r.Context(), w, lg, err)
		return
	}
	lg = lg.With("attemptId", attemptID)
	lg.DebugContext(ctx, "forwarding submission to the rail", "event", api.EventSubmissionForwarding,
		"amountMinor", req.AmountMinor, "currency", req.Currency)

	ans, err := p.forward(ctx, req)
	switch {
	case errors.Is(err, errNotSent):
		forwards.WithLabelValues(string(api.StateNotSent)).Inc()
		p.notReached(ctx, w, lg, attemptID, req.PayoutID, err)
		return
	case errors.Is(err, errRefStopped):
		forwards.WithLabelValues(string(api.StateNotAtRail)).Inc()
		p.stopped(ctx, w, lg, attemptID, err)
		return
	case err != nil:
		forwards.WithLabelValues(string(api.StateAmbiguous)).Inc()
		if ferr := p.finish(ctx, attemptID, api.StateAmbiguous, ""); ferr != nil {
			lg.ErrorContext(ctx, "could not record the ambiguous outcome; the attempt stays forwarding", "event", api.EventAttemptUpdateFailed, "error", ferr.Error())
		}
		lg.ErrorContext(ctx, "rail outcome unknown; the money may have moved: reconcile, never retry blindly",
			"event", api.EventSubmissionAmbiguous, "error", err.Error())
		p.fail(r.Context(), w, lg, fmt.Errorf("%w: attempt %d: %v", ErrRailAmbiguous, attemptID, err))
		return
	}
	state, event := api.StateAcked, api.EventSubmissionAcked
	if ans.Status == rail.StatusDecline {
		state, event = api.StateDeclined, api.EventSubmissionDeclined
	}
	forwards.WithLabelValues(string(state)).Inc()
	if ferr := p.finish(ctx, attemptID, state, ans.RailRef); ferr != nil {
		// The rail's answer is the truth about the money; answer it even
		// though the audit row could not be updated.
		lg.ErrorContext(ctx, "could not record the rail's answer; the attempt stays forwarding", "event", api.EventAttemptUpdateFailed,
			"state", state, "railRef", ans.RailRef, "error", ferr.Error())
	}
	lg.InfoContext(ctx, "rail answered "+ans.Status, "event", event, "railRef", ans.RailRef)
	jsonhandler.WriteJSON(w, http.StatusOK, api.SubmitAnswer{Status: api.RailStatus(ans.Status), RailRef: ans.RailRef, AttemptID: attemptID, Token: token,
		Receipt: p.receipt(req.PayoutID, req.AccountID, req.AmountMinor, req.Currency, state, ans.RailRef, token)})
}

// notReached answers a forward the rail certainly did not take (forward's
// errNotSent): the attempt is recorded not_sent and the payout's forward
// released (notSent), then 503 RAIL_NOT_REACHED, retryable. When the
// record fails, or the attempt was meanwhile recorded otherwise, the
// attempt stays the payout's forward: a later submission is answered
// PAYOUT_ALREADY_SUBMITTED and the payout goes to reconciliation, where
// the rail's record (nothing) settles it. The answer is the same: no money
// moved.
func (p *Proxy) notReached(ctx context.Context, w http.ResponseWriter, lg *slog.Logger, attemptID int64, payout string, cause error) {
	released, err := p.notSent(ctx, attemptID, payout)
	switch {
	case err != nil:
		lg.ErrorContext(ctx, "could not record that the rail did not take the submission; the attempt stays forwarding", "event", api.EventAttemptUpdateFailed,
			"state", api.StateNotSent, "error", err.Error())
	case !released:
		lg.WarnContext(ctx, "the rail did not take the submission, but the attempt was recorded otherwise meanwhile; it stays the payout's forward",
			"event", api.EventAttemptUpdateFailed, "state", api.StateNotSent)
	}
	lg.WarnContext(ctx, "the rail did not take the submission; nothing moved, the payout may be submitted again",
		"event", api.EventSubmissionNotReached, "released", released, "error", cause.Error())
	p.fail(ctx, w, lg, fmt.Errorf("%w: attempt %d: %v", ErrRailNotReached, attemptID, cause))
}

// stopped answers a forward the rail refused for a stop order on the
// payout's reference (forward's errRefStopped): the attempt is recorded
// not_at_rail (the rail holds nothing of it and never will), then 409
// PAYOUT_STOPPED.
func (p *Proxy) stopped(ctx context.Context, w http.ResponseWriter, lg *slog.Logger, attemptID int64, cause error) {
	if err := p.finish(ctx, attemptID, api.StateNotAtRail, ""); err != nil {
		lg.ErrorContext(ctx, "could not record the rail's refusal; the attempt stays forwarding", "event", api.EventAttemptUpdateFailed,
			"state", api.StateNotAtRail, "error", err.Error())
	}
	lg.WarnContext(ctx, "the rail refused the submission: a reconciliation stopped the payout's reference; nothing moved",
		"event", api.EventSubmissionStopped, "error", cause.Error())
	p.fail(ctx, w, lg, fmt.Errorf("%w: attempt %d: %v", ErrPayoutStopped, attemptID, cause))
}

// receipt signs the rail's answer to a payout's one forwarded submission
// (fencewire.RailReceipt) when state is StateAcked or StateDeclined, and
// a reconciliation's "nothing at the rail" (outcome NONE, no reference)
// when it is StateNotAtRail; "" otherwise (no answer to vouch for).
func (p *Proxy) receipt(payout, account string, amount int64, currency string, state api.State, railRef string, token int64) string {
	var outcome api.RailStatus
	switch state {
	case api.StateAcked:
		outcome = api.RailAck
	case api.StateDeclined:
		outcome = api.RailDecline
	case api.StateNotAtRail:
		outcome = api.RailNone
	default:
		return ""
	}
	rec := fencewire.RailReceipt{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: currency,
		Outcome: string(outcome), RailRef: railRef, RailToken: token}
	return p.cfg.ReceiptKey.Sign(fencewire.RailReceiptDomain, rec.Fields()...)
}

func (p *Proxy) handleHighWater(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.methodNotAllowed(w, r, http.MethodGet)
		return
	}
	if !p.noQuery(w, r) {
		return
	}
	acct := r.PathValue("accountId")
	if err := api.ValidateAccountID(acct); err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	release, shed := p.begin(w, r)
	if shed != nil {
		return
	}
	defer release()
	hw, err := p.highWater(r.Context(), acct)
	if err != nil {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, api.HighWater{AccountID: acct, HighWater: hw})
}

func (p *Proxy) handleAttempts(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.methodNotAllowed(w, r, http.MethodGet)
		return
	}
	q, err := jsonhandler.Query(r, api.QueryPayoutID)
	if err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	payout := q.Get(api.QueryPayoutID)
	if len(q[api.QueryPayoutID]) != 1 {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: query parameter %s must be given once", ErrInvalidRequest, api.QueryPayoutID))
		return
	}
	if err := api.ValidatePayoutID(payout); err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	release, shed := p.begin(w, r)
	if shed != nil {
		return
	}
	defer release()
	list, err := p.attempts(r.Context(), payout)
	if err != nil {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, api.AttemptList{Attempts: list})
}

func (p *Proxy) methodNotAllowed(w http.ResponseWriter, r *http.Request, allowed string) {
	w.Header().Set("Allow", allowed)
	p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %s %s; use %s", errMethod, r.Method, r.URL.Path, allowed))
}

// fail answers err with the envelope, through statusOf, and logs server
// failures (a restored raildb as the event raildb_restored). Refusals of
// bad input are logged at DEBUG; fenced_out, rail_submission_ambiguous,
// rail_submission_not_reached and rail_submission_stopped have been logged
// by the caller. A 5xx answer carries a generic message
// (serverMessage): the cause (a driver's error, SQL, the rail's address)
// goes to the log only. Every line is written with ctx, the request's
// context, so that it carries the request's trace (internal/logjson).
func (p *Proxy) fail(ctx context.Context, w http.ResponseWriter, lg *slog.Logger, err error) {
	status, code, retryable := statusOf(err)
	if code == api.CodeUnavailable && errors.Is(ctx.Err(), context.Canceled) {
		// The caller went away (it cancelled, or closed its connection)
		// before the answer: not raildb's failure.
		status, code, retryable = api.StatusRequestCancelled, api.CodeRequestCancelled, false
	}
	msg := jsonhandler.ClientMessage(err)
	if status >= 500 || code == api.CodeRequestCancelled {
		msg = serverMessage(code)
		if code == api.CodeUnavailable && errors.Is(err, errReconciling) {
			// A reconciliation's 503 cannot promise "nothing reached the
			// rail": the payout's forward may have, and the stop order too.
			msg = "rail-proxy, raildb or the rail did not answer; the reconciliation recorded nothing, the same request may be sent again"
		}
	}
	switch {
	case code == api.CodeRailAmbiguous || code == api.CodeFencedOut || code == api.CodeRailNotReached || code == api.CodePayoutStopped:
	case errors.Is(err, errOverloaded) || errors.Is(err, errStalled):
		// Shed at once: one line per refused request would flood the log
		// exactly when the service is in trouble; backend_stalled and the
		// gauges tell it once.
		lg.DebugContext(ctx, "rail-proxy request shed", "event", api.EventRequestFailed, "code", code, "error", err.Error())
	case code == api.CodeRestored:
		lg.ErrorContext(ctx, "raildb was restored: submission refused until rail-proxy recover-restore (docs/runbooks/raildb-restore.md)",
			"event", api.EventRaildbRestored, "code", code, "error", err.Error())
	case status >= 500:
		lg.ErrorContext(ctx, "rail-proxy request failed", "event", api.EventRequestFailed, "code", code, "error", err.Error())
	default:
		lg.DebugContext(ctx, "rail-proxy request refused", "event", api.EventRequestRefused, "code", code, "error", err.Error())
	}
	if status == http.StatusServiceUnavailable && retryable {
		overload.SetRetryAfter(w.Header())
	}
	jsonhandler.WriteJSON(w, status, api.ErrorEnvelope{Error: api.ErrorBody{Code: code, Message: msg, Retryable: retryable}})
}

// serverMessage is the message of a 5xx answer with code: fixed text that
// says what the caller may do, never the cause.
func serverMessage(code api.Code) string {
	switch code {
	case api.CodeRailAmbiguous:
		return "the rail was called and did not answer; the money may have moved: reconcile, never retry blindly"
	case api.CodeRailNotReached:
		return "the rail did not take the submission (not reached, or it recorded nothing); no money moved, the payout may be submitted again"
	case api.CodeRestored:
		return "raildb was restored from a backup; submissions are refused until an operator runs rail-proxy recover-restore"
	case api.CodeUnavailable:
		return "rail-proxy or raildb is unavailable; nothing reached the rail, the same request may be sent again"
	case api.CodeOverloaded:
		return "too many requests in flight; nothing was recorded and nothing reached the rail, the same request may be sent again after Retry-After"
	case api.CodeRequestCancelled:
		return "the request ended before rail-proxy answered; its outcome is unknown to the caller"
	}
	return "internal error; the cause is in rail-proxy's log (rail_request_failed)"
}

// statusOf maps an error to its HTTP status, code and retryability: the
// one place where rail-proxy's errors become answers.
func statusOf(err error) (status int, code api.Code, retryable bool) {
	var decodeErr *jsonhandler.Error
	switch {
	case errors.As(err, &decodeErr):
		return decodeErr.Status, api.Code(decodeErr.Code), false
	case errors.Is(err, ErrInvalidToken):
		return http.StatusBadRequest, api.CodeInvalidToken, false
	case errors.Is(err, ErrInvalidRequest):
		return http.StatusBadRequest, api.CodeInvalidRequest, false
	case errors.Is(err, ErrFencedOut):
		return http.StatusConflict, api.CodeFencedOut, false
	case errors.Is(err, ErrUnverifiedToken):
		return http.StatusForbidden, api.CodeUnverifiedToken, false
	case errors.Is(err, ErrInvalidTerms):
		return http.StatusForbidden, api.CodeInvalidTerms, false
	case errors.Is(err, ErrTermsKeyUnknown):
		return http.StatusForbidden, api.CodeTermsKeyUnknown, true
	case errors.Is(err, ErrTermsUnsigned):
		return http.StatusForbidden, api.CodeTermsUnsigned, false
	case errors.Is(err, ErrAlreadySubmitted):
		return http.StatusConflict, api.CodeAlreadySubmitted, false
	case errors.Is(err, ErrRailAmbiguous):
		return http.StatusBadGateway, api.CodeRailAmbiguous, false
	case errors.Is(err, ErrRailNotReached):
		return http.StatusServiceUnavailable, api.CodeRailNotReached, true
	case errors.Is(err, ErrPayoutStopped):
		return http.StatusConflict, api.CodePayoutStopped, false
	case errors.Is(err, ErrInFlight):
		return http.StatusConflict, api.CodeAttemptInFlight, true
	case errors.Is(err, ErrNotForwarded):
		return http.StatusNotFound, api.CodeNotForwarded, false
	case errors.Is(err, ErrRailSubmittedTwice):
		return http.StatusConflict, api.CodeRailSubmittedTwice, false
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, api.CodeNotFound, false
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, false
	case errors.Is(err, ErrRestored):
		return http.StatusServiceUnavailable, api.CodeRestored, true
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable, api.CodeUnavailable, true
	case errors.Is(err, errOverloaded):
		return http.StatusServiceUnavailable, api.CodeOverloaded, true
	default:
		return http.StatusInternalServerError, api.CodeInternal, false
	}
}

// MetricsFunction is this function's value of the function label of the
// request metrics (package httpmetrics).
const MetricsFunction = "rail-proxy"

// newRailTransport is the transport of the calls to the rail: the default
// one, limited to HTTP/1.1. Go's HTTP/1 client never sends a POST again
// on its own (it has no idempotency key), but its HTTP/2 client does,
// after a server resets the stream with PROTOCOL_ERROR, even when the
// server had already acted on it: one rail call could then pay twice,
// with no attempt of rail-proxy to show for the second payment. A rail
// on TLS (rail-stub on Cloud Run) would otherwise negotiate HTTP/2.
func newRailTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Keep a connection per payout in flight for reuse (net/http keeps 2
	// idle per host: the others were opened and closed for every call).
	tr.MaxIdleConnsPerHost = 64
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	return tr
}
