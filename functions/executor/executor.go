// Package executor is the payout worker, an http.Handler for Pub/Sub push
// requests that carry a payoutevent.Event. For each payout it takes the
// lease on payout:{account_id}, claims the payout at payment-resource,
// confirms the lease, submits through rail-proxy and posts the rail's
// outcome, every write carrying the lease's fencing token; the answer's
// status tells Pub/Sub whether to deliver again (Status).
//
// Build one with New from LoadConfig's Config, serve it, and call Close
// after the server's drain. docs/payout-pipeline.md explains each step,
// what stops a stale worker, and how every answer is classified.
package executor

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// Errors that end an execution without a final outcome; each makes Pub/Sub
// deliver the event again (see Status).
var (
	// ErrLockBusy: the account's lock was not granted within AcquireWait.
	ErrLockBusy = errors.New("executor: lock busy")
	// ErrNoLongerHolder: this worker stopped before a side effect because
	// it is no longer the holder: its lease ended (expired, revoked, or
	// refused by lock-server when confirmed, client.ErrLeaseLost); nothing
	// was sent.
	ErrNoLongerHolder = errors.New("executor: no longer the holder; stopped before a side effect")
	// ErrSubmissionInFlight: rail-proxy reports that an earlier worker's
	// submission of the payout is still waiting for the rail's answer;
	// a later delivery reports its outcome.
	ErrSubmissionInFlight = errors.New("executor: an earlier submission of the payout is still in flight")
	// ErrFencedOut: a fence point refused this worker's token: a newer
	// holder has written. The newer holder finishes the payout.
	ErrFencedOut = errors.New("executor: fenced out")
	// ErrDependency: lock-server, payment-resource or rail-proxy did not
	// answer, or answered in a way that a retry may change.
	ErrDependency = errors.New("executor: dependency unavailable")
)

// Outcome is a final result of one execution: the payout needs nothing more
// from this event.
type Outcome string

// Outcomes.
const (
	// OutcomePosted: the rail acknowledged and the debit is in the ledger.
	OutcomePosted Outcome = "posted"
	// OutcomeDeclined: the rail declined; no money moved.
	OutcomeDeclined Outcome = "declined"
	// OutcomeInDoubt: the rail's outcome is unknown; the payout is marked
	// ambiguous for reconciliation and never resubmitted automatically.
	OutcomeInDoubt Outcome = "in_doubt"
	// OutcomeAlreadyDone: an earlier delivery finished the payout.
	OutcomeAlreadyDone Outcome = "already_done"
	// OutcomeDropped: the message can never be executed (malformed, the
	// payout does not exist, or the event does not describe it); it is
	// logged and acknowledged.
	OutcomeDropped Outcome = "dropped"
	// OutcomeNeedsAttention: a refusal no retry can change (ClassPermanent,
	// or FENCED_OUT for the current lease holder); the payout is marked
	// needs_attention with the reason (or already was), and the message is
	// acknowledged.
	OutcomeNeedsAttention Outcome = "needs_attention"
)

// Fault is injected into an execution at fixed points, to play a worker
// paused at the most dangerous moments of the fencing experiment (package
// fault holds the experiment's and the game day's). New takes one with
// WithFault; production passes none, and then no point is visited. Its
// methods run on the delivery's goroutine and may block.
type Fault interface {
	// Renews reports whether the lease of delivery d is renewed in the
	// background while it works. A fault that stands for a stopped
	// process returns false: lock-server then ends the lease after its
	// TTL, and only the confirmation before the rail submission renews it.
	Renews(d Delivery) bool
	// At runs at point p of delivery d, under lease; the execution goes
	// on with the context it returns.
	At(ctx context.Context, p Point, d Delivery, lease *client.Lease) context.Context
}

// Delivery is the execution a Fault is asked about.
type Delivery struct {
	// Event is the payout event being executed.
	Event payoutevent.Event
	// Attempt is Pub/Sub's delivery attempt ("1", "2", ...), "" when the
	// push did not carry one or the call came through Execute.
	Attempt string
}

// Point is a place in an execution where a Fault runs.
type Point int

// Points, in the order an execution reaches them.
const (
	// AfterGrant: the lease was just granted; the local lease check and
	// the claim come next.
	AfterGrant Point = iota + 1
	// AfterClaim: the payout was just claimed under the lease.
	AfterClaim
	// BeforeSubmit: after the last lease confirmation, before the rail
	// submission: the point where a pause is most dangerous.
	BeforeSubmit
)

// Executor executes payout events. It is safe for concurrent use: Pub/Sub
// may push several events at once, and the lock serialises those of one
// account.
type Executor struct {
	cfg   Config
	locks *client.Client
	pay   *payclient.Client
	rail  *railclient.Client
	doer  client.Doer
	log   *slog.Logger
	fault Fault // nil: none

	// metered is serve, counted and timed (package httpmetrics).
	metered http.Handler

	// rndMu guards rnd, the jitter of the in-process retries.
	rndMu sync.Mutex
	rnd   *rand.Rand

	// relMu guards closed (set by Close: from then on a release is sent
	// before Execute returns) and the Adds of releases, which counts the
	// releases sent in the background (releaseLater); Close waits for it.
	relMu    sync.Mutex
	closed   bool
	releases sync.WaitGroup
}

