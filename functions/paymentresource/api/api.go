// Package api is the wire contract of payment-resource (fence point one):
// its routes, bodies, error codes, bounds and validation, configuration
// variables and log events. It imports only the standard library and the
// wire packages functions/payoutevent and functions/fencing/fencewire, so
// any client can use it without a database driver. Amounts are minor
// units, currencies ISO 4217 codes, instants RFC 3339 in UTC from paydb's
// clock, tokens positive int64s.
//
//	POST /v1/accounts                  AccountRequest -> Account
//	GET  /v1/accounts/{id}             -> Account
//	POST /v1/payouts                   PayoutRequest -> Payout
//	GET  /v1/payouts?state=S           -> PayoutList
//	GET  /v1/payouts/{id}              -> Payout
//	POST /v1/payouts/{id}/claim        (holder's headers) [ClaimRequest] -> Payout
//	POST /v1/payouts/{id}/result       (holder's headers) ResultRequest -> Payout
//	POST /v1/payouts/{id}/attention    (holder's headers) AttentionRequest -> Payout
//	POST /v1/payouts/{id}/resolution   (holder's headers) ResolutionRequest -> Payout
//	GET  /v1/audit                     -> AuditReport
//
// Every error is an [ErrorEnvelope] with a stable code; each route's
// answers and codes, and the holder's headers (fencewire.HeaderToken,
// HeaderProof, HeaderOwner), are in docs/payout-api.md ("payment-resource").
package api

