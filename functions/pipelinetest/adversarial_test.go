package pipelinetest_test

// Adversarial tests of the pipeline's safety (one forward per payout at
// rail-proxy, the executor reporting the first attempt's outcome, the
// cross-record audit). Each test is a finding: it fails on the code it was
// written against and says what the fix should make true.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newExecutor returns an executor on p; d, when not nil, carries every
// request it sends.
func newExecutor(t *testing.T, p *pipelinetest.Pipeline, owner string, d client.Doer) *executor.Executor {
	t.Helper()
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = p.LockURL, p.PayURL, p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = owner, 10*time.Minute
	var opts []executor.Option
	if d != nil {
		opts = append(opts, executor.WithHTTPClient(d))
	}
	x, err := executor.New(cfg, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		t.Fatal(err)
	}
	// Its lease releases follow the push answers: wait for the last ones.
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	return x
}

// send POSTs body to url with a fencing token (none when token is 0) and
// returns the status and the body.
// signed is r with payment-resource's signature over its terms (the test
// key), as if payment-resource had created that payout with those terms:
// for tests of what lies past rail-proxy's terms check (a payment-resource
// bug, or its key in the wrong hands).
func signed(r railapi.SubmitRequest) railapi.SubmitRequest {
	r.TermsSignature = fencingtest.Terms(r.Terms())
	return r
}

// A railapi.SubmitRequest body's TermsSignature goes in its header
// (railapi.HeaderTermsSignature), as the executor sends it.
func send(t *testing.T, url, account string, token int64, body any) (int, []byte) {
	t.Helper()
	var terms string
	if sub, ok := body.(railapi.SubmitRequest); ok {
		terms = sub.TermsSignature
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if terms != "" {
		req.Header.Set(railapi.HeaderTermsSignature, terms)
	}
	if token > 0 {
		req.Header.Set(fencewire.HeaderToken, strconv.FormatInt(token, 10))
		req.Header.Set(fencewire.HeaderOwner, "review")
		req.Header.Set(fencewire.HeaderProof, fencingtest.Proof(account, token)) // as if lock-server granted it
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// debits counts the ledger debits of payout id.
func debits(t *testing.T, p *pipelinetest.Pipeline, id string) (state string, n int) {
	t.Helper()
	err := p.PayDB.QueryRow(t.Context(), `SELECT p.state,
       (SELECT count(*) FROM ledger_txn l WHERE l.payout_id = p.payout_id AND l.kind = 'payout_debit')
  FROM payout p WHERE p.payout_id = $1`, id).Scan(&state, &n)
	if err != nil {
		t.Fatal(err)
	}
	return state, n
}

// deliver runs ev like Pub/Sub would: up to max deliveries, until one is
// answered 2xx. It returns the final outcome and how many deliveries it
// took, or the last error.
func deliver(t *testing.T, x *executor.Executor, ev payoutevent.Event, max int) (executor.Outcome, int, error) {
	t.Helper()
	var err error
	for i := 1; i <= max; i++ {
		var out executor.Outcome
		out, err = x.Execute(t.Context(), ev)
		if executor.Status(out, err) == http.StatusOK {
			return out, i, nil
		}
	}
	return "", max, err
}

// Finding 1 (money moves to the wrong place and the books say otherwise;
// a payout bricked by one submission). rail-proxy's one-forward rule is
// keyed by payoutId alone, while its fence is keyed by the accountId the
// request names and rail-proxy knows neither the payout's true account
// nor its amount. A submission naming the payout with another account
// (whose high-water is empty, so token 1 passes) or another amount takes
// the payout's rail_payout row. The real executor then gets
// PAYOUT_ALREADY_SUBMITTED and reports that attempt's outcome as its own
// payout's without comparing account, amount or currency
// (executor.firstAttempt does not even decode them):
//   - an ACK for another account is booked as this payout posted (a debit
//     of the real account, for the real amount, that the rail never made);
//   - a DECLINE (an amount over the rail's limit) declines the real payout
//     for good;
//   - a first attempt with a token above the reporter's makes
//     payment-resource refuse the report (railToken > token, 400), which the
//     executor answers 503: Pub/Sub redelivers forever (BRIEF 5a).
//
// What should hold: a first attempt whose terms are not the payout's is
// not this payout's outcome; the executor leaves the payout in doubt (a
// final answer, for reconciliation) and never books or declines it.
func TestForeignFirstAttemptIsNotThePayoutsOutcome(t *testing.T) {
	cases := []struct {
		name    string
		token   int64
		account string
		amount  int64
	}{
		{"ack-for-another-account", 1, "acct-mallory", 2500},
		{"ack-for-another-amount-same-account", 1, "acct-alice", 1},
		{"decline-over-the-rail-limit", 1, "acct-mallory", 5_000_000},
		{"token-above-every-grant", 1 << 40, "acct-mallory", 2500},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := pipelinetest.Start(t, pipelinetest.Options{})
			ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-alice", AmountMinor: 2500, Currency: "EUR"}
			if err := p.CreatePayout(t.Context(), ev); err != nil {
				t.Fatal(err)
			}
			foreign := railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: c.account, AmountMinor: c.amount, Currency: "EUR"}
			// Since signed payout terms the foreign
			// submission is refused: payment-resource never signed it. It
			// carries p-1's own signature (over p-1's real terms): a known
			// key's signature over other terms, INVALID_TERMS.
			withP1sSignature := foreign
			withP1sSignature.TermsSignature = fencingtest.Terms(fencewire.PayoutTerms(ev))
			status, body := send(t, p.ProxyURL+railapi.PathSubmissions, c.account, c.token, withP1sSignature)
			if status != http.StatusForbidden || !bytes.Contains(body, []byte(railapi.CodeInvalidTerms)) {
				t.Fatalf("foreign submission: %d %s; want 403 %s", status, body, railapi.CodeInvalidTerms)
			}
			// Past that check (as if payment-resource had signed it), the
			// executor must still not take it as the payout's outcome.
			status, body = send(t, p.ProxyURL+railapi.PathSubmissions, c.account, c.token, signed(foreign))
			if status != http.StatusOK {
				t.Fatalf("foreign submission: %d %s; want it forwarded", status, body)
			}

			out, n, err := deliver(t, newExecutor(t, p, "A", nil), ev, 3)
			state, debited := debits(t, p, ev.PayoutID)
			t.Logf("outcome %q after %d deliveries (err %v); paydb state %s, %d debit(s); rail: %+v", out, n, err, state, debited, p.Stub.Submissions(ev.PayoutID))
			if err != nil {
				t.Fatalf("the event is redelivered forever: %v", err)
			}
			if out == executor.OutcomePosted || out == executor.OutcomeDeclined || debited != 0 {
				t.Errorf("the payout of %s %d EUR was booked %q from a rail submission for %s %d EUR; want it left in doubt",
					ev.AccountID, ev.AmountMinor, out, c.account, c.amount)
			}
		})
	}
}

