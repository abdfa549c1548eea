package paymentresource_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// At fence point one: a claim and an ACK with a token
// lock-server never issued (the maximum int64) debited the account with no
// rail submission and set its fence to the maximum. Now every fenced write
// whose token has no proof for payout:{account} is refused, and changes
// nothing: the payout, the account and the history are as before.
func TestUnverifiedTokensAreRefusedAndChangeNothing(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	f.createPayout("p-1", "acct-1", 700, "EUR")
	f.createAccount("acct-2", "EUR", 10_000)
	f.raw = true // send the headers as written
	const maxToken = 1<<63 - 1
	tok := func(v int64) string { return strconv.FormatInt(v, 10) }
	before := f.snapshot()
	for _, c := range []struct {
		name, path, body string
		headers          []string
	}{
		{"claim with no proof", "/v1/payouts/p-1/claim", "", []string{fencewire.HeaderToken, tok(maxToken)}},
		{"claim with a proof of a lower token", "/v1/payouts/p-1/claim", "",
			[]string{fencewire.HeaderToken, tok(maxToken), fencewire.HeaderProof, fencingtest.Proof("acct-1", 5)}},
		{"claim with a proof of another account's lock", "/v1/payouts/p-1/claim", "",
			[]string{fencewire.HeaderToken, tok(9), fencewire.HeaderProof, fencingtest.Proof("acct-2", 9)}},
		{"claim with two proofs", "/v1/payouts/p-1/claim", "",
			[]string{fencewire.HeaderToken, tok(9), fencewire.HeaderProof, fencingtest.Proof("acct-1", 9), fencewire.HeaderProof, fencingtest.Proof("acct-1", 9)}},
		{"ACK with no proof", "/v1/payouts/p-1/result", `{"outcome":"ACK","railRef":"r-1"}`, []string{fencewire.HeaderToken, tok(maxToken)}},
	} {
		st, body := f.do("POST", c.path, c.body, c.headers...)
		want(t, c.name, st, body, http.StatusForbidden, api.CodeUnverifiedToken)
		// Probe 15: two proofs used to read "missing proof".
		if c.name == "claim with two proofs" && !strings.Contains(string(body), "more than one") {
			t.Errorf("%s: message %s; want it to say more than one proof came", c.name, body)
		}
		if after := f.snapshot(); after != before {
			t.Fatalf("%s changed paydb:\nbefore %s\nafter  %s", c.name, before, after)
		}
	}
	if n := len(f.logs.Events(t, api.EventUnverifiedToken)); n != 5 {
		t.Errorf("%d %s events, want 5", n, api.EventUnverifiedToken)
	}
	// The real holder of acct-1's lock is not locked out.
	f.raw = false
	st, body := f.claim("p-1", 5, "w")
	want(t, "the real holder's claim", st, body, http.StatusOK, "")
}

