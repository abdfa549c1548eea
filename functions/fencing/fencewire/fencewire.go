// Package fencewire is the fencing vocabulary of the payout pipeline's
// wire: the headers a lock holder sends (Holder), the error codes and log
// events of a refusal, the statements rail-proxy and payment-resource sign
// (RailReceipt, PayoutTerms) and their keys' variables. It imports only
// the standard library; both fence points' api packages and the executor
// use it. It sits under functions/fencing, which parses and enforces it,
// as a child that never imports its parent.
package fencewire

import "strconv"

const (
	// HeaderToken carries a lock holder's fencing token on every
	// fenced write: a positive decimal int64 in canonical form (no sign,
	// no leading zero), sent exactly once.
	HeaderToken = "X-Fencing-Token"
	// HeaderOwner carries the holder's owner id. It is recorded and
	// logged, never trusted for a decision.
	HeaderOwner = "X-Lock-Owner"
	// MaxOwnerLen is the longest HeaderOwner a fence point
	// accepts, in bytes (lock-server's owner bound); a longer one, or one
	// lock-server would not grant a lease to, is refused 400.
	MaxOwnerLen = 128
	// CodeInvalidToken is the error code (sent with 400) of a fenced write
	// whose HeaderToken is missing, repeated, or not a positive
	// decimal int64 in canonical form: both fence points answer it so.
	CodeInvalidToken = "INVALID_TOKEN"
	// CodeFencedOut is the error code (sent with 409) of a write a fence
	// point refused because a higher token (or, at a strict fence, the
	// same one) has written: the writer is a stale holder and must stop.
	CodeFencedOut = "FENCED_OUT"
	// EventFencedOut is the log event of every such refusal, with the
	// attributes resource, resourceId, presentedToken, highestToken and
	// ownerId.
	EventFencedOut = "fenced_out"
	// EventFencingDisabled is the WARN event a fence point logs once at
	// start when its kill switch turned fencing off.
	EventFencingDisabled = "fencing_disabled"
)

// Token verification: fence points accept only tokens that lock-server
// signed for the lock that guards their resource (lockserver/fenceproof).
const (
	// HeaderProof carries lock-server's proof of the holder's
	// token (lockserver/api Grant.Proof), unchanged, on every fenced write
	// next to HeaderToken.
	HeaderProof = "X-Fencing-Proof"
	// CodeUnverifiedToken is the error code (sent with 403) of a fenced
	// write whose token lock-server did not sign for the lock that guards
	// the resource: no proof, a malformed one, an unknown key, or a proof
	// of another lock key or token. Nothing was changed; a retry with the
	// same token cannot succeed.
	CodeUnverifiedToken = "UNVERIFIED_TOKEN"
	// EventUnverifiedToken is the WARN log event of each such refusal,
	// with resource, resourceId, presentedToken, ownerId and reason.
	EventUnverifiedToken = "unverified_token"
)

// Holder is what a lock holder sends with each fenced write: its fencing
// token (HeaderToken), lock-server's proof of it
// (HeaderProof, "" when lock-server signs none) and its owner id
// (HeaderOwner, for logs).
type Holder struct {
	// Token is the fencing token of the holder's grant, > 0.
	Token int64
	// Proof is the grant's proof, as lock-server sent it.
	Proof string
	// Owner is the holder's owner id.
	Owner string
}

// RailReceiptDomain names rail-proxy's receipts among the statements its
// key could sign (lockserver/fenceproof Sign).
const RailReceiptDomain = "distributed-lock-lab/rail-receipt/v1"

// RailReceipt is what rail-proxy signs when it reports the rail's answer
// to the one submission of a payout: payment-resource records an ACK or a
// DECLINE only with rail-proxy's signature over exactly these fields, so a
// holder cannot report an outcome or a rail reference it was not given.
type RailReceipt struct {
	// PayoutID, AccountID, AmountMinor (minor units) and Currency are the
	// submission's.
	PayoutID    string
	AccountID   string
	AmountMinor int64
	Currency    string
	// Outcome is the rail's answer, "ACK" or "DECLINE" (rail-proxy's
	// RailStatus, payment-resource's Outcome: the same spellings), or
	// "NONE": a reconciliation found no submission of the payout in the
	// rail's record, past the abandon threshold (RailRef is then "").
	Outcome string
	// RailRef is the rail's reference of the submission.
	RailRef string
	// RailToken is the fencing token the submission reached the rail with.
	RailToken int64
}

// Fields returns the receipt's fields in the order they are signed.
func (r RailReceipt) Fields() []string {
	return []string{r.PayoutID, r.AccountID, strconv.FormatInt(r.AmountMinor, 10), r.Currency,
		r.Outcome, r.RailRef, strconv.FormatInt(r.RailToken, 10)}
}

// PayoutTermsDomain names payment-resource's signatures over a payout's
// terms among the statements its key could sign (lockserver/fenceproof
// Sign).
const PayoutTermsDomain = "distributed-lock-lab/payout-terms/v1"

// PayoutTerms is what payment-resource signs for every payout it holds in
// paydb, and what rail-proxy checks before it lets a submission near the
// rail: the payout id (also the rail's reference), the debited account,
// the amount in minor units and the currency, i.e. everything rail-proxy
// forwards. A lease on the account's lock lets a holder send a payout;
// only this signature says the ledger created that payout with exactly
// these terms, so a holder cannot get a payout id paydb does not know, or
// another amount, currency or account, paid.
type PayoutTerms struct {
	// PayoutID, AccountID, AmountMinor (minor units) and Currency are the
	// payout's, as paydb records them.
	PayoutID    string
	AccountID   string
	AmountMinor int64
	Currency    string
}

// Fields returns the terms' fields in the order they are signed.
func (t PayoutTerms) Fields() []string {
	return []string{t.PayoutID, t.AccountID, strconv.FormatInt(t.AmountMinor, 10), t.Currency}
}

// Environment variables of the fence points' keys.
const (
	// EnvProofKeys lists, at both fence points, the public keys of
	// lock-server's grant proofs (lockserver/fenceproof VerifyKey forms,
	// comma-separated): the same name as lockserver/config.EnvProofKeys.
	// Required while fencing is on.
	EnvProofKeys = "LOCK_PROOF_KEYS"
	// EnvReceiptSigningKey is rail-proxy's secret key for its receipts
	// (a fenceproof SigningKey form). Required.
	EnvReceiptSigningKey = "RAIL_RECEIPT_SIGNING_KEY"
	// EnvReceiptKeys lists, at payment-resource, the public keys of
	// rail-proxy's receipts (comma-separated VerifyKey forms). Required.
	EnvReceiptKeys = "RAIL_RECEIPT_KEYS"
	// EnvTermsSigningKey is payment-resource's secret key for the
	// signatures over its payouts' terms (a fenceproof SigningKey form).
	// Required.
	EnvTermsSigningKey = "PAYMENT_TERMS_SIGNING_KEY"
	// EnvTermsKeys lists, at rail-proxy, the public keys of
	// payment-resource's terms signatures (comma-separated VerifyKey
	// forms). Required, whether fencing is on or off.
	EnvTermsKeys = "PAYMENT_TERMS_KEYS"
)
