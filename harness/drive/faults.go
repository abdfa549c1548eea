package drive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
)

// AheadToken is the fence FenceAhead and PaymentFenceAhead write: above
// any token lock-server grants (lockdb keeps its tokens near its clock in
// microseconds since 1970, about 2^50.7 in 2026; 2^52 is reached in 2112)
// and below the largest token, 2^53 - 1.
const AheadToken = int64(1) << 52

// FenceAhead creates account (1,000,000 EUR minor units) at
// payment-resource (payURL), puts rail-proxy's high-water mark of it at
// AheadToken in raildb (raildbURL), then creates payout (100 of the
// account) for the executor. A fence ahead of lock-server is what a
// lock-server moved to a backend whose tokens start lower, or a raildb
// copied from another environment, leaves behind: every holder of the
// account's lease is refused FENCED_OUT at the rail, and the executor,
// having confirmed its lease, marks the payout needs_attention
// (rail_fence_ahead).
func FenceAhead(ctx context.Context, payURL, raildbURL, account, payout string) error {
	pay, err := payclient.New(payURL)
	if err != nil {
		return err
	}
	balance := int64(1_000_000)
	if _, err := pay.CreateAccount(ctx, api.AccountRequest{AccountID: account, Currency: "EUR", OpeningBalanceMinor: &balance}); err != nil {
		return fmt.Errorf("fence-ahead: create account: %w", err)
	}
	conn, err := pgx.Connect(ctx, raildbURL)
	if err != nil {
		return fmt.Errorf("fence-ahead: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `INSERT INTO rail_high_water (account_id, high_water, updated_at) VALUES ($1, $2, now())
ON CONFLICT (account_id) DO UPDATE SET high_water = excluded.high_water, updated_at = now()`, account, AheadToken); err != nil {
		return fmt.Errorf("fence-ahead: %w", err)
	}
	if _, err := pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: payout, AccountID: account, AmountMinor: 100, Currency: "EUR"}); err != nil {
		return fmt.Errorf("fence-ahead: create payout: %w", err)
	}
	return nil
}

// PaymentFenceAhead creates account at payment-resource (payURL), puts its
// account fence at AheadToken in paydb (paydbURL: a paydb written by hand
// or restored from another environment), then creates payout for the
// executor. The holder of the account's lease is refused FENCED_OUT at
// the claim, confirms its lease, and its needs_attention mark is refused
// by the same fence: the executor acknowledges the delivery and counts it
// in executor_attention_unrecorded_total (payout_attention_unrecorded in
// its log); the payout stays pending.
func PaymentFenceAhead(ctx context.Context, payURL, paydbURL, account, payout string) error {
	pay, err := payclient.New(payURL)
	if err != nil {
		return err
	}
	balance := int64(1_000_000)
	if _, err := pay.CreateAccount(ctx, api.AccountRequest{AccountID: account, Currency: "EUR", OpeningBalanceMinor: &balance}); err != nil {
		return fmt.Errorf("payment-fence-ahead: create account: %w", err)
	}
	conn, err := pgx.Connect(ctx, paydbURL)
	if err != nil {
		return fmt.Errorf("payment-fence-ahead: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `UPDATE account SET fence = $2 WHERE account_id = $1`, account, AheadToken); err != nil {
		return fmt.Errorf("payment-fence-ahead: %w", err)
	}
	if _, err := pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: payout, AccountID: account, AmountMinor: 100, Currency: "EUR"}); err != nil {
		return fmt.Errorf("payment-fence-ahead: create payout: %w", err)
	}
	return nil
}

// SubmitForged creates account (1,000 EUR minor units) and payout (100 of
// it) at payment-resource (payURL), so that the payout's terms carry
// payment-resource's signature, then submits the payout to rail-proxy
// (proxyURL) under a token lock-server never granted, with no proof. It
// returns an error when rail-proxy accepts the submission. The terms are
// signed because rail-proxy checks them before the token's proof: an
// unsigned submission would be refused INVALID_TERMS without reaching the
// fence.
func SubmitForged(ctx context.Context, payURL, proxyURL, account, payout string) error {
	c, err := railclient.New(proxyURL)
	if err != nil {
		return err
	}
	pay, err := payclient.New(payURL)
	if err != nil {
		return err
	}
	balance := int64(1000)
	if _, err := pay.CreateAccount(ctx, api.AccountRequest{AccountID: account, Currency: "EUR", OpeningBalanceMinor: &balance}); err != nil {
		return err
	}
	p, err := pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: payout, AccountID: account, AmountMinor: 100, Currency: "EUR"})
	if err != nil {
		return err
	}
	h := fencewire.Holder{Token: 1 << 40, Owner: "gameday-forger"}
	_, err = c.Submit(ctx, h, railapi.SubmitRequest{PayoutID: p.PayoutID, AccountID: p.AccountID, AmountMinor: p.AmountMinor, Currency: p.Currency,
		TermsSignature: p.TermsSignature})
	if err == nil {
		return errors.New("rail-proxy accepted a forged token")
	}
	return nil
}

// Reconcile runs one reconciler pass (POST reconciler.PathRuns at
// reconcilerURL), within 2 minutes: it settles ambiguous payouts with the
// rail's record and audits the books.
func Reconcile(ctx context.Context, reconcilerURL string) (reconciler.PassReport, error) {
	var pr reconciler.PassReport
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, reconcilerURL+reconciler.PathRuns, bytes.NewReader(nil))
	if err != nil {
		return pr, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return pr, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return pr, fmt.Errorf("reconciler pass: %s", resp.Status)
	}
	return pr, json.NewDecoder(resp.Body).Decode(&pr)
}