// Finding 2 (audit false negative, INV-05). payoutaudit compares counts
// (rail submissions, acks, debits) and the rail token, never what the rail
// paid: a payout booked as 2500 EUR from acct-alice whose only rail
// submission moved 1 EUR (or moved money of another account) is reported
// balanced. Here a buggy worker, under a real lease and with its real
// token, submits the wrong amount and reports the ACK: every fence passes.
func TestAuditComparesWhatTheRailPaidWithTheBooks(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-alice", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	locks, err := client.New(p.LockURL)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := locks.Acquire(t.Context(), ev.LockKey(), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	tok := lease.Token()
	if _, err := p.Pay.Claim(t.Context(), ev.PayoutID, fencewire.Holder{Token: tok, Proof: lease.Proof(), Owner: "review"}, api.ClaimRequest{}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	// The wrong amount now needs payment-resource's signature over it too:
	// a payment-resource bug, for this test.
	status, body := send(t, p.ProxyURL+railapi.PathSubmissions, ev.AccountID, tok,
		signed(railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: 1, Currency: "EUR"}))
	var ans railapi.SubmitAnswer
	if status != http.StatusOK || json.Unmarshal(body, &ans) != nil || ans.Status != railapi.RailAck {
		t.Fatalf("submission: %d %s", status, body)
	}
	// Since rail receipts, payment-resource refuses to book an
	// ACK whose receipt covers another amount than the payout's; the rail
	// still paid 1 EUR with no debit, which the audit must report.
	_, err = p.Pay.PostResult(t.Context(), ev.PayoutID, fencewire.Holder{Token: tok, Proof: lease.Proof(), Owner: "review"},
		api.ResultRequest{Outcome: api.OutcomeAck, RailRef: ans.RailRef, RailToken: tok, Receipt: ans.Receipt})
	if !errors.Is(err, payclient.ErrInvalidReceipt) {
		t.Fatalf("result of an ACK for 1 EUR booked on a 2500 EUR payout: %v; want INVALID_RECEIPT", err)
	}
	rep, err := p.Audit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Balanced {
		t.Errorf("audit balanced (violations %v) although the rail paid %d minor units of p-1 and paydb booked %d",
			rep.Violations, 1, ev.AmountMinor)
	}
}

// cutAnswer is a transport that lets a submission reach rail-proxy and
// then loses rail-proxy's answer, as a connection reset after the request
// went out does.
type cutAnswer struct{ cut bool }

var errCut = errors.New("connection reset by peer (after the request was sent)")

func (c *cutAnswer) Do(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultClient.Do(req)
	if err == nil && c.cut && req.URL.Path == railapi.PathSubmissions {
		c.cut = false
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL, errCut)
	}
	return resp, err
}

