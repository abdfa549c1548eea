package paymentresource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Errors of this package. Handlers map them to HTTP statuses and codes in
// one place (statusOf); callers of New and LoadConfig test them with
// errors.Is.
var (
	// ErrInvalidConfig: a Config field or environment variable is invalid,
	// or New got a nil Publisher or logger.
	ErrInvalidConfig = errors.New("paymentresource: invalid config")
	// ErrInvalidArgument: a request field is missing or out of bounds (400).
	ErrInvalidArgument = errors.New("paymentresource: invalid argument")
	// ErrAccountNotFound: no account has the id (404).
	ErrAccountNotFound = errors.New("paymentresource: account not found")
	// ErrAccountConflict: the account id exists with another currency or
	// opening balance (409).
	ErrAccountConflict = errors.New("paymentresource: account exists with other values")
	// ErrCurrencyMismatch: a payout's currency is not its account's (422).
	ErrCurrencyMismatch = errors.New("paymentresource: currency is not the account's")
	// ErrInsufficientFunds: a new payout's amount is larger than its
	// account's available balance: the balance minus the amounts of the
	// account's payouts not yet posted, declined or failed (409).
	ErrInsufficientFunds = errors.New("paymentresource: insufficient funds")
	// ErrPayoutNotFound: no payout has the id (404).
	ErrPayoutNotFound = errors.New("paymentresource: payout not found")
	// ErrPayoutConflict: the payout id exists with other values (409).
	ErrPayoutConflict = errors.New("paymentresource: payout exists with other values")
	// ErrTermsMismatch: a claim names other terms (account, amount,
	// currency) than the payout's (409).
	ErrTermsMismatch = errors.New("paymentresource: claim terms are not the payout's")
	// ErrFencedOut: a fenced statement matched no row because the row
	// carries a higher token (or the same one on the strict account fence).
	// The returned error also describes the fencing.Refusal (409).
	ErrFencedOut = errors.New("paymentresource: fenced out")
	// ErrPayoutFinished: the payout is posted or declined (409).
	ErrPayoutFinished = errors.New("paymentresource: payout is finished")
	// ErrPayoutInDoubt: the payout's rail outcome is unknown (409).
	ErrPayoutInDoubt = errors.New("paymentresource: payout is in doubt")
	// ErrPayoutNeedsAttention: the payout is in needs_attention; a claim
	// does not take it (409).
	ErrPayoutNeedsAttention = errors.New("paymentresource: payout needs attention")
	// ErrPayoutNotClaimed: a result for a payout still pending (409).
	ErrPayoutNotClaimed = errors.New("paymentresource: payout is not claimed")
	// ErrRailRefConflict: the rail reference is recorded with another
	// payout or outcome (409).
	ErrRailRefConflict = errors.New("paymentresource: rail reference already recorded differently")
	// ErrUnverifiedToken: the holder's token has no proof that lock-server
	// granted it on the account's lock (403; wraps fencing.ErrUnverified).
	ErrUnverifiedToken = errors.New("paymentresource: fencing token not verified")
	// ErrInvalidReceipt: an ACK or DECLINE without rail-proxy's signature
	// over exactly it (422).
	ErrInvalidReceipt = errors.New("paymentresource: rail receipt not valid for this result")
	// ErrUnavailable: the database did not answer in time, or a
	// transaction lost a serialization race; the outcome is unknown (503,
	// retryable).
	ErrUnavailable = errors.New("paymentresource: database unavailable")

	// errOverloaded: the in-flight bound is reached (503 OVERLOADED).
	errOverloaded = errors.New("paymentresource: too many requests in flight")
	// errStalled: paydb is marked stalled and this request is not the
	// probe; always wrapped with ErrUnavailable (503 DATABASE_UNAVAILABLE).
	errStalled = errors.New("paymentresource: paydb is marked stalled (a call ran out its whole request timeout); not tried")
	// errAbandoned ends a paydb call that did not return (its handler
	// panicked): a cancellation, which tells the stall breaker nothing
	// (overload.Classify). See begin.
	errAbandoned = fmt.Errorf("paymentresource: paydb call abandoned: %w", context.Canceled)
	// errNoRoute: no route matches the request path (404).
	errNoRoute = errors.New("paymentresource: no such route")
	// errMethodNotAllowed: the route exists for another method (405).
	errMethodNotAllowed = errors.New("paymentresource: method not allowed")
)

// needingAttention counts payouts entering needs_attention, by reason
// (api.AttentionReasons, a bounded set; never an id or a token).
var needingAttention = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payouts_needing_attention_total",
		Help: "Payouts marked needs_attention by a lock holder (a refusal no retry can change), by reason.",
	}, []string{"reason"})
	for _, r := range api.AttentionReasons {
		c.WithLabelValues(string(r)) // present at 0, so that rates and alerts see it
	}
	return c
}()

// guardGauges publishes the in-flight bound and the stall breaker of
// every Service of the process (one, in production).
var guardGauges = func() *overload.Gauges {
	g, err := overload.NewGauges(overload.Metrics{
		Stalled:      "paymentresource_db_stalled",
		StalledHelp:  "1 while paydb is marked stalled (a call ran out its whole request timeout) and requests are answered 503 " + string(api.CodeUnavailable) + " at once; 0 otherwise.",
		InFlight:     "paymentresource_requests_in_flight",
		InFlightHelp: "Requests payment-resource is serving past their input checks (at most " + api.EnvMaxInFlight + "; one more is answered 503 " + string(api.CodeOverloaded) + ").",
	})
	if err != nil {
		panic(err) // the names above are constants
	}
	return g
}()

