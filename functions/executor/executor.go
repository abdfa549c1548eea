// Package executor is the payout worker: the critical section that the lock
// is taken for. It is an HTTP handler for Pub/Sub push requests carrying a
// payoutevent.Event; for each payout it
//
//  0. reads the payout and checks that the event describes it (the event
//     is a notification; the payout row decides the account and amount),
//  1. acquires the lease on payout:{account_id} through the SDK (renewed in
//     the background while it works),
//  2. confirms the lease with lock-server (a renewal), then claims the
//     payout at payment-resource with its fencing token,
//  3. confirms the lease again, then submits the payout to the rail
//     through rail-proxy with its fencing token; when rail-proxy answers
//     that the payout already went to the rail (an earlier worker's
//     submission, perhaps a stale one that arrived first), it takes that
//     attempt's outcome instead of submitting again,
//  4. posts the rail's outcome to payment-resource with its fencing token,
//  5. releases the lease.
//
// No step rests on an unfenced read: whether the payout may go to the rail
// is decided by rail-proxy inside the transaction that records the
// submission, never by a look-up beforehand (two holders would each read
// "not yet" and both submit). docs/payout-pipeline.md lists every read
// that decides a later write.
//
// The lease confirmations make an operator's revoke, or an expiry the
// worker's local deadline has not caught up with, stop the worker before
// its next side effect; they cannot close the window: the process can be
// paused right after a confirmation. What stops a stale worker is the two
// fence points, rail-proxy's high-water mark and one-forward-per-payout
// rule and payment-resource's conditional UPDATE.
//
// Pub/Sub delivers at least once; a redelivery is just another worker. The
// HTTP status tells Pub/Sub whether to deliver again: 2xx when the payout
// reached a state no retry can change (posted, declined, in doubt, or the
// message is malformed), 5xx or 409 when a later attempt may finish the job
// (the lock was busy, the lease was lost, a dependency was down, or this
// worker was fenced out while another may still fail).
//
// Which lock backend lock-server uses is invisible here: the executor is
// the same binary for PostgreSQL and etcd.
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// Errors that end an execution without a final outcome; each makes Pub/Sub
// deliver the event again (see Status).
var (
	// ErrLockBusy: the account's lock was not granted within AcquireWait.
	ErrLockBusy = errors.New("executor: lock busy")
	// ErrLeaseLost: the lease ended before a side effect (expired, revoked,
	// or refused by lock-server when confirmed); nothing was sent.
	ErrLeaseLost = errors.New("executor: lease lost before a side effect")
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
	// OutcomeDropped: the message can never be executed (malformed, or the
	// payout does not exist); it is logged and acknowledged.
	OutcomeDropped Outcome = "dropped"
)

// Hooks are called at fixed points of an execution. The fencing experiment
// uses BeforeRailSubmit to stop the worker with SIGSTOP at the most
// dangerous moment: after its last lease confirmation, before the rail.
type Hooks struct {
	// AfterClaim runs right after the payout was claimed under lease.
	AfterClaim func(ctx context.Context, e payoutevent.Event, lease *client.Lease)
	// BeforeRailSubmit runs after the last lease confirmation and before
	// the rail submission; token is the lease's fencing token.
	BeforeRailSubmit func(ctx context.Context, e payoutevent.Event, token int64)
}

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
	hooks Hooks
}

// Option configures New.
type Option func(*Executor)

// WithHooks installs h.
func WithHooks(h Hooks) Option { return func(x *Executor) { x.hooks = h } }

// WithHTTPClient sends every request (to lock-server, payment-resource and
// rail-proxy) through d. Both SDKs take the same Doer.
func WithHTTPClient(d client.Doer) Option { return func(x *Executor) { x.doer = d } }

