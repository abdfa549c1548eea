package pipelinetest_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// forged is a token above anything lock-server granted: the largest
// int64. With verified tokens a client can no longer put it
// in a fence without lock-server's proof; these tests put it there as a
// restore of lockdb from an old backup, a bug, or a test key would: with a
// proof made by the test keys, or straight into the database.
const forged = int64(9223372036854775807)

// pushUntilAcked posts ev to x as Pub/Sub push requests, redelivering
// every non-2xx answer, at most max times. It returns the number of
// deliveries and the last status.
func pushUntilAcked(t *testing.T, x *executor.Executor, ev payoutevent.Event, max int) (int, int) {
	t.Helper()
	n, status, _ := pushUntilAckedOutcome(t, x, ev, max)
	return n, status
}

// pushUntilAckedOutcome is pushUntilAcked that also returns the outcome
// the last answer names ("" for a redelivery answer).
func pushUntilAckedOutcome(t *testing.T, x *executor.Executor, ev payoutevent.Event, max int) (int, int, executor.Outcome) {
	t.Helper()
	status := 0
	var ans struct {
		Outcome executor.Outcome `json:"outcome"`
	}
	for i := 1; i <= max; i++ {
		body, err := payoutevent.Encode(ev, "m-"+ev.PayoutID, ev.AccountID, i)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		x.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body)))
		if status = rec.Code; status/100 == 2 {
			_ = json.Unmarshal(rec.Body.Bytes(), &ans)
			return i, status, ans.Outcome
		}
	}
	return max, status, ""
}

// TestPermanentRefusalEndsInNeedsAttentionWithNothingLooping (a probe's
// finding, the looping part): an account's fence holds a token above
// anything lock-server granted for payout:{account}. Before, every later
// payout of the account was refused FENCED_OUT, answered as transient and
// redelivered forever (60 history rows and 60 lease grants in 6 s). Now
// the holder of the current lease sees that no newer holder exists, marks
// the payout needs_attention with the reason, and the first delivery is
// acknowledged.
func TestPermanentRefusalEndsInNeedsAttentionWithNothingLooping(t *testing.T) {
	for _, tc := range []struct {
		name   string
		forge  func(t *testing.T, p *pipelinetest.Pipeline)
		reason api.AttentionReason
		rail   int // rail submissions of the payout
		// marked: the mark can be written. A forged account fence (only
		// possible by writing paydb by hand, now that tokens carry
		// lock-server's proof) also refuses the mark, since every fenced
		// payout statement holds the account's fence: the delivery still
		// ends at once (payout_attention_unrecorded, counted in
		// executor_attention_unrecorded_total, which pages:
		// PayoutAttentionUnrecorded), the payout stays pending for a
		// person.
		marked bool
	}{
		{"rail-proxy's high-water ahead", func(t *testing.T, p *pipelinetest.Pipeline) {
			st, body := send(t, p.ProxyURL+railapi.PathSubmissions, "acct-1", forged,
				signed(railapi.SubmitRequest{PayoutID: "p-x", AccountID: "acct-1", AmountMinor: 1, Currency: "EUR"}))
			if st != http.StatusOK {
				t.Fatalf("submission with the huge token: %d %s", st, body)
			}
		}, api.ReasonRailFenceAhead, 0, true},
		{"payment-resource's account fence ahead", func(t *testing.T, p *pipelinetest.Pipeline) {
			if _, err := p.PayDB.Exec(t.Context(), `UPDATE account SET fence = $1 WHERE account_id = 'acct-1'`, forged); err != nil {
				t.Fatal(err)
			}
		}, api.ReasonPaymentFenceAhead, 0, false}, // the claim is refused now: nothing goes to the rail
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pipelinetest.Start(t, pipelinetest.Options{})
			ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
			if err := p.CreatePayout(t.Context(), ev); err != nil {
				t.Fatal(err)
			}
			tc.forge(t, p)
			x := newExecutor(t, p, "worker-a", nil)
			reg := prometheus.NewRegistry()
			for _, c := range executor.Collectors() {
				if err := reg.Register(c); err != nil {
					t.Fatal(err)
				}
			}
			unrecordedBefore := unrecorded(t, reg, tc.reason)

			n, status := pushUntilAcked(t, x, ev, 20)
			if status != http.StatusOK || n != 1 {
				t.Fatalf("p-1 took %d deliveries, last answered %d; want 1, acknowledged", n, status)
			}
			po, err := p.Pay.PayoutWithHistory(t.Context(), "p-1")
			if err != nil {
				t.Fatal(err)
			}
			if tc.marked && (po.State != api.StateNeedsAttention || po.AttentionReason != tc.reason) {
				t.Fatalf("p-1 is %s (%q); want needs_attention (%s)", po.State, po.AttentionReason, tc.reason)
			}
			if !tc.marked && po.State != api.StatePending {
				t.Fatalf("p-1 is %s; want pending (the forged account fence refuses the mark too)", po.State)
			}
			// A mark that could not be written is counted (the
			// PayoutAttentionUnrecorded alert reads it); one that was
			// written is not.
			want := 0.0
			if !tc.marked {
				want = 1
			}
			if got := unrecorded(t, reg, tc.reason) - unrecordedBefore; got != want {
				t.Fatalf("%s{reason=%q} went up by %v; want %v", executor.MetricAttentionUnrecorded, tc.reason, got, want)
			}
			if len(po.History) > 3 {
				t.Fatalf("p-1's history has %d rows: %+v", len(po.History), po.History)
			}
			if _, d := debits(t, p, "p-1"); d != 0 {
				t.Fatalf("p-1 has %d debits; want 0", d)
			}
			if got := len(p.Stub.Submissions("p-1")); got != tc.rail {
				t.Fatalf("the rail got %d submissions of p-1; want %d", got, tc.rail)
			}
			// Pub/Sub delivers at least once: the duplicate ends at the
			// claim, and takes one lease grant, not one per 100 ms.
			before, _ := p.Locks.Inspect(t.Context(), ev.LockKey())
			if n, status := pushUntilAcked(t, x, ev, 20); n != 1 || status != http.StatusOK {
				t.Fatalf("a duplicate of p-1 took %d deliveries (last %d); want 1", n, status)
			}
			after, _ := p.Locks.Inspect(t.Context(), ev.LockKey())
			if grants := after.LastToken - before.LastToken; grants != 1 {
				t.Fatalf("the duplicate took %d lease grants; want 1", grants)
			}
			if po2, _ := p.Pay.PayoutWithHistory(t.Context(), "p-1"); len(po2.History) != len(po.History) {
				t.Fatalf("the duplicate grew p-1's history from %d to %d rows", len(po.History), len(po2.History))
			}
		})
	}
}

