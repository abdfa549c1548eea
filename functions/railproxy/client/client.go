// Package client is the typed Go client of rail-proxy's HTTP API
// (functions/railproxy/api). It imports only the standard library, the
// api package, functions/fencing/fencewire and internal/jsonclient (a stdlib-only
// transport core shared with payment-resource's client), so that any
// caller (the executor, a test harness, the reconciler, a tool) can use it
// without pulling in a database driver.
//
// Every method sends one request and decodes a 2xx answer into the api
// type. A non-2xx answer is returned as an *Error carrying the envelope's
// code; errors.Is matches it against the sentinel of its code
// (ErrFencedOut for FENCED_OUT, ErrAlreadySubmitted for
// PAYOUT_ALREADY_SUBMITTED, ...). A request that got no answer (a
// transport error, a timeout), an answer the client cannot read, and a
// 5xx without a code wrap ErrUnavailable: rail-proxy's outcome is unknown
// to the caller. Nothing is retried here.
//
// Submitting the same payout again is safe: rail-proxy forwards a payout
// to the rail at most once and answers every later submission with
// PAYOUT_ALREADY_SUBMITTED and the first attempt (Error.Attempt). It is
// not safe to treat ErrRailAmbiguous as a failure: the rail was called and
// the money may have moved.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonclient"
)

// Errors of the client. Refusals by the server are *Error values that match
// the sentinel of their code under errors.Is.
var (
	// ErrInvalidRequest: the server refused the request as malformed (codes
	// INVALID_REQUEST, INVALID_TOKEN, BODY_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE), or the
	// client refused it before sending. Nothing was recorded.
	ErrInvalidRequest = errors.New("railproxy client: invalid request")
	// ErrFencedOut: the token is not above the account's high-water mark
	// (or at or below a restore's token floor); the caller is a stale lock
	// holder and must stop (FENCED_OUT). The rail was not called.
	ErrFencedOut = errors.New("railproxy client: fenced out")
	// ErrUnverifiedToken: the fence point found no proof that lock-server
	// granted the token on the account's lock (UNVERIFIED_TOKEN). Nothing
	// changed; the same request cannot succeed.
	ErrUnverifiedToken = errors.New("railproxy client: fencing token not verified")
	// ErrAlreadySubmitted: the payout already went, or may have gone, to
	// the rail with an earlier attempt; this one was not forwarded
	// (PAYOUT_ALREADY_SUBMITTED). The *Error's Attempt is that first
	// attempt, never nil.
	ErrAlreadySubmitted = errors.New("railproxy client: payout already submitted")
	// ErrInvalidTerms: api.CodeInvalidTerms, a known key's signature over
	// other terms: the submission's terms are not the ones payment-resource
	// signed (SubmitRequest.TermsSignature of another payout, or the terms
	// changed); nothing recorded, the rail not called. Permanent for the
	// payout.
	ErrInvalidTerms = errors.New("railproxy client: payout terms not signed by payment-resource")
	// ErrTermsKeyUnknown: api.CodeTermsKeyUnknown, the terms signature
	// names a key rail-proxy does not hold (a key rotation not finished);
	// the same request succeeds once the key is added. Retryable.
	ErrTermsKeyUnknown = errors.New("railproxy client: payout terms signed by a key rail-proxy does not hold")
	// ErrTermsUnsigned: api.CodeTermsUnsigned, no usable terms signature
	// (TermsSignature empty or malformed).
	ErrTermsUnsigned = errors.New("railproxy client: payout terms carry no usable signature")
	// ErrRailAmbiguous: the rail was called and its outcome is unknown;
	// the money may have moved (RAIL_AMBIGUOUS). Never submit again to
	// find out: reconcile with the rail's records.
	ErrRailAmbiguous = errors.New("railproxy client: rail outcome unknown")
	// ErrRailNotReached: the rail certainly did not take the submission
	// (RAIL_NOT_REACHED): no money moved and rail-proxy released the
	// payout's forward, so submitting the payout again (after
	// Error.RetryAfter, with this token or a newer one) may reach the rail.
	ErrRailNotReached = errors.New("railproxy client: the rail did not take the submission")
	// ErrPayoutStopped: the rail refused the submission because a
	// reconciliation stopped the payout's reference (PAYOUT_STOPPED): no
	// money moved, and none ever will for this payout.
	ErrPayoutStopped = errors.New("railproxy client: payout stopped at the rail")
	// ErrUnavailable: rail-proxy or raildb did not answer before the rail
	// was called (UNAVAILABLE), or the caller cannot know what happened: a
	// transport error, a 5xx without a code, or a 2xx or
	// PAYOUT_ALREADY_SUBMITTED answer it cannot read.
	ErrUnavailable = errors.New("railproxy client: unavailable")
	// ErrOverloaded: rail-proxy refused the submission at once because it
	// holds as many requests as it serves (OVERLOADED); nothing was
	// recorded and the rail was not called. Send it again after
	// Error.RetryAfter.
	ErrOverloaded = errors.New("railproxy client: overloaded")
	// ErrRaildbRestored: raildb was restored from a backup; submissions
	// are refused, nothing recorded, until an operator runs rail-proxy
	// recover-restore (RAILDB_RESTORED).
	ErrRaildbRestored = errors.New("railproxy client: raildb restored")
	// ErrAttemptInFlight: a reconciliation came before the abandon
	// threshold of the payout's forwarded attempt (ATTEMPT_IN_FLIGHT);
	// ask again later.
	ErrAttemptInFlight = errors.New("railproxy client: submission still in flight")
	// ErrNotForwarded: the payout has no forwarded attempt
	// (PAYOUT_NOT_FORWARDED).
	ErrNotForwarded = errors.New("railproxy client: payout never forwarded")
	// ErrRailSubmittedTwice: the rail holds more than one submission of
	// the payout (RAIL_SUBMITTED_TWICE): a safety violation.
	ErrRailSubmittedTwice = errors.New("railproxy client: rail holds more than one submission")
	// ErrNotFound: no high-water mark for the account: no token was ever
	// accepted for it (NOT_FOUND; also a wrong base URL).
	ErrNotFound = errors.New("railproxy client: not found")
)

