package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
)

// Internal outcomes of the calls.
var (
	// errAmbiguous: rail-proxy called the rail and got no answer: the money
	// may or may not have moved, and only a reconciliation with the rail
	// can tell.
	errAmbiguous = errors.New("executor: rail outcome unknown")
	// errStopped: the rail refused the submission because a
	// reconciliation stopped the payout's reference (PAYOUT_STOPPED): no
	// money moved, and none will. The payout is reported ambiguous, which
	// hands it to the reconciler; rail-proxy's record (not_at_rail) lets it
	// fail the payout at once.
	errStopped = errors.New("executor: payout stopped at the rail")
)

// railResult is what the rail said about the payout's one submission, and
// the fencing token that submission reached the rail with, in
// payment-resource's spelling of an outcome (what postResult reports).
type railResult struct {
	Status  api.Outcome
	RailRef string
	Token   int64
	// Receipt is rail-proxy's signature over the answer, passed on to
	// payment-resource unchanged ("" for an ambiguous outcome).
	Receipt string
}

// outcomeOf is payment-resource's outcome for the rail's answer.
func outcomeOf(s railapi.RailStatus) api.Outcome {
	switch s {
	case railapi.RailAck:
		return api.OutcomeAck
	case railapi.RailDecline:
		return api.OutcomeDecline
	}
	return api.OutcomeAmbiguous
}

// firstAttempt is rail-proxy's refusal of a second submission: the
// payout's attempt that went to the rail (railapi.AlreadySubmittedAnswer).
type firstAttempt struct {
	railapi.Attempt
}

func (a *firstAttempt) Error() string {
	return fmt.Sprintf("payout already submitted by attempt %d (token %d, %s)", a.AttemptID, a.Token, a.State)
}

// outcome is the rail outcome the attempt stands for.
func (a *firstAttempt) outcome() api.Outcome {
	switch a.State {
	case railapi.StateAcked:
		return api.OutcomeAck
	case railapi.StateDeclined:
		return api.OutcomeDecline
	}
	return api.OutcomeAmbiguous
}

// claim claims the payout with token, with the event's terms: the event
// is only a notification and the payout row is the truth, so
// payment-resource compares the terms with the row before anything else
// and refuses other ones (PAYOUT_TERMS_MISMATCH; the event is dropped,
// having chosen no account or amount for the rail). It returns
// payment-resource's signature over the payout's terms
// (api.Payout.TermsSignature, which rail-proxy requires with the
// submission), or the client's error (for Classify).
func (x *Executor) claim(ctx context.Context, e payoutevent.Event, h fencewire.Holder) (terms string, err error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RequestTimeout)
	defer cancel()
	p, err := x.pay.Claim(ctx, e.PayoutID, h, api.ClaimRequest{AccountID: e.AccountID, AmountMinor: e.AmountMinor, Currency: e.Currency})
	if err != nil {
		return "", err
	}
	return p.TermsSignature, nil
}

// submit sends the payout to the rail through rail-proxy with token and
// payment-resource's signature over its terms (from the claim). It
// returns a *firstAttempt when the payout already went to the rail,
// errAmbiguous when rail-proxy says the rail was called and did not answer
// (RAIL_AMBIGUOUS), errStopped when the rail refused it for a stop order
// (PAYOUT_STOPPED), or the client's error (for Classify; RAIL_NOT_REACHED,
// nothing reached the rail, is transient: the delivery is redelivered and
// submits again).
//
// An answer lost on the way back (a broken connection, a timeout, a 5xx
// other than RAIL_AMBIGUOUS, an unreadable 200) is transient, not
// ambiguous: the submission may have gone to the rail, but asking again is
// safe, because rail-proxy forwards a payout once and answers a later
// submission with the first one's attempt and outcome.
func (x *Executor) submit(ctx context.Context, e payoutevent.Event, h fencewire.Holder, terms string) (railResult, error) {
	ctx, cancel := context.WithTimeout(ctx, x.cfg.RailTimeout)
	defer cancel()
	req := railapi.SubmitRequest{PayoutID: e.PayoutID, AccountID: e.AccountID, AmountMinor: e.AmountMinor, Currency: e.Currency,
		TermsSignature: terms}
	ans, err := x.rail.Submit(ctx, h, req)
	var refusal *railclient.Error
	switch {
	case err == nil:
		return railResult{Status: outcomeOf(ans.Status), RailRef: ans.RailRef, Token: h.Token, Receipt: ans.Receipt}, nil
	case errors.Is(err, railclient.ErrAlreadySubmitted) && errors.As(err, &refusal) && refusal.Attempt != nil:
		return railResult{}, &firstAttempt{*refusal.Attempt}
	case errors.Is(err, railclient.ErrAlreadySubmitted):
		// A refusal without its first attempt cannot be reported: asking
		// again is safe (rail-proxy answers with the attempt next time).
		return railResult{}, fmt.Errorf("%w: %v", ErrDependency, err)
	case errors.Is(err, railclient.ErrRailAmbiguous):
		return railResult{}, fmt.Errorf("%w: %v", errAmbiguous, err)
	case errors.Is(err, railclient.ErrPayoutStopped):
		return railResult{}, fmt.Errorf("%w: %v", errStopped, err)
	}
	return railResult{}, err
}

// postResult reports res to payment-resource with token; ctx bounds it. It
// returns nil or the client's error (for Classify).
func (x *Executor) postResult(ctx context.Context, e payoutevent.Event, h fencewire.Holder, res railResult) error {
	req := api.ResultRequest{Outcome: res.Status, RailRef: res.RailRef, RailToken: res.Token, Receipt: res.Receipt}
	_, err := x.pay.PostResult(ctx, e.PayoutID, h, req)
	return err
}
