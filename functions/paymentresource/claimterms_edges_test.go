package paymentresource_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// The claim's terms are compared byte for byte with the payout's, and a
// body that is not three well-formed terms is refused before the row is
// read: an account in another case, a currency in lower case, an amount
// at or past int64's edges, a key given twice or spelled in another case,
// all change nothing, whatever the token and the payout's state. Terms
// that match do not skip the fence: a stale holder with the payout's
// terms is still FENCED_OUT.
func TestClaimTermsEdgesChangeNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	f.createPayout("p-1", "acct-1", 700, "EUR")
	f.createPayout("p-doubt", "acct-1", 100, "EUR")
	st, body := f.claim("p-1", 8, "w")
	want(t, "claim p-1", st, body, http.StatusOK, "")
	st, body = f.claim("p-doubt", 8, "w")
	want(t, "claim p-doubt", st, body, http.StatusOK, "")
	st, body = f.result("p-doubt", 8, "w", "AMBIGUOUS", "rail-d")
	want(t, "AMBIGUOUS p-doubt", st, body, http.StatusOK, "")
	before := f.snapshot()
	terms := func(account, amount, currency string) string {
		return fmt.Sprintf(`{"accountId":%s,"amountMinor":%s,"currency":%s}`, account, amount, currency)
	}
	conflict, bad := http.StatusConflict, http.StatusBadRequest
	for _, c := range []struct {
		name, payout, body string
		token              int64
		status             int
		code               api.Code
	}{
		{"stale token, the payout's terms", "p-1", terms(`"acct-1"`, "700", `"EUR"`), 3, conflict, api.CodeFencedOut},
		{"account in upper case", "p-1", terms(`"ACCT-1"`, "700", `"EUR"`), 9, conflict, api.CodePayoutTermsMismatch},
		{"account with a space", "p-1", terms(`" acct-1"`, "700", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"account with a unicode hyphen", "p-1", terms(`"acct\u20101"`, "700", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"currency in lower case", "p-1", terms(`"acct-1"`, "700", `"eur"`), 9, bad, api.CodeInvalidRequest},
		{"amount int64 max", "p-1", terms(`"acct-1"`, "9223372036854775807", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"amount past int64", "p-1", terms(`"acct-1"`, "9223372036854775808", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"amount 700 plus 2^64", "p-1", terms(`"acct-1"`, "18446744073709552316", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"amount int64 min", "p-1", terms(`"acct-1"`, "-9223372036854775808", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"amount as a float", "p-1", terms(`"acct-1"`, "700.0", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"amount in exponent form", "p-1", terms(`"acct-1"`, "7e2", `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"amount as a string", "p-1", terms(`"acct-1"`, `"700"`, `"EUR"`), 9, bad, api.CodeInvalidRequest},
		{"account given twice", "p-1", `{"accountId":"acct-2","accountId":"acct-1","amountMinor":700,"currency":"EUR"}`, 9, bad, api.CodeInvalidRequest},
		{"key in another case", "p-1", `{"AccountId":"acct-1","amountMinor":700,"currency":"EUR"}`, 9, bad, api.CodeInvalidRequest},
		{"terms and an unknown field", "p-1", `{"accountId":"acct-1","amountMinor":700,"currency":"EUR","force":true}`, 9, bad, api.CodeInvalidRequest},
		{"only the amount", "p-1", `{"amountMinor":700}`, 9, bad, api.CodeInvalidRequest},
		{"terms, then more JSON", "p-1", terms(`"acct-1"`, "700", `"EUR"`) + `{}`, 9, bad, api.CodeInvalidRequest},
		{"other amount, payout in doubt", "p-doubt", terms(`"acct-1"`, "101", `"EUR"`), 9, conflict, api.CodePayoutTermsMismatch},
		{"the payout's terms, payout in doubt", "p-doubt", terms(`"acct-1"`, "100", `"EUR"`), 9, conflict, api.CodePayoutInDoubt},
	} {
		st, body := f.do("POST", "/v1/payouts/"+c.payout+"/claim", c.body,
			fencewire.HeaderToken, strconv.FormatInt(c.token, 10), fencewire.HeaderOwner, "forger")
		want(t, c.name, st, body, c.status, c.code)
		if after := f.snapshot(); after != before {
			t.Fatalf("%s changed paydb:\nbefore %s\nafter  %s", c.name, before, after)
		}
	}
	// Backward compatible: an empty body and {} claim without comparing.
	for i, b := range []string{"", "{}", " \n"} {
		st, body := f.do("POST", "/v1/payouts/p-1/claim", b,
			fencewire.HeaderToken, strconv.Itoa(10+i), fencewire.HeaderOwner, "w")
		want(t, fmt.Sprintf("claim with body %q", b), st, body, http.StatusOK, "")
	}
}
