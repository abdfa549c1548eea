package pipelinetest_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// post sends body as JSON to url with exactly the headers given (name,
// value pairs): a careless or hostile client, not a holder.
func post(t *testing.T, url string, body any, headers ...string) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if sub, ok := body.(railapi.SubmitRequest); ok && sub.TermsSignature != "" {
		req.Header.Set(railapi.HeaderTermsSignature, sub.TermsSignature) // as the executor sends it
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

// On the whole pipeline: the probe's request (the
// maximum token, no lease, straight to rail-proxy) and its twin at
// payment-resource used to brick acct-1 for good and set the executors
// looping. Now both are refused; acct-1's next payout is paid once, by the
// first delivery, and the audit is clean.
func TestAForgedMaximumTokenNeitherBricksTheAccountNorMovesMoney(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	maxToken := strconv.FormatInt(1<<63-1, 10)
	st, body := post(t, p.ProxyURL+railapi.PathSubmissions,
		signed(railapi.SubmitRequest{PayoutID: "p-x", AccountID: "acct-1", AmountMinor: 1, Currency: "EUR"}), // only the token is forged
		fencewire.HeaderToken, maxToken)
	if st != http.StatusForbidden || !bytes.Contains(body, []byte(railapi.CodeUnverifiedToken)) {
		t.Fatalf("forged submission: %d %s; want 403 %s", st, body, railapi.CodeUnverifiedToken)
	}
	st, body = post(t, p.PayURL+api.ClaimPath(ev.PayoutID), struct{}{}, fencewire.HeaderToken, maxToken)
	if st != http.StatusForbidden || !bytes.Contains(body, []byte(api.CodeUnverifiedToken)) {
		t.Fatalf("forged claim: %d %s; want 403 %s", st, body, api.CodeUnverifiedToken)
	}
	out, n, err := deliver(t, newExecutor(t, p, "A", nil), ev, 3)
	if err != nil || out != executor.OutcomePosted || n != 1 {
		t.Fatalf("acct-1's payout after the forgeries: %q after %d deliveries (%v); want posted by the first", out, n, err)
	}
	if rail := p.Stub.Submissions(""); len(rail) != 1 {
		t.Fatalf("the rail received %d submissions; want only p-1's", len(rail))
	}
	rep, err := p.Audit(t.Context())
	if err != nil || !rep.Balanced {
		t.Fatalf("audit: %+v, %v", rep.Violations, err)
	}
}

// On the whole pipeline: a holder of acct-1's lock
// recorded the rail's next reference as its payout's DECLINE; the next
// payout of another account, paid by the rail under that reference, then
// failed RAIL_REF_CONFLICT forever with money gone and no debit. Now the
// lie is refused (no receipt covers it), and the other payout is paid and
// booked once.
func TestAHolderCannotRecordAReferenceTheRailGaveAnotherPayout(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	liar := payoutevent.Event{PayoutID: "p-liar", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"}
	victim := payoutevent.Event{PayoutID: "p-victim", AccountID: "acct-2", AmountMinor: 2500, Currency: "EUR"}
	for _, e := range []payoutevent.Event{liar, victim} {
		if err := p.CreatePayout(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	locks := lockClient(t, p)
	lease, err := locks.Acquire(t.Context(), liar.LockKey())
	if err != nil {
		t.Fatal(err)
	}
	h := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: "liar"}
	if _, err := p.Pay.Claim(t.Context(), liar.PayoutID, h, api.ClaimRequest{}); err != nil {
		t.Fatal(err)
	}
	// The rail numbers its references; the next one is rail-000001.
	_, err = p.Pay.PostResult(t.Context(), liar.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeDecline, RailRef: "rail-000001"})
	if err == nil {
		t.Fatal("payment-resource recorded a DECLINE under a reference the rail never gave the payout")
	}
	out, _, err := deliver(t, newExecutor(t, p, "A", nil), victim, 3)
	if err != nil || out != executor.OutcomePosted {
		t.Fatalf("the victim payout: %q (%v); want posted", out, err)
	}
	if state, n := debits(t, p, victim.PayoutID); state != string(api.StatePosted) || n != 1 {
		t.Fatalf("the victim payout is %s with %d debits; want posted once", state, n)
	}
	rep, err := p.Audit(t.Context())
	if err != nil || !rep.Balanced {
		t.Fatalf("audit: %+v, %v", rep.Violations, err)
	}
}

// On the whole pipeline: an event that names another account, amount or
// currency than its payout's is dropped. The executor takes the lock the
// event names and claims with the event's terms; payment-resource refuses
// the claim (PAYOUT_TERMS_MISMATCH) before anything else, so the payout
// stays pending and unfenced, nothing reaches the rail, and the lock is
// released. The genuine event is then paid once, by its first delivery.
func TestAForgedEventIsDroppedAndChangesNothing(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if err := p.CreatePayout(t.Context(), payoutevent.Event{PayoutID: "p-2", AccountID: "acct-2", AmountMinor: 1, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	x := newExecutor(t, p, "A", nil)
	// Closed at once: from here on each execution releases its lease
	// before it returns, so the lock is seen as the execution left it.
	if err := x.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, forged := range []payoutevent.Event{
		{PayoutID: "p-1", AccountID: "acct-2", AmountMinor: 2500, Currency: "EUR"},
		{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 250000, Currency: "EUR"},
		{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "USD"},
	} {
		out, err := x.Execute(t.Context(), forged)
		if err != nil || out != executor.OutcomeDropped {
			t.Fatalf("%+v: Execute = %q, %v; want dropped", forged, out, err)
		}
		if st, err := p.Locks.Inspect(t.Context(), forged.LockKey()); err != nil || st.Lease != nil {
			t.Fatalf("%+v: %s is %+v (%v); want released", forged, forged.LockKey(), st.Lease, err)
		}
		po, err := p.Pay.Payout(t.Context(), ev.PayoutID)
		if err != nil || po.State != api.StatePending || po.Fence != 0 {
			t.Fatalf("%+v: p-1 is %+v (%v); want pending, fence 0: nothing claimed", forged, po, err)
		}
		if rail := p.Stub.Submissions(""); len(rail) != 0 {
			t.Fatalf("%+v: the rail received %v", forged, rail)
		}
	}
	out, n, err := deliver(t, x, ev, 3)
	if err != nil || out != executor.OutcomePosted || n != 1 {
		t.Fatalf("p-1's own event after the forgeries: %q after %d deliveries (%v); want posted by the first", out, n, err)
	}
	if rail := p.Stub.Submissions(""); len(rail) != 1 || rail[0].Request.AmountMinor != ev.AmountMinor {
		t.Fatalf("the rail received %+v; want p-1's one submission", rail)
	}
	rep, err := p.Audit(t.Context())
	if err != nil || !rep.Balanced {
		t.Fatalf("audit: %+v, %v", rep.Violations, err)
	}
}

// lockClient is an SDK client of the pipeline's lock-server.
func lockClient(t *testing.T, p *pipelinetest.Pipeline) *client.Client {
	t.Helper()
	c, err := client.New(p.LockURL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