// sentinels maps each code with a sentinel to it. METHOD_NOT_ALLOWED and
// INTERNAL have none: they mean a wrong client or a bug, and match only
// *Error.
var sentinels = map[api.Code]error{
	api.CodeInvalidRequest:       ErrInvalidRequest,
	api.CodeInvalidToken:         ErrInvalidRequest,
	api.CodeBodyTooLarge:         ErrInvalidRequest,
	api.CodeUnsupportedMediaType: ErrInvalidRequest,
	api.CodeFencedOut:            ErrFencedOut,
	api.CodeUnverifiedToken:      ErrUnverifiedToken,
	api.CodeInvalidTerms:         ErrInvalidTerms,
	api.CodeTermsKeyUnknown:      ErrTermsKeyUnknown,
	api.CodeTermsUnsigned:        ErrTermsUnsigned,
	api.CodeAlreadySubmitted:     ErrAlreadySubmitted,
	api.CodeRailAmbiguous:        ErrRailAmbiguous,
	api.CodeRailNotReached:       ErrRailNotReached,
	api.CodePayoutStopped:        ErrPayoutStopped,
	api.CodeUnavailable:          ErrUnavailable,
	api.CodeOverloaded:           ErrOverloaded,
	api.CodeRestored:             ErrRaildbRestored,
	api.CodeNotFound:             ErrNotFound,
	api.CodeAttemptInFlight:      ErrAttemptInFlight,
	api.CodeNotForwarded:         ErrNotForwarded,
	api.CodeRailSubmittedTwice:   ErrRailSubmittedTwice,
	api.CodeRequestCancelled:     ErrUnavailable, // never read: only the caller that gave up is answered it
}

// Error is a non-2xx answer of rail-proxy: the HTTP status and the decoded
// error envelope. errors.Is(err, ErrFencedOut) and friends match on Code.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Code is the stable error code; empty when the body was not an
	// envelope (a proxy's answer, say).
	Code api.Code
	// Message is the server's message for people (or the raw body, cut to
	// 512 bytes, when it was not an envelope).
	Message string
	// Retryable is the server's hint that the same request may succeed
	// later (for PAYOUT_ALREADY_SUBMITTED: the first attempt is still
	// forwarding).
	Retryable bool
	// RetryAfter is the answer's Retry-After (whole seconds, at most
	// jsonclient.MaxRetryAfter), 0 when absent: how long to wait before
	// sending the request again (503 UNAVAILABLE and OVERLOADED carry
	// one).
	RetryAfter time.Duration
	// Attempt is, for PAYOUT_ALREADY_SUBMITTED, the payout's attempt that
	// went to the rail first (api.AlreadySubmittedAnswer.Attempt), whose
	// outcome the caller reports instead; nil for every other code.
	Attempt *api.Attempt
}

// Error describes the refusal in one line.
func (e *Error) Error() string {
	if e.Attempt != nil {
		return fmt.Sprintf("railproxy client: rail-proxy answered %d %s: attempt %d (token %d) is %s: %s",
			e.Status, e.Code, e.Attempt.AttemptID, e.Attempt.Token, e.Attempt.State, e.Message)
	}
	return fmt.Sprintf("railproxy client: rail-proxy answered %d %s: %s", e.Status, e.Code, e.Message)
}

