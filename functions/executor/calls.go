package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
)

// Codes of rail-proxy that the executor acts on. (payment-resource's
// answers are classified by their api codes, through its typed client.)
const (
	codeRailAmbiguous = "RAIL_AMBIGUOUS"
	// codeAlreadySubmitted is rail-proxy's refusal of a second submission
	// of a payout (railproxy.CodeAlreadySubmitted).
	codeAlreadySubmitted = "PAYOUT_ALREADY_SUBMITTED"
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
// the fencing token that submission reached the rail with. rail-proxy
// reports the rail's answer in payment-resource's spelling of an outcome
// (ACK or DECLINE).
type railResult struct {
	Status  api.Outcome `json:"status"`
	RailRef string      `json:"railRef"`
	Token   int64       `json:"token"`
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
func (a *firstAttempt) outcome() api.Outcome {
	switch a.State {
	case stateAcked:
		return api.OutcomeAck
	case stateDeclined:
		return api.OutcomeDecline
	}
	return api.OutcomeAmbiguous
}

// answer is one HTTP exchange with rail-proxy: status, the decoded
// envelope code when the status is not 2xx, and the raw body.
type answer struct {
	status int
	code   string
	body   []byte
}

// call sends one request to rail-proxy, with the lease's headers when
// token > 0.
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

// verify reads the payout from payment-resource and checks that the event
// says the same: the event is only a notification, the payout row is the
// truth, and the event's account decides which lock is taken and which
// account the rail debits. It returns api.CodePayoutNotFound, errMismatch,
// or ErrDependency.
func (x *Executor) verify(ctx context.Context, e payoutevent.Event) (api.Code, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	p, err := x.pay.Payout(ctx, e.PayoutID)
	switch {
	case errors.Is(err, payclient.ErrPayoutNotFound):
		return api.CodePayoutNotFound, nil
	case err != nil:
		return "", fmt.Errorf("%w: read payout: %v", ErrDependency, err)
	}
	got := payoutevent.Event{PayoutID: p.PayoutID, AccountID: p.AccountID, AmountMinor: p.AmountMinor, Currency: p.Currency}
	if got != e {
		return "", fmt.Errorf("%w: event says %s %s %d %s, payment-resource says %s %s %d %s", errMismatch,
			e.PayoutID, e.AccountID, e.AmountMinor, e.Currency, p.PayoutID, p.AccountID, p.AmountMinor, p.Currency)
	}
	return "", nil
}

// claim claims the payout with token. It returns the payment-resource code
// for the final refusals (api.CodePayoutFinished, CodePayoutInDoubt,
// CodePayoutNotFound), ErrFencedOut, or ErrDependency.
func (x *Executor) claim(ctx context.Context, e payoutevent.Event, token int64) (api.Code, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	_, err := x.pay.Claim(ctx, e.PayoutID, token, x.Owner())
	var refusal *payclient.Error
	switch {
	case err == nil:
		return "", nil
	case errors.Is(err, payclient.ErrFencedOut):
		return "", fmt.Errorf("%w: claim: %v", ErrFencedOut, err)
	case errors.Is(err, payclient.ErrPayoutFinished), errors.Is(err, payclient.ErrPayoutInDoubt), errors.Is(err, payclient.ErrPayoutNotFound):
		errors.As(err, &refusal)
		return refusal.Code, nil
	}
	return "", fmt.Errorf("%w: claim: %v", ErrDependency, err)
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
		if err := json.Unmarshal(a.body, &r); err != nil || (r.Status != api.OutcomeAck && r.Status != api.OutcomeDecline) {
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

// postResult reports res to payment-resource with token. It returns
// api.CodePayoutFinished, ErrFencedOut, ErrDependency (no answer, or a
// 5xx), or another error for a refusal a retry cannot change (a 4xx, or a
// result the client refuses to send).
func (x *Executor) postResult(ctx context.Context, e payoutevent.Event, token int64, res railResult) (api.Code, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	req := api.ResultRequest{Outcome: res.Status, RailRef: res.RailRef, RailToken: res.Token}
	_, err := x.pay.PostResult(ctx, e.PayoutID, token, x.Owner(), req)
	var refusal *payclient.Error
	switch {
	case err == nil:
		return "", nil
	case errors.Is(err, payclient.ErrFencedOut):
		return "", fmt.Errorf("%w: post result: %v", ErrFencedOut, err)
	case errors.Is(err, payclient.ErrPayoutFinished):
		return api.CodePayoutFinished, nil
	case errors.As(err, &refusal) && refusal.Status < 500, errors.Is(err, payclient.ErrInvalidRequest):
		return "", fmt.Errorf("executor: payment-resource refused the result: %w", err)
	}
	return "", fmt.Errorf("%w: post result: %v", ErrDependency, err)
}
