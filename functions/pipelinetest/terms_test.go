package pipelinetest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// Issue #15, probe item 12, on the whole pipeline: a holder of a real
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
			h := payoutevent.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: "mallory"}
			for _, c := range []struct {
				name string
				req  railapi.SubmitRequest
			}{
				{"a ghost payout id, unsigned", railapi.SubmitRequest{PayoutID: "p-ghost", AccountID: "acct-1", AmountMinor: 900_000, Currency: "EUR"}},
				{"a ghost payout id with p-1's signature", railapi.SubmitRequest{PayoutID: "p-ghost", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR",
					TermsSignature: real.TermsSignature}},
				{"p-1 with its amount raised", railapi.SubmitRequest{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 900_000, Currency: "EUR",
					TermsSignature: real.TermsSignature}},
			} {
				_, err := p.Rail.Submit(t.Context(), h, c.req)
				var e *railclient.Error
				if !errors.Is(err, railclient.ErrInvalidTerms) || !errors.As(err, &e) || e.Status != 403 {
					t.Errorf("%s: %v; want 403 %s", c.name, err, railapi.CodeInvalidTerms)
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
