// Package client is the typed Go client of payment-resource's HTTP API
// (functions/paymentresource/api). It imports only the standard library,
// the api package, functions/fencing/fencewire and internal/jsonclient (a
// stdlib-only transport core shared with rail-proxy's client), so that any
// caller (the executor, a test harness, a tool) can use it without pulling
// in a database driver.
//
// Every method sends one request and decodes a 2xx answer into the api
// type. A non-2xx answer is returned as an *Error carrying the envelope's
// code; errors.Is matches it against the sentinel of its code
// (ErrFencedOut for FENCED_OUT, ...). A request that got no answer (a
// transport error, a timeout) wraps ErrUnavailable: its outcome is unknown.
// Nothing is retried here: every write of payment-resource is idempotent
// or fenced, so the caller decides whether to send it again.
package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonclient"
)

// Errors of the client. Refusals by the server are *Error values that match
// the sentinel of their code under errors.Is.
var (
	// ErrInvalidRequest: the server refused the request as malformed (codes
	// INVALID_REQUEST, INVALID_TOKEN, BODY_TOO_LARGE,
	// UNSUPPORTED_MEDIA_TYPE), or the client refused it before sending.
	ErrInvalidRequest = errors.New("paymentresource client: invalid request")
	// ErrAccountNotFound: the account does not exist (ACCOUNT_NOT_FOUND).
	ErrAccountNotFound = errors.New("paymentresource client: account not found")
	// ErrAccountConflict: the account exists with other values
	// (ACCOUNT_CONFLICT).
	ErrAccountConflict = errors.New("paymentresource client: account exists with other values")
	// ErrCurrencyMismatch: the payout's currency is not its account's
	// (CURRENCY_MISMATCH).
	ErrCurrencyMismatch = errors.New("paymentresource client: currency is not the account's")
	// ErrInsufficientFunds: the payout's amount is larger than its
	// account's available balance (INSUFFICIENT_FUNDS); nothing was
	// created.
	ErrInsufficientFunds = errors.New("paymentresource client: insufficient funds")
	// ErrPayoutNotFound: the payout does not exist (PAYOUT_NOT_FOUND).
	ErrPayoutNotFound = errors.New("paymentresource client: payout not found")
	// ErrPayoutConflict: the payout id exists with other values
	// (PAYOUT_CONFLICT).
	ErrPayoutConflict = errors.New("paymentresource client: payout exists with other values")
	// ErrTermsMismatch: a claim's terms are not the payout's
	// (PAYOUT_TERMS_MISMATCH); nothing changed.
	ErrTermsMismatch = errors.New("paymentresource client: claim terms are not the payout's")
	// ErrFencedOut: a newer lock holder has written; the caller is stale
	// and must stop (FENCED_OUT).
	ErrFencedOut = errors.New("paymentresource client: fenced out")
	// ErrUnverifiedToken: the fence point found no proof that lock-server
	// granted the token on the account's lock (UNVERIFIED_TOKEN). Nothing
	// changed; the same request cannot succeed.
	ErrUnverifiedToken = errors.New("paymentresource client: fencing token not verified")
	// ErrInvalidReceipt: an ACK or DECLINE without rail-proxy's receipt
	// over exactly it (INVALID_RECEIPT). Nothing changed.
	ErrInvalidReceipt = errors.New("paymentresource client: rail receipt not valid")
	// ErrPayoutFinished: the payout is posted or declined
	// (PAYOUT_FINISHED).
	ErrPayoutFinished = errors.New("paymentresource client: payout finished")
	// ErrPayoutInDoubt: the payout's rail outcome is unknown
	// (PAYOUT_IN_DOUBT).
	ErrPayoutInDoubt = errors.New("paymentresource client: payout in doubt")
	// ErrPayoutNotClaimed: a result for a payout no one claimed
	// (PAYOUT_NOT_CLAIMED).
	ErrPayoutNotClaimed = errors.New("paymentresource client: payout not claimed")
	// ErrPayoutNeedsAttention: the payout is in needs_attention and is
	// not claimed again (PAYOUT_NEEDS_ATTENTION).
	ErrPayoutNeedsAttention = errors.New("paymentresource client: payout needs attention")
	// ErrRailRefConflict: the rail reference is recorded with another
	// payout or outcome (RAIL_REF_CONFLICT).
	ErrRailRefConflict = errors.New("paymentresource client: rail reference conflict")
	// ErrUnavailable: payment-resource or paydb did not answer; the outcome
	// of the request is unknown (DATABASE_UNAVAILABLE, a 5xx without an
	// envelope, or a transport error).
	ErrUnavailable = errors.New("paymentresource client: unavailable")
	// ErrOverloaded: payment-resource refused the request at once because
	// it holds as many as it serves (OVERLOADED); nothing was done. Send
	// it again after Error.RetryAfter.
	ErrOverloaded = errors.New("paymentresource client: overloaded")
)

