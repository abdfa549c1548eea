package pipelinetest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// On the whole pipeline: a holder of a real
// lease on payout:acct-1 (lock-server's grant, its proof) sent rail-proxy
// a payout id paydb does not know, and the rail paid it; only the
// reconciler's audit saw it afterwards. Now rail-proxy forwards only
// terms payment-resource signed: the ghost payout, and the real payout
// with its amount raised, are refused before the fence and never reach
// the rail; the real payout is then paid once, by the first delivery.
func TestAGhostPayoutIdIsNotForwarded(t *testing.T) {
	for _, off := range []bool{false, true} {
		name := "fencing on"
		if off {
			name = "fencing off"
		}
		t.Run(name, func(t *testing.T) {
			p := pipelinetest.Start(t, pipelinetest.Options{RailFencingOff: off, PaymentFencingOff: off})
			ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
			if err := p.CreatePayout(t.Context(), ev); err != nil {
				t.Fatal(err)
			}
			real, err := p.Pay.Payout(t.Context(), ev.PayoutID)
			if err != nil || real.TermsSignature == "" {
				t.Fatalf("payout p-1: %+v, %v; want it with its terms signed", real, err)
			}
			locks, err := client.New(p.LockURL)
			if err != nil {
				t.Fatal(err)
			}
			lease, err := locks.Acquire(t.Context(), ev.LockKey(), client.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			h := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: "mallory"}
			for _, c := range []struct {
				name string
				req  railapi.SubmitRequest
				want error
			}{
				{"a ghost payout id, unsigned", railapi.SubmitRequest{PayoutID: "p-ghost", AccountID: "acct-1", AmountMinor: 900_000, Currency: "EUR"},
					railclient.ErrTermsUnsigned},
				{"a ghost payout id with p-1's signature", railapi.SubmitRequest{PayoutID: "p-ghost", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR",
					TermsSignature: real.TermsSignature}, railclient.ErrInvalidTerms},
				{"p-1 with its amount raised", railapi.SubmitRequest{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 900_000, Currency: "EUR",
					TermsSignature: real.TermsSignature}, railclient.ErrInvalidTerms},
			} {
				_, err := p.Rail.Submit(t.Context(), h, c.req)
				var e *railclient.Error
				if !errors.Is(err, c.want) || !errors.As(err, &e) || e.Status != 403 {
					t.Errorf("%s: %v; want 403 %v", c.name, err, c.want)
				}
			}
			for _, id := range []string{"p-ghost", "p-1"} {
				if got, err := p.Rail.Attempts(t.Context(), id); err != nil || len(got) != 0 {
					t.Errorf("attempts of %s: %+v, %v; want none recorded", id, got, err)
				}
			}
			if _, err := p.Rail.HighWater(t.Context(), "acct-1"); !errors.Is(err, railclient.ErrNotFound) {
				t.Errorf("acct-1's high-water after the refusals: %v; want none yet", err)
			}
			if rail := p.Stub.Submissions(""); len(rail) != 0 {
				t.Fatalf("the rail received %+v; want nothing", rail)
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			out, n, err := deliver(t, newExecutor(t, p, "A", nil), ev, 3)
			if err != nil || out != executor.OutcomePosted || n != 1 {
				t.Fatalf("p-1 after the refusals: %q after %d deliveries (%v); want posted by the first", out, n, err)
			}
			if rail := p.Stub.Submissions(""); len(rail) != 1 || rail[0].Request.PayoutID != "p-1" || rail[0].Request.AmountMinor != 2500 {
				t.Fatalf("the rail received %+v; want p-1's 2500 once", rail)
			}
			if rep, err := p.Audit(t.Context()); err != nil || !rep.Balanced {
				t.Fatalf("audit: %+v, %v; want balanced", rep, err)
			}
		})
	}
}

// tamperDoer sends requests through http.DefaultClient, raising the amount
// of every submission to rail-proxy on the way (the terms signature, in
// its header, is left as payment-resource made it): an altered payout.
type tamperDoer struct{}

func (tamperDoer) Do(r *http.Request) (*http.Response, error) {
	if r.URL.Path == railapi.PathSubmissions && r.Body != nil {
		var sub railapi.SubmitRequest
		if err := json.NewDecoder(r.Body).Decode(&sub); err != nil {
			return nil, err
		}
		sub.AmountMinor *= 100
		b, _ := json.Marshal(sub)
		r = r.Clone(r.Context())
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	}
	return http.DefaultClient.Do(r)
}

// An altered payout used to loop until the dead-letter topic: the executor
// took every INVALID_TERMS for a key mismatch between the services and
// had it redelivered. Now a known key's signature over other terms is
// permanent for the payout: the first delivery marks it needs_attention
// (rail_request_refused) and is acknowledged; nothing reaches the rail,
// nothing is recorded at rail-proxy, and the books stay balanced.
func TestAnAlteredPayoutNeedsAttentionAfterOneDelivery(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	out, n, err := deliver(t, newExecutor(t, p, "A", tamperDoer{}), ev, 3)
	if err != nil || out != executor.OutcomeNeedsAttention || n != 1 {
		t.Fatalf("altered p-1: %q after %d deliveries (%v); want needs_attention, acknowledged by the first", out, n, err)
	}
	got, err := p.Pay.Payout(t.Context(), ev.PayoutID)
	if err != nil || got.State != payapi.StateNeedsAttention || got.AttentionReason != payapi.ReasonRailRequestRefused || got.Debits != 0 {
		t.Fatalf("p-1: %+v, %v; want needs_attention, %s, no debit", got, err, payapi.ReasonRailRequestRefused)
	}
	if rail := p.Stub.Submissions(""); len(rail) != 0 {
		t.Fatalf("the rail received %+v; want nothing", rail)
	}
	if a, err := p.Rail.Attempts(t.Context(), ev.PayoutID); err != nil || len(a) != 0 {
		t.Fatalf("attempts of p-1: %+v, %v; want none recorded", a, err)
	}
	if rep, err := p.Audit(t.Context()); err != nil || !rep.Balanced {
		t.Fatalf("audit: %+v, %v; want balanced", rep, err)
	}
}

// A key rotation done in the wrong order: payment-resource signs with a
// key rail-proxy has not been given. That is the deployment's fault, not
// the payout's: each delivery is refused TERMS_KEY_UNKNOWN and answered
// for redelivery (nothing marked, nothing at the rail), and once
// rail-proxy is redeployed with the key, the next delivery pays the
// payout once.
func TestAnUnknownTermsKeyIsRedeliveredAndSucceedsOnceTheKeyIsAdded(t *testing.T) {
	next, err := fenceproof.GenerateSigningKey("pay-next", strings.NewReader(strings.Repeat("n", 64)))
	if err != nil {
		t.Fatal(err)
	}
	p := pipelinetest.Start(t, pipelinetest.Options{TermsSigningKey: next})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	x := newExecutor(t, p, "A", nil)
	for i := 1; i <= 2; i++ {
		out, err := x.Execute(t.Context(), ev)
		if st := executor.Status(out, err); st != http.StatusServiceUnavailable || !errors.Is(err, executor.ErrDependency) {
			t.Fatalf("delivery %d with the key unknown: %q, %v (push %d); want redelivered (503, %v)", i, out, err, st, executor.ErrDependency)
		}
	}
	if got, err := p.Pay.Payout(t.Context(), ev.PayoutID); err != nil || got.State == payapi.StateNeedsAttention || got.Debits != 0 {
		t.Fatalf("p-1 after the refusals: %+v, %v; want it not marked and not debited", got, err)
	}
	if rail := p.Stub.Submissions(""); len(rail) != 0 {
		t.Fatalf("the rail received %+v; want nothing yet", rail)
	}
	p.ReplaceProxy(t, func(c *railproxy.Config) {
		ring, err := fenceproof.NewKeyring(fencingtest.TermsSigningKey().VerifyKey(), next.VerifyKey())
		if err != nil {
			t.Fatal(err)
		}
		c.TermsKeys = ring
	})
	out, n, err := deliver(t, x, ev, 3)
	if err != nil || out != executor.OutcomePosted || n != 1 {
		t.Fatalf("p-1 once the key is added: %q after %d deliveries (%v); want posted by the first", out, n, err)
	}
	if rail := p.Stub.Submissions(""); len(rail) != 1 || rail[0].Request.PayoutID != "p-1" || rail[0].Request.AmountMinor != 2500 {
		t.Fatalf("the rail received %+v; want p-1's 2500 once", rail)
	}
	if rep, err := p.Audit(t.Context()); err != nil || !rep.Balanced {
		t.Fatalf("audit: %+v, %v; want balanced", rep, err)
	}
}
