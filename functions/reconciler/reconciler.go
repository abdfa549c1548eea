// Package reconciler settles the payouts the pipeline left ambiguous or
// needs_attention against the rail's own record, with exactly one ledger
// effect each, and reports where the rail's record and the books disagree.
//
// New(cfg, logger, opts...) returns a Reconciler; Pass runs one pass, Loop
// runs passes until ctx ends, Settle settles one payout, and ServeHTTP
// runs a pass on request. For each payout it takes the payout's lease like
// any executor, asks rail-proxy to reconcile the payout's forwarded
// attempt, posts the signed outcome as the payout's resolution, and
// releases the lease, so its writes pass the same fences. With
// WithAuditor, a pass ends with the cross audit of package payoutaudit.
// The design: "The reconciler" in docs/payout-pipeline.md.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// PathRuns is the reconciler's one route: POST runs one pass and answers
// its PassReport (Cloud Scheduler's target on Cloud Run).
const PathRuns = "/v1/reconciler/runs"

// States lists the payout states a pass settles, in the order it visits
// them.
var States = []api.State{api.StateAmbiguous, api.StateNeedsAttention}

// Result is what a pass did with one payout: the value of
// reconciler_payouts_total{result} and of PassReport.Results' keys.
type Result string

// Results.
const (
	// ResultPosted, ResultDeclined, ResultFailed: the resolution settled
	// the payout so (posted with one debit, declined, failed).
	ResultPosted   Result = "posted"
	ResultDeclined Result = "declined"
	ResultFailed   Result = "failed"
	// ResultAlreadyDone: the payout was settled meanwhile (PAYOUT_FINISHED).
	ResultAlreadyDone Result = "already_done"
	// ResultLockBusy: the payout's lock was held past AcquireWait; next pass.
	ResultLockBusy Result = "lock_busy"
	// ResultInFlight: rail-proxy's attempt is younger than its abandon
	// threshold (ATTEMPT_IN_FLIGHT); next pass.
	ResultInFlight Result = "in_flight"
	// ResultNotForwarded: rail-proxy never let the payout through and
	// did not close it (a rail-proxy older than this reconciler, which
	// answers PAYOUT_NOT_FORWARDED): left to a person (logged). A current
	// rail-proxy closes such a payout and answers NONE: failed.
	ResultNotForwarded Result = "not_forwarded"
	// ResultRailSubmittedTwice: the rail holds more than one submission of
	// the payout: a safety violation, left to a person (ERROR).
	ResultRailSubmittedTwice Result = "rail_submitted_twice"
	// ResultTermsRefused: rail-proxy refused to close a payout it never
	// forwarded because payment-resource's signature does not cover the
	// payout's facts as sent (INVALID_TERMS, permanent for the payout):
	// left to a person (ERROR), nothing recorded. A key rail-proxy does not
	// hold yet (TERMS_KEY_UNKNOWN) or no signature (TERMS_UNSIGNED) is a
	// deployment fault instead: ResultError, tried again next pass.
	ResultTermsRefused Result = "terms_refused"
	// ResultFencedOut: a newer holder of the payout's lock is at work:
	// rail-proxy refused the closing reconciliation, or payment-resource
	// the resolution, FENCED_OUT, because a token newer than this pass's
	// has already passed the account's fence (this pass's lease ended, by
	// expiry or revoke, while it ran). Nothing was recorded; the newer
	// holder's own report settles the payout, or the next pass does, under
	// a newer token. Logged at INFO: the fence doing its work, not a
	// failure.
	ResultFencedOut Result = "fenced_out"
	// ResultError: a dependency failed or refused; next pass.
	ResultError Result = "error"
	// ResultAttemptSettled: a forwarded attempt rail-proxy listed as
	// unsettled (forwarding or ambiguous past its abandon threshold) under
	// a payout in no state of States was settled at rail-proxy
	// (acked, declined or not_at_rail); the payout itself was left as it
	// is (finished, or an executor's redelivery reports the attempt).
	ResultAttemptSettled Result = "attempt_settled"
	// ResultNotInDoubt: Settle found the payout in no state of States;
	// nothing was done. A pass never reports it.
	ResultNotInDoubt Result = "not_in_doubt"
)

