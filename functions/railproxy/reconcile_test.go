package railproxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// reconcileAs posts a reconciliation of body (a ReconcileRequest) as the
// holder of token on account's lock, with lock-server's proof of it.
func reconcileAs(h http.Handler, account string, token int64, body string) *httptest.ResponseRecorder {
	body, sig := termsToHeader(body) // as the reconciler sends it
	req := httptest.NewRequest("POST", api.PathReconciliations, strings.NewReader(body))
	if sig != "" {
		req.Header.Set(api.HeaderTermsSignature, sig)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(fencewire.HeaderToken, strconv.FormatInt(token, 10))
	req.Header.Set(fencewire.HeaderProof, fencingtest.Proof(account, token))
	req.Header.Set(fencewire.HeaderOwner, "reconciler")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// forwardingAttempt records, by hand, a forwarded attempt of payout on
// acct-1 that stayed forwarding (its proxy died before the rail's answer
// was recorded), created age ago.
func (r *rig) forwardingAttempt(payout string, token int64, age time.Duration) int64 {
	r.t.Helper()
	ctx := r.t.Context()
	var id int64
	if err := r.pool().QueryRow(ctx, `INSERT INTO rail_attempt (payout_id, account_id, token, amount_minor, currency, state, created_at)
VALUES ($1, 'acct-1', $2, 700, 'EUR', 'forwarding', now() - $3::bigint * interval '1 millisecond') RETURNING attempt_id`,
		payout, token, age.Milliseconds()).Scan(&id); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.pool().Exec(ctx, `INSERT INTO rail_payout (payout_id, attempt_id) VALUES ($1, $2)`, payout, id); err != nil {
		r.t.Fatal(err)
	}
	return id
}

// TestReconciliationWithTheRailDownDoesNotClaimNothingReachedIt (probe
// 10): with the rail dead, a reconciliation's stop order gets no answer:
// 503 UNAVAILABLE, retryable, nothing recorded, and the message must not
// promise that nothing reached the rail (the payout's forward may have).
func TestReconciliationWithTheRailDownDoesNotClaimNothingReachedIt(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) {
		c.RailURL = deadURL(t)
		c.RailTimeout, c.DBTimeout = time.Second, time.Second
	})
	r.forwardingAttempt("po-1", 5, time.Minute)
	rec := reconcileAs(p, "acct-1", 6, `{"payoutId":"po-1"}`)
	e := envelope(t, rec)
	if rec.Code != http.StatusServiceUnavailable || e.Code != api.CodeUnavailable || !e.Retryable {
		t.Fatalf("answer %d %s; want 503 %s, retryable", rec.Code, rec.Body, api.CodeUnavailable)
	}
	if strings.Contains(e.Message, "nothing reached the rail") {
		t.Fatalf("message %q claims nothing reached the rail", e.Message)
	}
	if got := r.attemptStates(); got[api.StateForwarding] != 1 || len(got) != 1 {
		t.Fatalf("attempt states %v; want the one forwarding attempt unchanged", got)
	}
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &v) != nil {
		t.Fatalf("answer %d %s; want 200 with a body", rec.Code, rec.Body)
	}
	return v
}