// sentinels maps each code with a sentinel to it. NOT_FOUND,
// METHOD_NOT_ALLOWED and INTERNAL have none: they mean a wrong base URL,
// a wrong client or a bug, and match only *Error.
var sentinels = map[api.Code]error{
	api.CodeInvalidRequest:       ErrInvalidRequest,
	api.CodeInvalidToken:         ErrInvalidRequest,
	api.CodeBodyTooLarge:         ErrInvalidRequest,
	api.CodeUnsupportedMediaType: ErrInvalidRequest,
	api.CodeAccountNotFound:      ErrAccountNotFound,
	api.CodeAccountConflict:      ErrAccountConflict,
	api.CodeCurrencyMismatch:     ErrCurrencyMismatch,
	api.CodeInsufficientFunds:    ErrInsufficientFunds,
	api.CodePayoutNotFound:       ErrPayoutNotFound,
	api.CodePayoutConflict:       ErrPayoutConflict,
	api.CodePayoutTermsMismatch:  ErrTermsMismatch,
	api.CodeFencedOut:            ErrFencedOut,
	api.CodeUnverifiedToken:      ErrUnverifiedToken,
	api.CodeInvalidReceipt:       ErrInvalidReceipt,
	api.CodePayoutFinished:       ErrPayoutFinished,
	api.CodePayoutInDoubt:        ErrPayoutInDoubt,
	api.CodePayoutNotClaimed:     ErrPayoutNotClaimed,
	api.CodePayoutNeedsAttention: ErrPayoutNeedsAttention,
	api.CodeRailRefConflict:      ErrRailRefConflict,
	api.CodeUnavailable:          ErrUnavailable,
	api.CodeOverloaded:           ErrOverloaded,
	api.CodeRequestCancelled:     ErrUnavailable, // never read: only the caller that gave up is answered it
}

// Error is a non-2xx answer of payment-resource: the HTTP status and the
// decoded error envelope. errors.Is(err, ErrFencedOut) and friends match
// on Code.
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
	// later.
	Retryable bool
	// RetryAfter is the answer's Retry-After (whole seconds, at most
	// jsonclient.MaxRetryAfter), 0 when absent: how long to wait before
	// sending the request again (503 DATABASE_UNAVAILABLE and OVERLOADED
	// carry one).
	RetryAfter time.Duration
}

// Error describes the refusal in one line.
func (e *Error) Error() string {
	return fmt.Sprintf("paymentresource client: payment-resource answered %d %s: %s", e.Status, e.Code, e.Message)
}

// Is matches e against the sentinel of its code; an answer without a code
// and with a 5xx status matches ErrUnavailable.
func (e *Error) Is(target error) bool {
	return jsonclient.Matches(sentinels, e.Code, e.Status, target, ErrUnavailable)
}

// Doer sends one HTTP request; *http.Client implements it, and so does
// the Doer of lockserver/client, so one transport can serve both.
type Doer = jsonclient.Doer

// Client talks to one payment-resource. It is safe for concurrent use.
type Client struct {
	conn *jsonclient.Conn
}

// Option configures a Client (WithHTTPClient).
type Option = jsonclient.ConnOption

// WithHTTPClient sends requests through d instead of http.DefaultClient.
// Deadlines come from the ctx of each call; the client adds none. New
// fails for a nil d.
func WithHTTPClient(d Doer) Option { return jsonclient.WithDoer(d) }

