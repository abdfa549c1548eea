package paymentresource

import (
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
)

// Routes served by Service.Handler. {id} is an account or payout id.
const (
	// PathAccounts: POST creates an account (AccountRequest -> Account).
	PathAccounts = "/v1/accounts"
	// PathAccount: GET returns one account ("/v1/accounts/{id}").
	PathAccount = "/v1/accounts/{id}"
	// PathPayouts: POST creates a payout (PayoutRequest -> Payout).
	PathPayouts = "/v1/payouts"
	// PathPayout: GET returns one payout ("/v1/payouts/{id}").
	PathPayout = "/v1/payouts/{id}"
	// PathClaim: POST claims a payout for a lock holder
	// ("/v1/payouts/{id}/claim"; headers X-Fencing-Token, X-Lock-Owner).
	PathClaim = "/v1/payouts/{id}/claim"
	// PathResult: POST records a rail result (ResultRequest;
	// "/v1/payouts/{id}/result"; same headers as PathClaim).
	PathResult = "/v1/payouts/{id}/result"
	// PathAudit: GET runs the ledger check (AuditReport).
	PathAudit = "/v1/audit"
)

// MaxBodyBytes is the largest request body accepted (4 KiB); a larger one
// is answered 413 BODY_TOO_LARGE.
const MaxBodyBytes = 4 << 10

// Bounds of request fields.
const (
	// MaxAccountIDLen bounds an account id (payoutevent.MaxAccountIDLen).
	MaxAccountIDLen = payoutevent.MaxAccountIDLen
	// MaxPayoutIDLen bounds a payout id (payoutevent.MaxPayoutIDLen).
	MaxPayoutIDLen = payoutevent.MaxPayoutIDLen
	// MaxRailRefLen bounds a rail reference.
	MaxRailRefLen = 128
	// MaxAmountMinor bounds amounts and opening balances, in minor units
	// (payoutevent.MaxAmountMinor).
	MaxAmountMinor = payoutevent.MaxAmountMinor
)

// Error codes of the envelope {"error":{"code","message","retryable"}}.
// Codes are stable; only CodeUnavailable is retryable.
const (
	// CodeInvalidRequest (400): malformed body, unknown field, or a field
	// out of bounds.
	CodeInvalidRequest = httpjson.CodeInvalidRequest
	// CodeBodyTooLarge (413): body larger than MaxBodyBytes.
	CodeBodyTooLarge = httpjson.CodeBodyTooLarge
	// CodeUnsupportedMediaType (415): a Content-Type other than
	// application/json.
	CodeUnsupportedMediaType = httpjson.CodeUnsupportedMediaType
	// CodeInvalidToken (400): X-Fencing-Token missing, repeated, or not a
	// positive decimal int64.
	CodeInvalidToken = "INVALID_TOKEN"
	// CodeNotFound (404): no such route.
	CodeNotFound = "NOT_FOUND"
	// CodeMethodNotAllowed (405): the route exists for another method.
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// CodeAccountNotFound (404): the account does not exist, whether it is
	// named in the path or in a payout's body.
	CodeAccountNotFound = "ACCOUNT_NOT_FOUND"
	// CodeAccountConflict (409): the account exists with another currency
	// or opening balance.
	CodeAccountConflict = "ACCOUNT_CONFLICT"
	// CodeCurrencyMismatch (422): the payout's currency is not its
	// account's.
	CodeCurrencyMismatch = "CURRENCY_MISMATCH"
	// CodePayoutNotFound (404): the payout does not exist.
	CodePayoutNotFound = "PAYOUT_NOT_FOUND"
	// CodePayoutConflict (409): the payout id exists with another account,
	// amount or currency.
	CodePayoutConflict = "PAYOUT_CONFLICT"
	// CodeFencedOut (409): a fenced row carries a higher token (or, on the
	// strict account fence, the same one). The writer is a stale lock
	// holder and must stop.
	CodeFencedOut = fencing.CodeFencedOut
	// CodePayoutFinished (409): the payout is posted or declined; there is
	// nothing left to do (the executor acknowledges its message).
	CodePayoutFinished = "PAYOUT_FINISHED"
	// CodePayoutInDoubt (409): the payout's rail outcome is unknown
	// (ambiguous or submitted); it must not be claimed again until a result
	// or an operator settles it.
	CodePayoutInDoubt = "PAYOUT_IN_DOUBT"
	// CodePayoutNotClaimed (409): a result for a payout no one claimed.
	CodePayoutNotClaimed = "PAYOUT_NOT_CLAIMED"
	// CodeRailRefConflict (409): the rail reference is already recorded
	// with another payout or outcome.
	CodeRailRefConflict = "RAIL_REF_CONFLICT"
	// CodeUnavailable (503): the database did not answer, or the
	// transaction lost a serialization race; the outcome is unknown and
	// the request may be retried. Retryable.
	CodeUnavailable = "DATABASE_UNAVAILABLE"
	// CodeInternal (500): a bug. Not retryable.
	CodeInternal = "INTERNAL"
)

