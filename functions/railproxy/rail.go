package railproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// railRequest is the rail's POST /submit body: no token, no idempotency
// key. The reference is the payout id.
type railRequest struct {
	PayoutID    string `json:"payoutId"`
	AccountID   string `json:"accountId"`
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
}

// railAnswer is the rail's 200 body. Unknown fields are ignored: the rail
// is someone else's API and may grow.
type railAnswer struct {
	Status  api.RailStatus `json:"status"`
	RailRef string         `json:"railRef"`
}

// maxRailAnswerBytes bounds how much of the rail's answer is read.
const maxRailAnswerBytes = 64 << 10

// forward submits req to the rail once, within Config.RailTimeout. It
// returns the answer when the rail answered 200 with ACK or DECLINE and a
// reference, and otherwise an error: the outcome is then unknown and the
// caller must treat the submission as ambiguous.
//
// Deliberately conservative: every failure counts as ambiguous, including
// a refused connection or a 4xx, where the money most likely did not move.
// Telling "never sent" from "sent, answer lost" apart depends on transport
// details (a reused keep-alive connection can fail after the request went
// out), and one wrong guess is a second payment; reconciliation with the
// rail's records settles every ambiguous attempt instead.
func (p *Proxy) forward(ctx context.Context, req api.SubmitRequest) (railAnswer, error) {
	body, err := json.Marshal(railRequest{
		PayoutID: req.PayoutID, AccountID: req.AccountID, AmountMinor: req.AmountMinor,
		Currency: req.Currency, Reference: req.PayoutID,
	})
	if err != nil {
		return railAnswer{}, fmt.Errorf("encode rail request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.submitURL, bytes.NewReader(body))
	if err != nil {
		return railAnswer{}, fmt.Errorf("build rail request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := p.rail.Do(hreq)
	if err != nil {
		return railAnswer{}, fmt.Errorf("rail call: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxRailAnswerBytes))
	if err != nil {
		return railAnswer{}, fmt.Errorf("rail answered %d, reading its body: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return railAnswer{}, fmt.Errorf("rail answered %d: %.200s", resp.StatusCode, raw)
	}
	var ans railAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		return railAnswer{}, fmt.Errorf("rail answered 200 with an unreadable body: %w", err)
	}
	if ans.Status != api.RailAck && ans.Status != api.RailDecline {
		return railAnswer{}, fmt.Errorf("rail answered 200 with status %q", ans.Status)
	}
	if ans.RailRef == "" || len(ans.RailRef) > api.MaxRailRefLen {
		return railAnswer{}, errors.New("rail answered 200 without a usable railRef")
	}
	return ans, nil
}