// New returns a Client for the payment-resource at baseURL, an absolute
// http(s) URL with an optional path prefix and no query. It returns an
// error for a malformed URL or an invalid option.
func New(baseURL string, opts ...Option) (*Client, error) {
	conn, err := jsonclient.NewConn("paymentresource client", baseURL, ErrInvalidRequest, ErrUnavailable, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn}, nil
}

// CreateAccount creates an account (POST /v1/accounts), or returns it
// unchanged when it already exists with the same values. It returns
// ErrAccountConflict when it exists otherwise, ErrInvalidRequest,
// ErrUnavailable.
func (c *Client) CreateAccount(ctx context.Context, req api.AccountRequest) (api.Account, error) {
	var a api.Account
	if err := req.Validate(); err != nil {
		return a, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodPost, api.PathAccounts, nil, req, &a)
	return a, err
}

// Account reads one account (GET /v1/accounts/{id}). ErrAccountNotFound
// when it does not exist.
func (c *Client) Account(ctx context.Context, id string) (api.Account, error) {
	var a api.Account
	if err := api.ValidateAccountID(id); err != nil {
		return a, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodGet, api.AccountPath(id), nil, nil, &a)
	return a, err
}

// CreatePayout creates a payout (POST /v1/payouts) and so publishes its
// event, or returns it as it is now when it already exists with the same
// values. It returns ErrPayoutConflict, ErrInsufficientFunds,
// ErrAccountNotFound, ErrCurrencyMismatch, ErrInvalidRequest,
// ErrUnavailable.
func (c *Client) CreatePayout(ctx context.Context, req api.PayoutRequest) (api.Payout, error) {
	var p api.Payout
	if err := req.Validate(); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodPost, api.PathPayouts, nil, req, &p)
	return p, err
}

// Payout reads one payout, without its history (GET /v1/payouts/{id}).
// ErrPayoutNotFound when it does not exist.
func (c *Client) Payout(ctx context.Context, id string) (api.Payout, error) {
	return c.payout(ctx, api.PayoutPath(id), id)
}

// PayoutWithHistory is Payout with the payout's history
// (?include=history).
func (c *Client) PayoutWithHistory(ctx context.Context, id string) (api.Payout, error) {
	return c.payout(ctx, api.WithHistory(api.PayoutPath(id)), id)
}

func (c *Client) payout(ctx context.Context, path, id string) (api.Payout, error) {
	var p api.Payout
	if err := api.ValidatePayoutID(id); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodGet, path, nil, nil, &p)
	return p, err
}

// Claim claims payout id for the lock holder h (its fencing token, the
// token's proof and its owner id, sent as headers; POST
// /v1/payouts/{id}/claim) and returns the claimed payout. terms, unless
// it is the zero value, are the account, amount and currency h means to
// pay: payment-resource refuses the claim with ErrTermsMismatch, changing
// nothing, when they are not the payout's; a zero terms sends no body.
// It returns ErrFencedOut when a newer holder has written,
// ErrPayoutFinished, ErrPayoutInDoubt, ErrPayoutNotFound,
// ErrInvalidRequest (also for a token that is not positive or terms that
// fail api.ClaimRequest.Validate, without sending), ErrUnavailable.
func (c *Client) Claim(ctx context.Context, id string, h fencewire.Holder, terms api.ClaimRequest) (api.Payout, error) {
	var p api.Payout
	if err := errors.Join(api.ValidatePayoutID(id), api.ValidateToken(h.Token), terms.Validate()); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	var in any
	if terms != (api.ClaimRequest{}) {
		in = terms
	}
	err := c.call(ctx, http.MethodPost, api.ClaimPath(id), &h, in, &p)
	return p, err
}

// PostResult reports the rail's answer to a submission of payout id, as
// the lock holder h (POST /v1/payouts/{id}/result), and returns the payout. Posting the same
// result again changes nothing. It returns ErrFencedOut,
// ErrPayoutFinished, ErrPayoutInDoubt, ErrPayoutNotClaimed,
// ErrRailRefConflict, ErrPayoutNotFound, ErrInvalidRequest (also for a
// request that fails api.ResultRequest.Validate, without sending),
// ErrUnavailable.
func (c *Client) PostResult(ctx context.Context, id string, h fencewire.Holder, req api.ResultRequest) (api.Payout, error) {
	var p api.Payout
	if err := errors.Join(api.ValidatePayoutID(id), api.ValidateToken(h.Token)); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := req.Validate(h.Token); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodPost, api.ResultPath(id), &h, req, &p)
	return p, err
}

