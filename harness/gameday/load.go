package gameday

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
)

// loadKey is the lock the steady acquire load asks for (load).
const loadKey = "gameday:load"

// The payout API load's account and its first payout (payoutLoad).
const (
	loadAccount = "gd-load"
	loadPayout  = "gd-load-0"
)

// payoutLoadSetup creates the account and the first payout the payout API
// load reads.
func payoutLoadSetup(ctx context.Context, d *drive.Driver) error {
	if err := d.CreateAccount(ctx, loadAccount, "EUR", 1_000_000_000_000); err != nil {
		return fmt.Errorf("payout load: %w", err)
	}
	if _, err := d.CreatePayout(ctx, payoutevent.Event{PayoutID: loadPayout, AccountID: loadAccount, AmountMinor: 1, Currency: "EUR"}); err != nil {
		return fmt.Errorf("payout load: %w", err)
	}
	return nil
}

// payoutLoad keeps payment-resource's payout API and rail-proxy busy until
// ctx ends, as callers would: a read of one payout every 200 ms (the
// payout-api-availability SLO needs a total to divide by, and a frozen
// paydb is noticed only by a request that waits for it), a new payout
// every second (its outbox row is what PayoutOutboxStuck watches when
// Pub/Sub stops), and a read of the account's high-water mark at
// rail-proxy every second (raildb's stall is noticed the same way). The
// payouts are published, and executed only in the executor-path phase,
// where the push bridge runs (Fault.Executes). Answers are not checked:
// during a fault they are the fault.
func payoutLoad(ctx context.Context, d *drive.Driver) {
	client := &http.Client{Timeout: 2 * time.Second}
	pay, payURL, proxyURL := d.Pay, d.Stack().PaymentResourceURL(), d.Stack().RailProxyURL()
	get := func(url string) {
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil); err == nil {
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Each call in a goroutine of its own: a frozen database must not
		// slow the load down (the callers of a real API do not wait for
		// each other). Each ends within the client's timeout.
		go get(payURL + payapi.PathPayouts + "/" + loadPayout)
		if n%5 == 0 {
			go get(proxyURL + railapi.HighWaterPath(loadAccount))
			go func() {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, _ = pay.CreatePayout(cctx, payapi.PayoutRequest{PayoutID: "gd-load-" + strconv.Itoa(n), AccountID: loadAccount, AmountMinor: 1, Currency: "EUR"})
			}()
		}
	}
}

// holdRowLocks slows lockdb down for one lock key without stopping it:
// until ctx ends, a session of its own takes the key's lease row FOR
// UPDATE and holds it for 300 ms, lets go for 20 ms, and again. An
// acquire of the key (an INSERT ... ON CONFLICT DO UPDATE, which locks the
// conflicting row) waits behind it. It returns nil when ctx ends.
func holdRowLocks(ctx context.Context, lockdbURL, key string) error {
	conn, err := pgx.Connect(ctx, lockdbURL)
	if err != nil {
		return fmt.Errorf("lockdb-slow: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return ignoreCanceled(ctx, err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM lock_lease WHERE lock_key = $1 FOR UPDATE`, key); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return ignoreCanceled(ctx, err)
		}
		hold := time.NewTimer(300 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-hold.C:
		}
		hold.Stop()
		_ = tx.Rollback(context.WithoutCancel(ctx))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func ignoreCanceled(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
