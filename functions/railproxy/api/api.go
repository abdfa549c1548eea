// Package api is the wire contract of rail-proxy (fence point two): its
// routes, bodies, error codes, bounds and validation, configuration
// variables and log events. It imports only the standard library and the
// wire packages functions/payoutevent, functions/fencing/fencewire and
// functions/rail (whose answers it relays), so any client can use it
// without a database driver. Amounts are minor
// units, currencies ISO 4217 codes, tokens positive int64s.
//
//	POST /v1/rail/submissions             SubmitRequest -> SubmitAnswer
//	GET  /v1/rail/unsettled               -> UnsettledList
//	GET  /v1/rail/high-water/{accountId}  -> HighWater
//	GET  /v1/rail/attempts?payoutId=P     -> AttemptList
//	POST /v1/rail/reconciliations         ReconcileRequest -> Reconciliation
//
// Every error is an [ErrorEnvelope] with a stable code; each route's
// headers, answers and codes are in docs/payout-api.md ("rail-proxy").
// A refused submission never reaches the rail.
package api

import (
	"net/url"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// Routes, as net/http.ServeMux patterns. Build a concrete path with
// HighWaterPath or AttemptsPath.
const (
	// PathSubmissions: POST submits a payout to the rail (headers
	// HeaderToken, HeaderOwner; SubmitRequest -> SubmitAnswer).
	PathSubmissions = pathRail + "/submissions"
	// PathHighWater: GET returns the account's high-water mark
	// (HighWater); {accountId} is an account id.
	PathHighWater = pathHighWaterPrefix + "{accountId}"
	// PathAttempts: GET returns the attempts of the payout named by the
	// query parameter QueryPayoutID (AttemptList).
	PathAttempts = pathRail + "/attempts"
	// QueryPayoutID is the query parameter of PathAttempts, given once.
	QueryPayoutID = "payoutId"
	// PathReconciliations: POST resolves the payout's forwarded attempt
	// against the rail's own record (headers HeaderToken, HeaderProof,
	// HeaderOwner of the payout's lease holder; ReconcileRequest ->
	// Reconciliation).
	PathReconciliations = pathRail + "/reconciliations"

	// PathUnsettled: GET lists the payouts' forwarded attempts still
	// forwarding or ambiguous and older than the abandon threshold, oldest
	// attempt first (query QueryLimit, QueryAfter; headers HeaderToken,
	// HeaderProof of a grant on UnsettledLockKey -> UnsettledList): the
	// reconciler settles each with PathReconciliations, so that every
	// attempt ends in a final state, also under a payout already posted.
	PathUnsettled = pathRail + "/unsettled"
	// QueryLimit is PathUnsettled's page size, 1..MaxUnsettledLimit
	// (default DefaultUnsettledLimit), given at most once.
	QueryLimit = "limit"
	// QueryAfter starts PathUnsettled's page after that attempt id (a
	// positive decimal; UnsettledList.Next), given at most once.
	QueryAfter = "after"
	// UnsettledLockKey is the lock whose grant's token and proof a caller
	// of PathUnsettled presents (verified while fencing is on), as a
	// reconciliation presents the payout's: the same integrity check, not
	// authentication (SECURITY.md).
	UnsettledLockKey = "rail-proxy:unsettled"
	// DefaultUnsettledLimit and MaxUnsettledLimit bound QueryLimit.
	DefaultUnsettledLimit = 100
	MaxUnsettledLimit     = 500

	pathRail            = "/v1/rail"
	pathHighWaterPrefix = pathRail + "/high-water/"
)

// HighWaterPath returns the path of GET PathHighWater for account,
// escaped.
func HighWaterPath(account string) string { return pathHighWaterPrefix + url.PathEscape(account) }

// AttemptsPath returns the path and query of GET PathAttempts for payout,
// escaped.
func AttemptsPath(payout string) string {
	return PathAttempts + "?" + url.Values{QueryPayoutID: {payout}}.Encode()
}

// Headers of a submission, made on behalf of a lock holder; the spelling
// lives in functions/fencing/fencewire, shared with payment-resource.
const (
	// HeaderToken carries the holder's fencing token: one positive decimal
	// int64 in canonical form. Missing, repeated or malformed: 400
	// INVALID_TOKEN.
	HeaderToken = fencewire.HeaderToken
	// HeaderOwner carries the holder's owner id, recorded as
	// Attempt.OwnerID and logged; it decides nothing. Since it is stored,
	// it must be an owner id lock-server accepts (1..MaxOwnerLen bytes of
	// ASCII letters, digits and . _ : - @ /), or the request is refused 400
	// INVALID_REQUEST, never cut.
	HeaderOwner = fencewire.HeaderOwner
	// HeaderProof carries lock-server's proof of the holder's token
	// (lockserver/api Grant.Proof), unchanged; required while fencing is
	// on (fencewire.HeaderProof).
	HeaderProof = fencewire.HeaderProof
	// HeaderTermsSignature carries payment-resource's signature over the
	// payout's terms (paymentresource/api Payout.TermsSignature, passed
	// unchanged; fencewire.PayoutTerms): SubmitRequest.TermsSignature,
	// and ReconcileRequest.TermsSignature with the payout's facts. At most
	// once (sent twice: 400 INVALID_REQUEST). A header rather than a body
	// member so that a rail-proxy older than the terms check, which
	// decodes bodies strictly, ignores it instead of refusing the
	// submission (docs/payout-pipeline.md, deploying).
	HeaderTermsSignature = "X-Payout-Terms-Signature"
)

// Bounds of requests. A request outside them is answered 400
// INVALID_REQUEST (413 BODY_TOO_LARGE for the body), records nothing and
// does not reach the rail.
const (
	// MaxBodyBytes is the largest submission body accepted, in bytes
	// (4 KiB).
	MaxBodyBytes = 4 << 10
	// MaxPayoutIDLen bounds a payout id, in bytes
	// (payoutevent.MaxPayoutIDLen).
	MaxPayoutIDLen = payoutevent.MaxPayoutIDLen
	// MaxAccountIDLen bounds an account id, in bytes
	// (payoutevent.MaxAccountIDLen).
	MaxAccountIDLen = payoutevent.MaxAccountIDLen
	// MaxAmountMinor bounds an amount, in minor units
	// (payoutevent.MaxAmountMinor, 10^15).
	MaxAmountMinor = payoutevent.MaxAmountMinor
	// MaxOwnerLen is the longest HeaderOwner accepted, in bytes; a longer
	// one is refused 400 INVALID_REQUEST.
	MaxOwnerLen = fencewire.MaxOwnerLen
	// MaxRailRefLen bounds the rail's reference, in bytes: a rail answer
	// with a longer one is not usable and counts as ambiguous.
	MaxRailRefLen = 128
)

// Code is a stable, machine-readable error code of the envelope. Codes
// are never renamed or reused; new ones may be added.
type Code string

// Error codes, with the HTTP status each is sent with.
const (
	// CodeInvalidRequest (400): malformed body, unknown or repeated field,
	// a field out of bounds, a malformed HeaderOwner, or a bad query
	// parameter. Nothing recorded.
	CodeInvalidRequest Code = "INVALID_REQUEST"
	// CodeInvalidToken (400): HeaderToken missing, repeated, or not a
	// positive decimal int64 in canonical form. Nothing recorded. Spelled
	// in fencewire: payment-resource answers the same header so.
	CodeInvalidToken Code = fencewire.CodeInvalidToken
	// CodeBodyTooLarge (413): body larger than MaxBodyBytes.
	CodeBodyTooLarge Code = "BODY_TOO_LARGE"
	// CodeUnsupportedMediaType (415): a Content-Type other than
	// application/json.
	CodeUnsupportedMediaType Code = "UNSUPPORTED_MEDIA_TYPE"
	// CodeFencedOut (409): the token is not greater than the account's
	// high-water mark (strict), or at or below the token floor of a
	// recovered restore. The writer is a stale lock holder and must stop.
	// The attempt is recorded StateFenced. Spelled in fencewire, shared
	// with payment-resource.
	CodeFencedOut Code = fencewire.CodeFencedOut
	// CodeUnverifiedToken (403): the token's HeaderProof is missing or
	// does not show that lock-server granted that token on the lock that
	// guards the account (payout:{accountId}). Nothing changed; the same
	// request can never succeed. Spelled in fencewire.
	CodeUnverifiedToken Code = fencewire.CodeUnverifiedToken
	// CodeInvalidTerms (403): the terms signature (HeaderTermsSignature)
	// is well formed and names a key of EnvTermsKeys, but that key did not
	// sign exactly this payout id, account id, amount and currency:
	// payment-resource did not create this payout with these terms (a
	// payout id paydb does not know, another amount, currency or account,
	// the signature of another payout). It depends on the payout, not on
	// the deployment: permanent for this payout (the executor marks it
	// needs_attention, rail_request_refused). Checked before the token's
	// proof and the fence, and also while fencing is off: nothing
	// recorded, no high-water moved, the rail not called. The same request
	// can never succeed.
	//
	// Until this version INVALID_TERMS also covered the two codes below.
	// They were split off because they mean something else: a key id
	// rail-proxy does not hold yet is a deployment fault that clears once
	// the key is added, and a missing signature is a caller that does not
	// send one; only a known key's signature over other terms says that
	// these terms are not the ledger's. The code kept the permanent case
	// because an executor of the previous version treats INVALID_TERMS as
	// a deployment fault: for the narrowed meaning that is slow (redelivered
	// to the dead-letter topic), never wrong. One caveat: a key of
	// EnvTermsKeys under the id of payment-resource's signing key but not
	// its public half (a key id reused for a new key) makes every payout
	// INVALID_TERMS: never reuse a key id.
	CodeInvalidTerms Code = "INVALID_TERMS"
	// CodeTermsKeyUnknown (403, retryable): the terms signature is well
	// formed but names a key id that is not in EnvTermsKeys:
	// payment-resource signs with a key rail-proxy has not been given (a
	// rotation done in the wrong order, or not finished). The same for
	// every payout signed with that key, a deployment fault: the same
	// request succeeds once the key is added. Nothing recorded, the rail
	// not called.
	CodeTermsKeyUnknown Code = "TERMS_KEY_UNKNOWN"
	// CodeTermsUnsigned (403): no usable terms signature:
	// HeaderTermsSignature (and the previous version's body member) absent
	// or empty, or not of the form "<key id>.<base64url signature>". A
	// caller that does not pass payment-resource's signature on (an
	// executor older than the terms check, a payment-resource without its
	// signing key): the same for every payout, a deployment fault. Not
	// retryable as such: the same request never succeeds while
	// EnvTermsRequired is on. Nothing recorded, the rail not called. With
	// EnvTermsRequired off, a request with no signature at all is let
	// through the terms check instead (logged EventTermsUnsigned); a
	// malformed one is still refused.
	CodeTermsUnsigned Code = "TERMS_UNSIGNED"
	// CodeAlreadySubmitted (409): an earlier attempt of the payout went,
	// or may have gone, to the rail; this one was recorded
	// StateDuplicate and not forwarded. The body is an
	// AlreadySubmittedAnswer; its retryable flag is true only while that
	// attempt is still StateForwarding.
	CodeAlreadySubmitted Code = "PAYOUT_ALREADY_SUBMITTED"
	// CodeRailAmbiguous (502): the rail was called and its outcome is
	// unknown (timeout, lost connection, 5xx, unusable answer); the money
	// may have moved. The attempt is StateAmbiguous. Not retryable:
	// reconcile with the rail's records.
	CodeRailAmbiguous Code = "RAIL_AMBIGUOUS"
	// CodeRailNotReached (503): the rail certainly did not take the
	// submission: the connection to it could not be established (nothing
	// was sent), or the rail answered that it recorded nothing (rail-stub's
	// 503 RAIL_UNAVAILABLE). No money moved. The attempt is recorded
	// StateNotSent and the payout's forward is released, so that a later
	// submission of the payout (a redelivery with a newer token, or the
	// same holder's resend with its own token) may go to the rail.
	// Retryable, with Retry-After. A timeout, a reset or any failure after
	// the request may have been written is CodeRailAmbiguous instead.
	CodeRailNotReached Code = "RAIL_NOT_REACHED"
	// CodePayoutStopped (409): the rail refused the submission because the
	// payout's reference has a stop order (rail-stub's 409
	// REFERENCE_STOPPED): a reconciliation stopped it. No money moved and
	// none ever will for this payout; the attempt is recorded
	// StateNotAtRail (a reconciliation answers it RailNone, with a
	// receipt). Not retryable.
	CodePayoutStopped Code = "PAYOUT_STOPPED"
	// CodeUnavailable (503): raildb did not answer, or the proxy is
	// closing, before the rail was called. Retryable; a retry with the
	// same token is refused FENCED_OUT if the failed request's transaction
	// did commit. Also the answer, at once and without touching raildb,
	// while raildb is marked stalled (a transaction ran out its whole
	// DBTimeout; one probe per EnvStallProbeMs goes through): then nothing
	// was recorded. Sent with Retry-After.
	CodeUnavailable Code = "UNAVAILABLE"
	// CodeOverloaded (503): rail-proxy holds EnvMaxInFlight requests
	// already; this one was refused before anything was done (nothing
	// recorded, the rail not called). Retryable, after Retry-After. The
	// same spelling as lock-server's and payment-resource's.
	CodeOverloaded Code = "OVERLOADED"
	// CodeRestored (503): raildb was restored from a backup and may have
	// forgotten high-water marks and forwarded payouts. Nothing was
	// recorded and the rail was not called. Retryable once an operator
	// has run "rail-proxy recover-restore" (docs/runbooks/raildb-restore.md).
	CodeRestored Code = "RAILDB_RESTORED"
	// CodeAttemptInFlight (409): a reconciliation of a payout whose
	// forwarded attempt is still forwarding (or ambiguous) and younger
	// than the abandon threshold (RailTimeout + 2 x DBTimeout + 1 s): the
	// original forward may still be calling the rail or recording its
	// answer. Nothing changed. Retryable: ask again later.
	CodeAttemptInFlight Code = "ATTEMPT_IN_FLIGHT"
	// CodeNotForwarded (404): a reconciliation of a payout rail-proxy
	// never let through to the rail (no forwarded attempt). Nothing
	// changed; there is nothing of this payout at the rail to resolve.
	CodeNotForwarded Code = "PAYOUT_NOT_FORWARDED"
	// CodeRailSubmittedTwice (409): the rail's record holds more than one
	// submission under the payout's reference. That breaks INV-04 (one
	// submission per payout) and is never resolved automatically: logged
	// at ERROR (EventRailSubmittedTwice), nothing changed; a person
	// decides (docs/runbooks/payout-needs-attention.md).
	CodeRailSubmittedTwice Code = "RAIL_SUBMITTED_TWICE"
	// CodeNotFound (404): no such route, or no high-water mark for the
	// account.
	CodeNotFound Code = "NOT_FOUND"
	// CodeMethodNotAllowed (405): the route exists for another method.
	CodeMethodNotAllowed Code = "METHOD_NOT_ALLOWED"
	// CodeInternal (500): a bug. Not retryable.
	CodeInternal Code = "INTERNAL"
	// CodeRequestCancelled (StatusRequestCancelled, 499): the caller's
	// request ended (cancelled, or its connection closed) before rail-proxy
	// answered, on a route whose work depends on its caller staying: a
	// read (the high-water mark, the attempts) or a reconciliation. Nobody
	// reads this answer, and it promises what UNAVAILABLE promises on the
	// same route: a read changed nothing; a reconciliation recorded
	// nothing, though its stop order may have reached the rail. It exists
	// so that the log and the request metrics tell a caller giving up from
	// raildb failing: a 4xx, logged at DEBUG (request_refused), not an
	// ERROR 503. A submission that has passed its fence no longer depends
	// on its caller: the rail is called and its answer recorded even if
	// the caller has gone. The same spelling and status as lock-server's
	// and payment-resource's.
	CodeRequestCancelled Code = "REQUEST_CANCELLED"
)

// StatusRequestCancelled is the status of CodeRequestCancelled: 499, the
// status proxies use for a request whose client closed it. It is recorded,
// never read by the caller.
const StatusRequestCancelled = 499

// Codes lists every Code, in the order declared above.
var Codes = []Code{
	CodeInvalidRequest, CodeInvalidToken, CodeBodyTooLarge, CodeUnsupportedMediaType, CodeFencedOut, CodeUnverifiedToken, CodeInvalidTerms, CodeTermsKeyUnknown, CodeTermsUnsigned, CodeAlreadySubmitted,
	CodeRailAmbiguous, CodeRailNotReached, CodePayoutStopped, CodeUnavailable, CodeOverloaded, CodeRestored, CodeAttemptInFlight, CodeNotForwarded, CodeRailSubmittedTwice,
	CodeNotFound, CodeMethodNotAllowed, CodeInternal, CodeRequestCancelled,
}

// Retryable reports whether the code always marks a condition that may
// clear if the identical request is sent again later (CodeUnavailable,
// CodeOverloaded, CodeRestored, CodeAttemptInFlight, CodeRailNotReached,
// CodeTermsKeyUnknown). CodeAlreadySubmitted is retryable only while the
// first attempt is forwarding; its envelope says which.
func (c Code) Retryable() bool {
	return c == CodeUnavailable || c == CodeOverloaded || c == CodeRestored || c == CodeAttemptInFlight || c == CodeRailNotReached ||
		c == CodeTermsKeyUnknown
}

// ErrorEnvelope is the body of every non-2xx answer but 409
// PAYOUT_ALREADY_SUBMITTED, which is an AlreadySubmittedAnswer (the same
// "error" member plus the attempt).
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
	// Retryable says whether the same request may succeed later.
	Retryable bool `json:"retryable"`
}

