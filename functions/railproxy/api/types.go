package api

import (
	"errors"
	"fmt"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
)

// State is the state of one attempt (a row of rail_attempt). The machine
// is
//
//	forwarding -> acked | declined | ambiguous
//	forwarding -> not_sent      (the rail certainly did not take it; the payout's forward is released)
//	forwarding -> not_at_rail   (the rail refused it: the reference was stopped)
//	forwarding | ambiguous -> acked | declined | not_at_rail   (by a reconciliation)
//	fenced, duplicate (final at once: the rail was not called)
//
// Only a forwarding attempt can have reached the rail; a forwarding
// attempt too old to be in flight is marked ambiguous.
type State string

// Attempt states.
const (
	// StateForwarding: the fence passed and the rail is being called (or
	// the proxy died while calling it: reconcile).
	StateForwarding State = "forwarding"
	// StateAcked: the rail answered ACK; money moved.
	StateAcked State = "acked"
	// StateDeclined: the rail answered DECLINE; no money moved.
	StateDeclined State = "declined"
	// StateAmbiguous: the rail was called and its outcome is unknown.
	StateAmbiguous State = "ambiguous"
	// StateNotAtRail: a reconciliation, past the abandon threshold, found
	// no submission of the payout in the rail's record: the forward never
	// reached the rail, and no money moved. Final.
	StateNotAtRail State = "not_at_rail"
	// StateNotSent: the rail certainly did not take the submission (the
	// connection was never established, or the rail answered that it
	// recorded nothing: api.CodeRailNotReached). No money moved. Final; the
	// attempt is no longer the payout's forward, so a later submission of
	// the payout may go to the rail.
	StateNotSent State = "not_sent"
	// StateFenced: the token was stale; the rail was not called.
	StateFenced State = "fenced"
	// StateDuplicate: the payout had already gone to the rail with an
	// earlier attempt; this one was not forwarded.
	StateDuplicate State = "duplicate"
)

// RailStatus is the rail's answer to a forwarded submission, as
// SubmitAnswer.Status carries it: the rail's own status values
// (functions/rail), relayed. (payment-resource's api.Outcome spells the
// same two answers, and AMBIGUOUS for no answer.)
type RailStatus string

// Rail answers.
const (
	// RailAck is rail.StatusAck: the rail accepted the payment; money moved.
	RailAck RailStatus = rail.StatusAck
	// RailDecline is rail.StatusDecline: the rail refused the payment; no
	// money moved.
	RailDecline RailStatus = rail.StatusDecline
	// RailNone is not an answer of the rail: it is what a reconciliation
	// reports (Reconciliation.Outcome, and a receipt's outcome) when the
	// rail's record holds no submission of the payout (StateNotAtRail).
	RailNone RailStatus = "NONE"
)

// RebuiltOwner is the Attempt.OwnerID of the attempts "rail-proxy
// recover-restore" rebuilds from the rail's journal after a raildb
// restore: their token is unknown, at most the recovery's floor, and
// recorded as the floor.
const RebuiltOwner = "rail-proxy recover-restore"

// SubmitRequest is the body of POST /v1/rail/submissions. Every field is
// required.
type SubmitRequest struct {
	// PayoutID identifies the payout, 1..MaxPayoutIDLen bytes; sent to the
	// rail as its reference too.
	PayoutID string `json:"payoutId"`
	// AccountID is the debited account, 1..MaxAccountIDLen bytes; the
	// fence is kept per account (the lock key is payout:{accountId}).
	AccountID string `json:"accountId"`
	// AmountMinor is the amount in minor currency units,
	// 1..MaxAmountMinor.
	AmountMinor int64 `json:"amountMinor"`
	// Currency is an ISO 4217 code: three upper-case ASCII letters.
	Currency string `json:"currency"`
	// TermsSignature is payment-resource's signature over the four fields
	// above (paymentresource/api Payout.TermsSignature, passed unchanged;
	// fencewire.PayoutTerms). It travels in HeaderTermsSignature, never
	// in the body. Required, but not by Validate: a missing or malformed
	// one is answered 403 CodeTermsUnsigned, one of an unknown key 403
	// CodeTermsKeyUnknown, one over other terms 403 CodeInvalidTerms.
	TermsSignature string `json:"-"`
	// BodyTermsSignature is the previous version's body member
	// "termsSignature", still accepted by rail-proxy for this one release
	// (executors of that version send it) and removed in the next: used
	// only when HeaderTermsSignature is absent; sent with a different
	// header it is 400 INVALID_REQUEST. Clients leave it empty (omitted).
	BodyTermsSignature string `json:"termsSignature,omitempty"`
}