// Option configures New.
type Option func(*Executor)

// WithFault injects f at the points of every execution. Default: none.
func WithFault(f Fault) Option { return func(x *Executor) { x.fault = f } }

// WithRand draws the jitter of the in-process retries from r (tests pass a
// seeded one). Default: a generator seeded from crypto/rand at New.
func WithRand(r *rand.Rand) Option { return func(x *Executor) { x.rnd = r } }

// WithHTTPClient sends every request (to lock-server, payment-resource and
// rail-proxy) through d. Both SDKs take the same Doer. The default is an
// *http.Client whose transport is tracing.Transport (a client span per
// request, traceparent in its headers) over KeepAliveTransport; a d
// without such a transport
// sends no trace context, so the other services start traces of their
// own.
func WithHTTPClient(d client.Doer) Option { return func(x *Executor) { x.doer = d } }

// IdleConnsPerHost is how many idle connections to each of lock-server,
// payment-resource and rail-proxy the default transport keeps for reuse
// (net/http keeps 2; an executor sends about six requests per payout;
// docs/benchmarks.md has the profile that set it).
const IdleConnsPerHost = 64

// KeepAliveTransport returns a clone of http.DefaultTransport that keeps
// IdleConnsPerHost idle connections per host (and at least as many in
// all). It returns http.DefaultTransport itself when a program replaced
// it with a transport of another type.
func KeepAliveTransport() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = IdleConnsPerHost
	t.MaxIdleConns = max(t.MaxIdleConns, 4*IdleConnsPerHost)
	return t
}

// New returns an Executor for cfg. It returns an error if cfg is invalid.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Executor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, errors.New("executor: New needs a logger")
	}
	x := &Executor{cfg: cfg, log: logger, doer: &http.Client{Transport: tracing.Transport(KeepAliveTransport())}}
	x.metered = httpmetrics.Handler(MetricsFunction, httpmetrics.OneRoute(MetricsRoute), http.HandlerFunc(x.serve))
	for _, o := range opts {
		o(x)
	}
	if x.rnd == nil {
		var seed [32]byte
		_, _ = crand.Read(seed[:]) // never fails (crypto/rand's contract)
		x.rnd = rand.New(rand.NewChaCha8(seed))
	}
	copts := []client.Option{client.WithHTTPClient(x.doer)}
	if cfg.Owner != "" {
		copts = append(copts, client.WithOwner(cfg.Owner))
	}
	locks, err := client.New(cfg.LockServerURL, copts...)
	if err != nil {
		return nil, err
	}
	x.locks = locks
	pay, err := payclient.New(cfg.PaymentResourceURL, payclient.WithHTTPClient(x.doer))
	if err != nil {
		return nil, err
	}
	x.pay = pay
	rail, err := railclient.New(cfg.RailProxyURL, railclient.WithHTTPClient(x.doer))
	if err != nil {
		return nil, err
	}
	x.rail = rail
	return x, nil
}

// Owner returns the owner id this executor takes leases as.
func (x *Executor) Owner() string { return x.locks.Owner() }

// maxPushBytes bounds a push request body (Pub/Sub messages here are small).
const maxPushBytes = 64 << 10

// ServeHTTP accepts one Pub/Sub push request (the wrapped JSON format), or
// the same message as a CloudEvent (google.cloud.pubsub.topic.v1.
// messagePublished, binary or structured mode), executes its payout and
// answers with the status of Status. The push form keeps the ordering key
// and the delivery attempt; a CloudEvent may lose them. Each push that
// decodes gets a span (SpanDelivery) in the payout's trace, whose context
// travels in the message's attributes (see startDelivery).
func (x *Executor) ServeHTTP(w http.ResponseWriter, r *http.Request) { x.metered.ServeHTTP(w, r) }

// PushPath is the path of the push endpoint, the executor's one route:
// the root of its URL, where Pub/Sub pushes (terraform's push_endpoint is
// the service's URL). Another path is answered 404 NOT_FOUND.
const PushPath = "/"

// MetricsRoute is the executor's one route in the request metrics
// (package httpmetrics): the push endpoint, served at "/".
const MetricsRoute = PushPath

