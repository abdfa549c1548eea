package paymentresource_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// The argument of the project at fence point one: a holder whose lease was
// taken over (token 41, superseded by 42) is refused by the payout row, the
// refusal is logged with both tokens, nothing is debited, and the current
// holder then posts exactly once.
func TestStaleHolderIsFencedAtPaymentResource(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-7", "EUR", 10_000)
	f.createPayout("p-1", "acct-7", 2_500, "EUR")

	st, body := f.claim("p-1", 41, "worker-A")
	want(t, "claim with 41", st, body, http.StatusOK, "")
	st, body = f.claim("p-1", 42, "worker-B")
	want(t, "claim with 42", st, body, http.StatusOK, "")

	st, body = f.result("p-1", 41, "worker-A", "ACK", "rail-41")
	want(t, "ACK with stale token 41", st, body, http.StatusConflict, api.CodeFencedOut)

	lines := f.logs.Events(t, fencewire.EventFencedOut)
	if len(lines) != 1 {
		t.Fatalf("fenced_out lines = %d, want 1: %v", len(lines), lines)
	}
	for k, v := range map[string]any{"presentedToken": 41.0, "highestToken": 42.0, "resource": "payout",
		"resourceId": "p-1", "ownerId": "worker-A", "payoutId": "p-1", "level": "WARN"} {
		if lines[0][k] != v {
			t.Errorf("fenced_out %s = %v, want %v (line %v)", k, lines[0][k], v, lines[0])
		}
	}
	if a := f.account("acct-7"); a.BalanceMinor != 10_000 || a.Fence != 0 {
		t.Errorf("after the stale ACK: balance %d fence %d, want 10000 and 0", a.BalanceMinor, a.Fence)
	}
	if n := f.count("ledger_txn") + f.count("ledger_entry") + f.count("rail_result"); n != 0 {
		t.Errorf("after the stale ACK: %d ledger or result rows, want 0", n)
	}
	if p := f.payout("p-1"); p.State != api.StateClaimed || p.Fence != 42 || p.OwnerID != "worker-B" {
		t.Errorf("after the stale ACK: payout %s fence %d owner %s, want claimed 42 worker-B", p.State, p.Fence, p.OwnerID)
	}

	st, body = f.do("POST", api.WithHistory(api.ResultPath("p-1")), `{"outcome":"ACK","railRef":"rail-42"}`,
		fencewire.HeaderToken, "42", fencewire.HeaderOwner, "worker-B")
	want(t, "ACK with current token 42", st, body, http.StatusOK, "")
	p := decode[api.Payout](t, body)
	if p.State != api.StatePosted || p.Debits != 1 || p.RailRef != "rail-42" || p.Fence != 42 {
		t.Errorf("posted payout = %+v; want posted, 1 debit, rail-42, fence 42", p)
	}
	var path []string
	for _, tr := range p.History {
		path = append(path, fmt.Sprintf("%s>%s@%d", tr.From, tr.To, tr.Token))
	}
	if got, w := strings.Join(path, " "), ">pending@0 pending>claimed@41 claimed>claimed@42 claimed>acknowledged@42 acknowledged>posted@42"; got != w {
		t.Errorf("history = %s\nwant      %s", got, w)
	}
	if a := f.account("acct-7"); a.BalanceMinor != 7_500 || a.Fence != 42 {
		t.Errorf("after posting: balance %d fence %d, want 7500 and 42", a.BalanceMinor, a.Fence)
	}
	if rep := f.audit(); !rep.Balanced || rep.Debits != 1 {
		t.Errorf("audit = %+v; want balanced with 1 debit", rep)
	}
	if n := len(f.logs.Events(t, "payout_posted")); n != 1 {
		t.Errorf("payout_posted lines = %d, want 1", n)
	}
}

// The account fence is strict: one debit per token. A token the payout row
// accepts (it has never seen a higher one) is still refused by the account
// when that token has already debited it.
func TestAccountFenceIsStrict(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "USD", 1_000)
	f.createPayout("p-1", "acct-1", 100, "USD")
	f.createPayout("p-2", "acct-1", 200, "USD")

	for i := 0; i < 2; i++ { // the payout fence is not strict: one holder may repeat a step
		st, body := f.claim("p-1", 42, "w")
		want(t, "claim p-1 with 42", st, body, http.StatusOK, "")
	}
	st, body := f.result("p-1", 42, "w", "ACK", "rail-a")
	want(t, "ACK p-1 with 42", st, body, http.StatusOK, "")

	st, body = f.claim("p-2", 42, "w")
	want(t, "claim p-2 with 42", st, body, http.StatusOK, "")
	st, body = f.result("p-2", 42, "w", "ACK", "rail-b")
	want(t, "ACK p-2 with 42, which already debited the account", st, body, http.StatusConflict, api.CodeFencedOut)
	lines := f.logs.Events(t, fencewire.EventFencedOut)
	if len(lines) != 1 || lines[0]["resource"] != "account" || lines[0]["resourceId"] != "acct-1" ||
		lines[0]["presentedToken"] != 42.0 || lines[0]["highestToken"] != 42.0 || lines[0]["payoutId"] != "p-2" {
		t.Fatalf("fenced_out lines = %v; want one on account acct-1, 42 against 42, payout p-2", lines)
	}
	if a := f.account("acct-1"); a.BalanceMinor != 900 {
		t.Errorf("balance %d, want 900 (p-1 only)", a.BalanceMinor)
	}
	if p := f.payout("p-2"); p.State != api.StateClaimed || p.Debits != 0 {
		t.Errorf("p-2 = %s with %d debits, want claimed with 0 (rolled back whole)", p.State, p.Debits)
	}

	st, body = f.claim("p-2", 43, "w2")
	want(t, "claim p-2 with 43", st, body, http.StatusOK, "")
	st, body = f.result("p-2", 43, "w2", "ACK", "rail-c")
	want(t, "ACK p-2 with 43", st, body, http.StatusOK, "")
	if a := f.account("acct-1"); a.BalanceMinor != 700 || a.Fence != 43 {
		t.Errorf("balance %d fence %d, want 700 and 43", a.BalanceMinor, a.Fence)
	}
	if rep := f.audit(); !rep.Balanced || rep.Debits != 2 {
		t.Errorf("audit = %+v; want balanced with 2 debits", rep)
	}
}