// TestRedeliveryOfTheForgedPayoutEnds: a payout finished under a token
// above every grant (its payout fence is the maximum) is finished: its own
// redelivery is acknowledged at the claim (PAYOUT_FINISHED), where it used
// to be refused FENCED_OUT and redelivered forever.
func TestRedeliveryOfTheForgedPayoutEnds(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-x", AccountID: "acct-1", AmountMinor: 1, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if st, body := send(t, p.PayURL+api.ClaimPath("p-x"), "acct-1", forged, nil); st != http.StatusOK {
		t.Fatalf("claim with the huge token: %d %s", st, body)
	}
	// Its result (a receipt-checked ACK needs the rail's answer) is
	// written as a declined payout straight into paydb.
	if _, err := p.PayDB.Exec(t.Context(), `UPDATE payout SET state = 'declined' WHERE payout_id = 'p-x'`); err != nil {
		t.Fatal(err)
	}
	x := newExecutor(t, p, "worker-a", nil)
	if n, status, out := pushUntilAckedOutcome(t, x, ev, 20); n != 1 || status != http.StatusOK || out != executor.OutcomeAlreadyDone {
		t.Fatalf("p-x took %d deliveries (last %d, %q); want 1, %s (PAYOUT_FINISHED at the claim)", n, status, out, executor.OutcomeAlreadyDone)
	}
	if got := len(p.Stub.Submissions("p-x")); got != 0 {
		t.Fatalf("the rail got %d submissions of p-x; want 0", got)
	}
}

// TestForeignRailReferenceEndsInNeedsAttention (a probe's finding, the
// looping part): the rail's next reference is already recorded for
// another payout (the probe did it with a foreign DECLINE, which receipts
// now refuse; here it is a row written before receipts
// existed), so the next real payout, which the rail pays under that
// reference, is refused RAIL_REF_CONFLICT. That refusal can never change:
// the payout ends in needs_attention (rail_ref_conflict) after one
// delivery, where it used to be redelivered forever.
func TestForeignRailReferenceEndsInNeedsAttention(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	thief := payoutevent.Event{PayoutID: "p-a", AccountID: "acct-a", AmountMinor: 1, Currency: "EUR"}
	victim := payoutevent.Event{PayoutID: "p-b", AccountID: "acct-b", AmountMinor: 2500, Currency: "EUR"}
	for _, ev := range []payoutevent.Event{thief, victim} {
		if err := p.CreatePayout(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.PayDB.Exec(t.Context(), `INSERT INTO rail_result (rail_ref, payout_id, outcome, token) VALUES ('rail-000001', 'p-a', 'DECLINE', 1)`); err != nil {
		t.Fatal(err)
	}
	x := newExecutor(t, p, "worker-a", nil)
	if n, status := pushUntilAcked(t, x, victim, 20); n != 1 || status != http.StatusOK {
		t.Fatalf("p-b took %d deliveries (last %d); want 1", n, status)
	}
	subs := p.Stub.Submissions("p-b")
	if len(subs) != 1 || subs[0].Answer.RailRef != "rail-000001" {
		t.Fatalf("the rail's record of p-b: %+v; want one submission under rail-000001 (the premise of the test)", subs)
	}
	po, err := p.Pay.Payout(t.Context(), "p-b")
	if err != nil {
		t.Fatal(err)
	}
	if po.State != api.StateNeedsAttention || po.AttentionReason != api.ReasonRailRefConflict {
		t.Fatalf("p-b is %s (%q); want needs_attention (%s)", po.State, po.AttentionReason, api.ReasonRailRefConflict)
	}
}

// unrecorded reads executor_attention_unrecorded_total{reason} from reg,
// which holds executor.Collectors().
func unrecorded(t *testing.T, reg *prometheus.Registry, reason api.AttentionReason) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != executor.MetricAttentionUnrecorded {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == string(reason) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s series for reason %q", executor.MetricAttentionUnrecorded, reason)
	return 0
}
