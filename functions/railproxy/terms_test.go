package railproxy_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/prooftest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// signedAs is the submission of req's fields with sig as its terms
// signature.
func signedAs(req api.SubmitRequest, sig string) string {
	req.TermsSignature = sig
	b, _ := json.Marshal(req)
	return string(b)
}

// Issue #15, probe item 12: rail-proxy forwarded any payout a holder of a
// valid lease on the account wrote, whether or not payment-resource had
// created it with those terms. Now each submission whose terms
// payment-resource did not sign is refused 403 INVALID_TERMS before the
// fence, with fencing on or off: no attempt row, no high-water moved, the
// rail not called.
func TestTermsPaymentResourceDidNotSignAreRefusedAndChangeNothing(t *testing.T) {
	// The ledger created po-1: 100 EUR from acct-1.
	created := api.SubmitRequest{PayoutID: "po-1", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
	sig := prooftest.Terms(created.Terms())
	with := func(mod func(*api.SubmitRequest)) api.SubmitRequest {
		r := created
		mod(&r)
		return r
	}
	forger, err := fenceproof.GenerateSigningKey(prooftest.TermsSigningKey().ID(), strings.NewReader(strings.Repeat("f", 64)))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		body string
	}{
		{"amount changed", signedAs(with(func(r *api.SubmitRequest) { r.AmountMinor = 100_000 }), sig)},
		{"currency changed", signedAs(with(func(r *api.SubmitRequest) { r.Currency = "GBP" }), sig)},
		{"payout id paydb does not know", signedAs(with(func(r *api.SubmitRequest) { r.PayoutID = "po-ghost" }), sig)},
		{"payout id paydb does not know, unsigned", signedAs(with(func(r *api.SubmitRequest) { r.PayoutID = "po-ghost" }), "")},
		{"other account", signedAs(with(func(r *api.SubmitRequest) { r.AccountID = "acct-2" }), sig)},
		{"signed by another key with the same id", signedAs(created, forger.Sign(payoutevent.PayoutTermsDomain, created.Terms().Fields()...))},
		{"signed by rail-proxy's receipt key", signedAs(created,
			prooftest.ReceiptSigningKey().Sign(payoutevent.PayoutTermsDomain, created.Terms().Fields()...))},
		{"payment-resource's key under another domain", signedAs(created,
			prooftest.TermsSigningKey().Sign(payoutevent.RailReceiptDomain, created.Terms().Fields()...))},
		{"no signature", signedAs(created, "")},
		{"a malformed signature", signedAs(created, "test-pay.not-base64!")},
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
				if e := envelope(t, rec); e.Code != api.CodeInvalidTerms || e.Retryable {
					t.Errorf("%s: envelope %+v; want %s, not retryable", c.name, e, api.CodeInvalidTerms)
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