// New returns an Executor for cfg. It returns an error if cfg is invalid.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Executor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, errors.New("executor: New needs a logger")
	}
	x := &Executor{cfg: cfg, log: logger, doer: &http.Client{}}
	for _, o := range opts {
		o(x)
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
// and the delivery attempt; a CloudEvent may lose them.
func (x *Executor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		deliveries.WithLabelValues(resultRejected).Inc()
		w.Header().Set("Allow", http.MethodPost)
		httpjson.WriteError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "send Pub/Sub push requests with POST", false)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPushBytes))
	if err != nil {
		deliveries.WithLabelValues(resultRejected).Inc()
		httpjson.WriteError(w, http.StatusRequestEntityTooLarge, httpjson.CodeBodyTooLarge, err.Error(), false)
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
		deliveries.WithLabelValues(resultRejected).Inc()
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalidRequest, err.Error(), false)
		return
	}
	if err != nil {
		// A message that cannot decode never will: acknowledge it so that it
		// is not redelivered forever, and leave the evidence in the log.
		x.log.Error("payout event dropped", "event", "payout_event_malformed", "messageId", push.Message.MessageID, "error", err.Error())
		deliveries.WithLabelValues(string(OutcomeDropped)).Inc()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	log := x.log.With("payoutId", ev.PayoutID, "accountId", ev.AccountID, "messageId", push.Message.MessageID, "deliveryAttempt", push.Attempt(), "ownerId", x.Owner())
	log.Info("payout event received", "event", "payout_event_received", "orderingKey", push.Message.OrderingKey)
	out, err := x.Execute(r.Context(), ev)
	status := Status(out, err)
	if err != nil {
		deliveries.WithLabelValues(codeOf(err)).Inc()
		log.Warn("payout execution incomplete; Pub/Sub will redeliver", "event", "payout_execution_retry", "status", status, "error", err.Error())
		httpjson.WriteError(w, status, codeOf(err), err.Error(), true)
		return
	}
	deliveries.WithLabelValues(string(out)).Inc()
	log.Info("payout execution finished", "event", "payout_execution_done", "outcome", string(out))
	httpjson.WriteJSON(w, status, map[string]string{"payoutId": ev.PayoutID, "outcome": string(out)})
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
		Help: "Push requests answered, by result: posted, declined, in_doubt, already_done, dropped; " + fencing.CodeFencedOut +
			", LOCK_BUSY, LEASE_LOST, SUBMISSION_IN_FLIGHT, DEPENDENCY_UNAVAILABLE (redelivered); rejected (not a push).",
	}, []string{"result"})
	for _, r := range []string{
		string(OutcomePosted), string(OutcomeDeclined), string(OutcomeInDoubt), string(OutcomeAlreadyDone), string(OutcomeDropped),
		fencing.CodeFencedOut, codeLockBusy, codeLeaseLost, codeInFlight, codeDependency, resultRejected,
	} {
		c.WithLabelValues(r) // present at 0
	}
	return c
}()

// Collectors returns the executor's metrics, for the registry its process
// serves: executor_deliveries_total{result}, one per request answered,
// result being an Outcome, the code of the error that makes Pub/Sub
// redeliver, or "rejected" for a request that is not a push (never a
// payout, an account or a token).
func Collectors() []prometheus.Collector { return []prometheus.Collector{deliveries} }

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
// fencing.CodeFencedOut), also values of executor_deliveries_total.
const (
	codeLockBusy   = "LOCK_BUSY"
	codeLeaseLost  = "LEASE_LOST"
	codeInFlight   = "SUBMISSION_IN_FLIGHT"
	codeDependency = "DEPENDENCY_UNAVAILABLE"
)

func codeOf(err error) string {
	switch {
	case errors.Is(err, ErrFencedOut):
		return fencing.CodeFencedOut
	case errors.Is(err, ErrLockBusy):
		return codeLockBusy
	case errors.Is(err, ErrLeaseLost):
		return codeLeaseLost
	case errors.Is(err, ErrSubmissionInFlight):
		return codeInFlight
	default:
		return codeDependency
	}
}