// Results are facts keyed by the rail reference: posting one again changes
// nothing, with fencing on or off; the same reference for another payout
// or outcome is a conflict.
func TestResultIsIdempotentByRailRef(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		opts []option
	}{{"fencing on", nil}, {"fencing off", []option{fencingOff}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, newPublisher(nil), mode.opts...)
			f.createAccount("acct-1", "EUR", 5_000)
			f.createPayout("p-1", "acct-1", 1_000, "EUR")
			f.createPayout("p-2", "acct-1", 300, "EUR")
			st, body := f.claim("p-1", 7, "w")
			want(t, "claim p-1", st, body, http.StatusOK, "")
			for i := 0; i < 3; i++ {
				st, body = f.result("p-1", 7, "w", "ACK", "rail-1")
				want(t, fmt.Sprintf("ACK rail-1 #%d", i+1), st, body, http.StatusOK, "")
				if p := decode[api.Payout](t, body); p.State != api.StatePosted || p.Debits != 1 {
					t.Fatalf("ACK rail-1 #%d: %s with %d debits, want posted with 1", i+1, p.State, p.Debits)
				}
			}
			if a := f.account("acct-1"); a.BalanceMinor != 4_000 {
				t.Errorf("balance %d, want 4000 (one debit)", a.BalanceMinor)
			}
			if n := len(f.logs.Events(t, "result_replayed")); n != 2 {
				t.Errorf("result_replayed lines = %d, want 2", n)
			}

			st, body = f.claim("p-2", 8, "w")
			want(t, "claim p-2", st, body, http.StatusOK, "")
			st, body = f.result("p-2", 8, "w", "ACK", "rail-1")
			want(t, "rail-1 again for another payout", st, body, http.StatusConflict, api.CodeRailRefConflict)
			for i := 0; i < 2; i++ {
				st, body = f.result("p-2", 8, "w", "DECLINE", "rail-2")
				want(t, fmt.Sprintf("DECLINE rail-2 #%d", i+1), st, body, http.StatusOK, "")
			}
			st, body = f.result("p-2", 8, "w", "ACK", "rail-2")
			want(t, "rail-2 again with another outcome", st, body, http.StatusConflict, api.CodeRailRefConflict)
			if p := f.payout("p-2"); p.State != api.StateDeclined || p.Debits != 0 {
				t.Errorf("p-2 = %s with %d debits, want declined with 0", p.State, p.Debits)
			}
			if rep := f.audit(); !rep.Balanced {
				t.Errorf("audit = %+v; want balanced", rep)
			}
		})
	}
}

// Creating an account or a payout twice with the same body answers the
// existing one; a payout creates exactly one outbox row and one event.
func TestCreateIsIdempotent(t *testing.T) {
	t.Parallel()
	pub := newPublisher(nil)
	f := newFixture(t, pub)

	acct := `{"accountId":"acct-1","currency":"GBP","openingBalanceMinor":900}`
	st, body := f.do("POST", "/v1/accounts", acct)
	want(t, "create account", st, body, http.StatusCreated, "")
	st, body = f.do("POST", "/v1/accounts", acct)
	want(t, "same account again", st, body, http.StatusOK, "")
	if a := decode[api.Account](t, body); a.AccountID != "acct-1" || a.Currency != "GBP" ||
		a.OpeningBalanceMinor != 900 || a.BalanceMinor != 900 || a.Fence != 0 {
		t.Errorf("account = %+v", a)
	}
	st, body = f.do("POST", "/v1/accounts", `{"accountId":"acct-1","currency":"GBP","openingBalanceMinor":901}`)
	want(t, "account with another opening balance", st, body, http.StatusConflict, api.CodeAccountConflict)

	payout := `{"payoutId":"p-1","accountId":"acct-1","amountMinor":250,"currency":"GBP"}`
	st, body = f.do("POST", "/v1/payouts", payout)
	want(t, "create payout", st, body, http.StatusCreated, "")
	first := decode[api.Payout](t, body)
	st, body = f.do("POST", "/v1/payouts", payout)
	want(t, "same payout again", st, body, http.StatusOK, "")
	if again := decode[api.Payout](t, body); again.PayoutID != "p-1" || again.State != api.StatePending ||
		!again.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("payout again = %+v; want the existing one %+v", again, first)
	}
	st, body = f.do("POST", "/v1/payouts", `{"payoutId":"p-1","accountId":"acct-1","amountMinor":251,"currency":"GBP"}`)
	want(t, "payout with another amount", st, body, http.StatusConflict, api.CodePayoutConflict)

	if n := f.count("outbox"); n != 1 {
		t.Errorf("outbox rows = %d, want 1", n)
	}
	if n := len(f.logs.Events(t, "payout_created")); n != 1 {
		t.Errorf("payout_created lines = %d, want 1", n)
	}
	c := pub.next(t)
	_, ev, err := payoutevent.Decode(mustPush(t, c))
	if err != nil || ev != (payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 250, Currency: "GBP"}) {
		t.Errorf("published event %+v, %v", ev, err)
	}
	if c.key != "acct-1" || c.attrs[payoutevent.AttrPayoutID] != "p-1" || c.attrs[payoutevent.AttrAccountID] != "acct-1" {
		t.Errorf("published with key %q attrs %v; want acct-1 and payoutId/accountId", c.key, c.attrs)
	}
}