// Environment variables of rail-proxy's configuration (read by
// railproxy.LoadConfig; the recover-restore command reads the first two);
// an unset or empty variable keeps the field's default.
const (
	// EnvDatabaseURL locates raildb: a PostgreSQL URL or key=value string.
	// Required.
	EnvDatabaseURL = "RAILDB_URL"
	// EnvDatabaseInstance, when set ("project:region:instance"), connects
	// through the Cloud SQL Go connector.
	EnvDatabaseInstance = "RAILDB_INSTANCE"
	// EnvRailURL is the rail's base URL (http or https, no query); the
	// proxy POSTs to it + functions/rail.PathSubmit. Required.
	EnvRailURL = "RAIL_URL"
	// EnvRailTimeoutMs bounds one call to the rail, in milliseconds
	// (default 5000, at most 600000).
	EnvRailTimeoutMs = "RAIL_TIMEOUT_MS"
	// EnvDBTimeoutMs bounds each raildb transaction of a request, in
	// milliseconds (default 5000, at most 600000).
	EnvDBTimeoutMs = "RAIL_PROXY_DB_TIMEOUT_MS"
	// EnvMaxInFlight bounds the requests rail-proxy serves at once: a
	// decimal integer, 1..100000, default 256; one more is answered 503
	// OVERLOADED at once.
	EnvMaxInFlight = "RAIL_PROXY_MAX_IN_FLIGHT"
	// EnvStallProbeMs is how often, in milliseconds (1..60000, default
	// 500), one request is let through to raildb while it is marked
	// stalled; the others are answered 503 UNAVAILABLE at once.
	EnvStallProbeMs = "RAIL_PROXY_STALL_PROBE_MS"
	// EnvStallAfterMs is how long, in milliseconds (0..60000, default
	// 1000; 0 turns it off), a raildb transaction before the rail call
	// may run while raildb answers nothing at all before raildb is marked
	// stalled and every such transaction still running is answered 503
	// UNAVAILABLE at once (rolled back; the rail not called).
	EnvStallAfterMs = "RAIL_PROXY_STALL_AFTER_MS"
	// EnvFencingEnabled is the kill switch rail.proxy.fencing.enabled:
	// true/false, 1/0, on/off, yes/no; default true. Off only for the
	// fencing experiment.
	EnvFencingEnabled = "RAIL_PROXY_FENCING_ENABLED"
	// EnvProofKeys lists the public keys of lock-server's grant proofs;
	// required while fencing is on (fencewire.EnvProofKeys).
	EnvProofKeys = fencewire.EnvProofKeys
	// EnvRailIDTokens, read by cmd/rail-proxy (true or false, default
	// false), adds a Cloud Run ID token for RAIL_URL to each call to the
	// rail: set on Cloud Run, where rail-stub is private.
	EnvRailIDTokens = "RAIL_ID_TOKENS"
	// EnvReceiptSigningKey is the secret key rail-proxy signs its
	// receipts with; required (fencewire.EnvReceiptSigningKey).
	EnvReceiptSigningKey = fencewire.EnvReceiptSigningKey
	// EnvTermsKeys lists the public keys of payment-resource's payout-terms
	// signatures (fenceproof VerifyKey forms, comma-separated); required,
	// whether fencing is on or off (fencewire.EnvTermsKeys).
	EnvTermsKeys = fencewire.EnvTermsKeys
	// EnvTermsRequired is rail.proxy.terms.required: true/false, 1/0,
	// on/off, yes/no; default true. Off, a submission or closing
	// reconciliation that carries no terms signature at all is let
	// through the terms check (logged EventTermsUnsigned at WARN) instead
	// of refused 403 TERMS_UNSIGNED; a signature that is sent is verified
	// all the same. Only for a rolling deploy over executors that do not
	// send the signature yet (docs/payout-pipeline.md); logged at WARN at
	// start when off (EventTermsNotRequired).
	EnvTermsRequired = "RAIL_PROXY_TERMS_REQUIRED"
)

