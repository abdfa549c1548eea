package paymentresource_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/jackc/pgx/v5"
)

// roundTrips counts the round trips and statements a pool's connections
// send to paydb: a query (BEGIN and COMMIT included) is one round trip and
// one statement; a batch is one round trip of as many statements as it
// queues. A connection's first preparation of a statement is not counted.
type roundTrips struct {
	mu                sync.Mutex
	trips, statements int
	sql               []string
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	r.statements++
	r.sql = append(r.sql, firstLine(d.SQL))
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	return ctx
}

func (r *roundTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statements++
	r.sql = append(r.sql, "(batch) "+firstLine(d.SQL))
}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// take returns the counts since the last take, and resets them.
func (r *roundTrips) take() (trips, statements int, sql []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	trips, statements, sql = r.trips, r.statements, r.sql
	r.trips, r.statements, r.sql = 0, 0, nil
	return trips, statements, sql
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// tracedFixture is newFixture whose service's requests are counted.
func tracedFixture(t *testing.T) (*fixture, *roundTrips) {
	t.Helper()
	f := newFixture(t, newPublisher(nil))
	rt := &roundTrips{}
	if err := paymentresource.TraceRequests(t.Context(), f.svc, rt); err != nil {
		t.Fatal(err)
	}
	return f, rt
}

// claimWithTerms claims payout id with its terms, as the executor does.
func (f *fixture) claimWithTerms(id string, token int64, owner string) (int, []byte) {
	f.t.Helper()
	p := f.payouts[id]
	return f.do("POST", "/v1/payouts/"+id+"/claim",
		fmt.Sprintf(`{"accountId":%q,"amountMinor":%d,"currency":%q}`, p.AccountID, p.AmountMinor, p.Currency),
		fencewire.HeaderToken, strconv.FormatInt(token, 10), fencewire.HeaderOwner, owner)
}

// An accepted creation, a first claim with the payout's terms and each
// result of a claimed payout (ACK, DECLINE, AMBIGUOUS) cost one round trip
// to paydb each, with no BEGIN or COMMIT: 5, 4 and 5 round trips before.
func TestAcceptedPayoutStepsTakeOneRoundTripEach(t *testing.T) {
	t.Parallel()
	f, rt := tracedFixture(t)
	f.createAccount("acct-1", "EUR", 10_000)
	check := func(what string, st, wantStatus int, body []byte) {
		t.Helper()
		trips, statements, sql := rt.take()
		if st != wantStatus {
			t.Fatalf("%s: status %d, want %d; body %s", what, st, wantStatus, body)
		}
		if trips != 1 {
			t.Errorf("%s: %d round trips to paydb (%d statements: %q), want 1", what, trips, statements, sql)
		}
	}
	for i, outcome := range []string{"ACK", "DECLINE", "AMBIGUOUS"} {
		id, token := "p-"+outcome, int64(10+i)
		rt.take()
		st, body := f.do("POST", "/v1/payouts", fmt.Sprintf(`{"payoutId":%q,"accountId":"acct-1","amountMinor":100,"currency":"EUR"}`, id))
		f.payouts[id] = api.PayoutRequest{PayoutID: id, AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
		check("create "+id, st, http.StatusCreated, body)
		st, body = f.claimWithTerms(id, token, "w")
		check("claim "+id, st, http.StatusOK, body)
		st, body = f.result(id, token, "w", outcome, "rail-"+id)
		check(outcome+" "+id, st, http.StatusOK, body)
	}
	if rep := f.audit(); !rep.Balanced {
		t.Fatalf("audit: %+v", rep)
	}
	if got := f.account("acct-1").BalanceMinor; got != 9_900 {
		t.Errorf("balance %d, want 9900 (one ACK of 100)", got)
	}
	p := f.payout("p-ACK")
	if p.State != api.StatePosted || p.Debits != 1 || p.Fence != 10 || p.RailRef != "rail-p-ACK" || len(p.History) != 4 {
		t.Errorf("p-ACK = %+v, want posted, one debit, fence 10, rail-p-ACK, 4 history rows", p)
	}
}

// A request the one-round-trip statement does not accept falls back to the
// transaction of several statements: it is answered as that transaction
// answers it (status and code), and neither path writes anything. The
// fast path is tried for each of these (a claim with the payout's terms,
// a result of a payout claimed here) except where the proof or the
// receipt fails before paydb is asked.
func TestRefusedFastPathFallsBackAndWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createAccount("acct-2", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	f.createPayout("p-2", "acct-1", 100, "EUR")
	f.createPayout("p-3", "acct-1", 100, "EUR")
	ok := func(what string, st int, body []byte) {
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", what, st, body)
		}
	}
	st, body := f.claimWithTerms("p-1", 10, "w1")
	ok("claim p-1", st, body)
	st, body = f.claimWithTerms("p-2", 20, "w2")
	ok("claim p-2", st, body)
	st, body = f.result("p-2", 20, "w2", "ACK", "rail-2")
	ok("ACK p-2", st, body) // the account's fence is 20 from here on
	create := func(id, account string, amount int64, ccy string) func() (int, []byte) {
		return func() (int, []byte) {
			return f.do("POST", "/v1/payouts", fmt.Sprintf(`{"payoutId":%q,"accountId":%q,"amountMinor":%d,"currency":%q}`, id, account, amount, ccy))
		}
	}
	claim := func(id, proofAccount string, token int64, terms string) func() (int, []byte) {
		return func() (int, []byte) {
			return f.do("POST", "/v1/payouts/"+id+"/claim", terms, fencewire.HeaderToken, strconv.FormatInt(token, 10),
				fencewire.HeaderOwner, "w", fencewire.HeaderProof, fencingtest.Proof(proofAccount, token))
		}
	}
	result := func(id string, token int64, outcome, ref string) func() (int, []byte) {
		return func() (int, []byte) { return f.result(id, token, "w", outcome, ref) }
	}
	terms := `{"accountId":"acct-1","amountMinor":100,"currency":"EUR"}`
	before := f.snapshot()
	for _, c := range []struct {
		name       string
		do         func() (int, []byte)
		wantStatus int
		wantCode   api.Code
	}{
		{"create beyond the available balance", create("p-big", "acct-1", 801, "EUR"), http.StatusConflict, api.CodeInsufficientFunds},
		{"create again", create("p-1", "acct-1", 100, "EUR"), http.StatusOK, ""},
		{"create again with another amount", create("p-1", "acct-1", 101, "EUR"), http.StatusConflict, api.CodePayoutConflict},
		{"create in another currency", create("p-usd", "acct-1", 1, "USD"), http.StatusUnprocessableEntity, api.CodeCurrencyMismatch},
		{"create on an unknown account", create("p-x", "acct-x", 1, "EUR"), http.StatusNotFound, api.CodeAccountNotFound},
		{"claim with another amount", claim("p-1", "acct-1", 30, `{"accountId":"acct-1","amountMinor":99,"currency":"EUR"}`),
			http.StatusConflict, api.CodePayoutTermsMismatch},
		{"claim with the proof of another account's lock", claim("p-1", "acct-2", 30, terms), http.StatusForbidden, api.CodeUnverifiedToken},
		{"claim below the payout's fence", claim("p-1", "acct-1", 5, terms), http.StatusConflict, api.CodeFencedOut},
		{"claim of a posted payout", claim("p-2", "acct-1", 30, terms), http.StatusConflict, api.CodePayoutFinished},
		{"ACK below the account's fence", result("p-1", 10, "ACK", "rail-1"), http.StatusConflict, api.CodeFencedOut},
		{"DECLINE below the account's fence", result("p-1", 10, "DECLINE", "rail-1"), http.StatusConflict, api.CodeFencedOut},
		{"AMBIGUOUS below the account's fence", result("p-1", 10, "AMBIGUOUS", "rail-1"), http.StatusConflict, api.CodeFencedOut},
		{"ACK with another payout's rail reference", result("p-1", 10, "ACK", "rail-2"), http.StatusConflict, api.CodeRailRefConflict},
		{"ACK again", result("p-2", 20, "ACK", "rail-2"), http.StatusOK, ""},
		{"ACK of a pending payout", result("p-3", 30, "ACK", "rail-3"), http.StatusConflict, api.CodePayoutNotClaimed},
		{"ACK with a receipt over another amount", func() (int, []byte) {
			receipt := fencingtest.Receipt(fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 99, Currency: "EUR",
				Outcome: "ACK", RailRef: "rail-1", RailToken: 30})
			return f.do("POST", "/v1/payouts/p-1/result", fmt.Sprintf(`{"outcome":"ACK","railRef":"rail-1","receipt":%q}`, receipt),
				fencewire.HeaderToken, "30", fencewire.HeaderOwner, "w")
		}, http.StatusUnprocessableEntity, api.CodeInvalidReceipt},
	} {
		st, body := c.do()
		want(t, c.name, st, body, c.wantStatus, c.wantCode)
		if after := f.snapshot(); after != before {
			t.Fatalf("%s wrote to paydb:\nbefore %s\nafter  %s", c.name, before, after)
		}
	}
}
