package railproxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// signedAs is the submission of req's fields with sig as its terms
// signature (in the body member, which submit moves to the header).
func signedAs(req api.SubmitRequest, sig string) string {
	req.BodyTermsSignature = sig
	b, _ := json.Marshal(req)
	return string(b)
}

// Rail-proxy forwarded any payout a holder of a
// valid lease on the account wrote, whether or not payment-resource had
// created it with those terms. Now each submission whose terms
// payment-resource did not sign is refused 403 INVALID_TERMS before the
// fence, with fencing on or off: no attempt row, no high-water moved, the
// rail not called. The code says why, because callers act on it
// differently: INVALID_TERMS (a known key's signature over other terms,
// permanent for the payout), TERMS_KEY_UNKNOWN (a key rail-proxy does
// not hold: retryable), TERMS_UNSIGNED (no usable signature).
func TestTermsPaymentResourceDidNotSignAreRefusedAndChangeNothing(t *testing.T) {
	// The ledger created po-1: 100 EUR from acct-1.
	created := api.SubmitRequest{PayoutID: "po-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
	sig := fencingtest.Terms(created.Terms())
	with := func(mod func(*api.SubmitRequest)) api.SubmitRequest {
		r := created
		mod(&r)
		return r
	}
	forger, err := fenceproof.GenerateSigningKey(fencingtest.TermsSigningKey().ID(), strings.NewReader(strings.Repeat("f", 64)))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		body string
		code api.Code
	}{
		{"amount changed", signedAs(with(func(r *api.SubmitRequest) { r.AmountMinor = 100_000 }), sig), api.CodeInvalidTerms},
		{"currency changed", signedAs(with(func(r *api.SubmitRequest) { r.Currency = "GBP" }), sig), api.CodeInvalidTerms},
		{"payout id paydb does not know", signedAs(with(func(r *api.SubmitRequest) { r.PayoutID = "po-ghost" }), sig), api.CodeInvalidTerms},
		{"payout id paydb does not know, unsigned", signedAs(with(func(r *api.SubmitRequest) { r.PayoutID = "po-ghost" }), ""), api.CodeTermsUnsigned},
		{"other account", signedAs(with(func(r *api.SubmitRequest) { r.AccountID = "acct-2" }), sig), api.CodeInvalidTerms},
		{"signed by another key with the same id", signedAs(created, forger.Sign(fencewire.PayoutTermsDomain, created.Terms().Fields()...)),
			api.CodeInvalidTerms},
		{"signed by rail-proxy's receipt key", signedAs(created,
			fencingtest.ReceiptSigningKey().Sign(fencewire.PayoutTermsDomain, created.Terms().Fields()...)), api.CodeTermsKeyUnknown},
		{"payment-resource's key under another domain", signedAs(created,
			fencingtest.TermsSigningKey().Sign(fencewire.RailReceiptDomain, created.Terms().Fields()...)), api.CodeInvalidTerms},
		{"no signature", signedAs(created, ""), api.CodeTermsUnsigned},
		{"a malformed signature", signedAs(created, "test-pay.not-base64!"), api.CodeTermsUnsigned},
	}
	for _, fencingOff := range []bool{false, true} {
		name := "fencing on"
		if fencingOff {
			name = "fencing off"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			p := r.proxy(func(c *railproxy.Config) { c.FencingDisabled = fencingOff })
			mustAccept(t, p, "w", body("po-0", "acct-1", 1), 40)
			mustAccept(t, p, "w", body("po-9", "acct-2", 1), 40)
			for _, c := range cases {
				// Token 50, above both accounts' high-water marks, with
				// lock-server's proof for the body's account: only the
				// terms are wrong.
				rec := submit(p, "mallory", c.body, "50")
				if rec.Code != http.StatusForbidden {
					t.Errorf("%s: status %d, body %s; want 403", c.name, rec.Code, rec.Body)
					continue
				}
				if e := envelope(t, rec); e.Code != c.code || e.Retryable != c.code.Retryable() {
					t.Errorf("%s: envelope %+v; want %s, retryable %t", c.name, e, c.code, c.code.Retryable())
				}
			}
			if n := r.attemptRows(); n != 2 {
				t.Errorf("%d attempt rows, want 2: a refused submission was recorded", n)
			}
			for _, acct := range []string{"acct-1", "acct-2"} {
				if hw := highWater(t, p, acct); hw != 40 {
					t.Errorf("%s high-water %d, want 40: a refused submission moved the fence", acct, hw)
				}
			}
			if n := len(r.stub.Submissions("")); n != 2 {
				t.Errorf("rail received %d submissions, want 2: a refused submission reached it", n)
			}
			if n := len(r.logs.Events(t, api.EventTermsRefused)); n != len(cases) {
				t.Errorf("%d %s events, want %d", n, api.EventTermsRefused, len(cases))
			}
			// The payout the ledger created, as it created it, still goes.
			mustAccept(t, p, "w", signedAs(created, sig), 50)
		})
	}
}

