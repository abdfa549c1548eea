package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
)

// Codes of payment-resource that the executor acts on.
const (
	codePayoutFinished = "PAYOUT_FINISHED"
	codePayoutInDoubt  = "PAYOUT_IN_DOUBT"
	codePayoutNotFound = "PAYOUT_NOT_FOUND"
	codeRailAmbiguous  = "RAIL_AMBIGUOUS"
	// codeAlreadySubmitted is rail-proxy's refusal of a second submission
	// of a payout (railproxy.CodeAlreadySubmitted).
	codeAlreadySubmitted = "PAYOUT_ALREADY_SUBMITTED"
)

// Rail outcomes, as rail-proxy reports them and payment-resource records them.
const (
	outcomeAck       = "ACK"
	outcomeDecline   = "DECLINE"
	outcomeAmbiguous = "AMBIGUOUS"
)

// Internal outcomes of the calls.
var (
	// errAmbiguous: rail-proxy called the rail and got no answer: the money
	// may or may not have moved, and only a reconciliation with the rail
	// can tell.
	errAmbiguous = errors.New("executor: rail outcome unknown")
	// errMismatch: the event does not describe the payout it names.
	errMismatch = errors.New("executor: event does not match its payout")
)

// railResult is what the rail said about the payout's one submission, and
// the fencing token that submission reached the rail with.
type railResult struct {
	Status  string `json:"status"`
	RailRef string `json:"railRef"`
	Token   int64  `json:"token"`
}

// Attempt states of rail-proxy (railproxy.State*) the executor acts on.
const (
	stateForwarding = "forwarding"
	stateAcked      = "acked"
	stateDeclined   = "declined"
)

// firstAttempt is rail-proxy's refusal of a second submission: the
// payout's attempt that went to the rail (railproxy.AlreadySubmittedAnswer).
type firstAttempt struct {
	AttemptID   int64  `json:"attemptId"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Token       int64  `json:"token"`
	State       string `json:"state"`
	RailRef     string `json:"railRef"`
}

func (a *firstAttempt) Error() string {
	return fmt.Sprintf("payout already submitted by attempt %d (token %d, %s)", a.AttemptID, a.Token, a.State)
}

// outcome is the rail outcome the attempt stands for.
func (a *firstAttempt) outcome() string {
	switch a.State {
	case stateAcked:
		return outcomeAck
	case stateDeclined:
		return outcomeDecline
	}
	return outcomeAmbiguous
}

// answer is one HTTP exchange: status, the decoded envelope code when the
// status is not 2xx, and the raw body.
type answer struct {
	status int
	code   string
	body   []byte
}

func (x *Executor) call(ctx context.Context, method, u string, token int64, in any) (answer, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return answer{}, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return answer{}, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token > 0 {
		req.Header.Set(fencing.HeaderToken, strconv.FormatInt(token, 10))
		req.Header.Set(fencing.HeaderOwner, x.Owner())
	}
	resp, err := x.doer.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, body: raw}
	if resp.StatusCode/100 != 2 {
		var env httpjson.Envelope
		if json.Unmarshal(raw, &env) == nil {
			a.code = env.Error.Code
		}
	}
	return a, nil
}

// payoutFacts are the fields of a payout that the event repeats.
type payoutFacts struct {
	PayoutID    string `json:"payoutId"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
}

// verify reads the payout from payment-resource and checks that the event
// says the same: the event is only a notification, the payout row is the
// truth, and the event's account decides which lock is taken and which
// account the rail debits. It returns codePayoutNotFound, errMismatch, or
// ErrDependency.
func (x *Executor) verify(ctx context.Context, e payoutevent.Event) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	a, err := x.call(ctx, http.MethodGet, x.cfg.PaymentResourceURL+"/v1/payouts/"+url.PathEscape(e.PayoutID), 0, nil)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: read payout: %v", ErrDependency, err)
	case a.status == http.StatusNotFound && a.code == codePayoutNotFound:
		return codePayoutNotFound, nil
	case a.status != http.StatusOK:
		return "", fmt.Errorf("%w: read payout answered %d: %s", ErrDependency, a.status, a.body)
	}
	var p payoutFacts
	if err := json.Unmarshal(a.body, &p); err != nil {
		return "", fmt.Errorf("%w: read payout: %v", ErrDependency, err)
	}
	if p != (payoutFacts{e.PayoutID, e.AccountID, e.AmountMinor, e.Currency}) {
		return "", fmt.Errorf("%w: event says %s %s %d %s, payment-resource says %s %s %d %s", errMismatch,
			e.PayoutID, e.AccountID, e.AmountMinor, e.Currency, p.PayoutID, p.AccountID, p.AmountMinor, p.Currency)
	}
	return "", nil
}