// State is a payout's state. The machine is
//
//	pending -> claimed -> acknowledged -> posted
//	                   -> declined
//	                   -> ambiguous -> posted | declined
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
)

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
)

// AccountRequest is the body of POST /v1/accounts. Creating the same
// account twice is idempotent.
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
	// minor units. It may be negative: an acknowledged rail payment is
	// recorded even when it overdraws.
	BalanceMinor int64 `json:"balanceMinor"`
	// Fence is the highest fencing token that debited the account (0: none).
	Fence int64 `json:"fence"`
	// CreatedAt is when the account was created (UTC).
	CreatedAt time.Time `json:"createdAt"`
}

// PayoutRequest is the body of POST /v1/payouts. The client chooses the
// payout id; creating the same payout twice is idempotent.
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

// ResultRequest is the body of POST /v1/payouts/{id}/result: the rail's
// answer to a submission of the payout. Results are facts keyed by RailRef:
// posting the same one again changes nothing.
type ResultRequest struct {
	// Outcome is ACK, DECLINE or AMBIGUOUS.
	Outcome Outcome `json:"outcome"`
	// RailRef is the rail's reference of the submission: required for ACK
	// and DECLINE, optional for AMBIGUOUS; at most MaxRailRefLen bytes.
	RailRef string `json:"railRef"`
	// RailToken is the fencing token the submission reached the rail with,
	// when it is not the reporter's own: a holder that rail-proxy refused
	// as a second submission reports the first one's outcome and token.
	// Optional (0: the reporter's token); otherwise 1..the reporter's
	// token, since a fenced rail-proxy never lets a submission through
	// after a greater token.
	RailToken int64 `json:"railToken,omitempty"`
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
	// OwnerID is the owner id (X-Lock-Owner) of the last writer; "" if none.
	OwnerID string `json:"ownerId"`
	// RailRef is the rail reference of the last result; "" if none.
	RailRef string `json:"railRef"`
	// RailToken is the fencing token of the submission that reached the
	// rail, as the last result reported it (ResultRequest.RailToken); 0
	// before any result.
	RailToken int64 `json:"railToken"`
	// Debits counts the ledger debits posted for the payout: 1 when posted;
	// 2 or more only when fencing was off (the corruption the experiment
	// shows).
	Debits int `json:"debits"`
	// CreatedAt and UpdatedAt are the times of the creation and of the
	// last accepted write (UTC).
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// History lists every accepted state change, oldest first, never nil.
	History []Transition `json:"history"`
}

// Transition is one accepted state change of a payout, oldest first.
type Transition struct {
	// From is "" for the creation.
	From State `json:"from,omitempty"`
	// To is the state entered.
	To State `json:"to"`
	// Token is the fencing token of the write (0, omitted, for creation).
	Token int64 `json:"token,omitempty"`
	// OwnerID is the writer's X-Lock-Owner ("", omitted, if none).
	OwnerID string `json:"ownerId,omitempty"`
	// At is when the change was made (UTC).
	At time.Time `json:"at"`
}
