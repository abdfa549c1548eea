package paymentresource_test

import (
	"net/http"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// TestListPayoutsPagesAndRefusesBadQueries: GET /v1/payouts?state=S lists
// one state in pages, and a bad query is a 400 with the envelope, never a
// 5xx.
func TestListPayoutsPagesAndRefusesBadQueries(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	for _, id := range []string{"p-1", "p-2", "p-3"} {
		f.createPayout(id, "acct-1", 100, "EUR")
		if st, body := f.claim(id, 5, "w"); st != http.StatusOK {
			t.Fatalf("claim %s: %d %s", id, st, body)
		}
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatalf("more than 3 pages of 1: %v", got)
		}
		st, body := f.do("GET", api.ListPath(api.StateClaimed, 1, after), "")
		want(t, "list", st, body, http.StatusOK, "")
		list := decode[api.PayoutList](t, body)
		for _, p := range list.Payouts {
			got = append(got, p.PayoutID)
		}
		if list.Next == "" {
			break
		}
		after = list.Next
	}
	if len(got) != 3 || got[0] != "p-1" || got[2] != "p-3" {
		t.Fatalf("listed %v; want p-1, p-2, p-3", got)
	}
	st, body := f.do("GET", api.ListPath(api.StateAmbiguous, 0, ""), "")
	want(t, "list of none", st, body, http.StatusOK, "")
	if l := decode[api.PayoutList](t, body); l.Payouts == nil || len(l.Payouts) != 0 || l.Next != "" {
		t.Fatalf("empty list: %s", body)
	}
	for _, q := range []string{
		"/v1/payouts", "/v1/payouts?state=posted", "/v1/payouts?state=claimed&limit=0", "/v1/payouts?state=claimed&limit=501",
		"/v1/payouts?state=claimed&limit=01", "/v1/payouts?state=claimed&limit=x", "/v1/payouts?state=claimed&state=claimed",
		"/v1/payouts?state=claimed&other=1", "/v1/payouts?state=claimed&after=%20",
		// Malformed pairs were dropped by url.URL.Query: "after=%zz" listed
		// from the start (200), ";" read as no state at all (newcomer
		// probe, session 7).
		"/v1/payouts?state=claimed&after=%zz", "/v1/payouts?state=claimed;limit=5",
	} {
		st, body := f.do("GET", q, "")
		want(t, q, st, body, http.StatusBadRequest, api.CodeInvalidRequest)
	}
}