// listUnsettled gets one page of PathUnsettled with query, as the holder
// of token on lockKey (with lock-server's proof of it).
func listUnsettled(h http.Handler, lockKey string, token int64, query string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", api.PathUnsettled+query, nil)
	req.Header.Set(fencewire.HeaderToken, strconv.FormatInt(token, 10))
	req.Header.Set(fencewire.HeaderProof, fencingtest.LockSigningKey().SignGrant(lockKey, token, time.Now()))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestUnsettledListsOnlyForwardedAttemptsPastTheThresholdAndNeedsAProof:
// the listing names the forwarded attempts still forwarding or ambiguous
// and older than the abandon threshold, pages by attempt id, refuses a
// token without a proof on its lock, and an attempt settled by a
// reconciliation leaves it.
func TestUnsettledListsOnlyForwardedAttemptsPastTheThresholdAndNeedsAProof(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) { c.RailTimeout, c.DBTimeout = time.Second, time.Second })
	old1 := r.forwardingAttempt("po-1", 5, time.Minute)
	old2 := r.forwardingAttempt("po-2", 6, time.Minute)
	r.forwardingAttempt("po-3", 7, 0) // young: may still be in flight
	mustAccept(t, p, "w", body("po-4", "acct-1", 100), 8)

	wantCode(t, listUnsettled(p, "payout:acct-1", 9, ""), http.StatusForbidden, api.CodeUnverifiedToken)
	wantCode(t, listUnsettled(p, api.UnsettledLockKey, 9, "?limit=0"), http.StatusBadRequest, api.CodeInvalidRequest)
	wantCode(t, listUnsettled(p, api.UnsettledLockKey, 9, "?limit=1&limit=2"), http.StatusBadRequest, api.CodeInvalidRequest)
	wantCode(t, listUnsettled(p, api.UnsettledLockKey, 9, "?state=x"), http.StatusBadRequest, api.CodeInvalidRequest)

	page := decode[api.UnsettledList](t, listUnsettled(p, api.UnsettledLockKey, 9, "?limit=1"))
	if len(page.Attempts) != 1 || page.Attempts[0].AttemptID != old1 || page.Next != old1 {
		t.Fatalf("first page %+v; want attempt %d and next %d", page, old1, old1)
	}
	page = decode[api.UnsettledList](t, listUnsettled(p, api.UnsettledLockKey, 9, "?limit=1&after="+strconv.FormatInt(old1, 10)))
	if len(page.Attempts) != 1 || page.Attempts[0].AttemptID != old2 || page.Attempts[0].PayoutID != "po-2" {
		t.Fatalf("second page %+v; want attempt %d of po-2", page, old2)
	}
	// Settled by the reconciliation (the rail has nothing: not_at_rail),
	// po-1 leaves the list.
	if rec := decode[api.Reconciliation](t, reconcileAs(p, "acct-1", 10, `{"payoutId":"po-1"}`)); rec.Outcome != api.RailNone {
		t.Fatalf("reconciliation %+v; want NONE", rec)
	}
	page = decode[api.UnsettledList](t, listUnsettled(p, api.UnsettledLockKey, 11, ""))
	if len(page.Attempts) != 1 || page.Attempts[0].AttemptID != old2 || page.Next != 0 {
		t.Fatalf("list after settling po-1: %+v; want only attempt %d, no next page", page, old2)
	}
}

