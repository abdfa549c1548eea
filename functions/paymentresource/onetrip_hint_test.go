package paymentresource_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

// A process remembers the terms of the payouts it claimed until their
// result, but the result may reach another replica: the first process's
// hint is then stale. A later result there, by a newer holder with a new
// rail reference and a valid receipt, takes the one-round-trip statement
// and is refused PAYOUT_FINISHED like any result of a finished payout:
// the statement requires the payout to be claimed, or the second ACK would
// debit again.
func TestAStaleClaimHintFromAnotherReplicaChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	g := newFixtureOn(t, f.dsn, newPublisher(nil)) // a second replica over the same paydb
	g.payouts = f.payouts
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	st, body := f.claimWithTerms("p-1", 10, "w1")
	want(t, "claim p-1 at f", st, body, http.StatusOK, "")
	st, body = g.result("p-1", 10, "w1", "ACK", "rail-1")
	want(t, "ACK p-1 at g", st, body, http.StatusOK, "")
	before := f.snapshot()
	for i, outcome := range []string{"ACK", "DECLINE"} {
		ref := fmt.Sprintf("rail-%d", i+2)
		st, body = f.result("p-1", 11, "w2", outcome, ref)
		want(t, outcome+" of posted p-1 at f, token 11, "+ref, st, body, http.StatusConflict, api.CodePayoutFinished)
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("a result of a posted payout wrote to paydb:\nbefore %s\nafter  %s", before, after)
	}
	if a := f.account("acct-1"); a.BalanceMinor != 900 {
		t.Errorf("balance %d, want 900 (one debit)", a.BalanceMinor)
	}
}

// The remembered terms are only a hint: when they are wrong (here, an
// amount the payout does not have) the statement writes nothing, and the
// transaction of several statements judges the request against the row.
// A receipt over the hint's amount is refused INVALID_RECEIPT instead of
// debiting the account that amount.
func TestAWrongClaimHintDebitsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	st, body := f.claimWithTerms("p-1", 10, "w1")
	want(t, "claim p-1", st, body, http.StatusOK, "")
	wrong := api.Payout{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 1, Currency: "EUR"}
	paymentresource.RememberClaim(f.svc, wrong)
	before := f.snapshot()
	for _, outcome := range []string{"ACK", "DECLINE"} {
		receipt := fencingtest.Receipt(fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 1, Currency: "EUR",
			Outcome: outcome, RailRef: "rail-1", RailToken: 10})
		st, body = f.do("POST", "/v1/payouts/p-1/result", fmt.Sprintf(`{"outcome":%q,"railRef":"rail-1","receipt":%q}`, outcome, receipt),
			fencewire.HeaderToken, "10", fencewire.HeaderOwner, "w1")
		want(t, outcome+" with a receipt over the hint's amount", st, body, http.StatusUnprocessableEntity, api.CodeInvalidReceipt)
		paymentresource.RememberClaim(f.svc, wrong)
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("a result judged against wrong terms wrote to paydb:\nbefore %s\nafter  %s", before, after)
	}
}

// A payout's terms are remembered from its claim until its result,
// whatever the outcome: an AMBIGUOUS payout is never claimed again, so
// no later result of it can use them.
func TestClaimHintIsForgottenAtEveryResult(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	for i, outcome := range []string{"ACK", "DECLINE", "AMBIGUOUS"} {
		id := "p-" + outcome
		f.createPayout(id, "acct-1", 100, "EUR")
		st, body := f.claimWithTerms(id, int64(10+i), "w")
		want(t, "claim "+id, st, body, http.StatusOK, "")
		if !paymentresource.RemembersClaim(f.svc, id) {
			t.Fatalf("%s: terms not remembered at its claim", id)
		}
		st, body = f.result(id, int64(10+i), "w", outcome, "rail-"+id)
		want(t, outcome+" "+id, st, body, http.StatusOK, "")
		if paymentresource.RemembersClaim(f.svc, id) {
			t.Errorf("%s: terms still remembered after its %s", id, outcome)
		}
	}
}

// Two payouts reported with one rail reference at once: the
// one-round-trip ACK of p-1 finds the reference not recorded while
// another transaction is recording it for p-2, and meets that record on
// the reference's key. Its whole batch rolls back, debit included, and the
// transaction of several statements answers RAIL_REF_CONFLICT, as for a
// reference recorded before.
func TestARailReferenceRecordedMeanwhileRollsTheFastResultBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	f.createPayout("p-2", "acct-1", 100, "EUR")
	st, body := f.claimWithTerms("p-1", 10, "w")
	want(t, "claim p-1", st, body, http.StatusOK, "")
	other, err := f.db.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(context.Background()) }()
	if _, err := other.Exec(t.Context(), `INSERT INTO rail_result (rail_ref, payout_id, outcome, token) VALUES ('rail-x', 'p-2', 'ACK', 20)`); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status int
		body   []byte
	}
	done := make(chan answer, 1)
	go func() {
		st, body := f.result("p-1", 10, "w", "ACK", "rail-x")
		done <- answer{st, body}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	pgtest.AwaitBlockedOnLock(t, ctx, f.dsn, done)
	if err := other.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := <-done
	want(t, "ACK p-1 with the reference recorded meanwhile for p-2", a.status, a.body, http.StatusConflict, api.CodeRailRefConflict)
	if p := f.payout("p-1"); p.State != api.StateClaimed || p.Debits != 0 {
		t.Errorf("p-1 is %s with %d debits; want claimed with none", p.State, p.Debits)
	}
	if acct := f.account("acct-1"); acct.BalanceMinor != 1_000 || acct.Fence != 0 {
		t.Errorf("account balance %d fence %d; want 1000 and 0", acct.BalanceMinor, acct.Fence)
	}
	if n := f.count("ledger_txn"); n != 0 {
		t.Errorf("%d ledger transactions; want none", n)
	}
}
