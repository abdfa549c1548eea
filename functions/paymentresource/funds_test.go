package paymentresource_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// A payout larger than its account's available balance is refused at
// creation (409 INSUFFICIENT_FUNDS) and changes nothing: the newcomer's
// probe 16 overdrew an account of balance 1 by a payout of 500000, and the
// audit still said balanced.
func TestPayoutBeyondTheBalanceIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1)
	before := f.snapshot()
	st, body := f.do("POST", "/v1/payouts", `{"payoutId":"p-1","accountId":"acct-1","amountMinor":500000,"currency":"EUR"}`)
	want(t, "payout of 500000 from a balance of 1", st, body, http.StatusConflict, api.CodeInsufficientFunds)
	if after := f.snapshot(); after != before {
		t.Errorf("a refused payout changed paydb:\nbefore %s\nafter  %s", before, after)
	}
	if a := f.account("acct-1"); a.BalanceMinor != 1 {
		t.Errorf("balance %d, want 1", a.BalanceMinor)
	}
}

// The available balance is the balance minus every payout not yet final:
// a pending payout holds its amount until it is posted (then the balance
// carries it), declined or failed (then it is free again). A replay of an
// existing payout is answered from that payout whatever the balance.
func TestAvailableBalanceCountsPayoutsNotYetFinal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	payout := func(id string, amount int64) (int, []byte) {
		return f.do("POST", "/v1/payouts", fmt.Sprintf(`{"payoutId":%q,"accountId":"acct-1","amountMinor":%d,"currency":"EUR"}`, id, amount))
	}

	f.createPayout("p-1", "acct-1", 600, "EUR")
	st, body := payout("p-2", 401)
	want(t, "401 with 600 of 1000 pending", st, body, http.StatusConflict, api.CodeInsufficientFunds)
	f.createPayout("p-2", "acct-1", 400, "EUR") // exactly what is left
	st, body = payout("p-1", 600)
	want(t, "replay of p-1 with nothing available", st, body, http.StatusOK, "")
	st, body = payout("p-1", 700)
	want(t, "p-1 again with another amount", st, body, http.StatusConflict, api.CodePayoutConflict)
	st, body = payout("p-3", 1)
	want(t, "1 with nothing available", st, body, http.StatusConflict, api.CodeInsufficientFunds)

	// p-1 declined: its 600 are available again.
	st, body = f.claim("p-1", 5, "w")
	want(t, "claim p-1", st, body, http.StatusOK, "")
	st, body = f.result("p-1", 5, "w", "DECLINE", "rail-1")
	want(t, "decline p-1", st, body, http.StatusOK, "")
	f.createPayout("p-3", "acct-1", 600, "EUR")

	// p-2 posted: the balance is 600, p-3 holds all of it.
	st, body = f.claim("p-2", 6, "w")
	want(t, "claim p-2", st, body, http.StatusOK, "")
	st, body = f.result("p-2", 6, "w", "ACK", "rail-2")
	want(t, "ACK p-2", st, body, http.StatusOK, "")
	if a := f.account("acct-1"); a.BalanceMinor != 600 {
		t.Fatalf("balance after p-2 posted = %d, want 600", a.BalanceMinor)
	}
	st, body = payout("p-4", 1)
	want(t, "1 with p-3 holding the whole balance", st, body, http.StatusConflict, api.CodeInsufficientFunds)
	if rep := f.audit(); !rep.Balanced {
		t.Errorf("audit = %+v; want balanced", rep)
	}
}

// Concurrent creations on one account cannot both count the same money:
// the account row is locked in the creating transaction. Each round sends
// eight payouts of 600 at once against a balance of 1000: exactly one may
// pass. Without the row lock several pass (shown by removing FOR UPDATE).
func TestConcurrentPayoutsCannotShareTheBalance(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	const rounds, racers = 6, 8
	for r := range rounds {
		acct := fmt.Sprintf("acct-%d", r)
		f.createAccount(acct, "EUR", 1_000)
		start := make(chan struct{})
		statuses := make([]int, racers)
		codes := make([]api.Code, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start
				st, body := f.do("POST", "/v1/payouts",
					fmt.Sprintf(`{"payoutId":"p-%d-%d","accountId":%q,"amountMinor":600,"currency":"EUR"}`, r, i, acct))
				statuses[i] = st
				var env api.ErrorEnvelope
				if st != http.StatusCreated && json.Unmarshal(body, &env) == nil {
					codes[i] = env.Error.Code
				}
			})
		}
		close(start)
		wg.Wait()
		created := 0
		for i, st := range statuses {
			switch {
			case st == http.StatusCreated:
				created++
			case st != http.StatusConflict || codes[i] != api.CodeInsufficientFunds:
				t.Errorf("round %d racer %d: %d %s, want 201 or 409 %s", r, i, st, codes[i], api.CodeInsufficientFunds)
			}
		}
		if created != 1 {
			t.Errorf("round %d: %d payouts of 600 created against a balance of 1000, want exactly 1", r, created)
		}
	}
}