// Log events of rail-proxy: the value of the "event" attribute of its
// structured log lines. Consumers (the harness, tests) match on these.
// Lines about a submission carry payoutId, accountId, token and ownerId;
// after admission also attemptId.
const (
	// EventSubmissionForwarding (DEBUG): the fence passed and the attempt
	// is recorded forwarding; the rail is being called (amountMinor,
	// currency).
	EventSubmissionForwarding = "rail_submission_forwarding"
	// EventSubmissionAcked (INFO): the rail answered ACK (railRef).
	EventSubmissionAcked = "rail_submission_acked"
	// EventSubmissionDeclined (INFO): the rail answered DECLINE (railRef).
	EventSubmissionDeclined = "rail_submission_declined"
	// EventSubmissionAmbiguous (ERROR): the rail's outcome is unknown; the
	// answer is 502 RAIL_AMBIGUOUS.
	EventSubmissionAmbiguous = "rail_submission_ambiguous"
	// EventSubmissionNotReached (WARN): the rail certainly did not take the
	// submission (connection never established, or the rail recorded
	// nothing); the attempt is recorded not_sent and the payout's forward
	// released (released); answered 503 RAIL_NOT_REACHED.
	EventSubmissionNotReached = "rail_submission_not_reached"
	// EventSubmissionStopped (WARN): the rail refused the submission for a
	// stop order on the payout's reference; the attempt is recorded
	// not_at_rail; answered 409 PAYOUT_STOPPED.
	EventSubmissionStopped = "rail_submission_stopped"
	// EventSubmissionDuplicate (WARN): the payout already went to the
	// rail; answered 409 PAYOUT_ALREADY_SUBMITTED (firstAttemptId,
	// firstToken, firstState).
	EventSubmissionDuplicate = "rail_submission_duplicate"
	// EventAttemptUpdateFailed (ERROR): the rail's answer (or its absence)
	// could not be recorded; the attempt stays forwarding.
	EventAttemptUpdateFailed = "rail_attempt_update_failed"
	// EventAttemptAbandoned (ERROR): a forwarding attempt too old to be in
	// flight was marked ambiguous (abandonedAttemptId, abandonedToken).
	EventAttemptAbandoned = "rail_attempt_abandoned"
	// EventAttemptReconciled (WARN): a reconciliation recorded the rail's
	// record of a forwarded attempt that was forwarding or ambiguous
	// (previousState, state, railRef, railOutcome).
	EventAttemptReconciled = "rail_attempt_reconciled"
	// EventPayoutClosed (WARN): a reconciliation with the payout's facts
	// closed a payout rail-proxy never forwarded: an attempt of the
	// reconciliation's token became its forward, and the stop order goes
	// to the rail (attemptId).
	EventPayoutClosed = "rail_payout_closed"
	// EventRailSubmittedTwice (ERROR): a reconciliation found more than
	// one submission of the payout at the rail (count, railRefs): a
	// safety violation; answered 409 RAIL_SUBMITTED_TWICE.
	EventRailSubmittedTwice = "rail_submitted_twice"
	// EventFencedOut (WARN): a submission was refused by the fence (see
	// fencewire.EventFencedOut for its attributes; resource is "rail").
	EventFencedOut = fencewire.EventFencedOut
	// EventUnverifiedToken (WARN): a fenced write was refused for an
	// unverified token (see fencewire.EventUnverifiedToken).
	EventUnverifiedToken = fencewire.EventUnverifiedToken
	// EventTermsRefused (WARN): a submission or closing reconciliation
	// was refused for its terms signature (payoutId, accountId,
	// amountMinor, currency, token, ownerId, code: INVALID_TERMS,
	// TERMS_KEY_UNKNOWN or TERMS_UNSIGNED, reason).
	EventTermsRefused = "payout_terms_refused"
	// EventTermsUnsigned (WARN): with EnvTermsRequired off, a submission
	// or closing reconciliation without a terms signature was let through
	// the terms check (payoutId, accountId, amountMinor, currency, token,
	// ownerId). Once none is logged any more, every caller sends the
	// signature: turn EnvTermsRequired on.
	EventTermsUnsigned = "payout_terms_unsigned"
	// EventTermsNotRequired (WARN, once at start): EnvTermsRequired is
	// off; a submission without a terms signature is forwarded.
	EventTermsNotRequired = "payout_terms_not_required"
	// EventFencingDisabled (WARN, once at start): the kill switch turned
	// fencing off.
	EventFencingDisabled = fencewire.EventFencingDisabled
	// EventFencingBypassed (WARN): with fencing disabled, a submission the
	// fence or the one-forward check would have refused was forwarded.
	EventFencingBypassed = "fencing_bypassed"
	// EventRaildbRestored (ERROR): a submission was refused 503
	// RAILDB_RESTORED.
	EventRaildbRestored = "raildb_restored"
	// EventRaildbRecovered (WARN): recover-restore stamped raildb and set
	// the token floor (past, tokenFloor, rebuilt, ...).
	EventRaildbRecovered = "raildb_recovered"
	// EventRequestFailed (ERROR): a request answered 5xx (code).
	EventRequestFailed = "rail_request_failed"
	// EventRequestRefused (DEBUG): a request answered 4xx for bad input
	// (code).
	EventRequestRefused = "rail_request_refused"
)