// mustPush wraps a published message as the push body the executor gets.
func mustPush(t *testing.T, c publishCall) []byte {
	t.Helper()
	var ev payoutevent.Event
	if err := json.Unmarshal(c.data, &ev); err != nil {
		t.Fatalf("published data %q: %v", c.data, err)
	}
	b, err := payoutevent.Encode(ev, "m-1", c.key, 1)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The outbox publishes every row, in creation order, with the account as
// ordering key.
func TestOutboxPublishesInOrder(t *testing.T) {
	t.Parallel()
	pub := newPublisher(nil)
	f := newFixture(t, pub)
	f.createAccount("acct-1", "EUR", 1_000)
	f.createAccount("acct-2", "EUR", 1_000)
	want := []string{"p-1/acct-1", "p-2/acct-2", "p-3/acct-1", "p-4/acct-2", "p-5/acct-1"}
	for _, w := range want {
		id, acct, _ := strings.Cut(w, "/")
		f.createPayout(id, acct, 10, "EUR")
	}
	for i, w := range want {
		c := pub.next(t)
		var ev payoutevent.Event
		if err := json.Unmarshal(c.data, &ev); err != nil {
			t.Fatal(err)
		}
		if got := ev.PayoutID + "/" + c.key; got != w {
			t.Errorf("publish #%d = %s, want %s", i+1, got, w)
		}
	}
}

// An acknowledged create is never lost: the outbox row outlives a process
// whose publisher never succeeded, and the next process publishes it.
func TestOutboxSurvivesRestart(t *testing.T) {
	t.Parallel()
	down := newPublisher(errBrokerDown)
	f := newFixture(t, down)
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	down.next(t) // the publisher tried, and failed
	f.svc.Close()

	var unpublished int
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 1 {
		t.Fatalf("unpublished outbox rows after a failed publish = %d, want 1", unpublished)
	}
	if n := len(f.logs.Events(t, "outbox_publish_failed")); n == 0 {
		t.Errorf("no outbox_publish_failed line")
	}

	up := newPublisher(nil)
	f.start(up)
	c := up.next(t)
	var ev payoutevent.Event
	if err := json.Unmarshal(c.data, &ev); err != nil || ev.PayoutID != "p-1" || c.key != "acct-1" {
		t.Fatalf("published after restart: %q key %q (%v); want p-1 on acct-1", c.data, c.key, err)
	}
	f.svc.Close() // waits for the publisher, which records the acknowledgement first
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 0 {
		t.Errorf("unpublished outbox rows after the restart = %d, want 0", unpublished)
	}
	if n := len(f.logs.Events(t, "outbox_published")); n != 1 {
		t.Errorf("outbox_published lines = %d, want 1", n)
	}
}

// staleAck plays the experiment at fence point one: 41 claims, its lease
// passes to 42, 42 claims and posts, then 41 wakes up and posts the ACK of
// its own (second, real) rail submission.
func staleAck(t *testing.T, f *fixture) (int, []byte) {
	t.Helper()
	f.createAccount("acct-7", "EUR", 10_000)
	f.createPayout("p-1", "acct-7", 2_500, "EUR")
	st, body := f.claim("p-1", 41, "worker-A")
	want(t, "claim 41", st, body, http.StatusOK, "")
	st, body = f.claim("p-1", 42, "worker-B")
	want(t, "claim 42", st, body, http.StatusOK, "")
	st, body = f.result("p-1", 42, "worker-B", "ACK", "rail-42")
	want(t, "ACK 42", st, body, http.StatusOK, "")
	return f.result("p-1", 41, "worker-A", "ACK", "rail-41")
}

// With the kill switch off the stale ACK is recorded as a second debit,
// and the audit catches the corruption.
func TestStaleAckWithFencingOffCorruptsTheLedger(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil), fencingOff)
	if n := len(f.logs.Events(t, "fencing_disabled")); n != 1 {
		t.Errorf("fencing_disabled lines = %d, want 1", n)
	}
	st, body := staleAck(t, f)
	want(t, "stale ACK with fencing off", st, body, http.StatusOK, "")
	if p := decode[api.Payout](t, body); p.Debits != 2 || p.Fence != 42 {
		t.Errorf("payout after the stale ACK: %d debits fence %d, want 2 and 42 (the fence only grows)", p.Debits, p.Fence)
	}
	if a := f.account("acct-7"); a.BalanceMinor != 5_000 {
		t.Errorf("balance %d, want 5000 (paid twice)", a.BalanceMinor)
	}
	rep := f.audit()
	if rep.Balanced || len(rep.Violations) != 1 || rep.Violations[0].Check != api.CheckOneDebitPerPayout ||
		rep.Violations[0].Subject != "p-1" {
		t.Errorf("audit = %+v; want one %s violation on p-1", rep, api.CheckOneDebitPerPayout)
	}
}