// Signature returns the terms signature r was sent with: TermsSignature
// (the header's) when set, else BodyTermsSignature.
func (r SubmitRequest) Signature() string {
	if r.TermsSignature != "" {
		return r.TermsSignature
	}
	return r.BodyTermsSignature
}

// Terms returns the payout terms r asks rail-proxy to forward, the
// statement TermsSignature must sign.
func (r SubmitRequest) Terms() fencewire.PayoutTerms {
	return fencewire.PayoutTerms{PayoutID: r.PayoutID, AccountID: r.AccountID, AmountMinor: r.AmountMinor, Currency: r.Currency}
}

// Validate returns an error describing the first invalid field of r (ids
// as payoutevent.ValidateID has them, an amount within 1..MaxAmountMinor,
// an ISO 4217 currency); rail-proxy answers it 400 INVALID_REQUEST.
func (r SubmitRequest) Validate() error {
	if err := ValidatePayoutID(r.PayoutID); err != nil {
		return err
	}
	if err := ValidateAccountID(r.AccountID); err != nil {
		return err
	}
	return validateAmount(r.AmountMinor, r.Currency)
}

// ValidatePayoutID returns an error unless id is a well-formed payout id
// (payoutevent.ValidateID, at most MaxPayoutIDLen bytes).
func ValidatePayoutID(id string) error {
	return payoutevent.ValidateID("payoutId", id, MaxPayoutIDLen)
}

// ValidateAccountID returns an error unless id is a well-formed account
// id (payoutevent.ValidateID, at most MaxAccountIDLen bytes).
func ValidateAccountID(id string) error {
	return payoutevent.ValidateID("accountId", id, MaxAccountIDLen)
}

// ValidateToken returns an error unless token is a fencing token
// (positive).
func ValidateToken(token int64) error {
	if token <= 0 {
		return fmt.Errorf("fencing token %d is not positive", token)
	}
	return nil
}

// SubmitAnswer is the 200 body of POST /v1/rail/submissions: the rail
// answered.
type SubmitAnswer struct {
	// Status is the rail's answer, RailAck or RailDecline.
	Status RailStatus `json:"status"`
	// RailRef is the rail's reference of the submission, 1..MaxRailRefLen
	// bytes.
	RailRef string `json:"railRef"`
	// AttemptID is the attempt of this submission.
	AttemptID int64 `json:"attemptId"`
	// Token is the fencing token the submission was accepted with.
	Token int64 `json:"token"`
	// Receipt is rail-proxy's signature over this answer
	// (fencewire.RailReceipt): pass it unchanged to payment-resource
	// with the result.
	Receipt string `json:"receipt"`
}

// HighWater is the 200 body of GET /v1/rail/high-water/{accountId}.
type HighWater struct {
	// AccountID is the account.
	AccountID string `json:"accountId"`
	// HighWater is the highest fencing token accepted for it.
	HighWater int64 `json:"highWater"`
}

// Attempt is one submission as rail-proxy recorded it (a rail_attempt
// row).
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
	// OwnerID is the HeaderOwner of the request, as claimed ("" when
	// absent; RebuiltOwner for an attempt rebuilt after a restore).
	OwnerID string `json:"ownerId"`
	// State is one of the State constants.
	State State `json:"state"`
	// RailRef is the rail's reference; set when acked or declined.
	RailRef string `json:"railRef,omitempty"`
	// CreatedAt is when the attempt was recorded (raildb's clock).
	CreatedAt time.Time `json:"createdAt"`
	// FinishedAt is when its outcome was recorded; nil while forwarding.
	FinishedAt *time.Time `json:"finishedAt"`
	// Receipt is rail-proxy's signature over the rail's answer
	// (fencewire.RailReceipt), when State is StateAcked or
	// StateDeclined and the attempt is a payout's forwarded one; "" otherwise.
	Receipt string `json:"receipt,omitempty"`
}

// AttemptList is the 200 body of GET /v1/rail/attempts.
type AttemptList struct {
	// Attempts of the payout, oldest first; empty, never null, when none.
	Attempts []Attempt `json:"attempts"`
}

// AlreadySubmittedAnswer is the 409 PAYOUT_ALREADY_SUBMITTED body: the
// error envelope's member plus the payout's forwarded attempt. The caller
// reports that attempt's outcome instead of submitting again:
// StateAcked and StateDeclined carry the rail's reference, StateAmbiguous
// needs reconciliation, and StateForwarding means the first submission is
// still being answered (Error.Retryable is true: ask again later). A
// forwarding attempt older than rail-proxy's rail timeout + 2 x its
// database timeout + 1 s can no longer be in flight; it is then marked
// StateAmbiguous (EventAttemptAbandoned) before being answered.
type AlreadySubmittedAnswer struct {
	// Error is the envelope's body, code CodeAlreadySubmitted.
	Error ErrorBody `json:"error"`
	// Attempt is the payout's forwarded attempt.
	Attempt Attempt `json:"attempt"`
}