// A holder recorded the rail's next reference as its
// own payout's DECLINE, and a later payout that the rail paid under that
// reference then failed RAIL_REF_CONFLICT with money gone and no debit. Now
// an ACK or DECLINE is recorded only with rail-proxy's receipt over exactly
// this payout, outcome, reference and rail token.
func TestResultsWithoutRailProxysReceiptAreRefusedAndChangeNothing(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	f.createPayout("p-1", "acct-1", 700, "EUR")
	f.createPayout("p-2", "acct-1", 300, "EUR")
	st, body := f.claim("p-1", 5, "w")
	want(t, "claim", st, body, http.StatusOK, "")
	holder := []string{fencewire.HeaderToken, "5", fencewire.HeaderProof, fencingtest.Proof("acct-1", 5)}
	receipt := func(r fencewire.RailReceipt) string { return fencingtest.Receipt(r) }
	honest := fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 700, Currency: "EUR", Outcome: "DECLINE", RailRef: "rail-7", RailToken: 5}
	before := f.snapshot()
	for _, c := range []struct{ name, receipt string }{
		{"no receipt", ""},
		{"the receipt of another payout", receipt(fencewire.RailReceipt{PayoutID: "p-2", AccountID: "acct-1", AmountMinor: 300, Currency: "EUR", Outcome: "DECLINE", RailRef: "rail-7", RailToken: 5})},
		{"a receipt of an ACK", receipt(fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 700, Currency: "EUR", Outcome: "ACK", RailRef: "rail-7", RailToken: 5})},
		{"a receipt of another reference", receipt(fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 700, Currency: "EUR", Outcome: "DECLINE", RailRef: "rail-6", RailToken: 5})},
		{"a receipt of another amount", receipt(fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 1, Currency: "EUR", Outcome: "DECLINE", RailRef: "rail-7", RailToken: 5})},
		{"a receipt signed by lock-server's key", fencingtest.LockSigningKey().Sign(fencewire.RailReceiptDomain, honest.Fields()...)},
	} {
		f.raw = true
		b := `{"outcome":"DECLINE","railRef":"rail-7"`
		if c.receipt != "" {
			b += `,"receipt":"` + c.receipt + `"`
		}
		st, body := f.do("POST", "/v1/payouts/p-1/result", b+"}", holder...)
		want(t, c.name, st, body, http.StatusUnprocessableEntity, api.CodeInvalidReceipt)
		if c.receipt == "" && (!strings.Contains(string(body), "no receipt") || strings.Contains(string(body), "proof")) {
			t.Errorf("%s: message %s: want it to say no receipt, not name a proof", c.name, body)
		}
		if after := f.snapshot(); after != before {
			t.Fatalf("%s changed paydb:\nbefore %s\nafter  %s", c.name, before, after)
		}
	}
	st, body = f.do("POST", "/v1/payouts/p-1/result", `{"outcome":"DECLINE","railRef":"rail-7","receipt":"`+receipt(honest)+`"}`, holder...)
	want(t, "the honest DECLINE", st, body, http.StatusOK, "")
	if p := f.payout("p-1"); p.State != api.StateDeclined || p.RailRef != "rail-7" {
		t.Fatalf("payout after the honest DECLINE: %+v", p)
	}
}

// Found by a newcomer's probe of the running stack (session 4): a token
// older than the account's last debit was still accepted on a payout
// nobody had touched since (its own fence was 0), so a stale holder could
// claim it, mark it ambiguous or needs_attention, and leave it stuck. The
// fenced payout statements now also hold the account's fence (non-strict).
func TestATokenOlderThanTheAccountsLastDebitWritesNoPayoutOfTheAccount(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	f.createPayout("p-1", "acct-1", 700, "EUR")
	st, body := f.claim("p-1", 20, "new")
	want(t, "claim p-1 with 20", st, body, http.StatusOK, "")
	st, body = f.result("p-1", 20, "new", "ACK", "rail-1")
	want(t, "ACK p-1 with 20", st, body, http.StatusOK, "")
	f.createPayout("p-2", "acct-1", 300, "EUR")
	before := f.snapshot()
	st, body = f.claim("p-2", 18, "stale")
	want(t, "claim of an untouched payout with a token older than the account's debit", st, body, http.StatusConflict, api.CodeFencedOut)
	st, body = f.do("POST", "/v1/payouts/p-2/attention", `{"reason":"payment_fence_ahead"}`, fencewire.HeaderToken, "18")
	want(t, "attention with the stale token", st, body, http.StatusConflict, api.CodeFencedOut)
	if after := f.snapshot(); after != before {
		t.Fatalf("the stale token changed paydb:\nbefore %s\nafter  %s", before, after)
	}
	st, body = f.claim("p-2", 21, "next")
	want(t, "the next holder's claim", st, body, http.StatusOK, "")
	st, body = f.result("p-2", 18, "stale", "AMBIGUOUS", "")
	want(t, "AMBIGUOUS from the stale token", st, body, http.StatusConflict, api.CodeFencedOut)
	if p := f.payout("p-2"); p.State != api.StateClaimed || p.Fence != 21 {
		t.Fatalf("p-2 after the stale writes: %s fence %d; want claimed by 21", p.State, p.Fence)
	}
}
