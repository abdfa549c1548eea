package paymentresource_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// TestConcurrentAcksOfOneAccountDebitOnlyWhatTheyPost: twelve payouts of
// one account, each claimed under its own token, have their ACKs posted
// at once, in a seeded shuffled order. The account fence is strict, so an
// ACK whose token is below one that already debited the account is
// refused FENCED_OUT, and its transaction, whose post, debit and ledger
// rows travel as one CTE and one batch, leaves nothing behind: the payout
// is still claimed with no debit, and the ledger holds exactly one
// transaction (two entries) per posted payout. The highest token is never
// refused, the account's fence is the highest token posted, and the books
// balance.
func TestConcurrentAcksOfOneAccountDebitOnlyWhatTheyPost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	const n, amount, opening = 12, 100, 100_000
	f.createAccount("acct-1", "EUR", opening)
	for i := range n {
		id := fmt.Sprintf("p-%d", i)
		f.createPayout(id, "acct-1", amount, "EUR")
		st, body := f.claim(id, int64(i+1), fmt.Sprintf("w%d", i+1))
		want(t, "claim "+id, st, body, http.StatusOK, "")
	}
	order := rand.New(rand.NewPCG(16, 6)).Perm(n)
	type answer struct {
		status int
		code   api.Code
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, i := range order {
		wg.Go(func() {
			<-start
			st, body := f.result(fmt.Sprintf("p-%d", i), int64(i+1), fmt.Sprintf("w%d", i+1), "ACK", fmt.Sprintf("rail-%d", i))
			a := answer{status: st}
			if st != http.StatusOK {
				var env api.ErrorEnvelope
				_ = json.Unmarshal(body, &env)
				a.code = env.Error.Code
			}
			answers[i] = a
		})
	}
	close(start)
	wg.Wait()

	t.Logf("answers %v", answers)
	posted, highest := 0, int64(0)
	for i, a := range answers {
		id := fmt.Sprintf("p-%d", i)
		p := f.payout(id)
		switch {
		case a.status == http.StatusOK:
			posted++
			highest = max(highest, int64(i+1))
			if p.State != api.StatePosted || p.Debits != 1 {
				t.Errorf("%s answered 200 but is %s with %d debits; want posted with 1", id, p.State, p.Debits)
			}
		case a.status == http.StatusConflict && a.code == api.CodeFencedOut:
			if p.State != api.StateClaimed || p.Debits != 0 || p.RailRef != "" {
				t.Errorf("%s refused FENCED_OUT but is %s with %d debits, rail ref %q; want claimed, nothing recorded", id, p.State, p.Debits, p.RailRef)
			}
		default:
			t.Errorf("%s answered %d %s; want 200 or 409 FENCED_OUT", id, a.status, a.code)
		}
	}
	if answers[n-1].status != http.StatusOK {
		t.Errorf("the highest token's ACK answered %d %s; nothing can fence it out", answers[n-1].status, answers[n-1].code)
	}
	if got := f.count("ledger_txn"); got != posted {
		t.Errorf("%d ledger transactions for %d posted payouts", got, posted)
	}
	if got := f.count("ledger_entry"); got != 2*posted {
		t.Errorf("%d ledger entries for %d posted payouts; want %d", got, posted, 2*posted)
	}
	if got := f.count("rail_result"); got != posted {
		t.Errorf("%d rail results recorded for %d posted payouts (a refused ACK's must roll back)", got, posted)
	}
	if a := f.account("acct-1"); a.BalanceMinor != opening-int64(posted)*amount || a.Fence != highest {
		t.Errorf("account balance %d fence %d; want %d and %d", a.BalanceMinor, a.Fence, opening-int64(posted)*amount, highest)
	}
	if rep := f.audit(); !rep.Balanced || rep.Debits != posted {
		t.Errorf("audit %+v; want balanced with %d debits", rep, posted)
	}
}