// Is matches e against the sentinel of its code; an answer without a code
// and with a 5xx status matches ErrUnavailable.
func (e *Error) Is(target error) bool {
	return jsonclient.Matches(sentinels, e.Code, e.Status, target, ErrUnavailable)
}

// Doer sends one HTTP request; *http.Client implements it, and so does
// the Doer of lockserver/client, so one transport can serve both.
type Doer = jsonclient.Doer

// Client talks to one rail-proxy. It is safe for concurrent use.
type Client struct {
	conn *jsonclient.Conn
}

// Option configures a Client (WithHTTPClient).
type Option = jsonclient.ConnOption

// WithHTTPClient sends requests through d instead of http.DefaultClient.
// Deadlines come from the ctx of each call; the client adds none. New
// fails for a nil d.
func WithHTTPClient(d Doer) Option { return jsonclient.WithDoer(d) }

// New returns a Client for the rail-proxy at baseURL, an absolute http(s)
// URL with an optional path prefix and no query. It returns an error for a
// malformed URL or an invalid option.
func New(baseURL string, opts ...Option) (*Client, error) {
	conn, err := jsonclient.NewConn("railproxy client", baseURL, ErrInvalidRequest, ErrUnavailable, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn}, nil
}

// Submit sends the payout to the rail through rail-proxy, as the lock
// holder h (its fencing token, the token's proof and its owner id, sent
// as headers; POST /v1/rail/submissions) with req.TermsSignature in
// header api.HeaderTermsSignature, and
// returns the rail's answer (ACK or DECLINE). It returns ErrFencedOut,
// ErrInvalidTerms, ErrTermsKeyUnknown, ErrTermsUnsigned,
// ErrAlreadySubmitted (with the first attempt in the *Error's Attempt),
// ErrRailAmbiguous, ErrRailNotReached, ErrPayoutStopped,
// ErrRaildbRestored, ErrUnavailable, or
// ErrInvalidRequest (also for a token that is not positive or a request
// that fails api.SubmitRequest.Validate, without sending).
func (c *Client) Submit(ctx context.Context, h fencewire.Holder, req api.SubmitRequest) (api.SubmitAnswer, error) {
	var ans api.SubmitAnswer
	if err := errors.Join(api.ValidateToken(h.Token), req.Validate()); err != nil {
		return ans, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := c.call(ctx, http.MethodPost, api.PathSubmissions, &h, terms(req.TermsSignature), req, &ans); err != nil {
		return api.SubmitAnswer{}, err
	}
	if ans.Status != api.RailAck && ans.Status != api.RailDecline {
		return api.SubmitAnswer{}, fmt.Errorf("%w: rail-proxy answered 200 with status %q, neither %s nor %s",
			ErrUnavailable, ans.Status, api.RailAck, api.RailDecline)
	}
	return ans, nil
}

// HighWater reads the highest fencing token rail-proxy accepted for
// account (GET /v1/rail/high-water/{accountId}). ErrNotFound when none was
// ever accepted.
func (c *Client) HighWater(ctx context.Context, account string) (int64, error) {
	if err := api.ValidateAccountID(account); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	var hw api.HighWater
	if err := c.call(ctx, http.MethodGet, api.HighWaterPath(account), nil, nil, nil, &hw); err != nil {
		return 0, err
	}
	return hw.HighWater, nil
}

// Attempts lists every attempt to submit payout, oldest first (GET
// /v1/rail/attempts?payoutId=P); empty, not an error, when there is none.
func (c *Client) Attempts(ctx context.Context, payout string) ([]api.Attempt, error) {
	if err := api.ValidatePayoutID(payout); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	var list api.AttemptList
	if err := c.call(ctx, http.MethodGet, api.AttemptsPath(payout), nil, nil, nil, &list); err != nil {
		return nil, err
	}
	if list.Attempts == nil {
		list.Attempts = []api.Attempt{}
	}
	return list.Attempts, nil
}

// Reconcile asks rail-proxy to resolve payout's forwarded attempt against
// the rail's record, as the holder h of the payout's lease (POST
// /v1/rail/reconciliations), and returns the outcome with its receipt.
// It returns ErrAttemptInFlight (retry later), ErrNotForwarded,
// ErrRailSubmittedTwice, ErrUnverifiedToken, ErrUnavailable, or
// ErrInvalidRequest (without sending, for a malformed id or token).
func (c *Client) Reconcile(ctx context.Context, h fencewire.Holder, payout string) (api.Reconciliation, error) {
	return c.ReconcilePayout(ctx, h, api.ReconcileRequest{PayoutID: payout})
}

// ReconcilePayout is Reconcile with the payout's facts (req's AccountID,
// AmountMinor, Currency, as payment-resource holds them, and its
// TermsSignature, sent in header api.HeaderTermsSignature): a payout
// rail-proxy never forwarded is then closed and answered (RailNone unless
// the rail holds it) instead of ErrNotForwarded; terms rail-proxy does not
// verify are refused with ErrInvalidTerms, ErrTermsKeyUnknown or
// ErrTermsUnsigned, as a submission's.
func (c *Client) ReconcilePayout(ctx context.Context, h fencewire.Holder, req api.ReconcileRequest) (api.Reconciliation, error) {
	var rec api.Reconciliation
	if err := errors.Join(api.ValidateToken(h.Token), req.Validate()); err != nil {
		return rec, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := c.call(ctx, http.MethodPost, api.PathReconciliations, &h, terms(req.TermsSignature), req, &rec); err != nil {
		return api.Reconciliation{}, err
	}
	switch rec.Outcome {
	case api.RailAck, api.RailDecline, api.RailNone:
	default:
		return api.Reconciliation{}, fmt.Errorf("%w: rail-proxy answered 200 with outcome %q", ErrUnavailable, rec.Outcome)
	}
	return rec, nil
}

// Unsettled lists one page of the payouts' forwarded attempts still
// forwarding or ambiguous past rail-proxy's abandon threshold (GET
// /v1/rail/unsettled), after attempt id after (0: from the first), at most
// limit (1..api.MaxUnsettledLimit), as the holder h of a grant on
// api.UnsettledLockKey. It returns ErrUnverifiedToken, ErrUnavailable, or
// ErrInvalidRequest (without sending, for a bad token, after or limit).
func (c *Client) Unsettled(ctx context.Context, h fencewire.Holder, after int64, limit int) (api.UnsettledList, error) {
	var list api.UnsettledList
	if err := api.ValidateToken(h.Token); err != nil || after < 0 || limit < 1 || limit > api.MaxUnsettledLimit {
		return list, fmt.Errorf("%w: token %d, after %d, limit %d (1..%d)", ErrInvalidRequest, h.Token, after, limit, api.MaxUnsettledLimit)
	}
	q := url.Values{api.QueryLimit: {strconv.Itoa(limit)}}
	if after > 0 {
		q.Set(api.QueryAfter, strconv.FormatInt(after, 10))
	}
	if err := c.call(ctx, http.MethodGet, api.PathUnsettled+"?"+q.Encode(), &h, nil, nil, &list); err != nil {
		return api.UnsettledList{}, err
	}
	if list.Attempts == nil {
		list.Attempts = []api.Attempt{}
	}
	return list, nil
}

// terms is the header that carries a payout-terms signature
// (api.HeaderTermsSignature); nil for "".
func terms(sig string) http.Header {
	if sig == "" {
		return nil
	}
	return http.Header{http.CanonicalHeaderKey(api.HeaderTermsSignature): {sig}}
}

// call sends one request through jsonclient.Conn.Call, with the holder's
// headers and extra when h is not nil, and decodes a 2xx body into out or
// a refusal into *Error (with the first attempt for
// PAYOUT_ALREADY_SUBMITTED).
func (c *Client) call(ctx context.Context, method, path string, h *fencewire.Holder, extra http.Header, in, out any) error {
	var jh *jsonclient.Holder
	if h != nil {
		jh = &jsonclient.Holder{Token: h.Token, Owner: h.Owner, Proof: h.Proof, TokenHeader: api.HeaderToken, OwnerHeader: api.HeaderOwner, ProofHeader: api.HeaderProof,
			Extra: extra}
	}
	r, err := c.conn.Call(ctx, method, path, jh, in, out)
	if r == nil {
		return err
	}
	e := &Error{Status: r.Status, Code: api.Code(r.Code), Message: r.Message, Retryable: r.Retryable, RetryAfter: r.RetryAfter}
	if e.Code == api.CodeAlreadySubmitted {
		var ans api.AlreadySubmittedAnswer
		if json.Unmarshal(r.Body, &ans) != nil || ans.Attempt.AttemptID <= 0 || ans.Attempt.Token <= 0 {
			// Not forwarded, but what went before is unknown.
			return fmt.Errorf("%w: %d %s without its first attempt: %.512s", ErrUnavailable, r.Status, e.Code, r.Body)
		}
		e.Attempt = &ans.Attempt
	}
	return e
}