// Finding 3 (liveness: books left in doubt for nothing). When the answer
// of rail-proxy is lost, the executor marks the payout ambiguous at once,
// a final state only a reconciliation leaves. With one forward per payout
// decided in raildb, asking again is safe: a redelivery (new lease, new
// token) either is the payout's first forward (the lost request never
// committed) or gets PAYOUT_ALREADY_SUBMITTED with the first attempt's
// outcome (or its 'forwarding' state, redelivered until it ends). The
// books could then record what the rail did instead of "in doubt".
func TestLostRailProxyAnswerIsAskedAgainNotLeftInDoubt(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-alice", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	x := newExecutor(t, p, "A", &cutAnswer{cut: true})
	out, n, err := deliver(t, x, ev, 3)
	state, debited := debits(t, p, ev.PayoutID)
	rail := p.Stub.Submissions(ev.PayoutID)
	t.Logf("outcome %q after %d deliveries (err %v); paydb %s with %d debit(s); rail submissions %d", out, n, err, state, debited, len(rail))
	if err != nil {
		t.Fatal(err)
	}
	if len(rail) != 1 || rail[0].Answer.Status != "ACK" {
		t.Fatalf("rail: %+v; want one ACK", rail)
	}
	if out != executor.OutcomePosted || debited != 1 {
		t.Errorf("the rail acknowledged p-1 and rail-proxy recorded it, yet the payout ended %q (paydb %s, %d debits); want posted after a redelivery",
			out, state, debited)
	}
}

func TestConcurrentSubmissionsOfOnePayoutReachTheRailOnce(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("rail-fencing-off=%v", off), func(t *testing.T) {
			p := pipelinetest.Start(t, pipelinetest.Options{RailFencingOff: off})
			const n = 16
			codes := make(chan int, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					// Both accounts' terms signed: what is tested is the
					// one forward per payout, past the terms check.
					status, _ := send(t, p.ProxyURL+railapi.PathSubmissions, fmt.Sprintf("acct-%d", i%2), int64(i+1),
						signed(railapi.SubmitRequest{PayoutID: "p-1", AccountID: fmt.Sprintf("acct-%d", i%2), AmountMinor: 2500, Currency: "EUR"}))
					codes <- status
				})
			}
			wg.Wait()
			close(codes)
			ok := 0
			for c := range codes {
				if c == http.StatusOK {
					ok++
				}
			}
			rail := len(p.Stub.Submissions("p-1"))
			t.Logf("%d of %d submissions answered 200; the rail received %d", ok, n, rail)
			if off {
				if rail < 2 {
					t.Errorf("with the kill switch off the rail received %d; want the burst to get through more than once", rail)
				}
				return
			}
			if rail != 1 || ok != 1 {
				t.Errorf("the rail received p-1 %d times (%d answered 200); want once", rail, ok)
			}
		})
	}
}

// Finding 5 (audit false positive, ops noise). rail-proxy answers the
// rail's ACK even when it cannot record it in raildb ("the rail's answer
// is the truth about the money"): the attempt stays 'forwarding' without
// its rail reference, and nothing ever moves it on (only a later
// submission of the payout marks an old 'forwarding' attempt ambiguous,
// and a posted payout is never submitted again). The executor books the
// ACK correctly: the rail paid once, paydb debited once with the token
// that reached the rail. The audit matches the token by rail reference
// only and reports payout_records_the_token_that_reached_the_rail broken,
// forever, for a payout whose books are right.
func TestAuditDoesNotBreakARightPayoutWhoseAnswerRaildbMissed(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-alice", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	// raildb fails the recording of the rail's answer (as a lost
	// connection or a failover right after the rail answered would).
	if _, err := p.RailDB.Exec(t.Context(), `
CREATE FUNCTION review_fail_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.state = 'forwarding' AND NEW.state = 'acked' THEN
    RAISE EXCEPTION 'injected: raildb lost while recording the answer' USING ERRCODE = '08006';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER review_fail_finish BEFORE UPDATE ON rail_attempt FOR EACH ROW EXECUTE FUNCTION review_fail_finish();`); err != nil {
		t.Fatal(err)
	}
	out, _, err := deliver(t, newExecutor(t, p, "A", nil), ev, 3)
	if err != nil || out != executor.OutcomePosted {
		t.Fatalf("delivery: %q %v; want posted", out, err)
	}
	state, debited := debits(t, p, ev.PayoutID)
	rail := p.Stub.Submissions(ev.PayoutID)
	if len(rail) != 1 || rail[0].Answer.Status != "ACK" || state != "posted" || debited != 1 {
		t.Fatalf("rail %+v, paydb %s with %d debits; want one ACK and one debit", rail, state, debited)
	}
	rep, err := p.Audit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("money moved once and the books say so, yet the audit reports: %s", v)
	}
}
