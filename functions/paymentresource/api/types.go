package api

import (
	"errors"
	"fmt"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// State is a payout's state. The machine is
//
//	pending -> claimed -> acknowledged -> posted
//	                   -> declined
//	                   -> ambiguous -> posted | declined
//	pending | claimed | submitted | ambiguous -> needs_attention -> posted | declined | ambiguous
//	claimed | submitted | ambiguous | needs_attention -> posted | declined | failed   (a resolution)
//
// acknowledged exists only inside the transaction that posts the debit (the
// history shows it); submitted is reserved for a rail submission recorded
// before the rail answers and is treated like ambiguous.
type State string

// Payout states.
const (
	// StatePending: created, not yet claimed.
	StatePending State = "pending"
	// StateClaimed: a lock holder claimed it (Payout.Fence is its token).
	StateClaimed State = "claimed"
	// StateSubmitted: submitted to the rail, outcome unknown (in doubt).
	StateSubmitted State = "submitted"
	// StateAcknowledged: the rail acknowledged it; the debit is being
	// posted in the same transaction.
	StateAcknowledged State = "acknowledged"
	// StateDeclined: the rail declined it. Final.
	StateDeclined State = "declined"
	// StatePosted: acknowledged and debited. Final.
	StatePosted State = "posted"
	// StateAmbiguous: the submission's outcome is unknown (in doubt).
	StateAmbiguous State = "ambiguous"
	// StateFailed: a resolution with rail-proxy's receipt of outcome NONE
	// showed that the payout's submission never reached the rail: no
	// money moved, and rail-proxy will never forward it. Final; no debit.
	StateFailed State = "failed"
	// StateNeedsAttention: a lock holder met a refusal that no retry can
	// change and recorded why (Payout.AttentionReason). It is never
	// claimed again automatically; a fenced result resolves it (the
	// reconciler's or an operator's, after reading the rail's record).
	StateNeedsAttention State = "needs_attention"
)

// AttentionReason says why a payout needs attention: a stable code, one of
// AttentionReasons (the bounded label set of
// payouts_needing_attention_total{reason}).
type AttentionReason string

// Attention reasons.
const (
	// ReasonPaymentFenceAhead: payment-resource refused the token of the
	// holder of the account's current lease (FENCED_OUT while the lease
	// was confirmed): a payout or account fence holds a token above any
	// grant of payout:{account}. No later holder can pass it either.
	ReasonPaymentFenceAhead AttentionReason = "payment_fence_ahead"
	// ReasonRailFenceAhead: rail-proxy refused the token of the current
	// holder: the account's high-water mark is above any grant of its
	// lock. The rail was not called.
	ReasonRailFenceAhead AttentionReason = "rail_fence_ahead"
	// ReasonRailRefConflict: the rail reference of the payout's
	// submission is recorded for another payout or outcome
	// (RAIL_REF_CONFLICT); the rail's answer could not be recorded.
	ReasonRailRefConflict AttentionReason = "rail_ref_conflict"
	// ReasonPayoutNotClaimed: a result was refused PAYOUT_NOT_CLAIMED
	// after the holder had claimed the payout.
	ReasonPayoutNotClaimed AttentionReason = "payout_not_claimed"
	// ReasonPaymentRequestRefused: payment-resource refused the holder's
	// claim or result as invalid for this payout (INVALID_REQUEST and
	// other 4xx codes that depend on the payout, not on the deployment).
	ReasonPaymentRequestRefused AttentionReason = "payment_request_refused"
	// ReasonRailRequestRefused: rail-proxy refused the payout's submission
	// as invalid (INVALID_REQUEST), or its terms as not the ones
	// payment-resource signed (INVALID_TERMS: a known key's signature over
	// other terms); the rail was not called.
	ReasonRailRequestRefused AttentionReason = "rail_request_refused"
	// ReasonReceiptRefused: payment-resource refused the rail's answer
	// because its receipt is missing or not rail-proxy's over this payout
	// (INVALID_RECEIPT): the rail answered, and the answer cannot be
	// booked.
	ReasonReceiptRefused AttentionReason = "receipt_refused"
	// ReasonUnclassified: a 4xx answer with a code the executor does not
	// know (a newer service).
	ReasonUnclassified AttentionReason = "unclassified_refusal"
)

// AttentionReasons lists every AttentionReason, in the order declared.
var AttentionReasons = []AttentionReason{
	ReasonPaymentFenceAhead, ReasonRailFenceAhead, ReasonRailRefConflict, ReasonPayoutNotClaimed,
	ReasonPaymentRequestRefused, ReasonRailRequestRefused, ReasonReceiptRefused, ReasonUnclassified,
}

// AttentionRequest is the body of POST /v1/payouts/{id}/attention.
type AttentionRequest struct {
	// Reason is one of AttentionReasons.
	Reason AttentionReason `json:"reason"`
}

// Validate returns an error unless r.Reason is one of AttentionReasons
// (answered 400 INVALID_REQUEST).
func (r AttentionRequest) Validate() error {
	for _, k := range AttentionReasons {
		if r.Reason == k {
			return nil
		}
	}
	return fmt.Errorf("reason %q is not a known attention reason", r.Reason)
}

// Outcome is the rail's answer to one submission, as posted in a
// ResultRequest.
type Outcome string

// Rail outcomes.
const (
	// OutcomeAck: the rail paid; the payout is debited and posted.
	OutcomeAck Outcome = "ACK"
	// OutcomeDecline: the rail refused; the payout is declined.
	OutcomeDecline Outcome = "DECLINE"
	// OutcomeAmbiguous: no answer (timeout); the payout is in doubt.
	OutcomeAmbiguous Outcome = "AMBIGUOUS"
	// OutcomeNone: only in a ResolutionRequest: the rail's record holds no
	// submission of the payout (rail-proxy's reconciliation, past its
	// abandon threshold); the payout fails.
	OutcomeNone Outcome = "NONE"
)

// Listable lists the states GET /v1/payouts?state=S accepts: the payouts
// a reconciliation looks for.
var Listable = []State{StateAmbiguous, StateNeedsAttention, StateClaimed, StateSubmitted}

// Bounds of GET /v1/payouts.
const (
	// DefaultListLimit is the page size when QueryLimit is absent.
	DefaultListLimit = 100
	// MaxListLimit bounds QueryLimit.
	MaxListLimit = 500
)

// PayoutList is the 200 body of GET /v1/payouts?state=S: a page of the
// payouts in state S, in payout id order. They carry no History.
type PayoutList struct {
	// Payouts of the page, never null.
	Payouts []Payout `json:"payouts"`
	// Next is the QueryAfter of the next page; "" on the last page.
	Next string `json:"next,omitempty"`
}

// ResolutionRequest is the body of POST /v1/payouts/{id}/resolution: the
// outcome of the payout's one rail submission as rail-proxy's
// reconciliation established it from the rail's record, with rail-proxy's
// receipt.
type ResolutionRequest struct {
	// Outcome is ACK, DECLINE or NONE.
	Outcome Outcome `json:"outcome"`
	// RailRef is the rail's reference: required for ACK and DECLINE, ""
	// for NONE.
	RailRef string `json:"railRef,omitempty"`
	// RailToken is the token the submission was admitted with at
	// rail-proxy (railproxy/api Reconciliation.RailToken): 1..the
	// resolver's token.
	RailToken int64 `json:"railToken"`
	// Receipt is rail-proxy's signature over the outcome
	// (fencewire.RailReceipt; Outcome "NONE" and RailRef "" for NONE).
	// Required.
	Receipt string `json:"receipt"`
}

// Validate returns an error describing the first invalid field of r for a
// resolver holding token (answered 400 INVALID_REQUEST).
func (r ResolutionRequest) Validate(token int64) error {
	switch r.Outcome {
	case OutcomeAck, OutcomeDecline:
		return ResultRequest(r).Validate(token)
	case OutcomeNone:
		if r.RailRef != "" {
			return fmt.Errorf("railRef must be empty for %s", OutcomeNone)
		}
		if r.RailToken <= 0 || r.RailToken > token {
			return fmt.Errorf("railToken %d is outside 1..%d (the resolver's token)", r.RailToken, token)
		}
		return nil
	}
	return fmt.Errorf("outcome %q is not %s, %s or %s", r.Outcome, OutcomeAck, OutcomeDecline, OutcomeNone)
}

// AccountRequest is the body of POST /v1/accounts. Creating the same
// account twice is idempotent (the second answer is 200, not 201).
type AccountRequest struct {
	// AccountID: 1..MaxAccountIDLen bytes of ASCII letters, digits and
	// . _ : -, starting with a letter or digit.
	AccountID string `json:"accountId"`
	// Currency: ISO 4217 code, three upper-case letters.
	Currency string `json:"currency"`
	// OpeningBalanceMinor: required, 0..MaxAmountMinor minor units. A
	// pointer so that a missing field is told from 0.
	OpeningBalanceMinor *int64 `json:"openingBalanceMinor"`
}

// Account is the answer of POST /v1/accounts and GET /v1/accounts/{id}.
type Account struct {
	// AccountID is the account's id, as created.
	AccountID string `json:"accountId"`
	// Currency is the account's ISO 4217 code.
	Currency string `json:"currency"`
	// OpeningBalanceMinor is the balance at creation, in minor units.
	OpeningBalanceMinor int64 `json:"openingBalanceMinor"`
	// BalanceMinor is the opening balance minus the posted debits, in
	// minor units. A payout is created only within the available balance
	// (BalanceMinor minus the payouts not yet final; INSUFFICIENT_FUNDS
	// otherwise), so with fencing on it never goes negative. An
	// acknowledged rail payment is still recorded when it overdraws: with
	// fencing off a second debit of one payout can.
	BalanceMinor int64 `json:"balanceMinor"`
	// Fence is the highest fencing token that debited the account (0: none).
	Fence int64 `json:"fence"`
	// CreatedAt is when the account was created (UTC).
	CreatedAt time.Time `json:"createdAt"`
}

// PayoutRequest is the body of POST /v1/payouts. The client chooses the
// payout id; creating the same payout twice is idempotent (200, not 201).
type PayoutRequest struct {
	// PayoutID: 1..MaxPayoutIDLen bytes, same alphabet as an account id.
	PayoutID string `json:"payoutId"`
	// AccountID names an existing account.
	AccountID string `json:"accountId"`
	// AmountMinor: 1..MaxAmountMinor minor units.
	AmountMinor int64 `json:"amountMinor"`
	// Currency must be the account's.
	Currency string `json:"currency"`
}

// ClaimRequest is the optional body of POST /v1/payouts/{id}/claim: the
// terms the holder is about to pay, as it learnt them (the executor: from
// the payout event). When they are given, payment-resource compares them
// with the payout before anything else, and a difference is refused 409
// PAYOUT_TERMS_MISMATCH with nothing changed. An empty body, or {}, asks
// for no comparison (the claim of clients that send none).
type ClaimRequest struct {
	// AccountID is the account the holder took the lock of.
	AccountID string `json:"accountId,omitempty"`
	// AmountMinor is the amount, 1..MaxAmountMinor minor units.
	AmountMinor int64 `json:"amountMinor,omitempty"`
	// Currency is the ISO 4217 code.
	Currency string `json:"currency,omitempty"`
}

// Validate returns an error describing the first invalid field of r
// (answered 400 INVALID_REQUEST): all three fields are given and valid,
// or none is.
func (r ClaimRequest) Validate() error {
	if r == (ClaimRequest{}) {
		return nil
	}
	return validateTerms(r.AccountID, r.AmountMinor, r.Currency)
}

// ResultRequest is the body of POST /v1/payouts/{id}/result: the rail's
// answer to a submission of the payout. Results are facts keyed by RailRef:
// posting the same one again changes nothing.
type ResultRequest struct {
	// Outcome is ACK, DECLINE or AMBIGUOUS.
	Outcome Outcome `json:"outcome"`
	// RailRef is the rail's reference of the submission: required for ACK
	// and DECLINE, optional for AMBIGUOUS; at most MaxRailRefLen bytes of
	// printable ASCII without spaces.
	RailRef string `json:"railRef"`
	// RailToken is the fencing token the submission reached the rail with,
	// when it is not the reporter's own: a holder that rail-proxy refused
	// as a second submission reports the first one's outcome and token.
	// Optional (0: the reporter's token); otherwise 1..the reporter's
	// token, since a fenced rail-proxy never lets a submission through
	// after a greater token.
	RailToken int64 `json:"railToken,omitempty"`
	// Receipt is rail-proxy's signature over the rail's answer
	// (railproxy/api SubmitAnswer.Receipt or Attempt.Receipt, passed on
	// unchanged). Required for ACK and DECLINE: the outcome, RailRef and
	// the rail token are recorded only if it covers exactly them and this
	// payout's account, amount and currency (fencewire.RailReceipt).
	// Ignored for AMBIGUOUS, which changes no balance.
	Receipt string `json:"receipt,omitempty"`
}

// Payout is the answer of every payout route.
type Payout struct {
	// PayoutID is the client-chosen id.
	PayoutID string `json:"payoutId"`
	// AccountID is the debited account.
	AccountID string `json:"accountId"`
	// AmountMinor is the amount paid out, in minor units, positive.
	AmountMinor int64 `json:"amountMinor"`
	// Currency is the payout's (and its account's) ISO 4217 code.
	Currency string `json:"currency"`
	// State is the payout's current state.
	State State `json:"state"`
	// Fence is the highest fencing token that wrote the payout (0: none).
	Fence int64 `json:"fence"`
	// OwnerID is the owner id (HeaderOwner) of the last writer; "" if none.
	OwnerID string `json:"ownerId"`
	// RailRef is the rail reference of the last result; "" if none.
	RailRef string `json:"railRef"`
	// RailToken is the fencing token of the submission that reached the
	// rail, as the last result reported it (ResultRequest.RailToken); 0
	// before any result.
	RailToken int64 `json:"railToken"`
	// AttentionReason says why the payout is in needs_attention (the
	// reason that first put it there); "" (omitted) in any other state.
	AttentionReason AttentionReason `json:"attentionReason,omitempty"`
	// Debits counts the ledger debits posted for the payout: 1 when posted;
	// 2 or more only when fencing was off (the corruption the experiment
	// shows).
	Debits int `json:"debits"`
	// CreatedAt and UpdatedAt are the times of the creation and of the
	// last accepted state change (UTC): exactly the At of the first and of
	// the last History row, taken from one clock in one statement. A write
	// that changes no state (a claim with the token the payout already
	// carries) moves neither.
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// History lists every accepted state change, oldest first: only when
	// the request asked for it (QueryInclude=IncludeHistory), read just
	// after the answer's write, so it may show a later writer's rows too;
	// absent otherwise.
	History []Transition `json:"history,omitempty"`
	// TermsSignature is payment-resource's signature over the payout's
	// terms (fencewire.PayoutTerms: payout id, account id, amount,
	// currency), made with its key (EnvTermsSigningKey) from paydb's row
	// whenever a payout is answered. Pass it unchanged to rail-proxy with
	// the submission (railproxy/api SubmitRequest.TermsSignature):
	// rail-proxy forwards only terms payment-resource signed.
	TermsSignature string `json:"termsSignature"`
}

// Transition is one accepted state change of a payout.
type Transition struct {
	// From is "" for the creation.
	From State `json:"from,omitempty"`
	// To is the state entered.
	To State `json:"to"`
	// Token is the fencing token of the write (0, omitted, for creation).
	Token int64 `json:"token,omitempty"`
	// OwnerID is the writer's HeaderOwner ("", omitted, if none).
	OwnerID string `json:"ownerId,omitempty"`
	// Reason is, on the change into needs_attention, why (omitted
	// otherwise).
	Reason AttentionReason `json:"reason,omitempty"`
	// Claims is, on a claimed -> claimed row (a re-claim by a newer
	// holder), how many re-claims the row stands for: consecutive
	// re-claims are one row showing the latest token, owner and time, so
	// that redeliveries do not grow the history without bound. Omitted
	// on every other row.
	Claims int `json:"claims,omitempty"`
	// At is when the change was made (UTC); for coalesced re-claims, the
	// latest.
	At time.Time `json:"at"`
}

// Names of the ledger checks, the values of Violation.Check.
const (
	// CheckTxnBalanced: every ledger transaction sums to zero, per currency.
	CheckTxnBalanced = "txn_sums_to_zero"
	// CheckAccountBalance: every account's balance equals its opening
	// balance minus its posted debits (the sum of its ledger entries).
	CheckAccountBalance = "balance_matches_ledger"
	// CheckOneDebitPerPayout: every posted payout has exactly one debit, of
	// its amount, on its account; no other payout has any debit.
	CheckOneDebitPerPayout = "one_debit_per_posted_payout"
)

// AuditReport is the answer of GET /v1/audit (and of ledgeraudit.Run):
// paydb's own ledger audit (INV-05 as far as paydb can tell; it cannot see
// the rail).
type AuditReport struct {
	// Balanced is true when there are no violations.
	Balanced bool `json:"balanced"`
	// Violations lists every broken rule, never nil.
	Violations []Violation `json:"violations"`
	// Accounts, Payouts and Debits count the accounts, the payouts and the
	// payout debit transactions checked.
	Accounts int `json:"accounts"`
	Payouts  int `json:"payouts"`
	Debits   int `json:"debits"`
}

// Violation is one broken ledger rule.
type Violation struct {
	// Check is one of the Check constants.
	Check string `json:"check"`
	// Subject is the ledger transaction id, account id or payout id.
	Subject string `json:"subject"`
	// Detail says what was found, with amounts in minor units.
	Detail string `json:"detail"`
}

// String describes v in one line.
func (v Violation) String() string { return v.Check + " " + v.Subject + ": " + v.Detail }

// ValidateAccountID returns an error unless id is a well-formed account
// id (payoutevent.ValidateID, at most MaxAccountIDLen bytes).
func ValidateAccountID(id string) error {
	return payoutevent.ValidateID("accountId", id, MaxAccountIDLen)
}

// ValidatePayoutID returns an error unless id is a well-formed payout id
// (payoutevent.ValidateID, at most MaxPayoutIDLen bytes).
func ValidatePayoutID(id string) error {
	return payoutevent.ValidateID("payoutId", id, MaxPayoutIDLen)
}

// ValidateToken returns an error unless token is a fencing token
// (positive).
func ValidateToken(token int64) error {
	if token <= 0 {
		return fmt.Errorf("fencing token %d is not positive", token)
	}
	return nil
}

func validateCurrency(v string) error {
	if !payoutevent.IsCurrency(v) {
		return fmt.Errorf("currency %q is not an ISO 4217 code (three upper-case letters)", v)
	}
	return nil
}

// Validate returns an error describing the first field of r that is
// missing or out of bounds (answered 400 INVALID_REQUEST).
func (r AccountRequest) Validate() error {
	if err := ValidateAccountID(r.AccountID); err != nil {
		return err
	}
	if err := validateCurrency(r.Currency); err != nil {
		return err
	}
	switch {
	case r.OpeningBalanceMinor == nil:
		return errors.New("openingBalanceMinor is required")
	case *r.OpeningBalanceMinor < 0 || *r.OpeningBalanceMinor > MaxAmountMinor:
		return fmt.Errorf("openingBalanceMinor %d is outside 0..%d", *r.OpeningBalanceMinor, MaxAmountMinor)
	}
	return nil
}

// Validate returns an error describing the first field of r that is
// missing or out of bounds (answered 400 INVALID_REQUEST).
func (r PayoutRequest) Validate() error {
	if err := ValidatePayoutID(r.PayoutID); err != nil {
		return err
	}
	return validateTerms(r.AccountID, r.AmountMinor, r.Currency)
}

// validateTerms checks a payout's terms: the account, the amount and the
// currency, in that order.
func validateTerms(account string, amountMinor int64, currency string) error {
	if err := ValidateAccountID(account); err != nil {
		return err
	}
	if err := validateCurrency(currency); err != nil {
		return err
	}
	if amountMinor <= 0 || amountMinor > MaxAmountMinor {
		return fmt.Errorf("amountMinor %d is outside 1..%d", amountMinor, MaxAmountMinor)
	}
	return nil
}

// Validate returns an error describing the first field of r that is
// missing or out of bounds for a reporter holding token (answered 400
// INVALID_REQUEST).
func (r ResultRequest) Validate(token int64) error {
	if r.RailToken < 0 || r.RailToken > token {
		return fmt.Errorf("railToken %d is outside 1..%d (the reporter's token)", r.RailToken, token)
	}
	switch r.Outcome {
	case OutcomeAck, OutcomeDecline:
		if r.RailRef == "" {
			return fmt.Errorf("railRef is required for %s", r.Outcome)
		}
	case OutcomeAmbiguous:
	default:
		return fmt.Errorf("outcome %q is not %s, %s or %s", r.Outcome, OutcomeAck, OutcomeDecline, OutcomeAmbiguous)
	}
	if len(r.RailRef) > MaxRailRefLen {
		return fmt.Errorf("railRef is %d bytes, longer than %d", len(r.RailRef), MaxRailRefLen)
	}
	for i := 0; i < len(r.RailRef); i++ {
		if c := r.RailRef[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("railRef has byte %q at offset %d; allowed: printable ASCII without spaces", r.RailRef[i:i+1], i)
		}
	}
	return nil
}