// serve answers one push; ServeHTTP counts and times it.
func (x *Executor) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != PushPath {
		// Pub/Sub pushes to the service's URL, path "/" (terraform's
		// push_endpoint, local/stack's bridge); any other path is a
		// caller's mistake, not a push to acknowledge. The query string
		// and the content type stay lenient (docs/reliability.md).
		deliveries.WithLabelValues(resultRejected).Inc()
		jsonhandler.WriteError(w, http.StatusNotFound, string(api.CodeNotFound), "no such route; Pub/Sub pushes with POST "+PushPath, false)
		return
	}
	if r.Method != http.MethodPost {
		deliveries.WithLabelValues(resultRejected).Inc()
		w.Header().Set("Allow", http.MethodPost)
		jsonhandler.WriteError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "send Pub/Sub push requests with POST", false)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPushBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		deliveries.WithLabelValues(resultRejected).Inc()
		jsonhandler.WriteError(w, http.StatusRequestEntityTooLarge, jsonhandler.CodeBodyTooLarge, fmt.Sprintf("body larger than %d bytes", maxPushBytes), false)
		return
	case err != nil:
		// The cause (a read timeout, a reset) names the connection's
		// addresses: never in an answer. Pub/Sub redelivers.
		deliveries.WithLabelValues(resultRejected).Inc()
		jsonhandler.WriteError(w, http.StatusBadRequest, jsonhandler.CodeInvalidRequest, "the body could not be read: it came too slowly or the connection broke", false)
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/cloudevents+json" {
		// A CloudEvent in structured mode (Eventarc): the Pub/Sub message
		// travels in its "data", in the push body's shape. In binary mode
		// (ce-* headers) the body already is that shape.
		var ce struct {
			Data json.RawMessage `json:"data"`
		}
		if json.Unmarshal(body, &ce) == nil && len(ce.Data) > 0 {
			body = ce.Data
		}
	}
	push, ev, err := payoutevent.Decode(body)
	if errors.Is(err, payoutevent.ErrMalformedPush) {
		// Not a push at all (Pub/Sub never sends a broken envelope): a
		// client error, refused with the envelope.
		// The decoder's own text (Go type names) stays in the log.
		x.log.WarnContext(r.Context(), "request is not a push", "event", EventPushBodyRefused, "error", err.Error())
		deliveries.WithLabelValues(resultRejected).Inc()
		jsonhandler.WriteError(w, http.StatusBadRequest, jsonhandler.CodeInvalidRequest,
			"the body is not one Pub/Sub push envelope: one JSON object, no key given twice, nothing after it", false)
		return
	}
	if err != nil {
		// A message that cannot decode never will: acknowledge it so that it
		// is not redelivered forever, and leave the evidence in the log.
		x.log.ErrorContext(r.Context(), "payout event dropped", "event", EventPayoutEventMalformed, "messageId", push.Message.MessageID, "error", err.Error())
		deliveries.WithLabelValues(string(OutcomeDropped)).Inc()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	ctx, span := startDelivery(r, push, ev)
	defer span.End()
	log := x.log.With("payoutId", ev.PayoutID, "accountId", ev.AccountID, "messageId", push.Message.MessageID, "deliveryAttempt", push.Attempt(), "ownerId", x.Owner())
	log.DebugContext(ctx, "payout event received", "event", EventPayoutEventReceived, "orderingKey", push.Message.OrderingKey)
	// The lease is released once the answer is written (deferred, so also
	// when the execution panics): Pub/Sub's next event of the account need
	// not wait for lock-server's answer to the release.
	var release func()
	defer func() { x.releaseLater(release) }()
	out, err := x.execute(withDeliveryAttempt(ctx, push.Attempt()), ev, &release)
	status := Status(out, err)
	if err != nil {
		code := codeOf(err)
		span.SetAttributes(attribute.String(tracing.AttrOutcome, code))
		span.SetStatus(codes.Error, code)
		deliveries.WithLabelValues(code).Inc()
		log.WarnContext(ctx, "payout execution incomplete; Pub/Sub will redeliver", "event", EventExecutionRetry, "status", status, "error", err.Error())
		// The cause (another service's answer, an address) stays in the
		// log; the push answer says only what happens next.
		jsonhandler.WriteError(w, status, code, retryMessages[code], true)
		return
	}
	span.SetAttributes(attribute.String(tracing.AttrOutcome, string(out)))
	deliveries.WithLabelValues(string(out)).Inc()
	log.DebugContext(ctx, "payout execution finished", "event", EventExecutionDone, "outcome", string(out))
	jsonhandler.WriteJSON(w, status, map[string]string{"payoutId": ev.PayoutID, "outcome": string(out)})
}

// tracerName scopes the executor's spans.
const tracerName = "github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"

// SpanDelivery is the name of the span of one push delivery (kind
// consumer).
const SpanDelivery = "payout.execute"

// startDelivery starts the span of one push delivery. Its parent is the
// trace context in the message's attributes (payment-resource's outbox
// publish span, tracing.Inject), so that the payout's trace runs from its
// creation to the rail; the trace context of the push request's headers
// (Pub/Sub's or Cloud Run's, not the payout's) becomes a link. Without
// attributes it is the headers' context, as for any request.
func startDelivery(r *http.Request, push payoutevent.Push, ev payoutevent.Event) (context.Context, trace.Span) {
	fromHeaders := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx := tracing.Extract(fromHeaders, push.Message.Attributes)
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String(tracing.AttrPayoutID, ev.PayoutID),
			attribute.String(tracing.AttrAccountID, ev.AccountID),
			attribute.String(tracing.AttrLockKey, ev.LockKey()),
			attribute.String("messaging.system", "gcp_pubsub"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.message.id", push.Message.MessageID),
		),
	}
	if push.DeliveryAttempt != nil {
		opts = append(opts, trace.WithAttributes(attribute.Int("messaging.gcp_pubsub.message.delivery_attempt", *push.DeliveryAttempt)))
	}
	if h := trace.SpanContextFromContext(fromHeaders); h.IsValid() && !h.Equal(trace.SpanContextFromContext(ctx)) {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: h}))
	}
	return tracing.Tracer(tracerName).Start(ctx, SpanDelivery, opts...)
}

