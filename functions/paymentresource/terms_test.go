package paymentresource_test

import (
	"net/http"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// Rail-proxy forwards only terms payment-resource
// signed, so every payout answer an executor may read (the create, the
// read, the claim) carries payment-resource's signature over exactly the
// payout's id, account, amount and currency, and over nothing else.
func TestEveryPayoutAnswerCarriesItsSignedTerms(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	terms := fencewire.PayoutTerms{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 700, Currency: "EUR"}
	check := func(what string, p api.Payout) {
		t.Helper()
		if _, err := fencingtest.TermsKeys().Verify(p.TermsSignature, fencewire.PayoutTermsDomain, terms.Fields()...); err != nil {
			t.Errorf("%s: terms signature %q does not verify over %+v: %v", what, p.TermsSignature, terms, err)
		}
		other := terms
		other.AmountMinor++
		if _, err := fencingtest.TermsKeys().Verify(p.TermsSignature, fencewire.PayoutTermsDomain, other.Fields()...); err == nil {
			t.Errorf("%s: terms signature also verifies over another amount", what)
		}
	}
	check("create", f.createPayout("p-1", "acct-1", 700, "EUR"))
	check("read", f.payout("p-1"))
	st, body := f.claim("p-1", 3, "worker-a")
	want(t, "claim", st, body, http.StatusOK, "")
	check("claim", decode[api.Payout](t, body))
	st, body = f.do("GET", api.ListPath(api.StateClaimed, 10, ""), "")
	want(t, "list", st, body, http.StatusOK, "")
	list := decode[api.PayoutList](t, body)
	if len(list.Payouts) != 1 {
		t.Fatalf("list: %+v; want p-1", list)
	}
	check("list", list.Payouts[0])
}