// Collectors returns payment-resource's metrics, for the registry its
// process serves: payouts_needing_attention_total{reason}, one per payout
// entering needs_attention, reason being one of api.AttentionReasons;
// payouts_created_total, one per payout created;
// payout_completion_seconds, the time from a payout's creation to posted
// or declined; the ages read from paydb at each scrape,
// payouts_ambiguous_oldest_age_seconds and
// payment_outbox_oldest_unpublished_age_seconds (see ages);
// paymentresource_db_stalled (1 while paydb is marked stalled) and
// paymentresource_requests_in_flight, over every Service of the process.
// No label carries an id or a token.
func Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{needingAttention, guardGauges, creations, completion, ages}, fencing.Collectors()...)
}

// Publisher publishes one message to the payout topic. Implementations
// must be safe for concurrent use.
type Publisher interface {
	// Publish sends data with the given ordering key and attributes, and
	// blocks until the broker has acknowledged (persisted) the message, or
	// returns an error: the outbox marks a row published only after a nil
	// return, and publishes it again otherwise, so a nil return before the
	// acknowledgement could lose an event. It must honour ctx. After an
	// error, the next call for the same ordering key must try again (with
	// Pub/Sub ordering keys: call ResumePublish).
	Publish(ctx context.Context, orderingKey string, data []byte, attrs map[string]string) error
}

// AsyncPublisher is an optional capability of a Publisher (payoutbus's
// has it): PublishAsync hands one message to the broker's client without
// waiting for the acknowledgement, and returns a function that waits for
// it, with the contract of Publish's return (nil only once the broker has
// persisted the message; it honours its ctx). Messages of one ordering
// key must be sent in the order of the calls, and after a failure of one,
// every later message of that key must fail until the key is resumed (the
// wait function resumes it). The outbox then hands a whole batch of rows
// over at once, so the client can bundle them, instead of paying one
// round trip and one bundling delay per row.
type AsyncPublisher interface {
	PublishAsync(ctx context.Context, orderingKey string, data []byte, attrs map[string]string) (wait func(context.Context) error)
}

// Service is payment-resource: its database pool, its HTTP handler and its
// outbox publisher. It is safe for concurrent use. Close releases it.
type Service struct {
	pool      *pgxpool.Pool
	closePool func()
	fencing   bool
	proofKeys fenceproof.Keyring    // lock-server's grant proofs
	receipts  fenceproof.Keyring    // rail-proxy's receipts
	termsKey  fenceproof.SigningKey // signs the payouts' terms (terms.go)
	log       *slog.Logger
	handler   http.Handler
	outbox    *outbox
	guard     *overload.Guard // in-flight bound and stall breaker (http.go)
	claimed   claimedTerms    // terms of claimed payouts, for resultFast
	detach    func()          // from guardGauges

	// stop cancels the lifetime context of the outbox publisher.
	stop      context.CancelFunc
	closeOnce sync.Once
}

// New opens paydb (directly or through the Cloud SQL connector), applies
// the pending migrations, logs a WARN when fencing is disabled, and starts
// the outbox publisher goroutine, which runs until Close. ctx bounds only
// the start (connecting and migrating). It returns an error wrapping
// ErrInvalidConfig for an invalid cfg or a nil pub or logger, or the
// error of connecting or migrating.
func New(ctx context.Context, cfg Config, pub Publisher, logger *slog.Logger) (*Service, error) {
	if pub == nil || logger == nil {
		return nil, fmt.Errorf("%w: New needs a Publisher and a logger", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pool, closePool, err := pgpool.Open(ctx, cfg.pool())
	if err != nil {
		return nil, fmt.Errorf("paymentresource: open paydb: %w", err)
	}
	if err := migrate(ctx, pool); err != nil {
		closePool()
		return nil, err
	}
	fencing.WarnIfOff(logger, api.EnvFencingEnabled, !cfg.FencingDisabled)
	gcfg := cfg.guard()
	gcfg.Ping = pgpool.PingOnNewConn(pool)
	guard, err := overload.New(gcfg, logger)
	if err != nil {
		closePool()
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}

	life, stop := context.WithCancel(context.Background())
	s := &Service{
		pool:      pool,
		closePool: closePool,
		fencing:   !cfg.FencingDisabled,
		proofKeys: cfg.ProofKeys,
		receipts:  cfg.ReceiptKeys,
		termsKey:  cfg.TermsKey,
		log:       logger,
		stop:      stop,
		outbox:    newOutbox(pool, pub, logger, cfg.OutboxPoll),
		guard:     guard,
		detach:    guardGauges.Attach(guard),
	}
	s.handler = s.routes()
	go s.outbox.run(life)
	ages.add(s)
	return s, nil
}

// Handler returns the HTTP handler of payment-resource: the routes,
// bodies, codes and headers of package api (its package doc lists every
// route with its answers). Bodies are JSON of at most api.MaxBodyBytes,
// decoded strictly (unknown or repeated fields refused); every error answer
// is an api.ErrorEnvelope with one of the api.Code constants.
func (s *Service) Handler() http.Handler { return s.handler }

// Close stops the outbox publisher and waits for it (a publish in flight is
// cancelled; its row stays unpublished and is published again by the next
// Service), then closes the pool. It is safe to call more than once.
// Requests still running when Close is called may fail.
func (s *Service) Close() {
	s.closeOnce.Do(func() {
		ages.remove(s)
		s.stop()
		<-s.outbox.done
		s.closePool()
		s.detach()
	})
}