// resultRejected is the result of a request refused before it could be
// read as a push (wrong method, oversized body, a body that is not one
// well-formed push envelope).
const resultRejected = "rejected"

// deliveries counts the push requests answered, by result: an Outcome, the
// code of the error that makes Pub/Sub redeliver, or resultRejected.
var deliveries = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "executor_deliveries_total",
		Help: "Push requests answered, by result: posted, declined, in_doubt, already_done, dropped, needs_attention; " + fencewire.CodeFencedOut +
			", LOCK_BUSY, LEASE_LOST, SUBMISSION_IN_FLIGHT, DEPENDENCY_UNAVAILABLE (redelivered); rejected (not a push).",
	}, []string{"result"})
	for _, r := range []string{
		string(OutcomePosted), string(OutcomeDeclined), string(OutcomeInDoubt), string(OutcomeAlreadyDone), string(OutcomeDropped),
		string(OutcomeNeedsAttention), fencewire.CodeFencedOut, codeLockBusy, codeLeaseLost, codeInFlight, codeDependency, resultRejected,
	} {
		c.WithLabelValues(r) // present at 0
	}
	return c
}()

// Collectors returns the executor's metrics, for the registry its process
// serves: executor_deliveries_total{result}, one per request answered,
// result being an Outcome, the code of the error that makes Pub/Sub
// redeliver, or "rejected" for a request that is not a push; and
// executor_attention_unrecorded_total{reason}, reason an
// api.AttentionReason (never a payout, an account or a token).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{deliveries, attentionUnrecorded}
}

// Status maps the result of Execute to the push answer: 200 for a final
// outcome (Pub/Sub acknowledges), 409 when fenced out, 503 otherwise
// (Pub/Sub redelivers with backoff).
func Status(out Outcome, err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, ErrFencedOut):
		return http.StatusConflict
	default:
		return http.StatusServiceUnavailable
	}
}

// Codes of the push answers that make Pub/Sub redeliver (besides
// fencewire.CodeFencedOut), also values of executor_deliveries_total.
const (
	codeLockBusy   = "LOCK_BUSY"
	codeLeaseLost  = "LEASE_LOST"
	codeInFlight   = "SUBMISSION_IN_FLIGHT"
	codeDependency = "DEPENDENCY_UNAVAILABLE"
)

// retryMessages is the message of each push answer that makes Pub/Sub
// redeliver.
var retryMessages = map[string]string{
	fencewire.CodeFencedOut: "fenced out by a newer holder of the account's lock; a later delivery takes a newer lease",
	codeLockBusy:            "the account's lock is held by another worker; deliver again later",
	codeLeaseLost:           "the lease ended before a side effect; nothing was sent; deliver again later",
	codeInFlight:            "an earlier submission of the payout is still waiting for the rail; deliver again later",
	codeDependency:          "a dependency did not answer or refused for now; deliver again later",
}

func codeOf(err error) string {
	switch {
	case errors.Is(err, ErrFencedOut):
		return fencewire.CodeFencedOut
	case errors.Is(err, ErrLockBusy):
		return codeLockBusy
	case errors.Is(err, ErrNoLongerHolder):
		return codeLeaseLost
	case errors.Is(err, ErrSubmissionInFlight):
		return codeInFlight
	default:
		return codeDependency
	}
}

// Execute runs the payout flow for e and returns its final outcome, or an
// error wrapping ErrLockBusy, ErrNoLongerHolder, ErrFencedOut,
// ErrSubmissionInFlight or ErrDependency when a later delivery should try
// again. Every answer of a dependency is classified by Classify; a
// permanent refusal marks the payout needs_attention and ends with
// OutcomeNeedsAttention. Once the lease is granted, its token and owner
// are set on the span of ctx (ServeHTTP's SpanDelivery), and every request
// made carries ctx's trace context.
//
// Execute returns once the outcome is known; the lease's release (if a
// lease was granted) then goes to lock-server in the background,
// conditional on the token, with ctx's values but not its cancellation.
// Close waits for the releases still in flight; after Close, Execute
// releases before it returns. An event that fails e.Validate is dropped
// (OutcomeDropped) before any call.
func (x *Executor) Execute(ctx context.Context, e payoutevent.Event) (Outcome, error) {
	var release func()
	defer func() { x.releaseLater(release) }()
	return x.execute(ctx, e, &release)
}

