package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// TestPathsMatchTheirPatterns checks that each path builder produces a path
// its route pattern matches, with the id as the pattern's {id}.
func TestPathsMatchTheirPatterns(t *testing.T) {
	for _, tc := range []struct{ pattern, path string }{
		{api.PathAccount, api.AccountPath("acct-7")},
		{api.PathPayout, api.PayoutPath("p:1.a_b")},
		{api.PathClaim, api.ClaimPath("p-1")},
		{api.PathResult, api.ResultPath("p-1")},
	} {
		mux := http.NewServeMux()
		var id string
		mux.HandleFunc(tc.pattern, func(_ http.ResponseWriter, r *http.Request) { id = r.PathValue("id") })
		r, _ := http.NewRequest(http.MethodGet, "http://h"+tc.path, nil)
		if _, p := mux.Handler(r); p != tc.pattern {
			t.Errorf("%s is routed to %q, want %q", tc.path, p, tc.pattern)
		}
		mux.ServeHTTP(nopWriter{}, r)
		if id == "" {
			t.Errorf("%s: no id in %s", tc.pattern, tc.path)
		}
	}
	if got := api.PayoutPath("a/b"); got != "/v1/payouts/a%2Fb" {
		t.Errorf("PayoutPath(a/b) = %q; the id must be escaped", got)
	}
}

type nopWriter struct{}

func (nopWriter) Header() http.Header         { return http.Header{} }
func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (nopWriter) WriteHeader(int)             {}

func TestOnlyTheTwo503sAreRetryable(t *testing.T) {
	for _, c := range api.Codes {
		if got := c.Retryable(); got != (c == api.CodeUnavailable || c == api.CodeOverloaded) {
			t.Errorf("%s.Retryable() = %v", c, got)
		}
	}
}

func TestValidation(t *testing.T) {
	zero, neg, huge := int64(0), int64(-1), api.MaxAmountMinor+1
	for name, err := range map[string]error{
		"account with zero opening":     api.AccountRequest{AccountID: "a", Currency: "EUR", OpeningBalanceMinor: &zero}.Validate(),
		"payout of 1":                   api.PayoutRequest{PayoutID: "p", AccountID: "a", AmountMinor: 1, Currency: "EUR"}.Validate(),
		"ambiguous without railRef":     api.ResultRequest{Outcome: api.OutcomeAmbiguous}.Validate(1),
		"ack with an earlier railToken": api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "r", RailToken: 3}.Validate(5),
	} {
		if err != nil {
			t.Errorf("%s refused: %v", name, err)
		}
	}
	// A byte that is not ASCII is named escaped (a probe found
	// it printed as a Latin-1 character).
	if err := (api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "r\xc3\xa9"}.Validate(1)); err == nil || !strings.Contains(err.Error(), `byte "\xc3" at offset 1`) {
		t.Errorf("railRef with a non-ASCII byte: %v; want it named \"\\xc3\"", err)
	}
	for name, err := range map[string]error{
		"account without opening":   api.AccountRequest{AccountID: "a", Currency: "EUR"}.Validate(),
		"account with negative":     api.AccountRequest{AccountID: "a", Currency: "EUR", OpeningBalanceMinor: &neg}.Validate(),
		"account above the bound":   api.AccountRequest{AccountID: "a", Currency: "EUR", OpeningBalanceMinor: &huge}.Validate(),
		"account id with a space":   api.AccountRequest{AccountID: "a b", Currency: "EUR", OpeningBalanceMinor: &zero}.Validate(),
		"payout of 0":               api.PayoutRequest{PayoutID: "p", AccountID: "a", Currency: "EUR"}.Validate(),
		"payout in lower case":      api.PayoutRequest{PayoutID: "p", AccountID: "a", AmountMinor: 1, Currency: "eur"}.Validate(),
		"unknown outcome":           api.ResultRequest{Outcome: "MAYBE", RailRef: "r"}.Validate(1),
		"decline without railRef":   api.ResultRequest{Outcome: api.OutcomeDecline}.Validate(1),
		"railToken above the token": api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "r", RailToken: 6}.Validate(5),
		"railRef with a space":      api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "r 1"}.Validate(1),
		"railRef too long":          api.ResultRequest{Outcome: api.OutcomeAck, RailRef: string(make([]byte, api.MaxRailRefLen+1))}.Validate(1),
		"token 0":                   api.ValidateToken(0),
		"payout id of 129 bytes":    api.ValidatePayoutID(string(make([]byte, api.MaxPayoutIDLen+1))),
	} {
		if err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
