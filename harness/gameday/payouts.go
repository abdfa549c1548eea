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
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
)

// The executor-path faults' accounts and payouts (Fault.Executes).
const (
	// aheadAccount is fence-ahead's account, aheadPayout its payout.
	aheadAccount = "gd-acct-ahead"
	aheadPayout  = "gd-ahead-1"
	// aheadToken is the fence fence-ahead writes: above any token
	// lock-server grants (lockdb keeps its tokens near its clock in
	// microseconds since 1970, about 2^50.7 in 2026; 2^52 is reached in
	// 2112) and below the largest token, 2^53 - 1.
	aheadToken = int64(1) << 52
	// payAheadAccount is payment-fence-ahead's account, payAheadPayout
	// its payout (the fence is aheadToken too).
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

// fenceAhead puts rail-proxy's high-water mark of a new account above
// every token lock-server has granted, in raildb, then creates a payout of
// the account for the executor. A fence ahead of lock-server is what a
// lock-server moved to a backend whose tokens start lower (lockdb's
// sequence to etcd's revisions), or a raildb copied from another
// environment, leaves behind: every holder of the account's current lease
// is then refused FENCED_OUT at the rail, and the executor, having
// confirmed its lease with lock-server, marks the payout needs_attention
// (rail_fence_ahead) instead of redelivering it forever.
//
// The fence is rail-proxy's, not payment-resource's: with
// payment-resource's account fence ahead, the executor's mark of the
// payout is refused by that same fence (payout_attention_unrecorded in
// its log), the payout is never counted in payouts_needing_attention_total,
// and only PayoutAttentionUnrecorded sees it (paymentFenceAhead; found by
// this game day).
func fenceAhead(ctx context.Context, payURL, raildbURL string) error {
	pay, err := payclient.New(payURL)
	if err != nil {
		return err
	}
	balance := int64(1_000_000)
	if _, err := pay.CreateAccount(ctx, payapi.AccountRequest{AccountID: aheadAccount, Currency: "EUR", OpeningBalanceMinor: &balance}); err != nil {
		return fmt.Errorf("fence-ahead: create account: %w", err)
	}
	conn, err := pgx.Connect(ctx, raildbURL)
	if err != nil {
		return fmt.Errorf("fence-ahead: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `INSERT INTO rail_high_water (account_id, high_water, updated_at) VALUES ($1, $2, now())
ON CONFLICT (account_id) DO UPDATE SET high_water = excluded.high_water, updated_at = now()`, aheadAccount, aheadToken); err != nil {
		return fmt.Errorf("fence-ahead: %w", err)
	}
	if _, err := pay.CreatePayout(ctx, payapi.PayoutRequest{PayoutID: aheadPayout, AccountID: aheadAccount, AmountMinor: 100, Currency: "EUR"}); err != nil {
		return fmt.Errorf("fence-ahead: create payout: %w", err)
	}
	return nil
}

// paymentFenceAhead puts payment-resource's account fence of a new
// account above every token lock-server has granted, in paydb (a paydb
// written by hand or restored from another environment), then creates a
// payout of the account for the executor. The holder of the account's
// current lease is refused FENCED_OUT at the claim, confirms its lease,
// and its needs_attention mark is refused by the same fence: the executor
// acknowledges the delivery and counts it in
// executor_attention_unrecorded_total (payout_attention_unrecorded in its
// log). The payout stays pending; before that alert nothing paged.
func paymentFenceAhead(ctx context.Context, payURL, paydbURL string) error {
	pay, err := payclient.New(payURL)
	if err != nil {
		return err
	}
	balance := int64(1_000_000)
	if _, err := pay.CreateAccount(ctx, payapi.AccountRequest{AccountID: payAheadAccount, Currency: "EUR", OpeningBalanceMinor: &balance}); err != nil {
		return fmt.Errorf("payment-fence-ahead: create account: %w", err)
	}
	conn, err := pgx.Connect(ctx, paydbURL)
	if err != nil {
		return fmt.Errorf("payment-fence-ahead: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `UPDATE account SET fence = $2 WHERE account_id = $1`, payAheadAccount, aheadToken); err != nil {
		return fmt.Errorf("payment-fence-ahead: %w", err)
	}
	if _, err := pay.CreatePayout(ctx, payapi.PayoutRequest{PayoutID: payAheadPayout, AccountID: payAheadAccount, AmountMinor: 100, Currency: "EUR"}); err != nil {
		return fmt.Errorf("payment-fence-ahead: create payout: %w", err)
	}
	return nil
}

// awaitPayoutIn polls paydb until some payout is in state, and returns
// the id of the one that entered it last.
func awaitPayoutIn(ctx context.Context, paydbURL string, state payapi.State) (string, error) {
	conn, err := pgx.Connect(ctx, paydbURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var id string
		err := conn.QueryRow(ctx, `SELECT payout_id FROM payout WHERE state = $1 ORDER BY updated_at DESC LIMIT 1`, string(state)).Scan(&id)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no payout in state %s: %w", state, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// reconcileOnce asks the stack's reconciler for one pass (POST
// reconciler.PathRuns): it settles ambiguous payouts with the rail's
// record.
func reconcileOnce(ctx context.Context, reconcilerURL string) error {
	return post(ctx, reconcilerURL+reconciler.PathRuns, []byte("{}"))
}