// execute is Execute without the release: once the lease is granted it
// sets *release to the function that releases it, which the caller runs
// through releaseLater after it has answered.
func (x *Executor) execute(ctx context.Context, e payoutevent.Event, release *func()) (Outcome, error) {
	log := x.log.With("payoutId", e.PayoutID, "accountId", e.AccountID, "ownerId", x.Owner())
	// A push's event is validated when decoded; Execute's caller may hand
	// any. Terms that are not well-formed are no payout's: dropped before
	// any call (the client would refuse to send them, which reads as
	// INVALID_REQUEST, a permanent refusal that marks the payout).
	if err := e.Validate(); err != nil {
		log.ErrorContext(ctx, "payout event dropped", "event", EventPayoutEventMalformed, "error", err.Error())
		return OutcomeDropped, nil
	}
	d := Delivery{Event: e, Attempt: deliveryAttemptOf(ctx)}
	aopts := []client.AcquireOption{client.WithTTL(x.cfg.LeaseTTL)}
	if w := queueWait(x.cfg.AcquireWait); w > 0 {
		// Wait in lock-server's queue of the key: the previous delivery of
		// the account answers its push before it releases, so this acquire
		// often arrives first, and is granted about one round trip after
		// that release instead of after the SDK's backoff.
		aopts = append(aopts, client.WithWait(w))
	}
	if x.fault == nil || x.fault.Renews(d) {
		aopts = append(aopts, client.WithAutoRenew(0))
	}
	actx, cancel := context.WithTimeout(ctx, x.cfg.AcquireWait)
	lease, err := x.locks.Acquire(actx, e.LockKey(), aopts...)
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return "", fmt.Errorf("%w: %s: %v", ErrLockBusy, e.LockKey(), err)
		}
		return x.settle(ctx, log, e, nil, "acquire "+e.LockKey(), ServiceLockServer, err)
	}
	token := lease.Token()
	// The delivery's span (ServeHTTP's) carries the grant: the same token
	// shows at each fence point's span of this trace.
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int64(tracing.AttrToken, token), attribute.String(tracing.AttrLockOwner, x.Owner()))
	// The holder's headers at the fence points: the token, lock-server's
	// proof of it (the fence points verify it was granted on this
	// account's lock) and this worker's owner id.
	holder := fencewire.Holder{Token: token, Proof: lease.Proof(), Owner: x.Owner()}
	log = log.With("token", token)
	log.DebugContext(ctx, "lease granted; executing under it", "event", EventLeaseAcquired, "lock", e.LockKey(), "leaseId", lease.Grant().LeaseID, "ttlMs", lease.Grant().TTLMs)
	*release = func() { x.release(ctx, log, lease) }

	// (1) claim, once the lease's local deadline says it is still held.
	// The event is a notification; the payout row is the truth: the claim
	// carries the event's terms, and payment-resource refuses terms that
	// are not the payout's before anything else (a forged or corrupted
	// event is dropped, having held only the lock it named).
	// No confirmation with lock-server here: the claim is fenced and
	// reversible (a newer holder's claim takes the payout over), so a
	// lease the server ended behind this worker's back costs nothing yet;
	// the confirmation before the rail submission stops this worker
	// before the side effect that cannot be undone.
	ctx = x.inject(ctx, AfterGrant, d, lease)
	if err := x.checkLocal(ctx, log, lease, "claim"); err != nil {
		return leaseUnconfirmed("local lease check before the claim", err)
	}
	terms, err := x.claim(ctx, e, holder)
	if err != nil {
		return x.settle(ctx, log, e, lease, "claim", ServicePaymentResource, err)
	}
	log.DebugContext(ctx, "payout claimed", "event", EventPayoutClaimed)
	ctx = x.inject(ctx, AfterClaim, d, lease)

	// (2) the last confirmation, then the side effect no transaction can
	// undo. Whether the payout already went to the rail is rail-proxy's
	// decision, taken in the transaction that records this submission.
	if err := x.confirm(ctx, log, lease, "rail submission"); err != nil {
		return leaseUnconfirmed("confirm before the rail submission", err)
	}
	ctx = x.inject(ctx, BeforeSubmit, d, lease)
	res, err := x.submit(ctx, e, holder, terms)
	var first *firstAttempt
	switch {
	case errors.As(err, &first):
		log.WarnContext(ctx, "the payout already went to the rail; reporting that submission's outcome instead of submitting again",
			"event", EventRailPriorAttemptFound, "attemptState", first.State, "railRef", first.RailRef, "attemptToken", first.Token)
		if first.State == railapi.StateForwarding {
			return "", fmt.Errorf("%w: attempt %d with token %d", ErrSubmissionInFlight, first.AttemptID, first.Token)
		}
		res = railResult{Status: first.outcome(), RailRef: first.RailRef, Token: first.Token, Receipt: first.Receipt}
		if first.AccountID != e.AccountID || first.AmountMinor != e.AmountMinor || first.Currency != e.Currency {
			// What went to the rail under this payout's id is not this
			// payout (a forged or buggy submission): its outcome says
			// nothing about this payout's money. A person decides.
			log.ErrorContext(ctx, "the submission that went to the rail under this payout's id does not match the payout; marking it ambiguous",
				"event", EventRailPriorAttemptMismatch, "attemptAccountId", first.AccountID, "attemptAmountMinor", first.AmountMinor,
				"attemptCurrency", first.Currency)
			res = railResult{Status: api.OutcomeAmbiguous} // no token of this payout reached the rail
		}
	case errors.Is(err, errAmbiguous):
		log.ErrorContext(ctx, "rail outcome unknown; marking the payout ambiguous", "event", EventRailSubmissionAmbiguous, "error", err.Error())
		res = railResult{Status: api.OutcomeAmbiguous, Token: token}
	case errors.Is(err, errStopped):
		log.WarnContext(ctx, "the rail refused the payout for good (a reconciliation stopped it); marking it ambiguous for the reconciler to fail",
			"event", EventPayoutStoppedAtRail, "error", err.Error())
		res = railResult{Status: api.OutcomeAmbiguous, Token: token}
	case err != nil:
		return x.settle(ctx, log, e, lease, "rail submission", ServiceRailProxy, err)
	default:
		log.DebugContext(ctx, "rail submission answered", "event", EventRailSubmissionAccepted, "railStatus", res.Status, "railRef", res.RailRef)
	}
	// (3) The rail's answer is a fact: report it whatever the lease says now;
	// payment-resource's fence decides whether this worker may still write.
	if err := x.report(ctx, log, e, holder, res); err != nil {
		return x.settle(ctx, log, e, lease, "result", ServicePaymentResource, err)
	}
	switch res.Status {
	case api.OutcomeAck:
		log.InfoContext(ctx, "payout posted", "event", EventPayoutPosted, "railRef", res.RailRef)
		return OutcomePosted, nil
	case api.OutcomeDecline:
		log.InfoContext(ctx, "payout declined", "event", EventPayoutDeclined, "railRef", res.RailRef)
		return OutcomeDeclined, nil
	default:
		log.WarnContext(ctx, "payout marked ambiguous", "event", EventPayoutAmbiguous)
		return OutcomeInDoubt, nil
	}
}

