package railproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// maxRailAnswerBytes bounds how much of the rail's answer is read.
const maxRailAnswerBytes = 64 << 10

// Failures of forward that are not "outcome unknown".
var (
	// errNotSent: the rail certainly did not take the submission (see
	// forward); answered api.CodeRailNotReached.
	errNotSent = errors.New("railproxy: the rail did not take the submission")
	// errRefStopped: the rail refused the submission because its
	// reference has a stop order; answered api.CodePayoutStopped.
	errRefStopped = errors.New("railproxy: the rail refused the submission: its reference is stopped")
)

// forward submits req to the rail once, within Config.RailTimeout, and
// returns the answer when the rail answered 200 with ACK or DECLINE and a
// reference. Every other outcome is ambiguous (the money may have moved)
// except two certain ones: errNotSent (the connection was never
// established, or the rail answered its own 503 RAIL_UNAVAILABLE, which
// records nothing) and errRefStopped (409 REFERENCE_STOPPED: a
// reconciliation stopped the payout's reference). A wrong "not sent" would
// be a second payment, so nothing else qualifies. The submission carries
// no token and no idempotency key; its reference is the payout id. The
// answer is decoded loosely (unknown fields ignored): the rail is someone
// else's API and may grow.
func (p *Proxy) forward(ctx context.Context, req api.SubmitRequest) (rail.SubmitAnswer, error) {
	body, err := json.Marshal(rail.SubmitRequest{
		PayoutID: req.PayoutID, AccountID: req.AccountID, AmountMinor: req.AmountMinor,
		Currency: req.Currency, Reference: req.PayoutID,
	})
	if err != nil {
		return rail.SubmitAnswer{}, fmt.Errorf("encode rail request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.submitURL, bytes.NewReader(body))
	if err != nil {
		return rail.SubmitAnswer{}, fmt.Errorf("build rail request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := p.rail.Do(hreq)
	if err != nil {
		if dialFailed(err) {
			return rail.SubmitAnswer{}, fmt.Errorf("%w: connection never established: %w", errNotSent, err)
		}
		return rail.SubmitAnswer{}, fmt.Errorf("rail call: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxRailAnswerBytes))
	if err != nil {
		return rail.SubmitAnswer{}, fmt.Errorf("rail answered %d, reading its body: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		switch code := railCode(raw); {
		case resp.StatusCode == http.StatusServiceUnavailable && code == rail.CodeUnavailable:
			return rail.SubmitAnswer{}, fmt.Errorf("%w: rail answered %d %s (nothing recorded)", errNotSent, resp.StatusCode, code)
		case resp.StatusCode == http.StatusConflict && code == rail.CodeReferenceStopped:
			return rail.SubmitAnswer{}, fmt.Errorf("%w: rail answered %d %s", errRefStopped, resp.StatusCode, code)
		}
		return rail.SubmitAnswer{}, fmt.Errorf("rail answered %d: %.200s", resp.StatusCode, raw)
	}
	var ans rail.SubmitAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		return rail.SubmitAnswer{}, fmt.Errorf("rail answered 200 with an unreadable body: %w", err)
	}
	if ans.Status != rail.StatusAck && ans.Status != rail.StatusDecline {
		return rail.SubmitAnswer{}, fmt.Errorf("rail answered 200 with status %q", ans.Status)
	}
	if ans.RailRef == "" || len(ans.RailRef) > api.MaxRailRefLen {
		return rail.SubmitAnswer{}, errors.New("rail answered 200 without a usable railRef")
	}
	return ans, nil
}

// dialFailed reports whether err is a failure to establish the connection
// to the rail (a *net.OpError of operation "dial": refused, unreachable,
// no route, a dial timeout), before any byte of the request was written.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// railCode is the code of the rail's error envelope ({"error":{"code"}},
// rail-stub's), "" when raw is not one.
func railCode(raw []byte) string {
	var env struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &env) != nil {
		return ""
	}
	return env.Error.Code
}
