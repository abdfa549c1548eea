package paymentresource_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload/overloadtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

// Newcomer probe. With paydb frozen, a
// malformed body was answered 503 DATABASE_UNAVAILABLE: the stall breaker
// ran before the body was read. And GET /v1/audit ran outside the
// breaker's early cut, waiting out the whole RequestTimeout. Now the audit
// that meets the frozen paydb is cut like every route (503
// DATABASE_UNAVAILABLE with Retry-After, before RequestTimeout), and while
// paydb is marked stalled every bad request still gets its own 4xx code
// (nothing done), while a good one gets the breaker's fast 503.
func TestBadInputDuringAPaydbStallGetsItsOwn4xx(t *testing.T) {
	cluster := pgtest.NewCluster(t)
	if err := cluster.CreateDatabase(t.Context(), "paydb"); err != nil {
		t.Fatal(err)
	}
	clock := overloadtest.NewClock(time.Unix(1_790_000_000, 0))
	f := newFixtureOn(t, cluster.DSN("paydb"), newPublisher(nil), func(c *paymentresource.Config) {
		c.Now, c.StallAfter = clock.Now, overload.DefaultStallAfter
	})
	t.Cleanup(func() { _ = cluster.Thaw() }) // before the fixture's Close
	reg := prometheus.NewRegistry()
	reg.MustRegister(paymentresource.Collectors()...)
	f.createAccount("acct-7", "EUR", 100_000)
	f.createPayout("p-1", "acct-7", 2500, "EUR")
	before := f.snapshot()
	if err := cluster.Freeze(); err != nil {
		t.Fatal(err)
	}

	// Finding 2: the audit is behind the breaker like every paydb route.
	audit := func(what string) {
		t.Helper()
		w := httptest.NewRecorder()
		start := time.Now()
		f.h.ServeHTTP(w, httptest.NewRequest("GET", api.PathAudit, nil))
		took := time.Since(start)
		want(t, what, w.Code, w.Body.Bytes(), http.StatusServiceUnavailable, api.CodeUnavailable)
		if ra := w.Header().Get("Retry-After"); ra != "1" {
			t.Fatalf("%s: Retry-After %q; want 1", what, ra)
		}
		if took >= paymentresource.RequestTimeout {
			t.Fatalf("%s: answered after %v; want it cut when paydb is found stalled, before the %v RequestTimeout",
				what, took.Round(time.Millisecond), paymentresource.RequestTimeout)
		}
		t.Logf("%s: 503 after %v", what, took.Round(time.Millisecond))
	}
	audit("GET /v1/audit meeting the frozen paydb")
	if overloadtest.Gauge(t, reg, "paymentresource_db_stalled") != 1 {
		t.Fatal("paydb is not marked stalled after the audit was cut")
	}
	shedBefore := shedLines(t, f)
	audit("GET /v1/audit while paydb is marked stalled")
	if n := shedLines(t, f) - shedBefore; n != 1 {
		t.Fatalf("the second audit: %d requests refused by the breaker; want 1 (not sent to paydb)", n)
	}

	// Finding 1: bad input gets its own 4xx whatever paydb's state. The
	// clock stands still: no probe is due, so anything admitted to paydb
	// work would be answered 503 by the breaker.
	tok := []string{fencewire.HeaderToken, "5", fencewire.HeaderOwner, "w"}
	// A proof's form is judged without paydb (found by a later
	// probe): only its signature needs the payout's account. noProof
	// cases go unsigned (f.raw), badProof ones carry a proof no key could
	// verify.
	badProof := append([]string{fencewire.HeaderProof, "v1.17.not-a-signature"}, tok...)
	const noProof = "no proof"
	for _, tc := range []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code                     api.Code
	}{
		{"claim: " + noProof, "POST", api.ClaimPath("p-1"), ``, tok, http.StatusForbidden, api.CodeUnverifiedToken},
		{"claim: malformed proof", "POST", api.ClaimPath("p-1"), ``, badProof, http.StatusForbidden, api.CodeUnverifiedToken},
		{"claim: proof that is not v1", "POST", api.ClaimPath("p-1"), ``, append([]string{fencewire.HeaderProof, "x"}, tok...), http.StatusForbidden, api.CodeUnverifiedToken},
		{"result: " + noProof, "POST", api.ResultPath("p-1"), `{"outcome":"AMBIGUOUS","railRef":""}`, tok, http.StatusForbidden, api.CodeUnverifiedToken},
		{"result: malformed proof", "POST", api.ResultPath("p-1"), `{"outcome":"AMBIGUOUS","railRef":""}`, badProof, http.StatusForbidden, api.CodeUnverifiedToken},
		{"attention: " + noProof, "POST", api.AttentionPath("p-1"), `{"reason":"payment_fence_ahead"}`, tok, http.StatusForbidden, api.CodeUnverifiedToken},
		{"attention: malformed proof", "POST", api.AttentionPath("p-1"), `{"reason":"payment_fence_ahead"}`, badProof, http.StatusForbidden, api.CodeUnverifiedToken},
		{"resolution: malformed proof", "POST", api.ResolutionPath("p-1"), `{}`, badProof, http.StatusForbidden, api.CodeUnverifiedToken},
		{"account: malformed JSON", "POST", api.PathAccounts, `{"accountId":`, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"account: unassigned currency", "POST", api.PathAccounts, `{"accountId":"a-2","currency":"ZZZ","openingBalanceMinor":1}`, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"account: text body", "POST", api.PathAccounts, `x`, []string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType, api.CodeUnsupportedMediaType},
		{"account: query parameter", "POST", api.PathAccounts + "?foo=1", `{"accountId":"a-2","currency":"EUR","openingBalanceMinor":1}`, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"get account: bad id", "GET", "/v1/accounts/-x", ``, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"payout: not JSON", "POST", api.PathPayouts, `not json`, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"payout: zero amount", "POST", api.PathPayouts, `{"payoutId":"p-9","accountId":"acct-7","amountMinor":0,"currency":"EUR"}`, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"list: unknown state", "GET", api.PathPayouts + "?state=gone", ``, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"claim: malformed body", "POST", api.ClaimPath("p-1"), `{"x"`, tok, http.StatusBadRequest, api.CodeInvalidRequest},
		{"claim: missing token", "POST", api.ClaimPath("p-1"), ``, nil, http.StatusBadRequest, api.CodeInvalidToken},
		{"result: unknown outcome", "POST", api.ResultPath("p-1"), `{"outcome":"PAID","railRef":"r-1"}`, tok, http.StatusBadRequest, api.CodeInvalidRequest},
		{"result: malformed JSON", "POST", api.ResultPath("p-1"), `{"outcome":`, tok, http.StatusBadRequest, api.CodeInvalidRequest},
		{"attention: empty object", "POST", api.AttentionPath("p-1"), `{}`, tok, http.StatusBadRequest, api.CodeInvalidRequest},
		{"resolution: malformed JSON", "POST", api.ResolutionPath("p-1"), `[`, tok, http.StatusBadRequest, api.CodeInvalidRequest},
		{"audit: query parameter", "GET", api.PathAudit + "?full=1", ``, nil, http.StatusBadRequest, api.CodeInvalidRequest},
		{"audit: wrong method", "POST", api.PathAudit, `{}`, nil, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed},
		{"no such route", "GET", "/v2/payouts", ``, nil, http.StatusNotFound, api.CodeNotFound},
	} {
		shedBefore := shedLines(t, f)
		f.raw = strings.HasSuffix(tc.name, noProof)
		st, body := f.do(tc.method, tc.path, tc.body, tc.headers...)
		f.raw = false
		want(t, tc.name+" while paydb is stalled", st, body, tc.status, tc.code)
		if n := shedLines(t, f) - shedBefore; n != 0 {
			t.Fatalf("%s: reached the breaker", tc.name)
		}
	}
	// The breaker still answers a good request at once.
	st, body := f.claim("p-1", 5, "w")
	want(t, "a good claim while paydb is stalled", st, body, http.StatusServiceUnavailable, api.CodeUnavailable)

	if err := cluster.Thaw(); err != nil {
		t.Fatal(err)
	}
	awaitPaydbFound(t, f, clock)
	if after := f.snapshot(); after != before {
		t.Fatalf("the refused requests changed paydb:\nbefore %s\nafter  %s", before, after)
	}
}

