// Package railproxy is fence point two of the payout pipeline: the only way
// to the external payment rail, which has no fencing token and no
// idempotency key of its own (see package railstub).
//
// For every submission it keeps, in its own database (raildb), the highest
// fencing token accepted per account (rail_high_water), the one attempt
// per payout that went to the rail (rail_payout) and an audit row per
// attempt (rail_attempt). In ONE transaction, BEFORE the rail is called,
// it
//
//  0. checks that raildb is the database those records were written on
//     (the restore guard, guard.go): after a restore from a backup it is
//     not, and the submission is refused with 503 RAILDB_RESTORED until an
//     operator runs "rail-proxy recover-restore" (RecoverRestore), which
//     also sets a token floor at or below which every token is refused;
//  1. raises the account's high-water to the presented token with a
//     conditional statement; a token not greater than the high-water
//     (strict: an equal token is stale too) is refused with 409
//     FENCED_OUT, recorded as a 'fenced' attempt and logged as the
//     fenced_out event;
//  2. makes the attempt the payout's one forward; when an earlier attempt
//     of the payout already went (or may have gone) to the rail, the
//     submission is refused with 409 PAYOUT_ALREADY_SUBMITTED, recorded as
//     a 'duplicate' attempt, and the answer carries that earlier attempt,
//     whose outcome the caller reports instead;
//  3. records the attempt 'forwarding' (attempt-before-forward).
//
// Only after that transaction commits is the rail called, and its answer
// recorded. A refused submission never reaches the rail.
//
// Why both checks. The fence orders writes: once a token has been accepted
// for an account, no request with a lower or equal token reaches the rail
// through any rail-proxy sharing the database, before or after a restart.
// It cannot stop a lower token that arrives FIRST: a stale holder whose
// submission overtakes the new holder's finds a high-water it is above,
// and is let through; the new holder's submission, with its greater token,
// would pass the fence too. Check 2 is what stops that second payment: the
// decision "this payout has not been sent yet" is taken inside the
// transaction that records the send, never from an earlier read.
//
// What it does not guarantee: the order of arrival at the rail is not the
// order of tokens (the call happens after the commit); and the outcome of
// a call that timed out, lost its connection or got a 5xx is unknown (the
// money may have moved), so the attempt is marked 'ambiguous', answered
// 502 RAIL_AMBIGUOUS, not retryable, and left for reconciliation with the
// rail's records. Never retry such a submission blindly. An attempt left
// 'forwarding' by a rail-proxy that died while calling the rail is marked
// 'ambiguous' by the next submission of its payout once no live
// rail-proxy can still be calling (see AlreadySubmittedAnswer).
//
// Routes (every error answer is the envelope of package httpjson):
//
//	POST /v1/rail/submissions             headers X-Fencing-Token (required),
//	                                      X-Lock-Owner (logs only);
//	                                      body SubmitRequest (at most 4 KiB)
//	    200 SubmitAnswer                  the rail answered ACK or DECLINE
//	    400 INVALID_REQUEST, 413 BODY_TOO_LARGE, 415 UNSUPPORTED_MEDIA_TYPE
//	                                      nothing recorded, rail not called
//	    409 FENCED_OUT                    stale token (not above the account's
//	                                      high-water, or at or below the token
//	                                      floor); attempt recorded 'fenced'
//	    409 PAYOUT_ALREADY_SUBMITTED      AlreadySubmittedAnswer: the payout
//	                                      already went to the rail; attempt
//	                                      recorded 'duplicate'
//	    502 RAIL_AMBIGUOUS                rail outcome unknown; not retryable
//	    503 UNAVAILABLE                   raildb unreachable or proxy closing
//	                                      before forwarding; rail not called
//	    503 RAILDB_RESTORED               raildb restored from a backup; nothing
//	                                      recorded, rail not called; retryable
//	                                      after rail-proxy recover-restore
//	GET  /v1/rail/high-water/{accountId}  200 HighWater, 404 NOT_FOUND
//	GET  /v1/rail/attempts?payoutId=P     200 AttemptList (oldest first)
//
// The kill switch Config.FencingDisabled (RAIL_PROXY_FENCING_ENABLED=false)
// exists only for the fencing experiment: both checks are skipped, the
// attempt is still recorded, the high-water still raised to the greatest
// token seen and the payout's first forward still kept, so that both stay
// meaningful when fencing is switched back on.
package railproxy