// settle ends the execution on the error err of step, an answer of svc (or
// no answer), as Classify says: a final outcome for ClassDone; for
// ClassPermanent and ClassFenced the lease is confirmed with lock-server
// first, and only the holder of the current lease turns the refusal into
// a permanent one (the payout marked needs_attention, markAttention); a
// worker whose lease has ended is fenced out by a newer holder
// (ErrFencedOut, redelivered);
// otherwise an error wrapping the verdict's sentinel, so that Pub/Sub
// redelivers. lease is nil before the lease is held.
func (x *Executor) settle(ctx context.Context, log *slog.Logger, e payoutevent.Event, lease *client.Lease, step string, svc Service, err error) (Outcome, error) {
	v, code := classifyErr(svc, err)
	log = log.With("step", step, "service", string(svc), "code", code)
	switch v.Class {
	case ClassDone:
		if code == string(api.CodePayoutTermsMismatch) {
			log.ErrorContext(ctx, "payout event does not match its payout; dropped", "event", EventPayoutEventMismatch,
				"amountMinor", e.AmountMinor, "currency", e.Currency, "error", err.Error())
			return v.Outcome, nil
		}
		event := map[Outcome]string{OutcomeAlreadyDone: EventPayoutAlreadyDone, OutcomeInDoubt: EventPayoutInDoubt,
			OutcomeDropped: EventPayoutEventUnknownPayout, OutcomeNeedsAttention: EventPayoutAlreadyNeedsAttention}[v.Outcome]
		log.InfoContext(ctx, "payout needs nothing more from this delivery", "event", event, "outcome", string(v.Outcome), "error", err.Error())
		return v.Outcome, nil
	case ClassFenced:
		if lease == nil {
			return "", fmt.Errorf("%w: %s: %v", v.Err, step, err)
		}
		// Stale, or the fence is above every grant? Ask lock-server whether
		// this lease is still the current one: if it is, no newer holder
		// exists, so no grant of this key issued the fence's token.
		if cerr := x.confirm(ctx, log, lease, "judging a fence refusal"); cerr != nil {
			if !errors.Is(cerr, client.ErrLeaseLost) {
				// lock-server did not answer: whether a newer holder
				// exists is not known; the next delivery judges again.
				return "", fmt.Errorf("%w: %s: %v (lease not confirmed: %v)", ErrDependency, step, err, cerr)
			}
			log.WarnContext(ctx, "fenced out by a newer holder; Pub/Sub will redeliver", "event", EventPayoutFencedStale, "error", err.Error())
			return "", fmt.Errorf("%w: %s: %v", v.Err, step, err)
		}
		log.ErrorContext(ctx, "fenced out while holding the current lease: the fence holds a token lock-server never granted for this lock",
			"event", EventPayoutFenceAheadOfLease, "reason", string(v.Reason), "error", err.Error())
		return x.markAttention(ctx, log, e, lease, v.Reason)
	case ClassPermanent:
		// Only the holder of the current lease turns a refusal into the
		// payout's needs_attention, as for ClassFenced: a refusal answered
		// to a worker whose lease has ended may be the newer holder's doing
		// (it claimed, reported or resolved the payout meanwhile), and the
		// stale worker's mark would be fenced out anyway.
		if lease != nil {
			if cerr := x.confirm(ctx, log, lease, "judging a permanent refusal"); cerr != nil {
				if errors.Is(cerr, client.ErrLeaseLost) {
					log.WarnContext(ctx, "refused after this worker's lease ended: fenced out by a newer holder, whose work decides the payout; Pub/Sub will redeliver",
						"event", EventPayoutFencedStale, "reason", string(v.Reason), "error", err.Error())
					return "", fmt.Errorf("%w: %s: %v", ErrFencedOut, step, err)
				}
				// lock-server did not answer: not known to hold the lease,
				// so nothing is marked; the next delivery judges again.
				return "", fmt.Errorf("%w: %s: %v (lease not confirmed: %v)", ErrDependency, step, err, cerr)
			}
		}
		log.ErrorContext(ctx, "refusal no retry can change", "event", EventPayoutRefusedPermanently, "reason", string(v.Reason), "error", err.Error())
		return x.markAttention(ctx, log, e, lease, v.Reason)
	default:
		return "", fmt.Errorf("%w: %s: %v", v.Err, step, err)
	}
}