// TestTermsRefusalCodesAreSplitByCause pins which codes say "this payout"
// and which "the deployment": only TERMS_KEY_UNKNOWN may clear by
// itself (retryable), and the three are distinct.
func TestTermsRefusalCodesAreSplitByCause(t *testing.T) {
	if !api.CodeTermsKeyUnknown.Retryable() || api.CodeInvalidTerms.Retryable() || api.CodeTermsUnsigned.Retryable() {
		t.Fatalf("retryable: %s %t, %s %t, %s %t; want only %s", api.CodeInvalidTerms, api.CodeInvalidTerms.Retryable(),
			api.CodeTermsKeyUnknown, api.CodeTermsKeyUnknown.Retryable(), api.CodeTermsUnsigned, api.CodeTermsUnsigned.Retryable(), api.CodeTermsKeyUnknown)
	}
}

// The signature moved from the body to a header (so that a rail-proxy
// older than the check ignores it instead of refusing the unknown body
// member); the previous version's body member is still read for one
// release, as long as it does not contradict the header. A refused
// request records nothing.
func TestTermsSignatureTravelsInAHeaderAndTheBodyMemberStillWorks(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	terms := func(payout string) (api.SubmitRequest, string) {
		req := api.SubmitRequest{PayoutID: payout, AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
		return req, fencingtest.Terms(req.Terms())
	}
	plain := func(req api.SubmitRequest) string {
		b, _ := json.Marshal(req)
		return string(b)
	}
	// The header alone: how this version's executor sends it.
	req, sig := terms("po-h")
	if strings.Contains(plain(api.SubmitRequest{TermsSignature: sig}), sig) {
		t.Fatal("SubmitRequest.TermsSignature is encoded in the body; it belongs in the header")
	}
	if rec := submitWith(p, "w", plain(req), sig, "41"); rec.Code != http.StatusOK {
		t.Fatalf("signature in the header: %d %s; want 200", rec.Code, rec.Body)
	}
	// The body member alone: how the previous version's executor sends it.
	req, sig = terms("po-b")
	if rec := submitLegacy(p, "w", signedAs(req, sig), "42"); rec.Code != http.StatusOK {
		t.Fatalf("signature in the body member: %d %s; want 200", rec.Code, rec.Body)
	}
	// Both, the same: fine.
	req, sig = terms("po-hb")
	if rec := submitWith(p, "w", signedAs(req, sig), sig, "43"); rec.Code != http.StatusOK {
		t.Fatalf("the same signature in both: %d %s; want 200", rec.Code, rec.Body)
	}
	// Refused, nothing recorded: both, different; the header twice.
	req, sig = terms("po-x")
	_, other := terms("po-y")
	rec := submitWith(p, "w", signedAs(req, other), sig, "44")
	if e := envelope(t, rec); rec.Code != http.StatusBadRequest || e.Code != api.CodeInvalidRequest {
		t.Errorf("header and body member differ: %d %s; want 400 %s", rec.Code, rec.Body, api.CodeInvalidRequest)
	}
	hreq := httptest.NewRequest("POST", api.PathSubmissions, strings.NewReader(plain(req)))
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set(api.HeaderToken, "44")
	hreq.Header.Set(api.HeaderProof, fencingtest.Proof("acct-1", 44))
	hreq.Header.Add(api.HeaderTermsSignature, sig)
	hreq.Header.Add(api.HeaderTermsSignature, sig)
	rec = httptest.NewRecorder()
	p.ServeHTTP(rec, hreq)
	if e := envelope(t, rec); rec.Code != http.StatusBadRequest || e.Code != api.CodeInvalidRequest {
		t.Errorf("header sent twice: %d %s; want 400 %s", rec.Code, rec.Body, api.CodeInvalidRequest)
	}
	if n := r.attemptRows(); n != 3 {
		t.Errorf("%d attempt rows; want the 3 accepted submissions only", n)
	}
	if hw := highWater(t, p, "acct-1"); hw != 43 {
		t.Errorf("high-water %d; want 43: a refused submission moved it", hw)
	}
}

// A key rotation done in the wrong order (payment-resource signs with a
// key rail-proxy has not been given) is answered TERMS_KEY_UNKNOWN,
// retryable, nothing recorded; once the key is added, the same request
// is forwarded.
func TestAnUnknownTermsKeyIsRetryableAndPassesOnceAdded(t *testing.T) {
	r := newRig(t)
	next, err := fenceproof.GenerateSigningKey("pay-next", strings.NewReader(strings.Repeat("n", 64)))
	if err != nil {
		t.Fatal(err)
	}
	req := api.SubmitRequest{PayoutID: "po-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
	b := signedAs(req, next.Sign(fencewire.PayoutTermsDomain, req.Terms().Fields()...))

	before := r.proxy(nil) // PAYMENT_TERMS_KEYS without pay-next
	rec := submit(before, "w", b, "7")
	if e := envelope(t, rec); rec.Code != http.StatusForbidden || e.Code != api.CodeTermsKeyUnknown || !e.Retryable {
		t.Fatalf("unknown key: %d %s; want 403 %s, retryable", rec.Code, rec.Body, api.CodeTermsKeyUnknown)
	}
	if n := r.attemptRows(); n != 0 {
		t.Fatalf("%d attempt rows after the refusal; want none", n)
	}
	after := r.proxy(func(c *railproxy.Config) {
		ring, err := fenceproof.NewKeyring(fencingtest.TermsSigningKey().VerifyKey(), next.VerifyKey())
		if err != nil {
			t.Fatal(err)
		}
		c.TermsKeys = ring
	})
	mustAccept(t, after, "w", b, 7)
}

// RAIL_PROXY_TERMS_REQUIRED=false, for a rolling deploy over executors that
// do not send the signature yet: a request without any signature is
// forwarded (and logged), but a signature that is sent is still checked.
func TestUnsignedTermsPassOnlyWhileNotRequired(t *testing.T) {
	cfg, err := railproxy.LoadConfig(func(k string) string {
		return map[string]string{api.EnvDatabaseURL: "postgres://x", api.EnvRailURL: "http://rail", api.EnvProofKeys: fencingtest.LockSigningKey().VerifyKey().String(),
			api.EnvReceiptSigningKey: fencingtest.ReceiptSigningKey().String(), api.EnvTermsKeys: fencingtest.TermsSigningKey().VerifyKey().String(),
			api.EnvTermsRequired: "false"}[k]
	})
	if err != nil || !cfg.TermsNotRequired {
		t.Fatalf("LoadConfig with %s=false: TermsNotRequired %t, %v; want true", api.EnvTermsRequired, cfg.TermsNotRequired, err)
	}
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) { c.TermsNotRequired = true })
	if n := len(r.logs.Events(t, api.EventTermsNotRequired)); n != 1 {
		t.Errorf("%d %s events at start; want 1", n, api.EventTermsNotRequired)
	}
	req := api.SubmitRequest{PayoutID: "po-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
	mustAccept(t, p, "old-executor", signedAs(req, ""), 5)
	if n := len(r.logs.Events(t, api.EventTermsUnsigned)); n != 1 {
		t.Errorf("%d %s events; want 1", n, api.EventTermsUnsigned)
	}
	altered := req
	altered.PayoutID, altered.AmountMinor = "po-2", 100_000
	for _, c := range []struct {
		name string
		body string
		code api.Code
	}{
		{"altered terms", signedAs(altered, fencingtest.Terms(req.Terms())), api.CodeInvalidTerms},
		{"a malformed signature", signedAs(altered, "garbage"), api.CodeTermsUnsigned},
	} {
		rec := submit(p, "w", c.body, "6")
		if e := envelope(t, rec); rec.Code != http.StatusForbidden || e.Code != c.code {
			t.Errorf("%s: %d %s; want 403 %s", c.name, rec.Code, rec.Body, c.code)
		}
	}
	if n := r.attemptRows(); n != 1 {
		t.Errorf("%d attempt rows; want the unsigned submission's only", n)
	}
}