// Execute runs the payout flow for e and returns its final outcome, or an
// error wrapping ErrLockBusy, ErrLeaseLost, ErrFencedOut,
// ErrSubmissionInFlight or ErrDependency when a later delivery should try
// again.
func (x *Executor) Execute(ctx context.Context, e payoutevent.Event) (Outcome, error) {
	log := x.log.With("payoutId", e.PayoutID, "accountId", e.AccountID, "ownerId", x.Owner())
	// (0) the event is a notification; the payout row is the truth. A
	// forged or corrupted event must not choose the lock, the account or
	// the amount sent to the rail.
	switch code, err := x.verify(ctx, e); {
	case errors.Is(err, errMismatch):
		log.Error("payout event does not match its payout; dropped", "event", "payout_event_mismatch", "error", err.Error())
		return OutcomeDropped, nil
	case err != nil:
		return "", err
	case code == api.CodePayoutNotFound:
		log.Error("payout event for an unknown payout", "event", "payout_event_unknown_payout")
		return OutcomeDropped, nil
	}
	actx, cancel := context.WithTimeout(ctx, x.cfg.AcquireWait)
	lease, err := x.locks.Acquire(actx, e.LockKey(), client.WithTTL(x.cfg.LeaseTTL), client.WithAutoRenew(0))
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrLockHeld) {
			return "", fmt.Errorf("%w: %s: %v", ErrLockBusy, e.LockKey(), err)
		}
		return "", fmt.Errorf("%w: acquire %s: %v", ErrDependency, e.LockKey(), err)
	}
	token := lease.Token()
	// The holder's headers at the fence points: the token, lock-server's
	// proof of it (the fence points verify it was granted on this
	// account's lock) and this worker's owner id.
	holder := payoutevent.Holder{Token: token, Proof: lease.Proof(), Owner: x.Owner()}
	log = log.With("token", token)
	log.Info("lease granted; executing under it", "event", "lease_acquired", "lock", e.LockKey(), "leaseId", lease.Grant().LeaseID, "ttlMs", lease.Grant().TTLMs)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), x.cfg.RequestTimeout)
		defer cancel()
		if err := lease.Release(rctx); err != nil {
			log.Info("lease release refused or failed", "event", "lease_release_failed", "error", err.Error())
		} else {
			log.Info("lease released", "event", "lease_released")
		}
	}()

	// (1) claim, once lock-server has confirmed the grant is still ours.
	if err := x.confirm(ctx, log, lease, "claim"); err != nil {
		return "", err
	}
	switch code, err := x.claim(ctx, e, holder); {
	case err != nil:
		return "", err
	case code == api.CodePayoutFinished:
		log.Info("payout already finished by an earlier delivery", "event", "payout_already_done")
		return OutcomeAlreadyDone, nil
	case code == api.CodePayoutInDoubt:
		log.Warn("payout is in doubt; leaving it to reconciliation", "event", "payout_in_doubt")
		return OutcomeInDoubt, nil
	case code == api.CodePayoutNotFound:
		log.Error("payout event for an unknown payout", "event", "payout_event_unknown_payout")
		return OutcomeDropped, nil
	}
	log.Info("payout claimed", "event", "payout_claimed")
	if x.hooks.AfterClaim != nil {
		x.hooks.AfterClaim(ctx, e, lease)
	}

	// (2) the last confirmation, then the side effect no transaction can
	// undo. Whether the payout already went to the rail is rail-proxy's
	// decision, taken in the transaction that records this submission.
	if err := x.confirm(ctx, log, lease, "rail submission"); err != nil {
		return "", err
	}
	if x.hooks.BeforeRailSubmit != nil {
		x.hooks.BeforeRailSubmit(ctx, e, token)
	}
	res, err := x.submit(ctx, e, holder)
	var first *firstAttempt
	switch {
	case errors.Is(err, ErrFencedOut):
		log.Warn("rail-proxy refused this worker's token; a newer holder owns the payout", "event", "rail_submission_fenced")
		return "", err
	case errors.As(err, &first):
		log.Warn("the payout already went to the rail; reporting that submission's outcome instead of submitting again",
			"event", "rail_prior_attempt_found", "attemptState", first.State, "railRef", first.RailRef, "attemptToken", first.Token)
		if first.State == railapi.StateForwarding {
			return "", fmt.Errorf("%w: attempt %d with token %d", ErrSubmissionInFlight, first.AttemptID, first.Token)
		}
		res = railResult{Status: first.outcome(), RailRef: first.RailRef, Token: first.Token, Receipt: first.Receipt}
		if first.AccountID != e.AccountID || first.AmountMinor != e.AmountMinor || first.Currency != e.Currency {
			// What went to the rail under this payout's id is not this
			// payout (a forged or buggy submission): its outcome says
			// nothing about this payout's money. A person decides.
			log.Error("the submission that went to the rail under this payout's id does not match the payout; marking it ambiguous",
				"event", "rail_prior_attempt_mismatch", "attemptAccountId", first.AccountID, "attemptAmountMinor", first.AmountMinor,
				"attemptCurrency", first.Currency)
			res = railResult{Status: api.OutcomeAmbiguous} // no token of this payout reached the rail
		}
	case errors.Is(err, errAmbiguous):
		log.Error("rail outcome unknown; marking the payout ambiguous", "event", "rail_submission_ambiguous", "error", err.Error())
		res = railResult{Status: api.OutcomeAmbiguous, Token: token}
	case err != nil:
		return "", err
	default:
		log.Info("rail submission answered", "event", "rail_submission_accepted", "railStatus", res.Status, "railRef", res.RailRef)
	}
	// (3) The rail's answer is a fact: report it whatever the lease says now;
	// payment-resource's fence decides whether this worker may still write.
	return x.report(ctx, log, e, holder, res)
}