// Newcomer probe: a query parameter on a POST
// route (and on a GET route that takes none) was ignored, so that
// "POST /v1/accounts?dryRun=1" created the account. Now every such request
// is refused 400 INVALID_REQUEST, the code the list of payouts already
// gives an unknown parameter, and changes nothing.
func TestQueryParametersOnRoutesThatTakeNoneAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	before := f.snapshot()
	tok := []string{fencewire.HeaderToken, "5", fencewire.HeaderOwner, "w"}
	for _, tc := range []struct {
		name, method, path, body string
		headers                  []string
	}{
		{"create account", "POST", api.PathAccounts + "?dryRun=1", `{"accountId":"a-2","currency":"EUR","openingBalanceMinor":1}`, nil},
		{"create payout", "POST", api.PathPayouts + "?foo=1", `{"payoutId":"p-2","accountId":"acct-1","amountMinor":5,"currency":"EUR"}`, nil},
		{"claim", "POST", api.ClaimPath("p-1") + "?force=true", ``, tok},
		{"claim, malformed query", "POST", api.ClaimPath("p-1") + "?a=%zz", ``, tok},
		{"attention", "POST", api.AttentionPath("p-1") + "?x", `{"reason":"` + string(api.AttentionReasons[0]) + `"}`, tok},
		{"get account", "GET", api.AccountPath("acct-1") + "?fields=balance", ``, nil},
		{"get payout", "GET", api.PayoutPath("p-1") + "?expand=1", ``, nil},
		{"audit", "GET", api.PathAudit + "?foo=1", ``, nil},
	} {
		st, body := f.do(tc.method, tc.path, tc.body, tc.headers...)
		want(t, tc.name, st, body, http.StatusBadRequest, api.CodeInvalidRequest)
		if env := decode[api.ErrorEnvelope](t, body); !strings.Contains(env.Error.Message, "query") {
			t.Errorf("%s: message %q does not say the query is what was refused", tc.name, env.Error.Message)
		}
		if after := f.snapshot(); after != before {
			t.Fatalf("%s changed paydb:\nbefore %s\nafter  %s", tc.name, before, after)
		}
	}
	// The same requests without the query are served.
	st, body := f.claim("p-1", 5, "w")
	want(t, "claim without a query", st, body, http.StatusOK, "")
}

