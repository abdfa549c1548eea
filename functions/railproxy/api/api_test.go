package api_test

import (
	"net/http"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// TestPathsMatchTheirPatterns checks that each path builder produces a path
// its route pattern matches, with the id where the route expects it.
func TestPathsMatchTheirPatterns(t *testing.T) {
	for _, tc := range []struct{ pattern, path, id string }{
		{api.PathHighWater, api.HighWaterPath("acct:7.a_b"), "acct:7.a_b"},
		{api.PathAttempts, api.AttemptsPath("p-1&x=y"), "p-1&x=y"},
	} {
		mux := http.NewServeMux()
		var id string
		mux.HandleFunc(tc.pattern, func(_ http.ResponseWriter, r *http.Request) {
			id = r.PathValue("accountId") + r.URL.Query().Get(api.QueryPayoutID)
		})
		r, err := http.NewRequest(http.MethodGet, "http://h"+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, p := mux.Handler(r); p != tc.pattern {
			t.Errorf("%s is routed to %q, want %q", tc.path, p, tc.pattern)
		}
		mux.ServeHTTP(nopWriter{}, r)
		if id != tc.id {
			t.Errorf("%s: id %q from %s, want %q", tc.pattern, id, tc.path, tc.id)
		}
	}
	if got := api.HighWaterPath("a/b"); got != "/v1/rail/high-water/a%2Fb" {
		t.Errorf("HighWaterPath(a/b) = %q; the id must be escaped", got)
	}
}

type nopWriter struct{}

func (nopWriter) Header() http.Header         { return http.Header{} }
func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (nopWriter) WriteHeader(int)             {}

func TestRetryableCodes(t *testing.T) {
	for _, c := range api.Codes {
		want := c == api.CodeUnavailable || c == api.CodeOverloaded || c == api.CodeRestored || c == api.CodeAttemptInFlight ||
			c == api.CodeRailNotReached || c == api.CodeTermsKeyUnknown
		if got := c.Retryable(); got != want {
			t.Errorf("%s.Retryable() = %v, want %v", c, got, want)
		}
	}
}

func TestValidation(t *testing.T) {
	ok := api.SubmitRequest{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 1, Currency: "EUR"}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid request refused: %v", err)
	}
	max := ok
	max.AmountMinor = api.MaxAmountMinor
	if err := max.Validate(); err != nil {
		t.Errorf("amount at the bound refused: %v", err)
	}
	for name, mutate := range map[string]func(*api.SubmitRequest){
		"no payout id":          func(r *api.SubmitRequest) { r.PayoutID = "" },
		"payout id too long":    func(r *api.SubmitRequest) { r.PayoutID = string(make([]byte, api.MaxPayoutIDLen+1)) },
		"account id with slash": func(r *api.SubmitRequest) { r.AccountID = "a/b" },
		"amount 0":              func(r *api.SubmitRequest) { r.AmountMinor = 0 },
		"amount above bound":    func(r *api.SubmitRequest) { r.AmountMinor = api.MaxAmountMinor + 1 },
		"lower-case currency":   func(r *api.SubmitRequest) { r.Currency = "eur" },
	} {
		r := ok
		mutate(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if api.ValidateToken(0) == nil || api.ValidateToken(-3) == nil || api.ValidateToken(1) != nil {
		t.Error("ValidateToken accepts only positive tokens")
	}
}
