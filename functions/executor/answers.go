package executor

import (
	"context"
	"errors"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// Class is what one answer of a dependency means for the delivery that
// got it. Every answer is classified once, by Classify, from the table
// below; the flow of Execute only acts on the class.
type Class string

// Classes.
const (
	// ClassDone: nothing is left for this delivery to do (the payout is
	// finished, in doubt, already needs attention or does not exist, or
	// the event does not describe it). The push is acknowledged (2xx).
	ClassDone Class = "done"
	// ClassPermanent: a refusal that no retry can change, for this payout.
	// The payout is marked needs_attention with the verdict's reason and
	// the push is acknowledged, so that Pub/Sub stops delivering it.
	ClassPermanent Class = "permanent"
	// ClassTransient: a later try may succeed (a dependency down, a lock
	// busy, a lease lost, a refusal that is the same for every payout and
	// so a matter of the deployment). Reports are retried in process with
	// exponential backoff and jitter (Config.ReportRetry); everything else
	// is answered 409 or 503 so that Pub/Sub redelivers it with its own
	// backoff, up to its maximum delivery attempts and the dead-letter
	// topic.
	ClassTransient Class = "transient"
	// ClassFenced: FENCED_OUT. Transient for a stale holder (its lease has
	// ended: a newer holder of the account's lock exists, and the next
	// delivery gets a newer token); permanent, with the verdict's reason,
	// for the holder of the current lease, confirmed with lock-server
	// after the refusal: the fence then holds a token above anything
	// lock-server has granted for payout:{account}, and no later holder
	// can pass it either.
	ClassFenced Class = "fenced"
	// ClassContinue: the answer is the step's result and the execution
	// goes on (rail-proxy's RAIL_AMBIGUOUS, PAYOUT_STOPPED and
	// PAYOUT_ALREADY_SUBMITTED: an outcome to report).
	ClassContinue Class = "continue"
)

// Service names the dependency an answer came from.
type Service string

// Services the executor calls.
const (
	ServiceLockServer      Service = "lock-server"
	ServicePaymentResource Service = "payment-resource"
	ServiceRailProxy       Service = "rail-proxy"
)

// Verdict is the classification of one answer.
type Verdict struct {
	// Class is what the answer means for the delivery.
	Class Class
	// Outcome is the delivery's final outcome for ClassDone.
	Outcome Outcome
	// Reason is the payout's attention reason for ClassPermanent, and for
	// ClassFenced when the holder's lease is current.
	Reason api.AttentionReason
	// Err is the sentinel of a ClassTransient (or stale ClassFenced)
	// answer: ErrLockBusy, ErrNoLongerHolder, ErrFencedOut or ErrDependency,
	// which chooses the push status and the delivery's metric label. A
	// ClassContinue answer that cannot be acted on (a
	// PAYOUT_ALREADY_SUBMITTED without its attempt) is redelivered with
	// it too.
	Err error
}

var (
	transient = Verdict{Class: ClassTransient, Err: ErrDependency}
	// deployment is a refusal that would meet every payout alike (no such
	// route, wrong method, a body or media type the server does not take):
	// the deployment is wrong, not the payout. It is redelivered, so that
	// it ends in the dead-letter topic if it lasts, and no payout is
	// marked for it.
	deployment = transient
	// alteredTerms is rail-proxy's INVALID_TERMS: payment-resource's key
	// signed other terms than the ones submitted. That is about this
	// payout (its terms were changed after signing, or the signature is
	// another payout's), not the deployment: an unknown key
	// (TERMS_KEY_UNKNOWN) or no signature (TERMS_UNSIGNED) is the
	// deployment's. Redelivering it would loop to the dead-letter topic.
	alteredTerms = Verdict{Class: ClassPermanent, Reason: api.ReasonRailRequestRefused}
)

// answers is the classification of every code of lockserver/api,
// functions/paymentresource/api and functions/railproxy/api, by service.
// A code missing here is classified by Classify's default. lock-server's
// row is its answer to the acquire; its answers on a granted lease go
// through ClassifyLease.
var answers = map[Service]map[string]Verdict{
	ServiceLockServer: {
		string(lockapi.CodeLockHeld):             {Class: ClassTransient, Err: ErrLockBusy},
		string(lockapi.CodeLeaseNotHeld):         {Class: ClassTransient, Err: ErrNoLongerHolder},
		string(lockapi.CodeStaleToken):           {Class: ClassTransient, Err: ErrNoLongerHolder},
		string(lockapi.CodeInvalidRequest):       {Class: ClassDone, Outcome: OutcomeDropped}, // the event's lock key is refused: it never executes
		string(lockapi.CodeBodyTooLarge):         deployment,
		string(lockapi.CodeUnsupportedMediaType): deployment,
		string(lockapi.CodeNotFound):             deployment,
		string(lockapi.CodeMethodNotAllowed):     deployment,
		string(lockapi.CodeBackendUnavailable):   transient,
		string(lockapi.CodeBackendRestored):      transient, // until an operator advances the tokens
		string(lockapi.CodeOverloaded):           transient, // lock-server sheds load; Retry-After
		string(lockapi.CodeInternal):             transient,
		string(lockapi.CodeRequestCancelled):     transient, // only seen when the executor itself gave up: redelivered
	},
	ServicePaymentResource: {
		string(api.CodeInvalidRequest):       {Class: ClassPermanent, Reason: api.ReasonPaymentRequestRefused},
		string(api.CodeBodyTooLarge):         deployment,
		string(api.CodeUnsupportedMediaType): deployment,
		string(api.CodeInvalidToken):         deployment, // a token lock-server granted: the same for every payout
		string(api.CodeNotFound):             deployment,
		string(api.CodeMethodNotAllowed):     deployment,
		string(api.CodeAccountNotFound):      {Class: ClassPermanent, Reason: api.ReasonPaymentRequestRefused},
		string(api.CodeAccountConflict):      {Class: ClassPermanent, Reason: api.ReasonPaymentRequestRefused},
		string(api.CodeCurrencyMismatch):     {Class: ClassPermanent, Reason: api.ReasonPaymentRequestRefused},
		string(api.CodeInsufficientFunds):    {Class: ClassPermanent, Reason: api.ReasonPaymentRequestRefused}, // creation only; never sent to an executor
		string(api.CodePayoutNotFound):       {Class: ClassDone, Outcome: OutcomeDropped},
		string(api.CodePayoutConflict):       {Class: ClassPermanent, Reason: api.ReasonPaymentRequestRefused},
		string(api.CodePayoutTermsMismatch):  {Class: ClassDone, Outcome: OutcomeDropped}, // the event is not its payout's: dropped, the payout untouched
		string(api.CodeFencedOut):            {Class: ClassFenced, Reason: api.ReasonPaymentFenceAhead, Err: ErrFencedOut},
		string(api.CodeUnverifiedToken):      deployment, // lock-server's proof of a lease it granted: a key the fence point does not have
		string(api.CodeInvalidReceipt):       {Class: ClassPermanent, Reason: api.ReasonReceiptRefused},
		string(api.CodePayoutFinished):       {Class: ClassDone, Outcome: OutcomeAlreadyDone},
		string(api.CodePayoutInDoubt):        {Class: ClassDone, Outcome: OutcomeInDoubt},
		string(api.CodePayoutNotClaimed):     {Class: ClassPermanent, Reason: api.ReasonPayoutNotClaimed},
		string(api.CodePayoutNeedsAttention): {Class: ClassDone, Outcome: OutcomeNeedsAttention},
		string(api.CodeRailRefConflict):      {Class: ClassPermanent, Reason: api.ReasonRailRefConflict},
		string(api.CodeUnavailable):          transient, // paydb slow or marked stalled; Retry-After
		string(api.CodeOverloaded):           transient, // payment-resource sheds load; Retry-After
		string(api.CodeInternal):             transient,
		string(api.CodeRequestCancelled):     transient, // only seen when the executor itself gave up: redelivered
	},
	ServiceRailProxy: {
		string(railapi.CodeInvalidRequest):       {Class: ClassPermanent, Reason: api.ReasonRailRequestRefused},
		string(railapi.CodeInvalidToken):         deployment, // as at payment-resource
		string(railapi.CodeBodyTooLarge):         deployment,
		string(railapi.CodeUnsupportedMediaType): deployment,
		string(railapi.CodeFencedOut):            {Class: ClassFenced, Reason: api.ReasonRailFenceAhead, Err: ErrFencedOut},
		string(railapi.CodeUnverifiedToken):      deployment,                                 // as at payment-resource
		string(railapi.CodeInvalidTerms):         alteredTerms,                               // a known key's signature over other terms: this payout's, for good
		string(railapi.CodeTermsKeyUnknown):      transient,                                  // payment-resource signs with a key rail-proxy does not hold yet: redeliver until it does
		string(railapi.CodeTermsUnsigned):        deployment,                                 // no signature passed on: payment-resource or this executor is misdeployed, for every payout
		string(railapi.CodeAlreadySubmitted):     {Class: ClassContinue, Err: ErrDependency}, // report the first attempt's outcome; without it, ask again
		string(railapi.CodeRailAmbiguous):        {Class: ClassContinue, Err: ErrDependency}, // report AMBIGUOUS
		string(railapi.CodeRailNotReached):       transient,                                  // nothing reached the rail; the forward is released: redeliver
		string(railapi.CodePayoutStopped):        {Class: ClassContinue, Err: ErrDependency}, // nothing moved, for good: report AMBIGUOUS, the reconciler fails it
		string(railapi.CodeUnavailable):          transient,                                  // raildb slow or marked stalled; nothing recorded; Retry-After
		string(railapi.CodeOverloaded):           transient,                                  // rail-proxy sheds load; nothing recorded; Retry-After
		string(railapi.CodeRestored):             transient,                                  // until an operator runs recover-restore
		string(railapi.CodeNotFound):             deployment,
		string(railapi.CodeMethodNotAllowed):     deployment,
		string(railapi.CodeInternal):             transient,
		string(railapi.CodeRequestCancelled):     transient, // only seen when the executor itself gave up: redelivered
		// Answers of the reconciliation route, which the executor never
		// calls (the reconciler does): seen here, they mean a wrong
		// deployment, not this payout.
		string(railapi.CodeAttemptInFlight):    deployment,
		string(railapi.CodeNotForwarded):       deployment,
		string(railapi.CodeRailSubmittedTwice): deployment,
	},
}

// Classify returns the verdict on the answer of svc with code and HTTP
// status (0 when there was no answer at all). A code not in the table is
// ClassPermanent (api.ReasonUnclassified) with a 4xx status: a newer
// service's refusal of this request; anything else without a known code
// (no answer, a 5xx, a body that is not an envelope) is ClassTransient.
func Classify(svc Service, code string, status int) Verdict {
	if v, ok := answers[svc][code]; ok {
		return v
	}
	if code != "" && status >= 400 && status < 500 {
		return Verdict{Class: ClassPermanent, Reason: api.ReasonUnclassified}
	}
	return transient
}

// ClassifyLease returns the verdict on lock-server's answer with code and
// status (0 when there was no answer) to a call on a lease it granted: the
// confirmation before the rail submission, the local check before the
// claim. The grant accepted the event's lock key and the payout may be
// claimed by now, so such an answer says nothing about the payout: only
// LEASE_NOT_HELD and STALE_TOKEN, which say the lease ended, keep their
// verdict (ErrNoLongerHolder); any other answer, a 4xx that Classify
// calls done or permanent for the acquire included, is ClassTransient with
// ErrDependency, so that nothing is acknowledged or marked and Pub/Sub
// redelivers.
func ClassifyLease(code string, status int) Verdict {
	if v := Classify(ServiceLockServer, code, status); errors.Is(v.Err, ErrNoLongerHolder) {
		return v
	}
	return transient
}

// classifyErr classifies the error of a call to svc with Classify; it
// returns the code ("" without one) for the logs.
func classifyErr(svc Service, err error) (Verdict, string) {
	code, status := answerOf(svc, err)
	return Classify(svc, code, status), code
}

// answerOf returns the code and status of the error of a call to svc: the
// service's refusal, a request the client refused to send (as
// INVALID_REQUEST: it would be refused alike), or no answer ("", 0).
func answerOf(svc Service, err error) (code string, status int) {
	var (
		pe *payclient.Error
		re *railclient.Error
		le *client.Error
	)
	switch {
	case errors.As(err, &pe):
		code, status = string(pe.Code), pe.Status
	case errors.As(err, &re):
		code, status = string(re.Code), re.Status
	case errors.As(err, &le):
		code, status = string(le.Code), le.Status
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	case svc == ServicePaymentResource && errors.Is(err, payclient.ErrInvalidRequest):
		code, status = string(api.CodeInvalidRequest), http.StatusBadRequest
	case svc == ServiceRailProxy && errors.Is(err, railclient.ErrInvalidRequest):
		code, status = string(railapi.CodeInvalidRequest), http.StatusBadRequest
	case svc == ServiceLockServer && errors.Is(err, client.ErrInvalidRequest):
		code, status = string(lockapi.CodeInvalidRequest), http.StatusBadRequest
	case svc == ServiceLockServer && errors.Is(err, client.ErrLeaseLost):
		code = string(lockapi.CodeLeaseNotHeld) // lost locally (deadline passed) or refused on renewal
	}
	return code, status
}