// Newcomer probe: an idempotent create with other
// terms was answered 409 with the stored payout's amount, currency and
// account, or the account's opening balance: anyone who guessed an id
// learnt another's terms. Now the message names the fields that differ
// and never their stored values. INSUFFICIENT_FUNDS no longer tells the
// account's available balance, nor CURRENCY_MISMATCH its currency.
func TestConflictAnswersDoNotRevealTheStoredTerms(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-secret", "GBP", 987_654)
	f.createAccount("acct-other", "GBP", 10)
	f.createPayout("p-1", "acct-secret", 43_210, "GBP")
	for _, tc := range []struct {
		name, path, body string
		code             api.Code
		fields, secrets  []string
	}{
		{"account: other opening balance", api.PathAccounts, `{"accountId":"acct-secret","currency":"GBP","openingBalanceMinor":1}`,
			api.CodeAccountConflict, []string{"openingBalanceMinor"}, []string{"987654"}},
		{"account: other currency", api.PathAccounts, `{"accountId":"acct-secret","currency":"EUR","openingBalanceMinor":987654}`,
			api.CodeAccountConflict, []string{"currency"}, []string{"GBP"}},
		{"payout: other amount, within the balance", api.PathPayouts, `{"payoutId":"p-1","accountId":"acct-secret","amountMinor":1,"currency":"GBP"}`,
			api.CodePayoutConflict, []string{"amountMinor"}, []string{"43210", "987654"}},
		{"payout: other amount, beyond the balance", api.PathPayouts, `{"payoutId":"p-1","accountId":"acct-secret","amountMinor":99999999,"currency":"GBP"}`,
			api.CodePayoutConflict, []string{"amountMinor"}, []string{"43210", "987654", "944444"}},
		{"payout: other account", api.PathPayouts, `{"payoutId":"p-1","accountId":"acct-other","amountMinor":5,"currency":"GBP"}`,
			api.CodePayoutConflict, []string{"accountId", "amountMinor"}, []string{"acct-secret", "43210"}},
		// The same leak one code over: a new payout above the available
		// balance said how much was available.
		{"new payout above the available balance", api.PathPayouts, `{"payoutId":"p-2","accountId":"acct-secret","amountMinor":99999999,"currency":"GBP"}`,
			api.CodeInsufficientFunds, []string{"available balance"}, []string{"944444", "987654"}},
		{"new payout in another currency", api.PathPayouts, `{"payoutId":"p-2","accountId":"acct-secret","amountMinor":1,"currency":"EUR"}`,
			api.CodeCurrencyMismatch, []string{"currency"}, []string{"GBP"}},
	} {
		st, body := f.do("POST", tc.path, tc.body)
		status := http.StatusConflict
		if tc.code == api.CodeCurrencyMismatch {
			status = http.StatusUnprocessableEntity
		}
		want(t, tc.name, st, body, status, tc.code)
		msg := decode[api.ErrorEnvelope](t, body).Error.Message
		for _, field := range tc.fields {
			if !strings.Contains(msg, field) {
				t.Errorf("%s: message %q does not name the differing field %s", tc.name, msg, field)
			}
		}
		for _, s := range tc.secrets {
			if strings.Contains(string(body), s) {
				t.Errorf("%s: answer %s reveals the stored %q", tc.name, body, s)
			}
		}
	}
}