// claim claims the payout with token. It returns the payment-resource code
// for the final refusals (finished, in doubt, not found), ErrFencedOut, or
// ErrDependency.
func (x *Executor) claim(ctx context.Context, e payoutevent.Event, token int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	a, err := x.call(ctx, http.MethodPost, x.cfg.PaymentResourceURL+"/v1/payouts/"+url.PathEscape(e.PayoutID)+"/claim", token, nil)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: claim: %v", ErrDependency, err)
	case a.status == http.StatusOK:
		return "", nil
	case a.code == fencing.CodeFencedOut:
		return "", fmt.Errorf("%w: claim: %s", ErrFencedOut, a.body)
	case a.code == codePayoutFinished, a.code == codePayoutInDoubt, a.code == codePayoutNotFound:
		return a.code, nil
	}
	return "", fmt.Errorf("%w: claim answered %d: %s", ErrDependency, a.status, a.body)
}

// submit sends the payout to the rail through rail-proxy with token. It
// returns ErrFencedOut, a *firstAttempt when the payout already went to the
// rail, errAmbiguous when rail-proxy says the rail was called and did not
// answer (RAIL_AMBIGUOUS), or ErrDependency otherwise.
//
// An answer lost on the way back (a broken connection, a timeout, a 5xx
// other than RAIL_AMBIGUOUS, an unreadable 200) is ErrDependency, not
// ambiguous: the submission may have gone to the rail, but asking again is
// safe, because rail-proxy forwards a payout once and answers a later
// submission with the first one's attempt and outcome.
func (x *Executor) submit(ctx context.Context, e payoutevent.Event, token int64) (railResult, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RailTimeout)
	defer cancel()
	body := map[string]any{"payoutId": e.PayoutID, "accountId": e.AccountID, "amountMinor": e.AmountMinor, "currency": e.Currency}
	a, err := x.call(ctx, http.MethodPost, x.cfg.RailProxyURL+"/v1/rail/submissions", token, body)
	switch {
	case err != nil:
		return railResult{}, fmt.Errorf("%w: rail-proxy's answer was lost (%v); a later delivery asks again", ErrDependency, err)
	case a.status == http.StatusOK:
		var r railResult
		if err := json.Unmarshal(a.body, &r); err != nil || (r.Status != outcomeAck && r.Status != outcomeDecline) {
			return railResult{}, fmt.Errorf("%w: unreadable rail-proxy answer %s; a later delivery asks again", ErrDependency, a.body)
		}
		r.Token = token
		return r, nil
	case a.code == codeAlreadySubmitted:
		var ans struct {
			Attempt firstAttempt `json:"attempt"`
		}
		if err := json.Unmarshal(a.body, &ans); err != nil || ans.Attempt.AttemptID <= 0 || ans.Attempt.Token <= 0 {
			// Not forwarded, but what went before is unknown: try later.
			return railResult{}, fmt.Errorf("%w: unreadable rail-proxy refusal %s", ErrDependency, a.body)
		}
		return railResult{}, &ans.Attempt
	case a.code == fencing.CodeFencedOut:
		return railResult{}, fmt.Errorf("%w: rail-proxy: %s", ErrFencedOut, a.body)
	case a.code == codeRailAmbiguous:
		return railResult{}, fmt.Errorf("%w: rail-proxy answered %d: %s", errAmbiguous, a.status, a.body)
	}
	return railResult{}, fmt.Errorf("%w: rail-proxy refused the submission with %d: %s", ErrDependency, a.status, a.body)
}

// postResult reports res to payment-resource with token. It returns the
// PAYOUT_FINISHED code, ErrFencedOut, or ErrDependency.
func (x *Executor) postResult(ctx context.Context, e payoutevent.Event, token int64, res railResult) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	body := map[string]any{"outcome": res.Status}
	if res.RailRef != "" {
		body["railRef"] = res.RailRef
	}
	if res.Token > 0 {
		body["railToken"] = res.Token
	}
	a, err := x.call(ctx, http.MethodPost, x.cfg.PaymentResourceURL+"/v1/payouts/"+url.PathEscape(e.PayoutID)+"/result", token, body)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: post result: %v", ErrDependency, err)
	case a.status == http.StatusOK:
		return "", nil
	case a.code == fencing.CodeFencedOut:
		return "", fmt.Errorf("%w: post result: %s", ErrFencedOut, a.body)
	case a.code == codePayoutFinished:
		return a.code, nil
	case a.status >= 500:
		return "", fmt.Errorf("%w: post result answered %d: %s", ErrDependency, a.status, a.body)
	}
	return "", fmt.Errorf("executor: payment-resource refused the result with %d: %s", a.status, a.body)
}
