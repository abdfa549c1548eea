// Package rail is the wire contract of the external payment rail: its
// routes, request and answer bodies, answer statuses, error codes and
// bounds. rail-proxy and the reconciler call a rail through it; rail-stub
// (package railstub) implements it. It imports only the standard library.
//
// The rail takes no fencing token and no idempotency key: every accepted
// submission is a new movement of money.
//
//	POST PathSubmit   SubmitRequest -> 200 SubmitAnswer; 503 CodeUnavailable (nothing recorded),
//	                  409 CodeReferenceStopped (nothing recorded)
//	POST PathStops    StopRequest -> 200 StopAnswer (the payments made with the reference before the stop)
//	GET  PathJournal  -> 200 SubmissionList, in sequence order (?payoutId=P keeps payout P's)
package rail

import "time"

// Routes, relative to the rail's base URL.
const (
	// PathSubmit: POST one payment (answered ACK or DECLINE).
	PathSubmit = "/submit"
	// PathStops: POST a stop order for a reference: from then on the rail
	// refuses a payment with it, and answers the payments it already has.
	PathStops = "/stops"
	// PathJournal: GET every submission the rail recorded, oldest first.
	PathJournal = "/submissions"
	// QueryPayoutID is PathJournal's one query parameter.
	QueryPayoutID = "payoutId"
)

// Statuses of SubmitAnswer.Status.
const (
	// StatusAck: the rail accepted the payment; money moved.
	StatusAck = "ACK"
	// StatusDecline: the rail refused the payment; no money moved.
	StatusDecline = "DECLINE"
	// StatusStopped is the status of a stop order's record (Submission.Stop).
	StatusStopped = "STOPPED"
)

// Error codes of the rail's envelope ({"error":{"code":...}}), besides
// INVALID_REQUEST, BODY_TOO_LARGE and UNSUPPORTED_MEDIA_TYPE.
const (
	// CodeNotFound (404): no such route.
	CodeNotFound = "NOT_FOUND"
	// CodeMethodNotAllowed (405): the route exists for another method.
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// CodeUnavailable (503): the rail did not take the submission; nothing
	// was recorded. Retryable.
	CodeUnavailable = "RAIL_UNAVAILABLE"
	// CodeJournalFailed (500): the rail could not record; it refuses every
	// later submission until restarted.
	CodeJournalFailed = "JOURNAL_FAILED"
	// CodeStubClosed (503): the rail is closing; a submission answered so
	// may have been recorded.
	CodeStubClosed = "STUB_CLOSED"
	// CodeReferenceStopped (409): the submission's reference was stopped
	// before it arrived; nothing recorded, no money moved.
	CodeReferenceStopped = "REFERENCE_STOPPED"
	// CodeInternal (500): a bug.
	CodeInternal = "INTERNAL"
)

// Bounds of a submission.
const (
	// MaxBodyBytes bounds a request body, in bytes.
	MaxBodyBytes = 4 << 10
	// MaxPayoutIDLen bounds SubmitRequest.PayoutID, in bytes.
	MaxPayoutIDLen = 128
	// MaxAccountIDLen bounds SubmitRequest.AccountID, in bytes.
	MaxAccountIDLen = 64
	// MaxReferenceLen bounds SubmitRequest.Reference, in bytes.
	MaxReferenceLen = 140
)

// SubmitRequest is the body of POST PathSubmit. Every field is required;
// text fields are 1..max bytes of UTF-8 without control characters.
type SubmitRequest struct {
	// PayoutID identifies the payout (at most MaxPayoutIDLen bytes). The
	// rail does not deduplicate on it.
	PayoutID string `json:"payoutId"`
	// AccountID is the debited account (at most MaxAccountIDLen bytes).
	AccountID string `json:"accountId"`
	// AmountMinor is the amount in minor currency units; positive.
	AmountMinor int64 `json:"amountMinor"`
	// Currency is an ISO 4217 code: three upper-case ASCII letters.
	Currency string `json:"currency"`
	// Reference is the payer's reference (at most MaxReferenceLen bytes;
	// rail-proxy sends the payout id).
	Reference string `json:"reference"`
}

// SubmitAnswer is the 200 body of POST PathSubmit.
type SubmitAnswer struct {
	// Status is StatusAck or StatusDecline.
	Status string `json:"status"`
	// RailRef is the rail's reference of the submission; unique.
	RailRef string `json:"railRef"`
}

// Submission is the rail's record of one accepted submission.
type Submission struct {
	// Seq numbers the submissions from 1, without gaps.
	Seq int64 `json:"seq"`
	// ReceivedAt is when the rail accepted the request (its own clock).
	ReceivedAt time.Time `json:"receivedAt"`
	// Request is the body as received.
	Request SubmitRequest `json:"request"`
	// Answer is the rail's decision: what it answered, or would have
	// answered when Withheld.
	Answer SubmitAnswer `json:"answer"`
	// Withheld: the caller never received the answer. With an ACK the
	// money moved and the caller never learned it.
	Withheld bool `json:"withheld,omitempty"`
	// Stop marks a stop order, not a payment: Request holds only the
	// Reference and Answer.Status is StatusStopped. PathJournal never
	// lists stop orders.
	Stop bool `json:"stop,omitempty"`
}

// StopRequest is the body of POST PathStops.
type StopRequest struct {
	// Reference is the payer's reference to stop (at most MaxReferenceLen bytes).
	Reference string `json:"reference"`
}

// StopAnswer is the 200 body of POST PathStops.
type StopAnswer struct {
	// Reference is the stopped reference.
	Reference string `json:"reference"`
	// Submissions are the payments recorded with the reference before the
	// stop, in sequence order (none: no payment with it can ever be made).
	Submissions []Submission `json:"submissions"`
}

// SubmissionList is the 200 body of GET PathJournal.
type SubmissionList struct {
	// Submissions in sequence order.
	Submissions []Submission `json:"submissions"`
}
