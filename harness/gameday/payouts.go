package gameday

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
)

// The executor-path faults' accounts and payouts (Fault.Executes).
const (
	// aheadAccount is fence-ahead's account, aheadPayout its payout.
	aheadAccount = "gd-acct-ahead"
	aheadPayout  = "gd-ahead-1"
	// payAheadAccount is payment-fence-ahead's account, payAheadPayout
	// its payout.
	payAheadAccount = "gd-acct-pay-ahead"
	payAheadPayout  = "gd-pay-ahead-1"
	// noDebitPayout is rail-paid-no-debit's payout, paid at the rail and
	// unknown to paydb; noDebitAccount the account the rail is told.
	noDebitPayout  = "gd-nodebit-1"
	noDebitAccount = "gd-acct-nodebit"
)

// railStubSubmit submits a payment of 100 EUR of payout id from account
// straight to rail-stub, past both fence points, and wants the rail's
// ACK: money moved.
func railStubSubmit(ctx context.Context, stubURL, id, account string) error {
	body, err := json.Marshal(rail.SubmitRequest{PayoutID: id, AccountID: account, AmountMinor: 100, Currency: "EUR", Reference: id})
	if err != nil {
		return err
	}
	resp, err := postJSON(ctx, stubURL+rail.PathSubmit, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var ans rail.SubmitAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != http.StatusOK || ans.Status != rail.StatusAck {
		return fmt.Errorf("rail-stub answered %d %q to a submission of %s (%v); want 200 %s", resp.StatusCode, ans.Status, id, err, rail.StatusAck)
	}
	return nil
}

// postJSON sends body to url as JSON (POST, 30 s timeout) and returns the
// answer, whose body the caller closes.
func postJSON(ctx context.Context, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return (&http.Client{Timeout: 30 * time.Second}).Do(req)
}

// setRailStubFaults replaces rail-stub's fault state with f (POST
// /admin/faults; the zero Faults heals).
func setRailStubFaults(ctx context.Context, stubURL string, f railstub.Faults) error {
	body, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return post(ctx, stubURL+railstub.PathFaults, body)
}

// post sends body as JSON and wants a 2xx answer.
func post(ctx context.Context, url string, body []byte) error {
	resp, err := postJSON(ctx, url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s answered %d", url, resp.StatusCode)
	}
	return nil
}

// awaitPayoutIn polls paydb until at least n payouts are in state, and
// returns the id of the one that entered it last.
func awaitPayoutIn(ctx context.Context, paydbURL string, state payapi.State, n int) (string, error) {
	conn, err := pgx.Connect(ctx, paydbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var (
			id    string
			count int
		)
		err := conn.QueryRow(ctx, `SELECT payout_id, count(*) OVER () FROM payout WHERE state = $1 ORDER BY updated_at DESC LIMIT 1`, string(state)).Scan(&id, &count)
		if err == nil && count >= n {
			return id, nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%d payouts in state %s: %w", n, state, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