// leaseUnconfirmed ends the execution whose lease was not confirmed at
// step (err from checkLocal or confirm), as ClassifyLease says: with an
// error wrapping ErrNoLongerHolder or ErrDependency, so that Pub/Sub
// redelivers. Nothing is acknowledged or marked: the payout may be
// claimed, and a later delivery finishes it.
func leaseUnconfirmed(step string, err error) (Outcome, error) {
	return "", fmt.Errorf("%w: %s: %v", ClassifyLease(answerOf(ServiceLockServer, err)).Err, step, err)
}

// markAttention records reason on the payout (needs_attention, fenced with
// the lease's token), retrying transient failures in process, and ends
// the execution with OutcomeNeedsAttention. Without a lease it cannot
// write: the event is logged (payout_attention_unrecorded), counted in
// executor_attention_unrecorded_total{reason} and acknowledged all the
// same, as it is when payment-resource refuses the
// mark for good (a payout fence above the current lease refuses this
// write too). A payout that turned out finished or unknown ends as the
// table says; a mark that stays unanswered is redelivered.
func (x *Executor) markAttention(ctx context.Context, log *slog.Logger, e payoutevent.Event, lease *client.Lease, reason api.AttentionReason) (Outcome, error) {
	if lease == nil {
		log.ErrorContext(ctx, "payout needs attention but no lease is held to record it", "event", EventPayoutAttentionUnrecorded, "reason", string(reason))
		countUnrecorded(reason)
		return OutcomeNeedsAttention, nil
	}
	err := x.retry(ctx, func(ctx context.Context) error {
		h := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: x.Owner()}
		_, err := x.pay.MarkNeedsAttention(ctx, e.PayoutID, h, reason)
		return err
	})
	if err == nil {
		log.ErrorContext(ctx, "payout marked needs_attention; delivery acknowledged", "event", EventPayoutNeedsAttention, "reason", string(reason))
		return OutcomeNeedsAttention, nil
	}
	v, code := classifyErr(ServicePaymentResource, err)
	switch v.Class {
	case ClassDone:
		return v.Outcome, nil
	case ClassTransient:
		return "", fmt.Errorf("%w: marking needs_attention: %v", v.Err, err)
	}
	log.ErrorContext(ctx, "payout needs attention but payment-resource refused to record it; delivery acknowledged",
		"event", EventPayoutAttentionUnrecorded, "reason", string(reason), "code", code, "error", err.Error())
	countUnrecorded(reason)
	return OutcomeNeedsAttention, nil
}

// release asks lock-server to end lease (conditional on its token: a
// lease that has ended, or a newer holder's, is left alone) and logs the
// answer. It is bounded by RequestTimeout and ignores ctx's cancellation
// (it runs after the push is answered), keeping its values (the trace).
func (x *Executor) release(ctx context.Context, log *slog.Logger, lease *client.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), x.cfg.RequestTimeout)
	defer cancel()
	if err := lease.Release(rctx); err != nil {
		log.InfoContext(ctx, "lease release refused or failed", "event", EventLeaseReleaseFailed, "error", err.Error())
	} else {
		log.DebugContext(ctx, "lease released", "event", EventLeaseReleased)
	}
}

// releaseLater runs release (nil: no lease was granted) in a goroutine
// that Close waits for, or, once Close has been called, before it
// returns. The goroutine ends when the release has been answered or has
// failed (release is bounded by RequestTimeout).
func (x *Executor) releaseLater(release func()) {
	if release == nil {
		return
	}
	x.relMu.Lock()
	if x.closed {
		x.relMu.Unlock()
		release()
		return
	}
	x.releases.Add(1)
	x.relMu.Unlock()
	go func() {
		defer x.releases.Done()
		release()
	}()
}