import (
	"net/url"
	"strconv"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// Routes, as net/http.ServeMux patterns; {id} is an account or payout id
// (see payoutevent.ValidateID). Build a concrete path with AccountPath,
// PayoutPath, ClaimPath or ResultPath.
const (
	// PathAccounts: POST creates an account (AccountRequest -> Account).
	PathAccounts = "/v1/accounts"
	// PathAccount: GET returns one account.
	PathAccount = PathAccounts + "/{id}"
	// PathPayouts: POST creates a payout (PayoutRequest -> Payout); GET
	// lists the payouts in one state (QueryState, QueryLimit, QueryAfter
	// -> PayoutList).
	PathPayouts = "/v1/payouts"
	// PathPayout: GET returns one payout.
	PathPayout = PathPayouts + "/{id}"
	// PathClaim: POST claims a payout for a lock holder (headers
	// HeaderToken, HeaderProof, HeaderOwner; an optional ClaimRequest, the
	// terms the holder means to pay) -> Payout.
	PathClaim = PathPayout + suffixClaim
	// PathResult: POST records the rail's answer to a submission of the
	// payout (ResultRequest, same headers as PathClaim) -> Payout.
	PathResult = PathPayout + suffixResult
	// PathAttention: POST marks a payout needs_attention for a lock
	// holder that met a refusal no retry can change (AttentionRequest,
	// same headers as PathClaim) -> Payout.
	PathAttention = PathPayout + suffixAttention
	// PathResolution: POST resolves a payout in doubt with the outcome
	// rail-proxy's reconciliation established (ResolutionRequest, same
	// headers as PathClaim) -> Payout.
	PathResolution = PathPayout + suffixResolution
	// QueryState, QueryLimit and QueryAfter are the query parameters of
	// GET PathPayouts: the state (one of Listable, required), the page
	// size (1..MaxListLimit, default DefaultListLimit) and the payout id
	// the page starts after (optional).
	QueryState = "state"
	QueryLimit = "limit"
	QueryAfter = "after"
	// QueryInclude is the query parameter of every route that answers a
	// Payout (create, GET, claim, result, attention, resolution): with
	// IncludeHistory the answer carries the payout's History; without it
	// History is absent, and the history is not read.
	QueryInclude = "include"
	// IncludeHistory is QueryInclude's one value.
	IncludeHistory = "history"
	// PathAudit: GET runs the ledger audit -> AuditReport.
	PathAudit = "/v1/audit"

	suffixClaim      = "/claim"
	suffixResult     = "/result"
	suffixAttention  = "/attention"
	suffixResolution = "/resolution"
)

// AccountPath returns the path of GET PathAccount for id, escaped.
func AccountPath(id string) string { return PathAccounts + "/" + url.PathEscape(id) }

// PayoutPath returns the path of GET PathPayout for id, escaped.
func PayoutPath(id string) string { return PathPayouts + "/" + url.PathEscape(id) }

// WithHistory returns path (one of the Payout routes' paths) asking for
// the payout's History (QueryInclude=IncludeHistory).
func WithHistory(path string) string { return path + "?" + QueryInclude + "=" + IncludeHistory }

// ClaimPath returns the path of POST PathClaim for payout id, escaped.
func ClaimPath(id string) string { return PayoutPath(id) + suffixClaim }

// ResultPath returns the path of POST PathResult for payout id, escaped.
func ResultPath(id string) string { return PayoutPath(id) + suffixResult }

// AttentionPath returns the path of POST PathAttention for payout id,
// escaped.
func AttentionPath(id string) string { return PayoutPath(id) + suffixAttention }

// ResolutionPath returns the path of POST PathResolution for payout id,
// escaped.
func ResolutionPath(id string) string { return PayoutPath(id) + suffixResolution }

// ListPath returns the path and query of GET PathPayouts for the payouts
// in state, limit per page (0: the default), after the payout id after
// ("" for the first page).
func ListPath(state State, limit int, after string) string {
	q := url.Values{QueryState: {string(state)}}
	if limit > 0 {
		q.Set(QueryLimit, strconv.Itoa(limit))
	}
	if after != "" {
		q.Set(QueryAfter, after)
	}
	return PathPayouts + "?" + q.Encode()
}

// Headers of a write made on behalf of a lock holder (PathClaim and
// PathResult and the other fenced routes). Both fence points read the
// same headers; the spelling lives in functions/fencing/fencewire.
const (
	// HeaderToken carries the holder's fencing token: one positive decimal
	// int64 in canonical form. Missing, repeated or malformed: 400
	// INVALID_TOKEN.
	HeaderToken = fencewire.HeaderToken
	// HeaderOwner carries the holder's owner id, recorded in the payout's
	// history and logged; it decides nothing. Optional; when sent, it must
	// be an owner id as lock-server accepts one (1..MaxOwnerLen bytes of
	// ASCII letters, digits and . _ : - @ /), or the request is refused
	// 400 INVALID_REQUEST and changes nothing.
	HeaderOwner = fencewire.HeaderOwner
	// HeaderProof carries lock-server's proof of the holder's token
	// (lockserver/api Grant.Proof), unchanged. While fencing is on, a
	// missing, repeated or unverified proof is refused 403
	// UNVERIFIED_TOKEN and changes nothing.
	HeaderProof = fencewire.HeaderProof
)

// Bounds of requests. A request outside them is answered 400
// INVALID_REQUEST (413 BODY_TOO_LARGE for the body) and changes nothing.
const (
	// MaxBodyBytes is the largest request body accepted, in bytes (4 KiB).
	MaxBodyBytes = 4 << 10
	// MaxAccountIDLen bounds an account id, in bytes
	// (payoutevent.MaxAccountIDLen).
	MaxAccountIDLen = payoutevent.MaxAccountIDLen
	// MaxPayoutIDLen bounds a payout id, in bytes
	// (payoutevent.MaxPayoutIDLen).
	MaxPayoutIDLen = payoutevent.MaxPayoutIDLen
	// MaxRailRefLen bounds a rail reference, in bytes.
	MaxRailRefLen = 128
	// MaxAmountMinor bounds amounts and opening balances, in minor units
	// (payoutevent.MaxAmountMinor, 10^15).
	MaxAmountMinor = payoutevent.MaxAmountMinor
	// MaxOwnerLen is the longest HeaderOwner accepted, in bytes
	// (fencewire.MaxOwnerLen, lock-server's owner bound).
	MaxOwnerLen = fencewire.MaxOwnerLen
)

// Code is a stable, machine-readable error code of the envelope. Codes
// are never renamed or reused; new ones may be added.
type Code string

// Error codes, with the HTTP status each is sent with. Only
// CodeUnavailable and CodeOverloaded are retryable; both are sent with the
// header Retry-After (whole seconds).
const (
	// CodeInvalidRequest (400): malformed body, unknown or repeated field,
	// or a field out of bounds.
	CodeInvalidRequest Code = "INVALID_REQUEST"
	// CodeBodyTooLarge (413): body larger than MaxBodyBytes.
	CodeBodyTooLarge Code = "BODY_TOO_LARGE"
	// CodeUnsupportedMediaType (415): a Content-Type other than
	// application/json.
	CodeUnsupportedMediaType Code = "UNSUPPORTED_MEDIA_TYPE"
	// CodeInvalidToken (400): HeaderToken missing, repeated, or not a
	// positive decimal int64.
	CodeInvalidToken Code = fencewire.CodeInvalidToken
	// CodeNotFound (404): no such route.
	CodeNotFound Code = "NOT_FOUND"
	// CodeMethodNotAllowed (405): the route exists for another method.
	CodeMethodNotAllowed Code = "METHOD_NOT_ALLOWED"
	// CodeAccountNotFound (404): the account does not exist, whether it is
	// named in the path or in a payout's body.
	CodeAccountNotFound Code = "ACCOUNT_NOT_FOUND"
	// CodeAccountConflict (409): the account exists with another currency
	// or opening balance.
	CodeAccountConflict Code = "ACCOUNT_CONFLICT"
	// CodeCurrencyMismatch (422): the payout's currency is not its
	// account's.
	CodeCurrencyMismatch Code = "CURRENCY_MISMATCH"
	// CodeInsufficientFunds (409): a new payout's amount is larger than
	// its account's available balance, Account.BalanceMinor minus the
	// amounts of the account's payouts not yet posted, declined or failed.
	// Nothing was created. The same request may succeed once earlier
	// payouts are declined or failed, so it is not retryable as such.
	CodeInsufficientFunds Code = "INSUFFICIENT_FUNDS"
	// CodePayoutNotFound (404): the payout does not exist.
	CodePayoutNotFound Code = "PAYOUT_NOT_FOUND"
	// CodePayoutConflict (409): the payout id exists with another account,
	// amount or currency.
	CodePayoutConflict Code = "PAYOUT_CONFLICT"
	// CodePayoutTermsMismatch (409): a claim's ClaimRequest names another
	// account, amount or currency than the payout's. Judged before the
	// token's proof and the fence; nothing changed. The same request can
	// never succeed: the caller's terms (a payout event) are not the
	// payout's.
	CodePayoutTermsMismatch Code = "PAYOUT_TERMS_MISMATCH"
	// CodeFencedOut (409): a fenced row carries a higher token (or, on the
	// strict account fence, the same one). The writer is a stale lock
	// holder and must stop. Spelled in fencewire, shared with rail-proxy.
	CodeFencedOut Code = fencewire.CodeFencedOut
	// CodeUnverifiedToken (403): the token's HeaderProof is missing or
	// does not show that lock-server granted that token on the lock that
	// guards the account (payout:{accountId}). Nothing changed; the same
	// request can never succeed. Spelled in fencewire.
	CodeUnverifiedToken Code = fencewire.CodeUnverifiedToken
	// CodePayoutFinished (409): the payout is posted, declined or failed; nothing
	// is left to do (the executor acknowledges its message).
	CodePayoutFinished Code = "PAYOUT_FINISHED"
	// CodePayoutInDoubt (409): the payout's rail outcome is unknown
	// (ambiguous or submitted); it must not be claimed again until a result
	// or an operator settles it.
	CodePayoutInDoubt Code = "PAYOUT_IN_DOUBT"
	// CodePayoutNotClaimed (409): a result for a payout no one claimed.
	CodePayoutNotClaimed Code = "PAYOUT_NOT_CLAIMED"
	// CodePayoutNeedsAttention (409): the payout is in needs_attention: an
	// executor met a refusal no retry can change and recorded why
	// (Payout.AttentionReason). It is not claimed again; a fenced result
	// (the reconciler's, or an operator's) resolves it. The executor
	// acknowledges its message.
	CodePayoutNeedsAttention Code = "PAYOUT_NEEDS_ATTENTION"
	// CodeRailRefConflict (409): the rail reference is already recorded
	// with another payout or outcome.
	CodeRailRefConflict Code = "RAIL_REF_CONFLICT"
	// CodeInvalidReceipt (422): an ACK or DECLINE result whose Receipt is
	// missing or not rail-proxy's signature over this payout, outcome,
	// rail reference and token. Nothing changed.
	CodeInvalidReceipt Code = "INVALID_RECEIPT"
	// CodeUnavailable (503): paydb did not answer, or the transaction lost
	// a serialization race; the outcome is unknown and the transaction was
	// rolled back, so the same request may be sent again. Also the answer,
	// at once and without touching paydb, while paydb is marked stalled (a
	// call ran out its whole RequestTimeout; one probe per
	// EnvStallProbeMs goes through). Retryable, after Retry-After.
	CodeUnavailable Code = "DATABASE_UNAVAILABLE"
	// CodeOverloaded (503): payment-resource holds EnvMaxInFlight requests
	// already; this one was refused before anything was done (nothing
	// happened). Retryable, after Retry-After. The same spelling as
	// lock-server's.
	CodeOverloaded Code = "OVERLOADED"
	// CodeInternal (500): a bug. Not retryable. Its message is generic;
	// the cause is in payment-resource's log (request_failed).
	CodeInternal Code = "INTERNAL"
	// CodeRequestCancelled (StatusRequestCancelled, 499): the caller's
	// request ended (cancelled, or its connection closed: a push the bridge
	// gave up on) while paydb was being asked. Nobody reads this answer;
	// the transaction was rolled back, or its outcome is unknown to the
	// caller, as for DATABASE_UNAVAILABLE. It exists so that the log (INFO,
	// request_refused) and the request metrics tell a caller giving up
	// from paydb failing: a 4xx, so not an error of the payout API's
	// availability SLO. The same spelling and status as lock-server's.
	CodeRequestCancelled Code = "REQUEST_CANCELLED"
)

// StatusRequestCancelled is the status of CodeRequestCancelled: 499, the
// status proxies use for a request whose client closed it. It is recorded,
// never read by the caller.
const StatusRequestCancelled = 499

// Codes lists every Code, in the order declared above.
var Codes = []Code{
	CodeInvalidRequest, CodeBodyTooLarge, CodeUnsupportedMediaType, CodeInvalidToken, CodeNotFound,
	CodeMethodNotAllowed, CodeAccountNotFound, CodeAccountConflict, CodeCurrencyMismatch, CodeInsufficientFunds, CodePayoutNotFound,
	CodePayoutConflict, CodePayoutTermsMismatch, CodeFencedOut, CodeUnverifiedToken, CodePayoutFinished, CodePayoutInDoubt, CodePayoutNotClaimed,
	CodePayoutNeedsAttention, CodeRailRefConflict, CodeInvalidReceipt, CodeUnavailable, CodeOverloaded, CodeInternal,
	CodeRequestCancelled,
}

// Retryable reports whether the code marks a condition that may clear if
// the identical request is sent again later.
func (c Code) Retryable() bool { return c == CodeUnavailable || c == CodeOverloaded }

// ErrorEnvelope is the body of every non-2xx answer.
type ErrorEnvelope struct {
	// Error is the refusal.
	Error ErrorBody `json:"error"`
}

// ErrorBody carries the stable code, a message for people (not stable; do
// not parse it) and whether the same request may succeed later.
type ErrorBody struct {
	// Code is one of the Code constants.
	Code Code `json:"code"`
	// Message is for people; it may change between versions.
	Message string `json:"message"`
	// Retryable is Code.Retryable(), sent for clients without this package.
	Retryable bool `json:"retryable"`
}

// Environment variables of payment-resource's configuration (read by
// paymentresource.LoadConfig); an unset or empty variable keeps the
// field's default.
const (
	// EnvDatabaseURL locates paydb: a PostgreSQL URL or key=value string.
	// Required.
	EnvDatabaseURL = "PAYDB_URL"
	// EnvCloudSQLInstance, when set ("project:region:instance"), connects
	// through the Cloud SQL Go connector.
	EnvCloudSQLInstance = "PAYDB_INSTANCE"
	// EnvMaxConns caps the connection pool: a decimal integer, 0 (pgx's
	// default) or at least 2.
	EnvMaxConns = "PAYDB_MAX_CONNS"
	// EnvFencingEnabled is the kill switch payment.fencing.enabled:
	// true/false, 1/0, on/off, yes/no; default true.
	EnvFencingEnabled = "PAYMENT_FENCING_ENABLED"
	// EnvOutboxPollMs is the outbox poll interval in milliseconds, a
	// positive decimal integer (10..600000).
	EnvOutboxPollMs = "OUTBOX_POLL_MS"
	// EnvMaxInFlight bounds the requests payment-resource serves at once:
	// a decimal integer, 1..100000, default 256; one more is answered 503
	// OVERLOADED at once.
	EnvMaxInFlight = "PAYMENT_MAX_IN_FLIGHT"
	// EnvStallProbeMs is how often, in milliseconds (1..60000, default
	// 500), one request is let through to paydb while it is marked
	// stalled; the others are answered 503 DATABASE_UNAVAILABLE at once.
	EnvStallProbeMs = "PAYMENT_STALL_PROBE_MS"
	// EnvStallAfterMs is how long, in milliseconds (0..60000, default
	// 1000; 0 turns it off), a paydb call may run while paydb answers no
	// call at all before paydb is marked stalled and every running call
	// is answered 503 DATABASE_UNAVAILABLE at once.
	EnvStallAfterMs = "PAYMENT_STALL_AFTER_MS"
	// EnvProofKeys lists the public keys of lock-server's grant proofs;
	// required while fencing is on (fencewire.EnvProofKeys).
	EnvProofKeys = fencewire.EnvProofKeys
	// EnvReceiptKeys lists the public keys of rail-proxy's receipts;
	// required (fencewire.EnvReceiptKeys).
	EnvReceiptKeys = fencewire.EnvReceiptKeys
	// EnvTermsSigningKey is the secret key payment-resource signs its
	// payouts' terms with (Payout.TermsSignature); required
	// (fencewire.EnvTermsSigningKey).
	EnvTermsSigningKey = fencewire.EnvTermsSigningKey
)

// Log events of payment-resource: the value of the "event" attribute of
// its structured log lines. Consumers (the harness, tests) match on these.
// Lines about a payout carry payoutId and accountId; fenced writes also
// token and ownerId.
const (
	// EventAccountCreated (INFO): an account was created.
	EventAccountCreated = "account_created"
	// EventPayoutCreated (INFO): a payout and its outbox row were created.
	EventPayoutCreated = "payout_created"
	// EventPayoutClaimed: a lock holder claimed a payout; token is its
	// fencing token. DEBUG for the payout's first claim, INFO for a claim
	// of a payout already claimed.
	EventPayoutClaimed = "payout_claimed"
	// EventResultReplayed (INFO): a result whose rail reference was
	// already recorded alike; nothing changed.
	EventResultReplayed = "result_replayed"
	// EventPayoutPosted (INFO): an ACK was recorded and the debit posted.
	EventPayoutPosted = "payout_posted"
	// EventPayoutDeclined (INFO): a DECLINE was recorded.
	EventPayoutDeclined = "payout_declined"
	// EventPayoutAmbiguous (WARN): an AMBIGUOUS result was recorded; the
	// payout is in doubt.
	EventPayoutAmbiguous = "payout_ambiguous"
	// EventPayoutNeedsAttention (ERROR): a lock holder marked the payout
	// needs_attention, with reason (an AttentionReason), token and ownerId.
	EventPayoutNeedsAttention = "payout_needs_attention"
	// EventPayoutFailed (WARN): a resolution with outcome NONE failed the
	// payout: its submission never reached the rail (token, railToken).
	EventPayoutFailed = "payout_failed"
	// EventPayoutResolved (WARN): a resolution changed the payout (outcome,
	// from, to), whatever the outcome: a payout in doubt was settled.
	EventPayoutResolved = "payout_resolved"
	// EventFencedOut (WARN): a fenced write was refused (see
	// fencewire.EventFencedOut for its attributes).
	EventFencedOut = fencewire.EventFencedOut
	// EventUnverifiedToken (WARN): a fenced write was refused for an
	// unverified token (see fencewire.EventUnverifiedToken).
	EventUnverifiedToken = fencewire.EventUnverifiedToken
	// EventFencingDisabled (WARN, once at start): the kill switch turned
	// fencing off.
	EventFencingDisabled = fencewire.EventFencingDisabled
	// EventRequestRefused (INFO; DEBUG for FENCED_OUT, already logged as
	// EventFencedOut): a request answered 4xx, with status and code.
	EventRequestRefused = "request_refused"
	// EventRequestFailed (ERROR): a request answered 5xx.
	EventRequestFailed = "request_failed"
	// EventAuditUnbalanced (WARN): GET /v1/audit found violations.
	EventAuditUnbalanced = "audit_unbalanced"
	// EventOutboxPublished (DEBUG): an outbox row was published and marked.
	EventOutboxPublished = "outbox_published"
	// EventOutboxPublishFailed (WARN): publishing an outbox row failed; it
	// is published again later.
	EventOutboxPublishFailed = "outbox_publish_failed"
	// EventOutboxDrainFailed (WARN): reading the outbox failed; the
	// publisher retries with backoff.
	EventOutboxDrainFailed = "outbox_drain_failed"
	// EventAgeQueryFailed (WARN): paydb did not answer the query of the
	// ages a metrics scrape reports (payouts_ambiguous_oldest_age_seconds,
	// payment_outbox_oldest_unpublished_age_seconds); they are left out of
	// that scrape.
	EventAgeQueryFailed = "paydb_age_query_failed"
	// EventBackendStalled (ERROR): a paydb call ran out its whole
	// RequestTimeout; requests are answered 503 DATABASE_UNAVAILABLE at
	// once until a probe gets an answer (internal/overload).
	EventBackendStalled = "backend_stalled"
	// EventBackendRecovered (INFO): paydb answered a probe; requests are
	// served again.
	EventBackendRecovered = "backend_recovered"
)