// With fencing on the same stale ACK is refused, and a non-stale ACK with a
// new rail reference for the posted payout is told it is finished.
func TestStaleAckWithFencingOnKeepsTheLedgerBalanced(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	st, body := staleAck(t, f)
	want(t, "stale ACK with fencing on", st, body, http.StatusConflict, api.CodeFencedOut)
	st, body = f.result("p-1", 42, "worker-B", "ACK", "rail-42b")
	want(t, "second ACK by the current holder", st, body, http.StatusConflict, api.CodePayoutFinished)
	st, body = f.result("p-1", 43, "worker-C", "ACK", "rail-43")
	want(t, "ACK by a newer holder", st, body, http.StatusConflict, api.CodePayoutFinished)
	if p := f.payout("p-1"); p.Debits != 1 {
		t.Errorf("debits %d, want 1", p.Debits)
	}
	if a := f.account("acct-7"); a.BalanceMinor != 7_500 {
		t.Errorf("balance %d, want 7500", a.BalanceMinor)
	}
	if rep := f.audit(); !rep.Balanced {
		t.Errorf("audit = %+v; want balanced", rep)
	}
}

// The claim's answers for payouts that cannot be claimed.
func TestClaimRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	for _, id := range []string{"posted", "declined", "ambiguous"} {
		f.createPayout(id, "acct-1", 10, "EUR")
		st, body := f.claim(id, 5, "w")
		want(t, "claim "+id, st, body, http.StatusOK, "")
	}
	f.createPayout("pending", "acct-1", 10, "EUR")
	for id, outcome := range map[string]string{"posted": "ACK", "declined": "DECLINE", "ambiguous": "AMBIGUOUS"} {
		st, body := f.result(id, 5, "w", outcome, "rail-"+id)
		want(t, outcome+" "+id, st, body, http.StatusOK, "")
	}
	for _, tc := range []struct {
		id     string
		token  int64
		status int
		code   api.Code
	}{
		{"nope", 9, http.StatusNotFound, api.CodePayoutNotFound},
		{"posted", 9, http.StatusConflict, api.CodePayoutFinished},
		{"declined", 9, http.StatusConflict, api.CodePayoutFinished},
		{"ambiguous", 9, http.StatusConflict, api.CodePayoutInDoubt},
		// A finished payout is finished whatever the token: before the
		// fence (a payout fence raised by a forged token made every
		// claim FENCED_OUT, and the executors redelivered it forever).
		{"posted", 4, http.StatusConflict, api.CodePayoutFinished},
		{"ambiguous", 4, http.StatusConflict, api.CodePayoutInDoubt},
	} {
		st, body := f.claim(tc.id, tc.token, "w2")
		want(t, fmt.Sprintf("claim %s with %d", tc.id, tc.token), st, body, tc.status, tc.code)
	}
	st, body := f.result("pending", 9, "w", "ACK", "rail-x")
	want(t, "ACK for an unclaimed payout", st, body, http.StatusConflict, api.CodePayoutNotClaimed)
	st, body = f.result("nope", 9, "w", "ACK", "rail-y")
	want(t, "ACK for an unknown payout", st, body, http.StatusNotFound, api.CodePayoutNotFound)
	// Token 5 has debited the account (payout "posted"): settling the
	// ambiguous payout takes a newer token.
	st, body = f.result("ambiguous", 5, "w", "ACK", "rail-settled")
	want(t, "ACK settling an ambiguous payout with a token that debited", st, body, http.StatusConflict, api.CodeFencedOut)
	st, body = f.result("ambiguous", 6, "w", "ACK", "rail-settled")
	want(t, "ACK settling an ambiguous payout", st, body, http.StatusOK, "")
	if rep := f.audit(); !rep.Balanced || rep.Debits != 2 {
		t.Errorf("audit = %+v; want balanced with 2 debits", rep)
	}
}