// confirm asks lock-server to renew the lease before the side effect named
// step, so that a grant the server has ended (revoked, or expired on the
// server's clock) stops this worker here. It returns an error wrapping
// ErrLeaseLost when the server refused the grant or the local deadline
// passed, ErrDependency when lock-server could not be asked (the lease is
// not known to be held, so nothing is sent either).
func (x *Executor) confirm(ctx context.Context, log *slog.Logger, lease *client.Lease, step string) error {
	rctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	err := lease.Renew(rctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, client.ErrLeaseLost):
		log.Warn("lease lost before the "+step+"; not sending it", "event", "lease_lost", "step", step, "error", err.Error())
		return fmt.Errorf("%w: before %s: %v", ErrLeaseLost, step, err)
	default:
		return fmt.Errorf("%w: confirming the lease before %s: %v", ErrDependency, step, err)
	}
}

// report posts res to payment-resource, retrying transient failures (the
// post is idempotent on the rail reference), and maps the answer to an
// Outcome.
func (x *Executor) report(ctx context.Context, log *slog.Logger, e payoutevent.Event, h payoutevent.Holder, res railResult) (Outcome, error) {
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
			case <-ctx.Done():
				return "", fmt.Errorf("%w: posting the result: %v", ErrDependency, ctx.Err())
			}
		}
		var code api.Code
		code, err = x.postResult(ctx, e, h, res)
		if errors.Is(err, ErrFencedOut) {
			log.Warn("payment-resource refused this worker's token", "event", "payout_result_fenced", "railStatus", res.Status, "railRef", res.RailRef)
			return "", err
		}
		if errors.Is(err, ErrDependency) {
			continue
		}
		if err != nil {
			return "", err
		}
		switch {
		case code == api.CodePayoutFinished:
			return OutcomeAlreadyDone, nil
		case res.Status == api.OutcomeAck:
			log.Info("payout posted", "event", "payout_posted", "railRef", res.RailRef)
			return OutcomePosted, nil
		case res.Status == api.OutcomeDecline:
			log.Info("payout declined", "event", "payout_declined", "railRef", res.RailRef)
			return OutcomeDeclined, nil
		default:
			log.Warn("payout marked ambiguous", "event", "payout_ambiguous")
			return OutcomeInDoubt, nil
		}
	}
	return "", err
}