import (
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
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Environment variables read by LoadConfig.
const (
	// EnvDatabaseURL sets Config.DB.DSN (required).
	EnvDatabaseURL = "RAILDB_URL"
	// EnvDatabaseInstance sets Config.DB.CloudSQLInstance.
	EnvDatabaseInstance = "RAILDB_INSTANCE"
	// EnvRailURL sets Config.RailURL (required).
	EnvRailURL = "RAIL_URL"
	// EnvRailTimeoutMs sets Config.RailTimeout (milliseconds).
	EnvRailTimeoutMs = "RAIL_TIMEOUT_MS"
	// EnvDBTimeoutMs sets Config.DBTimeout (milliseconds).
	EnvDBTimeoutMs = "RAIL_PROXY_DB_TIMEOUT_MS"
	// EnvFencingEnabled is the kill switch rail.proxy.fencing.enabled
	// (default true); "false" sets Config.FencingDisabled.
	EnvFencingEnabled = "RAIL_PROXY_FENCING_ENABLED"
)

// Defaults and bounds of Config and of requests.
const (
	// DefaultRailTimeout is the default of Config.RailTimeout.
	DefaultRailTimeout = 5 * time.Second
	// DefaultDBTimeout is the default of Config.DBTimeout.
	DefaultDBTimeout = 5 * time.Second
	// MaxTimeout bounds both timeouts of Config.
	MaxTimeout = 10 * time.Minute
	// MaxBodyBytes bounds the body of POST /v1/rail/submissions.
	MaxBodyBytes = 4 << 10
	// MaxPayoutIDLen bounds SubmitRequest.PayoutID, in bytes
	// (payoutevent.MaxPayoutIDLen).
	MaxPayoutIDLen = payoutevent.MaxPayoutIDLen
	// MaxAccountIDLen bounds SubmitRequest.AccountID, in bytes
	// (payoutevent.MaxAccountIDLen).
	MaxAccountIDLen = payoutevent.MaxAccountIDLen
)

// Routes.
const (
	// PathSubmissions is the route of POST submissions.
	PathSubmissions = "/v1/rail/submissions"
	// PathHighWaterPrefix, followed by an account id, is the route of GET
	// high-water.
	PathHighWaterPrefix = "/v1/rail/high-water/"
	// PathAttempts is the route of GET attempts (query payoutId).
	PathAttempts = "/v1/rail/attempts"
)

// Error codes of the envelope, besides fencing.CodeFencedOut (409) and
// httpjson's INVALID_REQUEST (400), BODY_TOO_LARGE (413) and
// UNSUPPORTED_MEDIA_TYPE (415).
const (
	// CodeAlreadySubmitted (409): an earlier attempt of the payout went,
	// or may have gone, to the rail; this one was not forwarded. The
	// answer is an AlreadySubmittedAnswer. Retryable only while that
	// attempt is still forwarding.
	CodeAlreadySubmitted = "PAYOUT_ALREADY_SUBMITTED"
	// CodeRailAmbiguous (502): the rail was called and its outcome is
	// unknown; the money may have moved. Not retryable.
	CodeRailAmbiguous = "RAIL_AMBIGUOUS"
	// CodeUnavailable (503): raildb did not answer, or the proxy is
	// closing, before the rail was called. Retryable; note that a retry
	// with the same token is refused FENCED_OUT if the failed request's
	// transaction did commit.
	CodeUnavailable = "UNAVAILABLE"
	// CodeRestored (503): raildb was restored from a backup (its identity
	// stamp does not match; see guard.go and
	// docs/runbooks/raildb-restore.md) and may have forgotten high-water
	// marks and forwarded payouts. Nothing was recorded and the rail was
	// not called. Retryable: submissions are admitted again once an
	// operator has run "rail-proxy recover-restore".
	CodeRestored = "RAILDB_RESTORED"
	// CodeNotFound (404): no such route, or no high-water for the account.
	CodeNotFound = "NOT_FOUND"
	// CodeMethodNotAllowed (405): the route exists for another method.
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// CodeInternal (500): a bug.
	CodeInternal = "INTERNAL"
)

// Errors of this package.
var (
	// ErrInvalidConfig: a Config field is out of bounds or an environment
	// variable does not parse.
	ErrInvalidConfig = errors.New("railproxy: invalid config")
	// ErrInvalidRequest: a request's token header, body or parameters are
	// malformed; nothing was recorded.
	ErrInvalidRequest = errors.New("railproxy: invalid request")
	// ErrFencedOut: the token is not greater than the account's high-water.
	// The error also wraps a fencing.Refusal with both tokens.
	ErrFencedOut = errors.New("railproxy: stale fencing token")
	// ErrAlreadySubmitted: the payout already has an attempt that went, or
	// may have gone, to the rail. The error also wraps an
	// *AlreadySubmitted with that attempt.
	ErrAlreadySubmitted = errors.New("railproxy: payout already submitted")
	// ErrRailAmbiguous: the rail was called and did not answer ACK or
	// DECLINE (timeout, connection failure, 5xx, anything else); the money
	// may have moved.
	ErrRailAmbiguous = errors.New("railproxy: rail outcome unknown")
	// ErrUnavailable: raildb could not be reached or did not answer in
	// time, or the proxy is closed.
	ErrUnavailable = errors.New("railproxy: unavailable")
	// ErrNotFound: no such route, or no high-water for the account.
	ErrNotFound = errors.New("railproxy: not found")
	// errMethod is a request with a method the route does not serve.
	errMethod = errors.New("railproxy: method not allowed")
)

// Config configures a Proxy. Start from DefaultConfig or LoadConfig.
type Config struct {
	// DB locates raildb: DSN from RAILDB_URL (required), CloudSQLInstance
	// from RAILDB_INSTANCE (optional; dial through the Cloud SQL connector).
	DB pgpool.Config
	// RailURL is the rail's base URL (http or https); submissions are
	// POSTed to RailURL + "/submit". Required. Env RAIL_URL.
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
}

// DefaultConfig returns the defaults documented on Config; DB.DSN and
// RailURL are left empty (required).
func DefaultConfig() Config {
	return Config{RailTimeout: DefaultRailTimeout, DBTimeout: DefaultDBTimeout}
}

// Validate returns an error wrapping ErrInvalidConfig describing the first
// invalid field.
func (c Config) Validate() error {
	if err := c.DB.Validate(); err != nil {
		return fmt.Errorf("%w: DB: %v", ErrInvalidConfig, err)
	}
	u, err := url.Parse(c.RailURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: RailURL %q must be an http(s) URL without query", ErrInvalidConfig, c.RailURL)
	}
	if c.RailTimeout <= 0 || c.RailTimeout > MaxTimeout {
		return fmt.Errorf("%w: RailTimeout %v must be in (0, %v]", ErrInvalidConfig, c.RailTimeout, MaxTimeout)
	}
	if c.DBTimeout <= 0 || c.DBTimeout > MaxTimeout {
		return fmt.Errorf("%w: DBTimeout %v must be in (0, %v]", ErrInvalidConfig, c.DBTimeout, MaxTimeout)
	}
	return nil
}

// LoadConfig returns DefaultConfig overridden by RAILDB_URL,
// RAILDB_INSTANCE, RAIL_URL, RAIL_TIMEOUT_MS, RAIL_PROXY_DB_TIMEOUT_MS and
// RAIL_PROXY_FENCING_ENABLED, read through getenv (an empty value keeps the
// default), validated. Errors wrap ErrInvalidConfig.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.DB.DSN = strings.TrimSpace(getenv(EnvDatabaseURL))
	c.DB.CloudSQLInstance = strings.TrimSpace(getenv(EnvDatabaseInstance))
	c.RailURL = strings.TrimSpace(getenv(EnvRailURL))
	for _, d := range []struct {
		env string
		dst *time.Duration
	}{{EnvRailTimeoutMs, &c.RailTimeout}, {EnvDBTimeoutMs, &c.DBTimeout}} {
		v := strings.TrimSpace(getenv(d.env))
		if v == "" {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > MaxTimeout.Milliseconds() {
			return Config{}, fmt.Errorf("%w: %s=%q must be milliseconds in [1, %d]", ErrInvalidConfig, d.env, v, MaxTimeout.Milliseconds())
		}
		*d.dst = time.Duration(ms) * time.Millisecond
	}
	on, err := fencing.Switch(EnvFencingEnabled, getenv(EnvFencingEnabled))
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	c.FencingDisabled = !on
	if c.DB.DSN == "" {
		return Config{}, fmt.Errorf("%w: %s is required (a PostgreSQL DSN of raildb)", ErrInvalidConfig, EnvDatabaseURL)
	}
	if err := c.Validate(); err != nil {
		// Name the environment variable behind the field.
		return Config{}, fmt.Errorf("%w (environment: %s, %s, %s)", err, EnvDatabaseURL, EnvRailURL, EnvDatabaseInstance)
	}
	return c, nil
}

// SubmitRequest is the body of POST /v1/rail/submissions. Every field is
// required.
type SubmitRequest struct {
	// PayoutID identifies the payout, 1..128 bytes; sent to the rail as its
	// reference too.
	PayoutID string `json:"payoutId"`
	// AccountID is the debited account, 1..64 bytes; the fence is kept per
	// account (the lock key is payout:{accountId}).
	AccountID string `json:"accountId"`
	// AmountMinor is the amount in minor currency units; positive.
	AmountMinor int64 `json:"amountMinor"`
	// Currency is an ISO 4217 code: three upper-case ASCII letters.
	Currency string `json:"currency"`
}

// Validate returns an error wrapping ErrInvalidRequest describing the first
// invalid field: ids as payoutevent.ValidateID has them, an amount within
// 1..payoutevent.MaxAmountMinor minor units, an ISO 4217 currency.
func (s SubmitRequest) Validate() error {
	if err := payoutevent.ValidateID("payoutId", s.PayoutID, MaxPayoutIDLen); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := payoutevent.ValidateID("accountId", s.AccountID, MaxAccountIDLen); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	switch {
	case s.AmountMinor <= 0 || s.AmountMinor > payoutevent.MaxAmountMinor:
		return fmt.Errorf("%w: amountMinor %d is outside 1..%d", ErrInvalidRequest, s.AmountMinor, payoutevent.MaxAmountMinor)
	case !payoutevent.IsCurrency(s.Currency):
		return fmt.Errorf("%w: currency %q is not three upper-case letters (ISO 4217)", ErrInvalidRequest, s.Currency)
	}
	return nil
}

// Rail answers, as SubmitAnswer.Status carries them.
const (
	// RailAck: the rail accepted the payment; money moved.
	RailAck = "ACK"
	// RailDecline: the rail refused the payment; no money moved.
	RailDecline = "DECLINE"
)

// SubmitAnswer is the 200 body of POST /v1/rail/submissions.
type SubmitAnswer struct {
	// Status is the rail's answer, RailAck or RailDecline.
	Status string `json:"status"`
	// RailRef is the rail's reference of the submission.
	RailRef string `json:"railRef"`
	// AttemptID is the rail_attempt row of this submission.
	AttemptID int64 `json:"attemptId"`
	// Token is the fencing token the submission was accepted with.
	Token int64 `json:"token"`
}

// HighWater is the 200 body of GET /v1/rail/high-water/{accountId}.
type HighWater struct {
	// AccountID is the account.
	AccountID string `json:"accountId"`
	// HighWater is the highest fencing token accepted for it.
	HighWater int64 `json:"highWater"`
}

// Attempt states, rail_attempt.state.
const (
	// StateForwarding: the fence passed and the rail is being called (or
	// the proxy died while calling it: reconcile).
	StateForwarding = "forwarding"
	// StateAcked: the rail answered ACK.
	StateAcked = "acked"
	// StateDeclined: the rail answered DECLINE.
	StateDeclined = "declined"
	// StateAmbiguous: the rail was called and its outcome is unknown.
	StateAmbiguous = "ambiguous"
	// StateFenced: the token was stale; the rail was not called.
	StateFenced = "fenced"
	// StateDuplicate: the payout had already gone to the rail with an
	// earlier attempt; this one was not forwarded.
	StateDuplicate = "duplicate"
)

// AlreadySubmitted is the refusal of a second submission of a payout: the
// attempt that went to the rail first. It is an error value, wrapped with
// ErrAlreadySubmitted by the submission path.
type AlreadySubmitted struct {
	// First is the payout's forwarded attempt, as locked by the refusing
	// transaction: acked, declined, ambiguous, or still forwarding.
	First Attempt
}

// Error describes the refusal.
func (a *AlreadySubmitted) Error() string {
	return fmt.Sprintf("payout %s already went to the rail with attempt %d (token %d, state %s)",
		a.First.PayoutID, a.First.AttemptID, a.First.Token, a.First.State)
}

// AlreadySubmittedAnswer is the 409 PAYOUT_ALREADY_SUBMITTED body: the
// error envelope of package httpjson plus the payout's forwarded attempt.
// The caller reports that attempt's outcome instead of submitting again:
// StateAcked and StateDeclined carry the rail's reference, StateAmbiguous
// needs reconciliation, and StateForwarding means the first submission is
// still being answered (Error.Retryable is true: ask again later). A
// forwarding attempt older than RailTimeout + 2 x DBTimeout + 1 s can no
// longer be in flight in a rail-proxy with this configuration; it is then
// marked StateAmbiguous (log event rail_attempt_abandoned) before being
// answered.
type AlreadySubmittedAnswer struct {
	// Error is the envelope's body, code CodeAlreadySubmitted.
	Error httpjson.Body `json:"error"`
	// Attempt is the payout's forwarded attempt.
	Attempt Attempt `json:"attempt"`
}

// Attempt is one rail_attempt row.
type Attempt struct {
	// AttemptID numbers the attempts; it grows with insertion, not with
	// commit order.
	AttemptID int64 `json:"attemptId"`
	// PayoutID is the request's payout id.
	PayoutID string `json:"payoutId"`
	// AccountID is the request's account id (the fence's resource id).
	AccountID string `json:"accountId"`
	// AmountMinor is the request's amount, in minor currency units.
	AmountMinor int64 `json:"amountMinor"`
	// Currency is the request's ISO 4217 code.
	Currency string `json:"currency"`
	// Token is the fencing token presented.
	Token int64 `json:"token"`
	// OwnerID is the X-Lock-Owner header, as claimed ("" when absent).
	OwnerID string `json:"ownerId"`
	// State is one of the State constants.
	State string `json:"state"`
	// RailRef is the rail's reference; set when acked or declined.
	RailRef string `json:"railRef,omitempty"`
	// CreatedAt is when the attempt was recorded (raildb's clock).
	CreatedAt time.Time `json:"createdAt"`
	// FinishedAt is when its outcome was recorded; nil while forwarding.
	FinishedAt *time.Time `json:"finishedAt"`
}

// AttemptList is the 200 body of GET /v1/rail/attempts.
type AttemptList struct {
	// Attempts of the payout, oldest first.
	Attempts []Attempt `json:"attempts"`
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
	mux       *http.ServeMux

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
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
	if err := migrate(ctx, pool); err != nil {
		closePool()
		return nil, err
	}
	fencing.WarnIfOff(log, EnvFencingEnabled, !cfg.FencingDisabled)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	p := &Proxy{
		cfg:       cfg,
		log:       log,
		pool:      pool,
		closePool: closePool,
		transport: tr,
		rail: &http.Client{
			Transport: tr,
			Timeout:   cfg.RailTimeout,
			// A redirect is not an answer: it ends as a non-200, ambiguous.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		submitURL: strings.TrimSuffix(cfg.RailURL, "/") + "/submit",
		mux:       http.NewServeMux(),
	}
	p.mux.HandleFunc(PathSubmissions, p.handleSubmit)
	p.mux.HandleFunc(PathHighWaterPrefix+"{accountId}", p.handleHighWater)
	p.mux.HandleFunc(PathAttempts, p.handleAttempts)
	p.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p.fail(w, p.log, fmt.Errorf("%w: no route for %s %s", ErrNotFound, r.Method, r.URL.Path))
	})
	return p, nil
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		p.fail(w, p.log, fmt.Errorf("%w: closing", ErrUnavailable))
		return
	}
	defer p.inflight.Done()
	p.mux.ServeHTTP(w, r)
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
	return nil
}