// ReconcileRequest is the body of POST /v1/rail/reconciliations.
type ReconcileRequest struct {
	// PayoutID names the payout whose forwarded attempt is resolved.
	PayoutID string `json:"payoutId"`
	// AccountID, AmountMinor and Currency are the payout as
	// payment-resource holds it: optional, all or none. With them, a
	// payout rail-proxy never forwarded is closed instead of answered
	// PAYOUT_NOT_FORWARDED: rail-proxy records an attempt of the
	// reconciliation's token as the payout's forward (so that no later
	// submission of it is forwarded), puts the stop order on its
	// reference and answers what the rail holds (RailNone, normally),
	// with a receipt over these facts.
	AccountID   string `json:"accountId,omitempty"`
	AmountMinor int64  `json:"amountMinor,omitempty"`
	Currency    string `json:"currency,omitempty"`
	// TermsSignature is payment-resource's signature over these facts
	// (the payout's termsSignature, unchanged), required with them and
	// sent in HeaderTermsSignature: a payout is closed only for the terms
	// payment-resource created, as a submission is forwarded only for
	// them (403 INVALID_TERMS, TERMS_KEY_UNKNOWN or TERMS_UNSIGNED
	// otherwise, nothing recorded). Without it anyone holding a grant on
	// an account's lock could close another account's payout under
	// made-up facts.
	TermsSignature string `json:"-"`
	// BodyTermsSignature is the previous version's body member, accepted
	// for this one release as SubmitRequest.BodyTermsSignature is.
	BodyTermsSignature string `json:"termsSignature,omitempty"`
}

// Validate returns an error unless the payout id is well-formed and the
// payout's facts are either all absent or all valid, as a SubmitRequest's
// (answered 400 INVALID_REQUEST).
func (r ReconcileRequest) Validate() error {
	if r.AccountID == "" && r.AmountMinor == 0 && r.Currency == "" {
		return ValidatePayoutID(r.PayoutID)
	}
	// Field by field, not through SubmitRequest: a submission may carry
	// more than the payout's facts.
	if err := errors.Join(ValidatePayoutID(r.PayoutID), ValidateAccountID(r.AccountID)); err != nil {
		return err
	}
	return validateAmount(r.AmountMinor, r.Currency)
}

// HasPayout reports whether the request carries the payout's facts.
func (r ReconcileRequest) HasPayout() bool { return r.AccountID != "" }

// Reconciliation is the 200 body of POST /v1/rail/reconciliations: the
// outcome of the payout's one forwarded attempt, as rail-proxy recorded it
// or, for an attempt that was forwarding or ambiguous, as the rail's own
// record (looked up by the payout's reference) says.
type Reconciliation struct {
	// Outcome is RailAck, RailDecline or RailNone (no submission at the
	// rail: the forward never reached it).
	Outcome RailStatus `json:"outcome"`
	// RailRef is the rail's reference; "" for RailNone.
	RailRef string `json:"railRef,omitempty"`
	// RailToken is the token the forwarded attempt was admitted with.
	RailToken int64 `json:"railToken"`
	// Resolved is true when this call recorded the outcome (the attempt
	// was forwarding or ambiguous); false when it was already recorded.
	Resolved bool `json:"resolved"`
	// Attempt is the forwarded attempt as recorded now.
	Attempt Attempt `json:"attempt"`
	// Receipt is rail-proxy's signature over the outcome
	// (fencewire.RailReceipt with Outcome "NONE" and RailRef "" for
	// RailNone): pass it unchanged to payment-resource's resolution.
	Receipt string `json:"receipt"`
}

// UnsettledList is the 200 body of GET PathUnsettled.
type UnsettledList struct {
	// Attempts are forwarded attempts (each its payout's one forward) in
	// StateForwarding or StateAmbiguous, older than rail-proxy's abandon
	// threshold, by attempt id; empty, never null, when none.
	Attempts []Attempt `json:"attempts"`
	// Next is the QueryAfter of the next page; 0 (absent) on the last.
	Next int64 `json:"next,omitempty"`
}

// validateAmount is the amount and currency rule of SubmitRequest and of
// a ReconcileRequest's payout facts: 1..MaxAmountMinor minor units, and
// three upper-case letters.
func validateAmount(amountMinor int64, currency string) error {
	switch {
	case amountMinor <= 0 || amountMinor > MaxAmountMinor:
		return fmt.Errorf("amountMinor %d is outside 1..%d", amountMinor, MaxAmountMinor)
	case !payoutevent.IsCurrency(currency):
		return fmt.Errorf("currency %q is not three upper-case letters (ISO 4217)", currency)
	}
	return nil
}
