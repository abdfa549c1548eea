package paymentresource_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
)

// A claim carries the terms its holder means to pay (the executor: its
// payout event's). Terms that are not the payout's are refused 409
// PAYOUT_TERMS_MISMATCH and change nothing, before anything else is
// judged: with the proof of the lock the terms name (the lock a forged
// event makes the executor take), with a token below the payout's fence,
// and for a finished payout, the answer is still the mismatch, not
// UNVERIFIED_TOKEN, FENCED_OUT or PAYOUT_FINISHED. A claim without terms
// (an executor that sends none) and one with the payout's terms claim.
func TestClaimWithOtherTermsIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	pay, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	f.createAccount("acct-1", "EUR", 10_000)
	f.createAccount("acct-2", "USD", 10_000)
	f.createPayout("p-1", "acct-1", 700, "EUR")
	f.createPayout("p-done", "acct-1", 100, "EUR")
	ctx := t.Context()
	if _, err := pay.Claim(ctx, "p-1", fencingtest.Holder("acct-1", 8, "w"), api.ClaimRequest{}); err != nil {
		t.Fatal(err) // the payout's fence is 8 from here on
	}
	if st, body := f.claim("p-done", 8, "w"); st != http.StatusOK {
		t.Fatalf("claim p-done: %d %s", st, body)
	}
	if st, body := f.result("p-done", 8, "w", "DECLINE", "rail-1"); st != http.StatusOK {
		t.Fatalf("DECLINE p-done: %d %s", st, body)
	}
	before := f.snapshot()
	for _, c := range []struct {
		name    string
		payout  string
		account string // whose lock the holder's proof is of
		token   int64
		terms   api.ClaimRequest
	}{
		{"another account", "p-1", "acct-2", 9, api.ClaimRequest{AccountID: "acct-2", AmountMinor: 700, Currency: "EUR"}},
		{"another amount", "p-1", "acct-1", 9, api.ClaimRequest{AccountID: "acct-1", AmountMinor: 701, Currency: "EUR"}},
		{"another currency", "p-1", "acct-1", 9, api.ClaimRequest{AccountID: "acct-1", AmountMinor: 700, Currency: "USD"}},
		{"another amount, token below the fence", "p-1", "acct-1", 3, api.ClaimRequest{AccountID: "acct-1", AmountMinor: 1, Currency: "EUR"}},
		{"another amount, finished payout", "p-done", "acct-1", 9, api.ClaimRequest{AccountID: "acct-1", AmountMinor: 1, Currency: "EUR"}},
	} {
		_, err := pay.Claim(ctx, c.payout, fencingtest.Holder(c.account, c.token, "forger"), c.terms)
		var refusal *client.Error
		if !errors.Is(err, client.ErrTermsMismatch) || !errors.As(err, &refusal) ||
			refusal.Status != http.StatusConflict || refusal.Code != api.CodePayoutTermsMismatch {
			t.Errorf("%s: Claim = %v; want 409 %s (client.ErrTermsMismatch)", c.name, err, api.CodePayoutTermsMismatch)
		}
		if refusal != nil && (strings.Contains(refusal.Message, "acct-1") || strings.Contains(refusal.Message, "700") || strings.Contains(refusal.Message, "EUR")) {
			t.Errorf("%s: message %q tells the payout's terms; it should name the fields that differ only", c.name, refusal.Message)
		}
		if after := f.snapshot(); after != before {
			t.Fatalf("%s changed paydb:\nbefore %s\nafter  %s", c.name, before, after)
		}
	}
	p, err := pay.Claim(ctx, "p-1", fencingtest.Holder("acct-1", 9, "w"), api.ClaimRequest{AccountID: "acct-1", AmountMinor: 700, Currency: "EUR"})
	if err != nil || p.State != api.StateClaimed || p.Fence != 9 {
		t.Fatalf("claim with the payout's terms = %+v, %v; want claimed with fence 9", p, err)
	}
}