func (p *Proxy) handleSubmit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		p.methodNotAllowed(w, r, http.MethodPost)
		return
	}
	token, err := fencing.TokenFrom(r)
	if err != nil {
		p.fail(w, p.log, fmt.Errorf("%w: %w", ErrInvalidRequest, err))
		return
	}
	owner := fencing.OwnerFrom(r)
	var req SubmitRequest
	if err := httpjson.Decode(w, r, &req, MaxBodyBytes); err != nil {
		p.fail(w, p.log, err)
		return
	}
	if err := req.Validate(); err != nil {
		p.fail(w, p.log, err)
		return
	}
	// From here on the submission does not depend on its caller staying:
	// once the fence has passed, the rail is called and its answer recorded
	// even if the caller hangs up, so that the audit learns the outcome.
	ctx := context.WithoutCancel(r.Context())
	lg := p.log.With("payoutId", req.PayoutID, "accountId", req.AccountID, "token", token, "ownerId", owner)

	attemptID, err := p.admit(ctx, req, token, owner, lg)
	var (
		refusal fencing.Refusal
		dup     *AlreadySubmitted
	)
	switch {
	case errors.As(err, &refusal):
		refusal.Log(p.log, "payoutId", req.PayoutID, "accountId", req.AccountID, "token", token, "attemptId", attemptID)
		p.fail(w, lg, err)
		return
	case errors.As(err, &dup):
		lg.Warn("payout already went to the rail; not forwarding it again", "event", "rail_submission_duplicate",
			"attemptId", attemptID, "firstAttemptId", dup.First.AttemptID, "firstToken", dup.First.Token, "firstState", dup.First.State)
		status, code, _ := statusOf(err)
		httpjson.WriteJSON(w, status, AlreadySubmittedAnswer{
			Error:   httpjson.Body{Code: code, Message: err.Error(), Retryable: dup.First.State == StateForwarding},
			Attempt: dup.First,
		})
		return
	case err != nil:
		p.fail(w, lg, err)
		return
	}
	lg = lg.With("attemptId", attemptID)
	lg.Info("forwarding submission to the rail", "event", "rail_submission_forwarding",
		"amountMinor", req.AmountMinor, "currency", req.Currency)

	ans, err := p.forward(ctx, req)
	if err != nil {
		if ferr := p.finish(ctx, attemptID, StateAmbiguous, ""); ferr != nil {
			lg.Error("could not record the ambiguous outcome; the attempt stays forwarding", "event", "rail_attempt_update_failed", "error", ferr.Error())
		}
		lg.Error("rail outcome unknown; the money may have moved: reconcile, never retry blindly",
			"event", "rail_submission_ambiguous", "error", err.Error())
		p.fail(w, lg, fmt.Errorf("%w: attempt %d: %v", ErrRailAmbiguous, attemptID, err))
		return
	}
	state, event := StateAcked, "rail_submission_acked"
	if ans.Status == RailDecline {
		state, event = StateDeclined, "rail_submission_declined"
	}
	if ferr := p.finish(ctx, attemptID, state, ans.RailRef); ferr != nil {
		// The rail's answer is the truth about the money; answer it even
		// though the audit row could not be updated.
		lg.Error("could not record the rail's answer; the attempt stays forwarding", "event", "rail_attempt_update_failed",
			"state", state, "railRef", ans.RailRef, "error", ferr.Error())
	}
	lg.Info("rail answered "+ans.Status, "event", event, "railRef", ans.RailRef)
	httpjson.WriteJSON(w, http.StatusOK, SubmitAnswer{Status: ans.Status, RailRef: ans.RailRef, AttemptID: attemptID, Token: token})
}