// Close waits until every lease release still in flight (Execute sends
// them after it returns) has been answered or has failed, each bounded by
// RequestTimeout, or until ctx ends; then it returns an error wrapping
// ctx's, and the releases left finish by themselves (if the process exits
// first, their leases end by their TTL, as after a crash). From the first
// Close on, an execution releases its lease before it returns, so that no
// release is sent unwaited for. Call it once the push endpoint has stopped
// taking requests (cmd/executor calls it after the server's drain); it may
// be called more than once.
func (x *Executor) Close(ctx context.Context) error {
	x.relMu.Lock()
	x.closed = true
	x.relMu.Unlock()
	done := make(chan struct{})
	go func() { // ends when the last release has ended
		x.releases.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("executor: lease releases still in flight: %w", ctx.Err())
	}
}

// checkLocal reports whether lease is held by its local deadline, with no
// request: nil, or the SDK's error wrapping client.ErrLeaseLost (the
// deadline passed, or a renewal was refused), logged as EventLeaseLost
// before the step named. The deadline is conservative (measured from the
// acquire's or last renewal's send time, less the drift allowance; see
// lockserver/client), so it never says held after lock-server may have
// expired the lease; it cannot see an operator's revoke.
func (x *Executor) checkLocal(ctx context.Context, log *slog.Logger, lease *client.Lease, step string) error {
	err := lease.Check()
	if err != nil {
		log.WarnContext(ctx, "lease lost before the "+step+" (checked locally, no request); not going on", "event", EventLeaseLost, "step", step, "error", err.Error())
	}
	return err
}

// confirm asks lock-server to renew the lease before the side effect named
// step, so that a grant the server has ended (revoked, or expired on the
// server's clock) stops this worker here. It returns nil, or the SDK's
// error: client.ErrLeaseLost (wrapped) when the server refused the grant
// or the local deadline passed, another error when lock-server could not
// be asked or answered anything else (the lease is not known to be held,
// so nothing is sent either); ClassifyLease tells them apart.
func (x *Executor) confirm(ctx context.Context, log *slog.Logger, lease *client.Lease, step string) error {
	rctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	err := lease.Renew(rctx)
	if errors.Is(err, client.ErrLeaseLost) {
		log.WarnContext(ctx, "lease lost before the "+step+"; not going on", "event", EventLeaseLost, "step", step, "error", err.Error())
	}
	return err
}

// report posts res to payment-resource (idempotent on the rail
// reference), retrying transient failures in process (Config.ReportRetry).
// It returns nil, or the last error, for settle.
func (x *Executor) report(ctx context.Context, log *slog.Logger, e payoutevent.Event, h fencewire.Holder, res railResult) error {
	err := x.retry(ctx, func(ctx context.Context) error { return x.postResult(ctx, e, h, res) })
	if err != nil {
		log.WarnContext(ctx, "payment-resource did not take the result", "event", EventPayoutResultRefused, "railStatus", res.Status, "railRef", res.RailRef, "error", err.Error())
	}
	return err
}

// retry calls f until it returns nil or an error Classify does not call
// transient for payment-resource, at most Config.ReportRetry.Attempts
// times, waiting ReportRetry.Delay between calls, or the refusal's
// Retry-After when that is longer (503 DATABASE_UNAVAILABLE and
// OVERLOADED carry one: paydb is stalled or payment-resource sheds load,
// and an earlier try would only be refused again); each call is bounded
// by RequestTimeout. It returns f's last error, or ctx's if ctx ends
// while waiting.
func (x *Executor) retry(ctx context.Context, f func(context.Context) error) error {
	var err error
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
		err = f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if v, _ := classifyErr(ServicePaymentResource, err); v.Class != ClassTransient || attempt >= x.cfg.ReportRetry.Attempts {
			return err
		}
		wait := x.delay(attempt)
		var refusal *payclient.Error
		if errors.As(err, &refusal) && refusal.RetryAfter > wait {
			wait = refusal.RetryAfter
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		}
	}
}

// deliveryAttemptKey carries Pub/Sub's delivery attempt of the push being
// executed from ServeHTTP to Execute ("" when unknown).
type deliveryAttemptKey struct{}

func withDeliveryAttempt(ctx context.Context, attempt string) context.Context {
	return context.WithValue(ctx, deliveryAttemptKey{}, attempt)
}

func deliveryAttemptOf(ctx context.Context) string {
	a, _ := ctx.Value(deliveryAttemptKey{}).(string)
	return a
}

// inject runs the Fault, if any, at point p.
func (x *Executor) inject(ctx context.Context, p Point, d Delivery, lease *client.Lease) context.Context {
	if x.fault == nil {
		return ctx
	}
	return x.fault.At(ctx, p, d, lease)
}

// delay is ReportRetry.Delay with the executor's random source.
func (x *Executor) delay(retry int) time.Duration {
	x.rndMu.Lock()
	defer x.rndMu.Unlock()
	return x.cfg.ReportRetry.Delay(retry, x.rnd)
}

// MetricsFunction is this function's value of the function label of the
// request metrics (package httpmetrics).
const MetricsFunction = "executor"