// Log events of the reconciler.
const (
	// EventPassDone (INFO): a pass ended (listed, results, mismatches).
	EventPassDone = "reconciler_pass_done"
	// EventRunRefused (INFO): POST PathRuns was refused before the pass
	// (a query parameter, or a body or Content-Type outside the rule:
	// status, code, error).
	EventRunRefused = "reconciler_run_refused"
	// EventPayoutReconciled (INFO, WARN when it changed nothing it
	// should have): one payout's result (payoutId, accountId, token,
	// result, outcome, railRef).
	EventPayoutReconciled = "reconciler_payout_reconciled"
	// EventPayoutSkipped (WARN; ERROR for rail_submitted_twice): a payout
	// the pass could not settle (result, error).
	EventPayoutSkipped = "reconciler_payout_skipped"
	// EventRailPaidNoDebit (ERROR): the audit found a payout the rail
	// acknowledged with no matching debit (payoutId).
	EventRailPaidNoDebit = "reconciler_rail_payment_without_debit"
	// EventDebitNoRailPayment (ERROR): the audit found a debit with no
	// rail payment (payoutId).
	EventDebitNoRailPayment = "reconciler_debit_without_rail_payment"
	// EventAuditViolation (ERROR): the audit found a rule broken (check,
	// subject: a payout id or what the ledger check names, detail).
	EventAuditViolation = "reconciler_audit_violation"
	// EventAuditFailed (WARN): the audit could not run.
	EventAuditFailed = "reconciler_audit_failed"
)

// Kinds of audit mismatch, the label of reconciler_audit_mismatches. The
// kinds overlap: a payout of the first two kinds is usually also a
// violation.
const (
	// KindRailPaidNoDebit counts payoutaudit.Report.RailPaidNoDebit.
	KindRailPaidNoDebit = "rail_payment_without_debit"
	// KindDebitNoRailPayment counts Report.DebitNoRailPayment.
	KindDebitNoRailPayment = "debit_without_rail_payment"
	// KindViolation counts Report.Violations: every rule the audit found
	// broken, the cross-record checks of payoutaudit and the ledger checks
	// of ledgeraudit.Run (an unbalanced ledger, a balance that is not
	// its opening balance less its debits).
	KindViolation = "violation"
)

var (
	payoutsTotal = func() *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_payouts_total",
			Help: "Payouts a reconciler pass visited, by result.",
		}, []string{"result"})
		for _, r := range []Result{ResultPosted, ResultDeclined, ResultFailed, ResultAlreadyDone, ResultLockBusy,
			ResultInFlight, ResultNotForwarded, ResultRailSubmittedTwice, ResultTermsRefused, ResultFencedOut, ResultError, ResultAttemptSettled} {
			c.WithLabelValues(string(r))
		}
		return c
	}()
	mismatches = func() *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconciler_audit_mismatches",
			Help: "What the last audit found wrong, by kind: payouts with a rail payment and no debit, payouts with a debit and no rail payment, broken rules (violations).",
		}, []string{"kind"})
		g.WithLabelValues(KindRailPaidNoDebit)
		g.WithLabelValues(KindDebitNoRailPayment)
		g.WithLabelValues(KindViolation)
		return g
	}()
)

// Collectors returns the reconciler's metrics: reconciler_payouts_total
// {result} and reconciler_audit_mismatches{kind} (never a payout, account
// or token as a label).
func Collectors() []prometheus.Collector { return []prometheus.Collector{payoutsTotal, mismatches} }

// Auditor runs the cross audit (payoutaudit.Run over the three records).
type Auditor func(ctx context.Context) (payoutaudit.Report, error)

// PassReport is the result of one pass, and the 200 body of POST PathRuns.
type PassReport struct {
	// Listed counts the payouts visited.
	Listed int `json:"listed"`
	// Results counts them by Result.
	Results map[Result]int `json:"results"`
	// RailPaidNoDebit and DebitNoRailPayment list the audit's findings,
	// payout ids: never nil, so that the body always carries both lists
	// (docs/payout-api.md), [] when the audit found none or did not run
	// (no Auditor).
	RailPaidNoDebit    []string `json:"railPaidNoDebit"`
	DebitNoRailPayment []string `json:"debitNoRailPayment"`
	// Violations lists every rule the audit found broken
	// (payoutaudit.Report.Violations), never nil: [] when none, or when
	// the audit did not run.
	Violations []payoutaudit.Violation `json:"violations"`
}

// Reconciler runs passes. It is safe for concurrent use; passes are
// serialised (one at a time per process).
type Reconciler struct {
	cfg   Config
	log   *slog.Logger
	locks *client.Client
	pay   *payclient.Client
	rail  *railclient.Client
	audit Auditor
	pass  sync.Mutex
}

// Option configures New.
type Option func(*options)