// MarkNeedsAttention marks payout id needs_attention with reason, as the
// lock holder h (POST /v1/payouts/{id}/attention), and returns the
// payout. A payout already in needs_attention is returned unchanged. It
// returns ErrFencedOut, ErrUnverifiedToken, ErrPayoutFinished,
// ErrPayoutNotFound, ErrInvalidRequest (also for a reason not in
// api.AttentionReasons, without sending), ErrUnavailable.
func (c *Client) MarkNeedsAttention(ctx context.Context, id string, h fencewire.Holder, reason api.AttentionReason) (api.Payout, error) {
	var p api.Payout
	req := api.AttentionRequest{Reason: reason}
	if err := errors.Join(api.ValidatePayoutID(id), api.ValidateToken(h.Token), req.Validate()); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodPost, api.AttentionPath(id), &h, req, &p)
	return p, err
}

// Resolve records the outcome rail-proxy's reconciliation established for
// payout id, as the holder h of the payout's lease (POST
// /v1/payouts/{id}/resolution), and returns the payout (posted, declined
// or failed). The same resolution again changes nothing. It returns
// ErrFencedOut, ErrUnverifiedToken, ErrInvalidReceipt, ErrPayoutFinished,
// ErrRailRefConflict, ErrPayoutNotClaimed, ErrPayoutNotFound,
// ErrInvalidRequest (also without sending, for a request that fails
// api.ResolutionRequest.Validate), ErrUnavailable.
func (c *Client) Resolve(ctx context.Context, id string, h fencewire.Holder, req api.ResolutionRequest) (api.Payout, error) {
	var p api.Payout
	if err := errors.Join(api.ValidatePayoutID(id), api.ValidateToken(h.Token)); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if err := req.Validate(h.Token); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	err := c.call(ctx, http.MethodPost, api.ResolutionPath(id), &h, req, &p)
	return p, err
}

// ListPayouts returns one page of the payouts in state (one of
// api.Listable), limit per page (0: api.DefaultListLimit), starting after
// the payout id after ("" for the first page) (GET /v1/payouts?state=S).
// It returns ErrInvalidRequest, ErrUnavailable.
func (c *Client) ListPayouts(ctx context.Context, state api.State, limit int, after string) (api.PayoutList, error) {
	var list api.PayoutList
	if limit < 0 || limit > api.MaxListLimit {
		return list, fmt.Errorf("%w: limit %d is outside 0..%d", ErrInvalidRequest, limit, api.MaxListLimit)
	}
	err := c.call(ctx, http.MethodGet, api.ListPath(state, limit, after), nil, nil, &list)
	return list, err
}

// Audit runs paydb's ledger audit (GET /v1/audit). Broken rules are in the
// report (Balanced false), not an error; the error is ErrUnavailable or
// another *Error.
func (c *Client) Audit(ctx context.Context) (api.AuditReport, error) {
	var rep api.AuditReport
	err := c.call(ctx, http.MethodGet, api.PathAudit, nil, nil, &rep)
	return rep, err
}

// call sends one request through jsonclient.Conn.Call, with the holder's
// headers when h is not nil, and decodes a 2xx body into out or a refusal
// into *Error.
func (c *Client) call(ctx context.Context, method, path string, h *fencewire.Holder, in, out any) error {
	var jh *jsonclient.Holder
	if h != nil {
		jh = &jsonclient.Holder{Token: h.Token, Owner: h.Owner, Proof: h.Proof, TokenHeader: api.HeaderToken, OwnerHeader: api.HeaderOwner, ProofHeader: api.HeaderProof}
	}
	r, err := c.conn.Call(ctx, method, path, jh, in, out)
	if r == nil {
		return err
	}
	return &Error{Status: r.Status, Code: api.Code(r.Code), Message: r.Message, Retryable: r.Retryable, RetryAfter: r.RetryAfter}
}