// Every malformed or refused request gets a 4xx envelope and changes no row.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	pub := newPublisher(nil)
	f := newFixture(t, pub)
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	f.createPayout("p-2", "acct-1", 100, "EUR")
	st, body := f.claim("p-2", 5, "w")
	want(t, "claim p-2", st, body, http.StatusOK, "")
	pub.next(t)
	pub.next(t)
	before := f.snapshot()

	tok := func(v string) []string { return []string{fencewire.HeaderToken, v} }
	big := `{"payoutId":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}`
	const (
		bad      = http.StatusBadRequest
		conflict = http.StatusConflict
	)
	for _, tc := range []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code                     api.Code
	}{
		// POST /v1/accounts
		{"account: malformed JSON", "POST", "/v1/accounts", `{"accountId":`, nil, bad, api.CodeInvalidRequest},
		{"account: empty body", "POST", "/v1/accounts", ``, nil, bad, api.CodeInvalidRequest},
		{"account: unknown field", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"EUR","openingBalanceMinor":1,"owner":"x"}`, nil, bad, api.CodeInvalidRequest},
		{"account: trailing data", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"EUR","openingBalanceMinor":1} {}`, nil, bad, api.CodeInvalidRequest},
		{"account: missing opening balance", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"account: negative opening balance", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"EUR","openingBalanceMinor":-1}`, nil, bad, api.CodeInvalidRequest},
		{"account: fractional balance", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"EUR","openingBalanceMinor":1.5}`, nil, bad, api.CodeInvalidRequest},
		{"account: lower-case currency", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"eur","openingBalanceMinor":1}`, nil, bad, api.CodeInvalidRequest},
		{"account: unassigned currency", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"ZZZ","openingBalanceMinor":1}`, nil, bad, api.CodeInvalidRequest},
		{"account: testing currency", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"XTS","openingBalanceMinor":1}`, nil, bad, api.CodeInvalidRequest},
		{"account: no-currency code", "POST", "/v1/accounts", `{"accountId":"a-2","currency":"XXX","openingBalanceMinor":1}`, nil, bad, api.CodeInvalidRequest},
		{"account: empty id", "POST", "/v1/accounts", `{"accountId":"","currency":"EUR","openingBalanceMinor":1}`, nil, bad, api.CodeInvalidRequest},
		{"account: id with a slash", "POST", "/v1/accounts", `{"accountId":"a/b","currency":"EUR","openingBalanceMinor":1}`, nil, bad, api.CodeInvalidRequest},
		{"account: oversized body", "POST", "/v1/accounts", big, nil, http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge},
		{"account: conflict", "POST", "/v1/accounts", `{"accountId":"acct-1","currency":"USD","openingBalanceMinor":1000}`, nil, conflict, api.CodeAccountConflict},
		{"account: wrong method", "DELETE", "/v1/accounts", ``, nil, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed},
		{"account: text body", "POST", "/v1/accounts", `x`, []string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType, api.CodeUnsupportedMediaType},
		// GET /v1/accounts/{id}
		{"get account: unknown", "GET", "/v1/accounts/nope", ``, nil, http.StatusNotFound, api.CodeAccountNotFound},
		{"get account: bad id", "GET", "/v1/accounts/-x", ``, nil, bad, api.CodeInvalidRequest},
		// POST /v1/payouts
		{"payout: malformed JSON", "POST", "/v1/payouts", `{"payoutId":"p-9",`, nil, bad, api.CodeInvalidRequest},
		{"payout: unknown field", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":1,"currency":"EUR","memo":"x"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: zero amount", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: negative amount", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":-5,"currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: missing amount", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: amount too large", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":9223372036854775807,"currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: amount beyond int64", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":9223372036854775808,"currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: amount as string", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":"5","currency":"EUR"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: unassigned currency", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":5,"currency":"ZZZ"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: gold", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":5,"currency":"XAU"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: unknown account", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-9","amountMinor":5,"currency":"EUR"}`, nil, http.StatusNotFound, api.CodeAccountNotFound},
		{"payout: wrong currency", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":5,"currency":"USD"}`, nil, http.StatusUnprocessableEntity, api.CodeCurrencyMismatch},
		{"payout: bad currency", "POST", "/v1/payouts", `{"payoutId":"p-9","accountId":"acct-1","amountMinor":5,"currency":"EURO"}`, nil, bad, api.CodeInvalidRequest},
		{"payout: oversized body", "POST", "/v1/payouts", big, nil, http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge},
		{"payout: conflict", "POST", "/v1/payouts", `{"payoutId":"p-1","accountId":"acct-1","amountMinor":101,"currency":"EUR"}`, nil, conflict, api.CodePayoutConflict},
		{"payout: wrong method", "PUT", "/v1/payouts", `{}`, nil, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed},
		// GET /v1/payouts/{id}
		{"get payout: unknown", "GET", "/v1/payouts/nope", ``, nil, http.StatusNotFound, api.CodePayoutNotFound},
		{"get payout: wrong method", "POST", "/v1/payouts/p-1", `{}`, nil, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed},
		// POST /v1/payouts/{id}/claim
		{"claim: missing token", "POST", "/v1/payouts/p-1/claim", ``, nil, bad, api.CodeInvalidToken},
		{"claim: non-numeric token", "POST", "/v1/payouts/p-1/claim", ``, tok("abc"), bad, api.CodeInvalidToken},
		{"claim: zero token", "POST", "/v1/payouts/p-1/claim", ``, tok("0"), bad, api.CodeInvalidToken},
		{"claim: negative token", "POST", "/v1/payouts/p-1/claim", ``, tok("-4"), bad, api.CodeInvalidToken},
		{"claim: two tokens", "POST", "/v1/payouts/p-1/claim", ``, []string{fencewire.HeaderToken, "5", fencewire.HeaderToken, "6"}, bad, api.CodeInvalidToken},
		{"claim: malformed body", "POST", "/v1/payouts/p-1/claim", `{"x"`, tok("5"), bad, api.CodeInvalidRequest},
		{"claim: unknown field", "POST", "/v1/payouts/p-1/claim", `{"force":true}`, tok("5"), bad, api.CodeInvalidRequest},
		{"claim: oversized body", "POST", "/v1/payouts/p-1/claim", big, tok("5"), http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge},
		{"claim: partial terms", "POST", "/v1/payouts/p-1/claim", `{"accountId":"acct-1","amountMinor":100}`, tok("5"), bad, api.CodeInvalidRequest},
		{"claim: terms of another amount", "POST", "/v1/payouts/p-1/claim", `{"accountId":"acct-1","amountMinor":99,"currency":"EUR"}`, tok("5"), conflict, api.CodePayoutTermsMismatch},
		{"claim: unknown payout", "POST", "/v1/payouts/nope/claim", ``, tok("5"), http.StatusNotFound, api.CodePayoutNotFound},
		{"claim: stale token", "POST", "/v1/payouts/p-2/claim", ``, tok("4"), conflict, api.CodeFencedOut},
		{"claim: wrong method", "GET", "/v1/payouts/p-1/claim", ``, tok("5"), http.StatusMethodNotAllowed, api.CodeMethodNotAllowed},
		// POST /v1/payouts/{id}/result
		{"result: missing token", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK","railRef":"r-1"}`, nil, bad, api.CodeInvalidToken},
		{"result: non-numeric token", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK","railRef":"r-1"}`, tok("5x"), bad, api.CodeInvalidToken},
		{"result: zero token", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK","railRef":"r-1"}`, tok("0"), bad, api.CodeInvalidToken},
		{"result: malformed JSON", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK",`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: unknown field", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK","railRef":"r-1","amountMinor":5}`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: unknown outcome", "POST", "/v1/payouts/p-2/result", `{"outcome":"PAID","railRef":"r-1"}`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: lower-case outcome", "POST", "/v1/payouts/p-2/result", `{"outcome":"ack","railRef":"r-1"}`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: ACK without railRef", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK"}`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: DECLINE without railRef", "POST", "/v1/payouts/p-2/result", `{"outcome":"DECLINE","railRef":""}`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: railRef with a space", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK","railRef":"r 1"}`, tok("5"), bad, api.CodeInvalidRequest},
		{"result: empty body", "POST", "/v1/payouts/p-2/result", ``, tok("5"), bad, api.CodeInvalidRequest},
		{"result: oversized body", "POST", "/v1/payouts/p-2/result", big, tok("5"), http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge},
		{"result: unknown payout", "POST", "/v1/payouts/nope/result", `{"outcome":"ACK","railRef":"r-1"}`, tok("5"), http.StatusNotFound, api.CodePayoutNotFound},
		{"result: not claimed", "POST", "/v1/payouts/p-1/result", `{"outcome":"ACK","railRef":"r-1"}`, tok("5"), conflict, api.CodePayoutNotClaimed},
		{"result: stale token", "POST", "/v1/payouts/p-2/result", `{"outcome":"ACK","railRef":"r-1"}`, tok("4"), conflict, api.CodeFencedOut},
		// GET /v1/audit and unknown routes
		{"audit: wrong method", "POST", "/v1/audit", `{}`, nil, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed},
		{"no such route", "GET", "/v2/payouts", ``, nil, http.StatusNotFound, api.CodeNotFound},
		{"no such payout step", "POST", "/v1/payouts/p-1/submit", `{}`, nil, http.StatusNotFound, api.CodeNotFound},
	} {
		st, body := f.do(tc.method, tc.path, tc.body, tc.headers...)
		want(t, tc.name, st, body, tc.status, tc.code)
		if env := decode[struct {
			Error struct{ Message string }
		}](t, body); env.Error.Message == "" {
			t.Errorf("%s: envelope without a message: %s", tc.name, body)
		}
		if after := f.snapshot(); after != before {
			t.Fatalf("%s changed the database:\nbefore %s\nafter  %s", tc.name, before, after)
		}
	}
	if rep := f.audit(); !rep.Balanced {
		t.Errorf("audit = %+v", rep)
	}
}

// Each rule of the audit fails when its invariant is deliberately broken,
// and reports only that rule.
func TestAuditDetectsEachBrokenRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		check, subject, corrupt string
	}{
		{api.CheckTxnBalanced, "1",
			`INSERT INTO ledger_entry (txn_id, ledger_account, amount_minor, currency) VALUES (1, 'rail:clearing', 1, 'EUR')`},
		{api.CheckAccountBalance, "acct-1",
			`UPDATE account SET balance_minor = balance_minor + 100`},
		{api.CheckOneDebitPerPayout, "p-1",
			`UPDATE payout SET state = 'declined' WHERE payout_id = 'p-1'`},
		{api.CheckOneDebitPerPayout, "p-2",
			`UPDATE payout SET state = 'posted' WHERE payout_id = 'p-2'`},
	} {
		t.Run(tc.check+"/"+tc.subject, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, newPublisher(nil))
			f.createAccount("acct-1", "EUR", 1_000)
			f.createPayout("p-1", "acct-1", 100, "EUR")
			f.createPayout("p-2", "acct-1", 200, "EUR")
			st, body := f.claim("p-1", 3, "w")
			want(t, "claim", st, body, http.StatusOK, "")
			st, body = f.result("p-1", 3, "w", "ACK", "rail-1")
			want(t, "ACK", st, body, http.StatusOK, "")
			if rep := f.audit(); !rep.Balanced || rep.Accounts != 1 || rep.Payouts != 2 || rep.Debits != 1 {
				t.Fatalf("audit before corruption = %+v; want balanced, 1 account, 2 payouts, 1 debit", rep)
			}
			if _, err := f.db.Exec(context.Background(), tc.corrupt); err != nil {
				t.Fatal(err)
			}
			rep := f.audit()
			if rep.Balanced || len(rep.Violations) != 1 || rep.Violations[0].Check != tc.check || rep.Violations[0].Subject != tc.subject {
				t.Fatalf("audit after %q = %+v; want exactly one %s violation on %s", tc.corrupt, rep, tc.check, tc.subject)
			}
			t.Log(rep.Violations[0])
		})
	}
}

func TestLoadConfig(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	const url = "postgres://pay@127.0.0.1:5432/paydb"
	proofKeys := fencingtest.LockSigningKey().VerifyKey().String()
	receiptKeys := fencingtest.ReceiptSigningKey().VerifyKey().String()
	termsKey := fencingtest.TermsSigningKey().String()
	// plain is the comparable part of a Config; keys are checked by length.
	type plain struct {
		DatabaseURL, CloudSQLInstance string
		MaxConns                      int32
		FencingDisabled               bool
		OutboxPoll                    time.Duration
		Proofs, Receipts              int
		TermsKeyID                    string
	}
	flat := func(c paymentresource.Config) plain {
		return plain{c.DatabaseURL, c.CloudSQLInstance, c.MaxConns, c.FencingDisabled, c.OutboxPoll, c.ProofKeys.Len(), c.ReceiptKeys.Len(), c.TermsKey.ID()}
	}
	cfg, err := paymentresource.LoadConfig(env("PAYDB_URL", url, "LOCK_PROOF_KEYS", proofKeys, "RAIL_RECEIPT_KEYS", receiptKeys,
		"PAYMENT_TERMS_SIGNING_KEY", termsKey))
	if want := paymentresource.DefaultConfig(); err != nil || flat(cfg) != (plain{DatabaseURL: url, OutboxPoll: want.OutboxPoll, Proofs: 1, Receipts: 1,
		TermsKeyID: fencingtest.TermsSigningKey().ID()}) {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
	cfg, err = paymentresource.LoadConfig(env("PAYDB_URL", url, "PAYDB_INSTANCE", "p:r:i", "PAYDB_MAX_CONNS", "8",
		"PAYMENT_FENCING_ENABLED", "false", "OUTBOX_POLL_MS", "250", "RAIL_RECEIPT_KEYS", receiptKeys+","+proofKeys,
		"PAYMENT_TERMS_SIGNING_KEY", termsKey))
	if wantCfg := (plain{DatabaseURL: url, CloudSQLInstance: "p:r:i", MaxConns: 8, FencingDisabled: true,
		OutboxPoll: 250 * 1e6, Receipts: 2, TermsKeyID: fencingtest.TermsSigningKey().ID()}); err != nil || flat(cfg) != wantCfg {
		t.Errorf("all set (fencing off needs no proof keys): %+v, %v; want %+v", flat(cfg), err, wantCfg)
	}
	for _, kv := range [][]string{
		{},
		{"PAYDB_URL", "postgres://x:abc/db"},
		{"PAYDB_URL", url, "PAYDB_MAX_CONNS", "many"},
		{"PAYDB_URL", url, "PAYDB_MAX_CONNS", "-1"},
		{"PAYDB_URL", url, "PAYDB_MAX_CONNS", "1"},
		{"PAYDB_URL", url, "PAYMENT_FENCING_ENABLED", "maybe"},
		{"PAYDB_URL", url, "OUTBOX_POLL_MS", "0"},
		{"PAYDB_URL", url, "OUTBOX_POLL_MS", "5"},
		{"PAYDB_URL", url, "OUTBOX_POLL_MS", "1s"},
		{"PAYDB_URL", url, "LOCK_PROOF_KEYS", proofKeys, "RAIL_RECEIPT_KEYS", ""},       // no receipt keys
		{"PAYDB_URL", url, "RAIL_RECEIPT_KEYS", receiptKeys, "LOCK_PROOF_KEYS", ""},     // fencing on, no proof keys
		{"PAYDB_URL", url, "RAIL_RECEIPT_KEYS", receiptKeys, "LOCK_PROOF_KEYS", "k1:x"}, // a bad key
		// A secret key where a public one goes: refused, and not echoed.
		{"PAYDB_URL", url, "LOCK_PROOF_KEYS", proofKeys, "RAIL_RECEIPT_KEYS", fencingtest.ReceiptSigningKey().String()},
		// Everything but the payout-terms key, then a public key in its place.
		{"PAYDB_URL", url, "LOCK_PROOF_KEYS", proofKeys, "RAIL_RECEIPT_KEYS", receiptKeys, "PAYMENT_TERMS_SIGNING_KEY", ""},
		{"PAYDB_URL", url, "LOCK_PROOF_KEYS", proofKeys, "RAIL_RECEIPT_KEYS", receiptKeys, "PAYMENT_TERMS_SIGNING_KEY", fencingtest.TermsSigningKey().VerifyKey().String()},
	} {
		_, err := paymentresource.LoadConfig(env(kv...))
		if !errors.Is(err, paymentresource.ErrInvalidConfig) {
			t.Errorf("LoadConfig(%q) error = %v; want ErrInvalidConfig", kv, err)
			continue
		}
		// The message names the variable to fix, not a Go field.
		if name := kv[max(len(kv)-2, 0):]; len(name) == 2 && !strings.Contains(err.Error(), name[0]) {
			t.Errorf("LoadConfig(%q) error %q does not name %s", kv, err, name[0])
		}
		if secret := fencingtest.ReceiptSigningKey().String(); strings.Contains(err.Error(), secret[len(secret)-20:]) {
			t.Errorf("LoadConfig error %q echoes a secret key", err)
		}
	}
	if _, err := paymentresource.New(context.Background(), paymentresource.Config{DatabaseURL: url}, nil, slog.Default()); !errors.Is(err, paymentresource.ErrInvalidConfig) {
		t.Errorf("New without a publisher: %v; want ErrInvalidConfig", err)
	}
	// The zero value is not the defaults: it is refused, naming what to set.
	if err := (paymentresource.Config{DatabaseURL: url}).Validate(); !errors.Is(err, paymentresource.ErrInvalidConfig) || !strings.Contains(err.Error(), "OUTBOX_POLL_MS") {
		t.Errorf("Validate(zero OutboxPoll) = %v; want ErrInvalidConfig naming OUTBOX_POLL_MS", err)
	}
}

// TestLoadConfigReportsEveryInvalidVariable: one run of LoadConfig names
// every variable to fix (two that do not parse, one missing), not only the
// first.
func TestLoadConfigReportsEveryInvalidVariable(t *testing.T) {
	env := map[string]string{api.EnvMaxConns: "many", api.EnvFencingEnabled: "maybe"}
	_, err := paymentresource.LoadConfig(func(k string) string { return env[k] })
	if !errors.Is(err, paymentresource.ErrInvalidConfig) {
		t.Fatalf("LoadConfig error = %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{api.EnvDatabaseURL, api.EnvMaxConns, api.EnvFencingEnabled} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("LoadConfig error %q does not name %s", err, name)
		}
	}
}

// TestEnvNamesListsEveryVariableLoadConfigReads keeps the list the unknown
// variable warning uses equal to what LoadConfig reads.
func TestEnvNamesListsEveryVariableLoadConfigReads(t *testing.T) {
	read := map[string]bool{}
	_, _ = paymentresource.LoadConfig(func(k string) string { read[k] = true; return "" })
	names := paymentresource.EnvNames()
	for k := range read {
		if !slices.Contains(names, k) {
			t.Errorf("LoadConfig reads %s, EnvNames does not list it", k)
		}
	}
	if len(names) != len(read) {
		t.Errorf("EnvNames = %v, LoadConfig reads %v", names, read)
	}
}

// Holders racing on one payout, each with its own token and rail
// reference, post it at most once with fencing on; concurrent creates of
// one payout write one outbox row.
func TestConcurrentHoldersPostAtMostOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 100_000)
	const holders = 8
	var wg sync.WaitGroup
	for i := 0; i < holders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, body := f.do("POST", "/v1/payouts", `{"payoutId":"p-1","accountId":"acct-1","amountMinor":700,"currency":"EUR"}`)
			if st != http.StatusCreated && st != http.StatusOK {
				t.Errorf("concurrent create: %d %s", st, body)
			}
		}()
	}
	wg.Wait()
	if n := f.count("outbox"); n != 1 {
		t.Fatalf("outbox rows after %d concurrent creates = %d, want 1", holders, n)
	}
	f.payouts["p-1"] = api.PayoutRequest{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 700, Currency: "EUR"} // for do's signing
	code := func(body []byte) api.Code {                                                                          // not decode: no t.Fatal off the test goroutine
		var env api.ErrorEnvelope
		if err := json.Unmarshal(body, &env); err != nil {
			return api.Code(fmt.Sprintf("undecodable %q", body))
		}
		return env.Error.Code
	}
	codes := make(chan api.Code, holders)
	for i := 1; i <= holders; i++ {
		wg.Add(1)
		go func(token int64) {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", token)
			if st, body := f.claim("p-1", token, owner); st != http.StatusOK {
				codes <- "claim:" + code(body)
				return
			}
			st, body := f.result("p-1", token, owner, "ACK", fmt.Sprintf("rail-%d", token))
			if st != http.StatusOK {
				codes <- "ack:" + code(body)
				return
			}
			codes <- "posted"
		}(int64(i))
	}
	wg.Wait()
	close(codes)
	posted := 0
	for c := range codes {
		switch c {
		case "posted":
			posted++
		case "claim:" + api.CodeFencedOut, "claim:" + api.CodePayoutFinished,
			"ack:" + api.CodeFencedOut, "ack:" + api.CodePayoutFinished:
		default:
			t.Errorf("unexpected answer %s", c)
		}
	}
	if posted != 1 {
		t.Errorf("%d holders posted, want exactly 1", posted)
	}
	if p := f.payout("p-1"); p.Debits != 1 {
		t.Errorf("debits %d, want 1", p.Debits)
	}
	if a := f.account("acct-1"); a.BalanceMinor != 99_300 {
		t.Errorf("balance %d, want 99300", a.BalanceMinor)
	}
	if rep := f.audit(); !rep.Balanced {
		t.Errorf("audit = %+v", rep)
	}
}

// TestDecodingCodesAreTheAPIs checks that the codes internal/jsonhandler
// answers with while decoding a body are spelled as the api declares them:
// the handler passes them through unchanged.
func TestDecodingCodesAreTheAPIs(t *testing.T) {
	for got, want := range map[string]api.Code{
		jsonhandler.CodeInvalidRequest:       api.CodeInvalidRequest,
		jsonhandler.CodeBodyTooLarge:         api.CodeBodyTooLarge,
		jsonhandler.CodeUnsupportedMediaType: api.CodeUnsupportedMediaType,
	} {
		if api.Code(got) != want {
			t.Errorf("jsonhandler answers %q where the api declares %q", got, want)
		}
	}
}