type options struct {
	doer  client.Doer
	audit Auditor
}

// WithHTTPClient sends every call (lock-server, payment-resource,
// rail-proxy) through d (Cloud Run ID tokens, tests).
func WithHTTPClient(d client.Doer) Option { return func(o *options) { o.doer = d } }

// WithAuditor runs a after each pass and reports its mismatches.
func WithAuditor(a Auditor) Option { return func(o *options) { o.audit = a } }

// New returns a Reconciler. Errors wrap ErrInvalidConfig.
func New(cfg Config, log *slog.Logger, opts ...Option) (*Reconciler, error) {
	if log == nil {
		return nil, fmt.Errorf("%w: nil logger", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{doer: http.DefaultClient}
	for _, f := range opts {
		f(&o)
	}
	copts := []client.Option{client.WithHTTPClient(o.doer)}
	if cfg.Owner != "" {
		copts = append(copts, client.WithOwner(cfg.Owner))
	}
	locks, err := client.New(cfg.LockServerURL, copts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	pay, err := payclient.New(cfg.PaymentResourceURL, payclient.WithHTTPClient(o.doer))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	rail, err := railclient.New(cfg.RailProxyURL, railclient.WithHTTPClient(o.doer))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return &Reconciler{cfg: cfg, log: log, locks: locks, pay: pay, rail: rail, audit: o.audit}, nil
}

// Owner is the owner id of the reconciler's leases.
func (r *Reconciler) Owner() string { return r.locks.Owner() }

// Pass runs one pass over every payout in States, then over rail-proxy's
// unsettled attempts, and then the audit (with WithAuditor). A payout it cannot settle now is counted
// and left for the next pass; the error is only for a listing that
// failed (the pass then stops) or a cancelled ctx.
func (r *Reconciler) Pass(ctx context.Context) (PassReport, error) {
	r.pass.Lock()
	defer r.pass.Unlock()
	rep := PassReport{Results: map[Result]int{}, RailPaidNoDebit: []string{}, DebitNoRailPayment: []string{}, Violations: []payoutaudit.Violation{}}
	for _, st := range States {
		after := ""
		for {
			lctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
			page, err := r.pay.ListPayouts(lctx, st, r.cfg.PageSize, after)
			cancel()
			if err != nil {
				return rep, fmt.Errorf("reconciler: list %s payouts: %w", st, err)
			}
			for _, p := range page.Payouts {
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				res := r.settle(ctx, p)
				rep.Listed++
				rep.Results[res]++
				payoutsTotal.WithLabelValues(string(res)).Inc()
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
	}
	if err := r.settleAttempts(ctx, &rep); err != nil {
		return rep, err
	}
	if r.audit != nil {
		a, err := r.audit(ctx)
		if err != nil {
			r.log.Warn("audit could not run", "event", EventAuditFailed, "error", err.Error())
		} else {
			rep.RailPaidNoDebit = append(rep.RailPaidNoDebit, a.RailPaidNoDebit...)
			rep.DebitNoRailPayment = append(rep.DebitNoRailPayment, a.DebitNoRailPayment...)
			for _, id := range a.RailPaidNoDebit {
				r.log.Error("the rail paid this payout more times than the books debited it", "event", EventRailPaidNoDebit, "payoutId", id)
			}
			for _, id := range a.DebitNoRailPayment {
				r.log.Error("the books debit this payout and the rail holds no payment of it", "event", EventDebitNoRailPayment, "payoutId", id)
			}
			rep.Violations = append(rep.Violations, a.Violations...)
			for _, v := range a.Violations {
				r.log.Error("the audit found a rule broken", "event", EventAuditViolation, "check", v.Check, "subject", v.Subject, "detail", v.Detail)
			}
			mismatches.WithLabelValues(KindRailPaidNoDebit).Set(float64(len(a.RailPaidNoDebit)))
			mismatches.WithLabelValues(KindDebitNoRailPayment).Set(float64(len(a.DebitNoRailPayment)))
			mismatches.WithLabelValues(KindViolation).Set(float64(len(a.Violations)))
		}
	}
	r.log.Info("reconciler pass done", "event", EventPassDone, "listed", rep.Listed, "results", rep.Results,
		"railPaidNoDebit", len(rep.RailPaidNoDebit), "debitNoRailPayment", len(rep.DebitNoRailPayment), "violations", len(rep.Violations))
	return rep, nil
}

// Settle does for the one payout id what a pass does for each payout it
// lists, whatever its turn: it reads the payout (GET /v1/payouts/{id})
// and, when its state is one of States, settles it under its lease and
// returns the Result (counted in reconciler_payouts_total, as a pass
// counts it); ResultNotInDoubt when the payout is in no such state. The
// read decides nothing by itself: every write that follows is fenced by
// the lease's token. The error is for a payout that could not be read
// (payment-resource client errors, such as payclient.ErrPayoutNotFound) or a
// cancelled ctx; no audit runs.
func (r *Reconciler) Settle(ctx context.Context, payoutID string) (Result, error) {
	r.pass.Lock()
	defer r.pass.Unlock()
	gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	p, err := r.pay.Payout(gctx, payoutID)
	cancel()
	if err != nil {
		return ResultError, fmt.Errorf("reconciler: read payout %s: %w", payoutID, err)
	}
	if !slices.Contains(States, p.State) {
		return ResultNotInDoubt, nil
	}
	res := r.settle(ctx, p)
	payoutsTotal.WithLabelValues(string(res)).Inc()
	return res, nil
}

// settleAttempts visits rail-proxy's unsettled forwarded attempts (GET
// /v1/rail/unsettled, under a lease on railapi.UnsettledLockKey, whose
// token and proof rail-proxy verifies) and settles each one whose payout
// is in no state of States with rail-proxy's reconciliation, under the
// payout's lease (settleAttempt): a rail-proxy or raildb that died after
// the rail answered and before the answer was recorded leaves the attempt
// forwarding under a payout that may be posted already, and no state pass
// visits it. Payouts in States were visited by the pass. Each attempt
// is counted in rep; the error is for a listing that failed (or a
// cancelled ctx): the pass then stops.
func (r *Reconciler) settleAttempts(ctx context.Context, rep *PassReport) error {
	actx, cancel := context.WithTimeout(ctx, r.cfg.AcquireWait)
	lease, err := r.locks.Acquire(actx, railapi.UnsettledLockKey, client.WithTTL(r.cfg.LeaseTTL), client.WithAutoRenew(0))
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil || errors.Is(err, client.ErrLockHeld) {
			// Another reconciler lists right now; next pass.
			r.log.Warn("unsettled attempts not listed: their lock is busy", "event", EventPayoutSkipped, "result", string(ResultLockBusy), "error", err.Error())
			return nil
		}
		return fmt.Errorf("reconciler: lease for listing unsettled attempts: %w", err)
	}
	var attempts []railapi.Attempt
	after := int64(0)
	for {
		h := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: r.Owner()}
		lctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
		page, err := r.rail.Unsettled(lctx, h, after, r.cfg.PageSize)
		cancel()
		if err != nil {
			r.releaseLease(ctx, lease)
			return fmt.Errorf("reconciler: list unsettled attempts: %w", err)
		}
		attempts = append(attempts, page.Attempts...)
		if page.Next == 0 {
			break
		}
		after = page.Next
	}
	r.releaseLease(ctx, lease)
	for _, a := range attempts {
		if err := ctx.Err(); err != nil {
			return err
		}
		res := r.settleAttempt(ctx, a)
		if res == "" {
			continue
		}
		rep.Listed++
		rep.Results[res]++
		payoutsTotal.WithLabelValues(string(res)).Inc()
	}
	return nil
}

// settleAttempt settles one unsettled attempt at rail-proxy under its
// payout's lease, unless the payout is in a state of States (the pass
// settles those; "" is returned, nothing counted).
func (r *Reconciler) settleAttempt(ctx context.Context, a railapi.Attempt) Result {
	log := r.log.With("payoutId", a.PayoutID, "accountId", a.AccountID, "ownerId", r.Owner(), "attemptId", a.AttemptID)
	skip := func(res Result, err error) Result {
		log.Warn("unsettled attempt not settled by this pass", "event", EventPayoutSkipped, "result", string(res), "error", err.Error())
		return res
	}
	gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	p, err := r.pay.Payout(gctx, a.PayoutID)
	cancel()
	switch {
	case err == nil && slices.Contains(States, p.State):
		return ""
	case err != nil && !errors.Is(err, payclient.ErrPayoutNotFound):
		return skip(ResultError, err)
	}
	// The attempt is rail-proxy's: its payout's lock orders this
	// reconciliation with every holder of the account.
	e := payoutevent.Event{PayoutID: a.PayoutID, AccountID: a.AccountID}
	lease, res, err := r.acquire(ctx, e.LockKey())
	if err != nil {
		return skip(res, err)
	}
	defer r.releaseLease(ctx, lease)
	h := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: r.Owner()}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	rec, err := r.rail.Reconcile(cctx, h, a.PayoutID)
	cancel()
	switch {
	case errors.Is(err, railclient.ErrAttemptInFlight):
		return skip(ResultInFlight, err)
	case errors.Is(err, railclient.ErrRailSubmittedTwice):
		log.Error("the rail holds more than one submission of this payout", "event", EventPayoutSkipped,
			"result", string(ResultRailSubmittedTwice), "error", err.Error())
		return ResultRailSubmittedTwice
	case err != nil:
		return skip(ResultError, err)
	}
	log.Info("unsettled attempt settled against the rail's record", "event", EventPayoutReconciled, "result", string(ResultAttemptSettled),
		"outcome", string(rec.Outcome), "railRef", rec.RailRef, "railToken", rec.RailToken, "state", string(rec.Attempt.State))
	return ResultAttemptSettled
}

// acquire takes key's lease for one settlement, waiting up to
// AcquireWait. When it is not granted it returns the result to skip the
// settlement with: ResultLockBusy when the key stayed held (LOCK_HELD, or
// AcquireWait ran out while the pass goes on), ResultError otherwise.
func (r *Reconciler) acquire(ctx context.Context, key string) (*client.Lease, Result, error) {
	actx, cancel := context.WithTimeout(ctx, r.cfg.AcquireWait)
	lease, err := r.locks.Acquire(actx, key, client.WithTTL(r.cfg.LeaseTTL), client.WithAutoRenew(0))
	cancel()
	switch {
	case err == nil:
		return lease, "", nil
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil || errors.Is(err, client.ErrLockHeld):
		return nil, ResultLockBusy, err
	}
	return nil, ResultError, err
}

// releaseLease releases lease, even when ctx has ended; a refused release
// means the lease had ended.
func (r *Reconciler) releaseLease(ctx context.Context, lease *client.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.RequestTimeout)
	defer cancel()
	_ = lease.Release(rctx)
}

// settle resolves one payout under its lease.
func (r *Reconciler) settle(ctx context.Context, p api.Payout) Result {
	e := payoutevent.Event{PayoutID: p.PayoutID, AccountID: p.AccountID}
	log := r.log.With("payoutId", p.PayoutID, "accountId", p.AccountID, "ownerId", r.Owner(), "state", string(p.State))
	skip := func(res Result, err error) Result {
		level, msg := slog.LevelWarn, "payout not settled by this pass"
		switch res {
		case ResultRailSubmittedTwice, ResultNotForwarded, ResultTermsRefused:
			level = slog.LevelError
		case ResultFencedOut:
			level, msg = slog.LevelInfo, "payout left to a newer holder of its lock: this pass's token was fenced out"
		}
		log.Log(ctx, level, msg, "event", EventPayoutSkipped, "result", string(res), "error", err.Error())
		return res
	}
	lease, res, err := r.acquire(ctx, e.LockKey())
	if err != nil {
		return skip(res, err)
	}
	defer r.releaseLease(ctx, lease)
	h := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: r.Owner()}
	log = log.With("token", h.Token)

	cctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	// With the payout's facts, a payout rail-proxy never forwarded is
	// closed there (no later submission of it is forwarded) and stopped
	// at the rail, and comes back NONE: it fails like any other payout the
	// rail does not hold.
	rec, err := r.rail.ReconcilePayout(cctx, h, railapi.ReconcileRequest{PayoutID: p.PayoutID, AccountID: p.AccountID,
		AmountMinor: p.AmountMinor, Currency: p.Currency, TermsSignature: p.TermsSignature})
	cancel()
	switch {
	case errors.Is(err, railclient.ErrAttemptInFlight):
		return skip(ResultInFlight, err)
	case errors.Is(err, railclient.ErrNotForwarded):
		return skip(ResultNotForwarded, err)
	case errors.Is(err, railclient.ErrRailSubmittedTwice):
		return skip(ResultRailSubmittedTwice, err)
	case errors.Is(err, railclient.ErrInvalidTerms):
		return skip(ResultTermsRefused, err)
	case errors.Is(err, railclient.ErrFencedOut):
		return skip(ResultFencedOut, err)
	case err != nil: // TERMS_KEY_UNKNOWN and TERMS_UNSIGNED too: a deployment fault, next pass
		return skip(ResultError, err)
	}
	req := api.ResolutionRequest{Outcome: outcome(rec.Outcome), RailRef: rec.RailRef, RailToken: rec.RailToken, Receipt: rec.Receipt}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	got, err := r.pay.Resolve(pctx, p.PayoutID, h, req)
	cancel()
	switch {
	case errors.Is(err, payclient.ErrPayoutFinished):
		log.Info("payout already settled", "event", EventPayoutReconciled, "result", string(ResultAlreadyDone), "outcome", string(req.Outcome))
		return ResultAlreadyDone
	case errors.Is(err, payclient.ErrFencedOut):
		return skip(ResultFencedOut, err)
	case err != nil:
		return skip(ResultError, err)
	}
	res = ResultError
	switch got.State {
	case api.StatePosted:
		res = ResultPosted
	case api.StateDeclined:
		res = ResultDeclined
	case api.StateFailed:
		res = ResultFailed
	}
	log.Info("payout settled against the rail's record", "event", EventPayoutReconciled, "result", string(res),
		"outcome", string(req.Outcome), "railRef", rec.RailRef, "railToken", rec.RailToken, "debits", got.Debits)
	return res
}