// TestClosingAPayoutNeedsItsSignedTerms (the newcomer's probe of 66b68cb):
// a reconciliation carrying a payout's facts closes a payout rail-proxy
// never forwarded only for the terms payment-resource signed. Made-up
// facts (another account, another amount), or none signed, are refused
// 403 INVALID_TERMS with nothing recorded (and so no stop order at the
// rail); the payout's real signed terms close it.
func TestClosingAPayoutNeedsItsSignedTerms(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	real := api.SubmitRequest{PayoutID: "g-1", AccountID: "acct-g", AmountMinor: 500, Currency: "EUR"}
	sig := fencingtest.Terms(real.Terms())
	body := func(account string, amount int64, signature string) string {
		b, _ := json.Marshal(api.ReconcileRequest{PayoutID: "g-1", AccountID: account, AmountMinor: amount, Currency: "EUR", BodyTermsSignature: signature})
		return string(b)
	}
	unknown, err := fenceproof.GenerateSigningKey("pay-next", strings.NewReader(strings.Repeat("n", 64)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, account string
		amount        int64
		signature     string
		code          api.Code
	}{
		{"another account's lock, the real signature", "acct-h", 500, sig, api.CodeInvalidTerms},
		{"another account, no signature", "acct-h", 1, "", api.CodeTermsUnsigned},
		{"the right account, another amount", "acct-g", 1, sig, api.CodeInvalidTerms},
		{"the right facts, no signature", "acct-g", 500, "", api.CodeTermsUnsigned},
		{"the right facts, a key rail-proxy does not hold", "acct-g", 500, unknown.Sign(fencewire.PayoutTermsDomain, real.Terms().Fields()...),
			api.CodeTermsKeyUnknown},
	} {
		rec := reconcileAs(p, tc.account, 7, body(tc.account, tc.amount, tc.signature))
		if e := envelope(t, rec); rec.Code != http.StatusForbidden || e.Code != tc.code {
			t.Fatalf("%s: answer %d %s; want 403 %s", tc.name, rec.Code, rec.Body, tc.code)
		}
		// The closing attempt is recorded before the stop order is
		// sent: no row, no stop order.
		if n := r.attemptRows(); n != 0 {
			t.Fatalf("%s: %d attempt rows; want none", tc.name, n)
		}
	}
	rec := reconcileAs(p, "acct-g", 7, body("acct-g", 500, sig))
	if rec.Code != http.StatusOK {
		t.Fatalf("the payout's own signed terms: %d %s; want 200", rec.Code, rec.Body)
	}
	if got := r.attemptStates(); got[api.StateNotAtRail]+got[api.StateAmbiguous] != 1 {
		t.Fatalf("attempt states %v; want the one closing attempt", got)
	}
}

// TestAStaleTokenCannotCloseANewerHoldersPayout (newcomer probe, session
// 7): closing a never-forwarded payout takes its forward, so it passes the
// account's fence like a submission. A revoked holder's token below the
// high-water is refused 409 FENCED_OUT with one 'fenced' audit row, no
// forward and no stop order, and the live holder's submission then
// reaches the rail. The newest holder may close (its token equal to the
// high-water), and a close with a newer token raises the high-water.
func TestAStaleTokenCannotCloseANewerHoldersPayout(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "A", body("z-11", "acct-1", 700), 411) // the account's high-water is now 411
	real := api.SubmitRequest{PayoutID: "z-12", AccountID: "acct-1", AmountMinor: 9, Currency: "EUR"}
	b, _ := json.Marshal(api.ReconcileRequest{PayoutID: "z-12", AccountID: "acct-1", AmountMinor: 9, Currency: "EUR",
		BodyTermsSignature: fencingtest.Terms(real.Terms())})

	rec := reconcileAs(p, "acct-1", 66, string(b))
	if e := envelope(t, rec); rec.Code != http.StatusConflict || e.Code != api.CodeFencedOut {
		t.Fatalf("a close with the stale token 66: %d %s; want 409 %s", rec.Code, rec.Body, api.CodeFencedOut)
	}
	if got := r.attemptStates(); got[api.StateFenced] != 1 || got[api.StateNotAtRail]+got[api.StateAmbiguous] != 0 {
		t.Fatalf("attempt states after the stale close %v; want one fenced audit row and no closing attempt", got)
	}
	mustAccept(t, p, "B", body("z-12", "acct-1", 9), 421) // the live holder's payout reaches the rail

	// The newest holder may close another payout with its own token.
	other := api.SubmitRequest{PayoutID: "z-13", AccountID: "acct-1", AmountMinor: 5, Currency: "EUR"}
	b, _ = json.Marshal(api.ReconcileRequest{PayoutID: "z-13", AccountID: "acct-1", AmountMinor: 5, Currency: "EUR",
		BodyTermsSignature: fencingtest.Terms(other.Terms())})
	if rec := reconcileAs(p, "acct-1", 421, string(b)); rec.Code != http.StatusOK {
		t.Fatalf("a close with the high-water's own token 421: %d %s; want 200", rec.Code, rec.Body)
	}
	// A close with a newer token raises the high-water: 421 is stale now.
	third := api.SubmitRequest{PayoutID: "z-14", AccountID: "acct-1", AmountMinor: 4, Currency: "EUR"}
	b, _ = json.Marshal(api.ReconcileRequest{PayoutID: "z-14", AccountID: "acct-1", AmountMinor: 4, Currency: "EUR",
		BodyTermsSignature: fencingtest.Terms(third.Terms())})
	if rec := reconcileAs(p, "acct-1", 500, string(b)); rec.Code != http.StatusOK {
		t.Fatalf("a close with the newer token 500: %d %s; want 200", rec.Code, rec.Body)
	}
	if rec := submit(p, "B", body("z-15", "acct-1", 3), "421"); rec.Code != http.StatusConflict || envelope(t, rec).Code != api.CodeFencedOut {
		t.Fatalf("a submission with 421 after the close with 500: %d %s; want 409 %s", rec.Code, rec.Body, api.CodeFencedOut)
	}
}
