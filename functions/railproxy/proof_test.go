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
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// submitWithProof posts body with one token and the given proof header
// ("" sends none).
func submitWithProof(h http.Handler, body string, token int64, proof string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", api.PathSubmissions, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(fencewire.HeaderToken, strconv.FormatInt(token, 10))
	req.Header.Set(fencewire.HeaderOwner, "mallory")
	if proof != "" {
		req.Header.Set(fencewire.HeaderProof, proof)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// A token lock-server never issued (the maximum
// int64, with no proof) was accepted, reached the rail and raised acct-1's
// high-water for good. Now every token without lock-server's proof for
// payout:acct-1 is refused before the fence, and changes nothing.
func TestTokensLockServerDidNotGrantOnTheAccountAreRefusedAndChangeNothing(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	const maxToken = 1<<63 - 1
	forger, err := fenceproof.GenerateSigningKey(fencingtest.LockSigningKey().ID(), strings.NewReader(strings.Repeat("f", 64)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		token int64
		proof string
	}{
		{"no proof", maxToken, ""},
		{"a proof of a lower token", maxToken, fencingtest.Proof("acct-1", 5)},
		{"a proof of another account's lock", 9, fencingtest.Proof("acct-2", 9)},
		{"a proof signed by another key with the same id", maxToken,
			forger.SignGrant(payoutevent.Event{AccountID: "acct-1"}.LockKey(), maxToken, time.Now())},
		{"a malformed proof", 9, "v1.garbage"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := submitWithProof(p, body("p-x", "acct-1", 1), c.token, c.proof)
			wantCode(t, rec, http.StatusForbidden, api.CodeUnverifiedToken)
			if hw := highWater(t, p, "acct-1"); hw != -1 {
				t.Fatalf("acct-1's high-water is %d after a refused token; want none", hw)
			}
			if n := len(r.stub.Submissions("p-x")); n != 0 {
				t.Fatalf("the rail received %d submission(s) of a refused token", n)
			}
		})
	}
	if n := len(r.logs.Events(t, api.EventUnverifiedToken)); n != 5 {
		t.Errorf("%d %s events, want one per refusal (5)", n, api.EventUnverifiedToken)
	}
	// The real holder of acct-1's lock is not locked out.
	rec := submitWithProof(p, body("p-1", "acct-1", 100), 5, fencingtest.Proof("acct-1", 5))
	if rec.Code != http.StatusOK {
		t.Fatalf("the real holder's submission: %d %s", rec.Code, rec.Body)
	}
	if hw := highWater(t, p, "acct-1"); hw != 5 {
		t.Fatalf("high-water %d after the real holder's token 5", hw)
	}
}

// With the kill switch off (the experiment's unfenced cells) there is no
// fence to protect: tokens are not verified.
func TestWithFencingOffTokensAreNotVerified(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) { c.FencingDisabled = true; c.ProofKeys = fenceproof.Keyring{} })
	if rec := submitWithProof(p, body("p-1", "acct-1", 100), 3, ""); rec.Code != http.StatusOK {
		t.Fatalf("unfenced submission without a proof: %d %s", rec.Code, rec.Body)
	}
}

// Payment-resource records an ACK or a DECLINE only
// with rail-proxy's receipt, which covers exactly the payout's submission
// and the rail's answer; the first answer and a refused second submission
// both carry it.
func TestAnswersCarryAReceiptOverExactlyTheRailsAnswer(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	rec := submitWithProof(p, body("p-1", "acct-1", 100), 5, fencingtest.Proof("acct-1", 5))
	var ans api.SubmitAnswer
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &ans) != nil {
		t.Fatalf("submission: %d %s", rec.Code, rec.Body)
	}
	want := fencewire.RailReceipt{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR",
		Outcome: string(ans.Status), RailRef: ans.RailRef, RailToken: 5}
	keys := fencingtest.ReceiptKeys()
	if _, err := keys.Verify(ans.Receipt, fencewire.RailReceiptDomain, want.Fields()...); err != nil {
		t.Fatalf("the answer's receipt does not cover %+v: %v", want, err)
	}
	for _, lie := range []fencewire.RailReceipt{
		{PayoutID: "p-2", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Outcome: want.Outcome, RailRef: want.RailRef, RailToken: 5},
		{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Outcome: string(api.RailDecline), RailRef: want.RailRef, RailToken: 5},
		{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Outcome: want.Outcome, RailRef: want.RailRef + "0", RailToken: 5},
	} {
		if _, err := keys.Verify(ans.Receipt, fencewire.RailReceiptDomain, lie.Fields()...); err == nil {
			t.Errorf("the receipt also verifies for %+v", lie)
		}
	}
	// A second submission is refused with the first attempt and its receipt.
	rec = submitWithProof(p, body("p-1", "acct-1", 100), 6, fencingtest.Proof("acct-1", 6))
	var dup api.AlreadySubmittedAnswer
	if rec.Code != http.StatusConflict || json.Unmarshal(rec.Body.Bytes(), &dup) != nil {
		t.Fatalf("second submission: %d %s", rec.Code, rec.Body)
	}
	if _, err := keys.Verify(dup.Attempt.Receipt, fencewire.RailReceiptDomain, want.Fields()...); err != nil {
		t.Fatalf("the first attempt's receipt does not cover %+v: %v", want, err)
	}
}

// wantCode checks an error answer's status and envelope code.
func wantCode(t *testing.T, rec *httptest.ResponseRecorder, status int, code api.Code) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, body %s; want %d %s", rec.Code, rec.Body, status, code)
	}
	if e := envelope(t, rec); e.Code != code {
		t.Fatalf("code %s, want %s", e.Code, code)
	}
}

// TestTwoProofHeadersAreRefusedAsMoreThanOne (probe 15): a request with
// two X-Fencing-Proof headers is refused 403 UNVERIFIED_TOKEN, saying that
// more than one proof came (it used to say "missing"), and changes
// nothing.
func TestTwoProofHeadersAreRefusedAsMoreThanOne(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	req := httptest.NewRequest("POST", api.PathSubmissions, strings.NewReader(body("p-1", "acct-1", 100)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(fencewire.HeaderToken, "5")
	req.Header.Add(fencewire.HeaderProof, fencingtest.Proof("acct-1", 5))
	req.Header.Add(fencewire.HeaderProof, fencingtest.Proof("acct-1", 5))
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	wantCode(t, rec, http.StatusForbidden, api.CodeUnverifiedToken)
	if msg := envelope(t, rec).Message; !strings.Contains(msg, "more than one") || strings.Contains(msg, "missing") {
		t.Fatalf("message %q; want it to say more than one proof, not a missing one", msg)
	}
	if hw := highWater(t, p, "acct-1"); hw != -1 || r.attemptRows() != 0 || len(r.stub.Submissions("")) != 0 {
		t.Fatalf("a refused request changed something: high-water %d, %d attempts", hw, r.attemptRows())
	}
}