// outcome maps rail-proxy's reconciliation outcome to payment-resource's
// resolution outcome (the same spellings, two vocabularies).
func outcome(s railapi.RailStatus) api.Outcome {
	switch s {
	case railapi.RailAck:
		return api.OutcomeAck
	case railapi.RailDecline:
		return api.OutcomeDecline
	}
	return api.OutcomeNone
}

// Loop runs a pass every cfg.Interval until ctx ends (the local stack's
// trigger); it returns at once when Interval is 0. A failed pass is
// logged and the next one runs on schedule.
func (r *Reconciler) Loop(ctx context.Context) {
	if r.cfg.Interval <= 0 {
		return
	}
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reconciler pass failed", "event", EventPassDone, "error", err.Error())
		}
	}
}

// MaxRunBodyBytes bounds the body of POST PathRuns, which takes no
// parameters: an empty body or "{}".
const MaxRunBodyBytes = 4096

// CodePassNotRun is the code of the 503 of POST PathRuns when the pass
// could not list the payouts (retryable: nothing was settled).
const CodePassNotRun = "PASS_NOT_RUN"

// ServeHTTP runs one pass on POST PathRuns and answers its PassReport.
// The request takes no parameters: its body is empty, or "{}" sent as
// application/json in UTF-8 (jsonhandler.DecodeEmpty, the rule of every
// service); anything else is refused 400, 413 or 415 before the pass.
// Other paths get 404 NOT_FOUND, other methods 405 METHOD_NOT_ALLOWED,
// and a pass that could not list the payouts 503 CodePassNotRun with
// Retry-After (overload.RetryAfterSeconds), each
// with the error envelope {"error":{"code","message","retryable"}}.
func (r *Reconciler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch {
	case req.URL.Path != PathRuns:
		jsonhandler.WriteError(w, http.StatusNotFound, string(api.CodeNotFound), "no such route; POST "+PathRuns, false)
		return
	case req.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		jsonhandler.WriteError(w, http.StatusMethodNotAllowed, string(api.CodeMethodNotAllowed), "use POST "+PathRuns, false)
		return
	}
	if _, err := jsonhandler.Query(req); err != nil {
		// A run takes no parameter: one sent anyway (a dry run the
		// caller believes it asked for) is refused, not ignored.
		e := &jsonhandler.Error{Status: http.StatusBadRequest, Code: jsonhandler.CodeInvalidRequest, Message: err.Error()}
		r.log.InfoContext(req.Context(), "reconciler run refused", "event", EventRunRefused, "status", e.Status, "code", e.Code, "error", e.Message)
		jsonhandler.Write(w, e)
		return
	}
	if err := jsonhandler.DecodeEmpty(w, req, MaxRunBodyBytes); err != nil {
		e := err.(*jsonhandler.Error)
		r.log.InfoContext(req.Context(), "reconciler run refused", "event", EventRunRefused, "status", e.Status, "code", e.Code, "error", e.Message)
		jsonhandler.Write(w, e)
		return
	}
	rep, err := r.Pass(req.Context())
	if err != nil {
		r.log.Error("reconciler pass failed", "event", EventPassDone, "error", err.Error())
		// Retry-After like every 503 of the project (overload.SetRetryAfter).
		overload.SetRetryAfter(w.Header())
		jsonhandler.WriteError(w, http.StatusServiceUnavailable, CodePassNotRun, "the pass could not list the payouts; see the reconciler's log", true)
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, rep)
}