func (p *Proxy) handleHighWater(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.methodNotAllowed(w, r, http.MethodGet)
		return
	}
	acct := r.PathValue("accountId")
	if err := payoutevent.ValidateID("accountId", acct, MaxAccountIDLen); err != nil {
		p.fail(w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	hw, err := p.highWater(r.Context(), acct)
	if err != nil {
		p.fail(w, p.log, err)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, HighWater{AccountID: acct, HighWater: hw})
}

func (p *Proxy) handleAttempts(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.methodNotAllowed(w, r, http.MethodGet)
		return
	}
	q := r.URL.Query()
	payout := q.Get("payoutId")
	if len(q["payoutId"]) != 1 {
		p.fail(w, p.log, fmt.Errorf("%w: query parameter payoutId must be given once", ErrInvalidRequest))
		return
	}
	if err := payoutevent.ValidateID("payoutId", payout, MaxPayoutIDLen); err != nil {
		p.fail(w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	list, err := p.attempts(r.Context(), payout)
	if err != nil {
		p.fail(w, p.log, err)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, AttemptList{Attempts: list})
}

func (p *Proxy) methodNotAllowed(w http.ResponseWriter, r *http.Request, allowed string) {
	w.Header().Set("Allow", allowed)
	p.fail(w, p.log, fmt.Errorf("%w: %s %s; use %s", errMethod, r.Method, r.URL.Path, allowed))
}

// fail answers err with the envelope, through statusOf, and logs server
// failures (a restored raildb as the event raildb_restored). Refusals of
// bad input are logged at DEBUG; fenced_out and rail_submission_ambiguous
// have been logged by the caller.
func (p *Proxy) fail(w http.ResponseWriter, lg *slog.Logger, err error) {
	status, code, retryable := statusOf(err)
	switch {
	case code == CodeRailAmbiguous || code == fencing.CodeFencedOut:
	case code == CodeRestored:
		lg.Error("raildb was restored: submission refused until rail-proxy recover-restore (docs/runbooks/raildb-restore.md)",
			"event", "raildb_restored", "code", code, "error", err.Error())
	case status >= 500:
		lg.Error("rail-proxy request failed", "event", "rail_request_failed", "code", code, "error", err.Error())
	default:
		lg.Debug("rail-proxy request refused", "event", "rail_request_refused", "code", code, "error", err.Error())
	}
	httpjson.WriteError(w, status, code, err.Error(), retryable)
}

// statusOf maps an error to its HTTP status, code and retryability: the
// one place where rail-proxy's errors become answers.
func statusOf(err error) (status int, code string, retryable bool) {
	var decodeErr *httpjson.Error
	switch {
	case errors.As(err, &decodeErr):
		return decodeErr.Status, decodeErr.Code, false
	case errors.Is(err, ErrInvalidRequest):
		return http.StatusBadRequest, httpjson.CodeInvalidRequest, false
	case errors.Is(err, ErrFencedOut):
		return http.StatusConflict, fencing.CodeFencedOut, false
	case errors.Is(err, ErrAlreadySubmitted):
		return http.StatusConflict, CodeAlreadySubmitted, false
	case errors.Is(err, ErrRailAmbiguous):
		return http.StatusBadGateway, CodeRailAmbiguous, false
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, CodeNotFound, false
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed, CodeMethodNotAllowed, false
	case errors.Is(err, ErrRestored):
		return http.StatusServiceUnavailable, CodeRestored, true
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable, CodeUnavailable, true
	default:
		return http.StatusInternalServerError, CodeInternal, false
	}
}
