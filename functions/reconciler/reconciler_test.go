package reconciler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// No goroutine outlives the tests: the reconciler's loop and its clients end with their test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.Tests(m),
		// The Cloud SQL connector (internal/pgpool) links OpenCensus, whose
		// view worker starts once per process and never stops.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// railTimeout is rail-proxy's rail timeout in these tests: a "hang" fault
// ends the forward as ambiguous after it.
const railTimeout = 300 * time.Millisecond

// setup starts a pipeline whose rail-proxy cuts a rail call at
// railTimeout, and creates payout p-1 of acct-1.
func setup(t *testing.T) (*pipelinetest.Pipeline, payoutevent.Event) {
	t.Helper()
	p := pipelinetest.Start(t, pipelinetest.Options{RailTimeout: railTimeout})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	return p, ev
}

// newReconciler returns a reconciler on p that reports p's audit.
func newReconciler(t *testing.T, p *pipelinetest.Pipeline, owner string) *reconciler.Reconciler {
	t.Helper()
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, owner
	// The reconciler's log goes to the test's output, shown only when the
	// test fails: a pass that counts an error says why there.
	r, err := reconciler.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)),
		reconciler.WithAuditor(func(ctx context.Context) (payoutaudit.Report, error) { return p.Audit(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fault arms the rail-stub: the next submission fails in mode.
func fault(t *testing.T, p *pipelinetest.Pipeline, mode string) {
	t.Helper()
	b, _ := json.Marshal(railstub.Faults{FailNext: 1, Mode: mode})
	resp, err := http.Post(p.RailURL+"/admin/faults", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("arming fault %s: %d", mode, resp.StatusCode)
	}
}

// holder takes the lease of ev's account as owner, released at the end of
// the test (or earlier by the caller).
func holder(t *testing.T, p *pipelinetest.Pipeline, ev payoutevent.Event, owner string) (*client.Lease, fencewire.Holder) {
	t.Helper()
	c, err := client.New(p.LockURL, client.WithOwner(owner))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.Acquire(t.Context(), ev.LockKey(), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease, fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: owner}
}

// submitInDoubt plays a holder whose submission's outcome it never
// learns: it claims ev, submits it with the rail-stub's fault mode armed
// (hang: the rail records it and withholds the answer; error: the rail
// answers 503 and records nothing), reports AMBIGUOUS and releases. It
// returns the holder.
func submitInDoubt(t *testing.T, p *pipelinetest.Pipeline, ev payoutevent.Event, mode string) fencewire.Holder {
	t.Helper()
	lease, h := holder(t, p, ev, "worker-a")
	claimed, err := p.Pay.Claim(t.Context(), ev.PayoutID, h, api.ClaimRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fault(t, p, mode)
	_, err = p.Rail.Submit(t.Context(), h, railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency,
		TermsSignature: claimed.TermsSignature})
	switch {
	case mode == railstub.FaultError && errors.Is(err, railclient.ErrRailNotReached):
		// rail-proxy knows this one never reached the rail (not_sent, the
		// forward released). Make it what a failure rail-proxy cannot tell
		// from a lost answer leaves (a 503 without the rail's code, a
		// reset): the payout's forward, ambiguous, absent from the rail.
		if _, err := p.RailDB.Exec(t.Context(), `UPDATE rail_attempt SET state = 'ambiguous' WHERE payout_id = $1 AND state = 'not_sent'`, ev.PayoutID); err != nil {
			t.Fatal(err)
		}
		if _, err := p.RailDB.Exec(t.Context(), `INSERT INTO rail_payout (payout_id, attempt_id)
SELECT payout_id, max(attempt_id) FROM rail_attempt WHERE payout_id = $1 GROUP BY payout_id`, ev.PayoutID); err != nil {
			t.Fatal(err)
		}
	case !errors.Is(err, railclient.ErrRailAmbiguous):
		t.Fatalf("submission with fault %s: %v; want RAIL_AMBIGUOUS", mode, err)
	}
	if _, err := p.Pay.PostResult(t.Context(), ev.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeAmbiguous}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	return h
}

// age makes the payout's forwarded attempt older than any abandon
// threshold (as if the time had passed), and, with forwarding, puts it
// back in 'forwarding' as a rail-proxy that crashed before recording the
// rail's answer (or its absence) leaves it.
func age(t *testing.T, p *pipelinetest.Pipeline, payout string, forwarding bool) {
	t.Helper()
	q := `UPDATE rail_attempt a SET created_at = a.created_at - interval '2 hours' FROM rail_payout r
WHERE r.attempt_id = a.attempt_id AND r.payout_id = $1`
	if forwarding {
		q = `UPDATE rail_attempt a SET created_at = a.created_at - interval '2 hours', state = 'forwarding', rail_ref = NULL, finished_at = NULL
FROM rail_payout r WHERE r.attempt_id = a.attempt_id AND r.payout_id = $1`
	}
	tag, err := p.RailDB.Exec(t.Context(), q, payout)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("ageing %s's attempt: %v (%d rows)", payout, err, tag.RowsAffected())
	}
}

// ledger returns the payout's state and its debits, from paydb.
func ledger(t *testing.T, p *pipelinetest.Pipeline, id string) (string, int) {
	t.Helper()
	var (
		state string
		n     int
	)
	if err := p.PayDB.QueryRow(t.Context(), `SELECT p.state,
       (SELECT count(*) FROM ledger_txn l WHERE l.payout_id = p.payout_id AND l.kind = 'payout_debit')
  FROM payout p WHERE p.payout_id = $1`, id).Scan(&state, &n); err != nil {
		t.Fatal(err)
	}
	return state, n
}

// clean fails the test unless the full cross audit is balanced with
// nothing left unreconciled.
func clean(t *testing.T, p *pipelinetest.Pipeline) {
	t.Helper()
	rep, err := p.Audit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Balanced || len(rep.Unreconciled) != 0 || len(rep.RailPaidNoDebit) != 0 || len(rep.DebitNoRailPayment) != 0 {
		t.Fatalf("audit: balanced %v, violations %v, unreconciled %v, rail paid no debit %v, debit no rail payment %v",
			rep.Balanced, rep.Violations, rep.Unreconciled, rep.RailPaidNoDebit, rep.DebitNoRailPayment)
	}
}

// TestReconcilerSettlesEachPayoutInDoubtWithOneLedgerEffect: a payout in
// doubt is settled from the rail's own record, with exactly one ledger
// effect, whether its forward reached the rail or not and whether
// rail-proxy recorded it ambiguous or a crash left it forwarding; the
// audit is clean after, and a second pass changes nothing.
func TestReconcilerSettlesEachPayoutInDoubtWithOneLedgerEffect(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       string // rail-stub fault of the submission
		forwarding bool   // the attempt stays forwarding (a crash)
		state      api.State
		debits     int
		rail       int // submissions at the rail
	}{
		{"(a) ambiguous, reached the rail", railstub.FaultHang, false, api.StatePosted, 1, 1},
		{"(b) ambiguous, never reached the rail", railstub.FaultError, false, api.StateFailed, 0, 0},
		{"(c) forwarding left by a crash, reached the rail", railstub.FaultHang, true, api.StatePosted, 1, 1},
		{"(c) forwarding left by a crash, never reached the rail", railstub.FaultError, true, api.StateFailed, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ev := setup(t)
			submitInDoubt(t, p, ev, tc.mode)
			if st, _ := ledger(t, p, ev.PayoutID); st != string(api.StateAmbiguous) {
				t.Fatalf("p-1 is %s before the pass; want ambiguous", st)
			}
			r := newReconciler(t, p, "reconciler-1")

			// Before the abandon threshold the attempt may be in flight:
			// nothing changes.
			rep, err := r.Pass(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Results[reconciler.ResultInFlight] != 1 {
				t.Fatalf("first pass (attempt young): %+v; want in_flight", rep)
			}
			// Its audit reports what the rail paid that the books have not
			// debited (yet).
			wantPaid := []string{}
			if tc.rail == 1 {
				wantPaid = []string{ev.PayoutID}
			}
			if !slices.Equal(rep.RailPaidNoDebit, wantPaid) {
				t.Fatalf("first pass reported rail payments without a debit %v; want p-1 exactly when the rail has it", rep.RailPaidNoDebit)
			}
			if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateAmbiguous) || n != 0 {
				t.Fatalf("after a pass within the threshold p-1 is %s with %d debits", st, n)
			}

			age(t, p, ev.PayoutID, tc.forwarding)
			rep, err = r.Pass(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Listed != 1 || rep.Results[reconciler.Result(tc.state)] != 1 {
				t.Fatalf("pass: %+v; want p-1 %s", rep, tc.state)
			}
			if st, n := ledger(t, p, ev.PayoutID); st != string(tc.state) || n != tc.debits {
				t.Fatalf("p-1 is %s with %d debits; want %s with %d", st, n, tc.state, tc.debits)
			}
			if got := len(p.Stub.Submissions(ev.PayoutID)); got != tc.rail {
				t.Fatalf("the rail has %d submissions of p-1; want %d", got, tc.rail)
			}
			atts, err := p.Rail.Attempts(t.Context(), ev.PayoutID)
			if err != nil {
				t.Fatal(err)
			}
			want := railapi.StateAcked
			if tc.rail == 0 {
				want = railapi.StateNotAtRail
			}
			if len(atts) != 1 || atts[0].State != want {
				t.Fatalf("rail-proxy's attempts of p-1: %+v; want one %s", atts, want)
			}
			clean(t, p)

			// Idempotent: a second pass finds nothing, and changes nothing.
			rep, err = r.Pass(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Listed != 0 {
				t.Fatalf("second pass listed %d payouts: %+v", rep.Listed, rep)
			}
			if st, n := ledger(t, p, ev.PayoutID); st != string(tc.state) || n != tc.debits {
				t.Fatalf("after the second pass p-1 is %s with %d debits", st, n)
			}
			clean(t, p)
		})
	}
}

// TestSameResolutionTwiceChangesNothing: the resolution a reconciler
// posted, posted again by a newer holder with the same receipt, changes
// nothing: one debit for ACK, still failed for NONE.
func TestSameResolutionTwiceChangesNothing(t *testing.T) {
	for _, mode := range []string{railstub.FaultHang, railstub.FaultError} {
		t.Run(mode, func(t *testing.T) {
			p, ev := setup(t)
			submitInDoubt(t, p, ev, mode)
			age(t, p, ev.PayoutID, false)
			lease, h := holder(t, p, ev, "reconciler-x")
			rec, err := p.Rail.Reconcile(t.Context(), h, ev.PayoutID)
			if err != nil {
				t.Fatal(err)
			}
			req := api.ResolutionRequest{Outcome: api.Outcome(rec.Outcome), RailRef: rec.RailRef, RailToken: rec.RailToken, Receipt: rec.Receipt}
			first, err := p.Pay.Resolve(t.Context(), ev.PayoutID, h, req)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			_, h2 := holder(t, p, ev, "reconciler-y")
			again, err := p.Pay.Resolve(t.Context(), ev.PayoutID, h2, req)
			if err != nil {
				t.Fatalf("the same resolution again: %v", err)
			}
			if again.State != first.State || again.Debits != first.Debits || !again.UpdatedAt.Equal(first.UpdatedAt) {
				t.Fatalf("the same resolution again changed the payout: %s/%d debits/updated %s, then %s/%d/%s",
					first.State, first.Debits, first.UpdatedAt, again.State, again.Debits, again.UpdatedAt)
			}
			clean(t, p)
		})
	}
}

// TestLateAckRefusedByTheAccountFenceThenSettledOnce (d): holder A's
// submission of p-1 reached the rail and A never learned the answer; a
// newer holder B then paid and debited p-2 of the same account. A's late
// ACK for p-1 is refused by the account fence (B's debit carries a newer
// token), and the reconciler, under a lease newer than both, posts p-1
// with one debit.
func TestLateAckRefusedByTheAccountFenceThenSettledOnce(t *testing.T) {
	p, ev := setup(t)
	a := submitInDoubt(t, p, ev, railstub.FaultHang)
	age(t, p, ev.PayoutID, false)

	ev2 := payoutevent.Event{PayoutID: "p-2", AccountID: ev.AccountID, AmountMinor: 100, Currency: ev.Currency}
	if err := p.CreatePayout(t.Context(), ev2); err != nil {
		t.Fatal(err)
	}
	leaseB, b := holder(t, p, ev2, "worker-b")
	claimed, err := p.Pay.Claim(t.Context(), ev2.PayoutID, b, api.ClaimRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ans, err := p.Rail.Submit(t.Context(), b, railapi.SubmitRequest{PayoutID: ev2.PayoutID, AccountID: ev2.AccountID, AmountMinor: ev2.AmountMinor, Currency: ev2.Currency,
		TermsSignature: claimed.TermsSignature})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pay.PostResult(t.Context(), ev2.PayoutID, b, api.ResultRequest{Outcome: api.Outcome(ans.Status), RailRef: ans.RailRef, Receipt: ans.Receipt}); err != nil {
		t.Fatal(err)
	}
	if err := leaseB.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A learns the rail's answer late (with rail-proxy's receipt) and
	// reports it with its old token.
	rec, err := p.Rail.Reconcile(t.Context(), a, ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != railapi.RailAck {
		t.Fatalf("rail-proxy's reconciliation of p-1: %s; want ACK", rec.Outcome)
	}
	_, err = p.Pay.PostResult(t.Context(), ev.PayoutID, a, api.ResultRequest{Outcome: api.OutcomeAck, RailRef: rec.RailRef, RailToken: rec.RailToken, Receipt: rec.Receipt})
	if !errors.Is(err, payclient.ErrFencedOut) {
		t.Fatalf("A's late ACK: %v; want FENCED_OUT (the account fence holds B's token)", err)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateAmbiguous) || n != 0 {
		t.Fatalf("after the refused late ACK p-1 is %s with %d debits", st, n)
	}

	rep, err := newReconciler(t, p, "reconciler-1").Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[reconciler.ResultPosted] != 1 {
		t.Fatalf("pass: %+v; want p-1 posted", rep)
	}
	for _, id := range []string{ev.PayoutID, ev2.PayoutID} {
		if st, n := ledger(t, p, id); st != string(api.StatePosted) || n != 1 {
			t.Fatalf("%s is %s with %d debits; want posted with 1", id, st, n)
		}
	}
	clean(t, p)
}

// TestReconcilerAndExecutorRacingEndWithOneLedgerEffect: passes of two
// reconcilers and redeliveries of the payout's event to an executor run
// at once on one payout in doubt; it ends posted with one debit.
func TestReconcilerAndExecutorRacingEndWithOneLedgerEffect(t *testing.T) {
	p, ev := setup(t)
	submitInDoubt(t, p, ev, railstub.FaultHang)
	age(t, p, ev.PayoutID, false)
	xcfg := executor.DefaultConfig()
	xcfg.LockServerURL, xcfg.PaymentResourceURL, xcfg.RailProxyURL, xcfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, "worker-c"
	x, err := executor.New(xcfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// Its lease releases follow the push answers: wait for the last ones.
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	body, err := payoutevent.Encode(ev, "m-1", ev.AccountID, 1)
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := newReconciler(t, p, "reconciler-1"), newReconciler(t, p, "reconciler-2")
	var wg sync.WaitGroup
	for _, r := range []*reconciler.Reconciler{r1, r2} {
		wg.Go(func() {
			if _, err := r.Pass(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			x.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body)))
		})
	}
	wg.Wait()
	// A pass that met the lock held by the other is left for the next.
	if _, err := r1.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StatePosted) || n != 1 {
		t.Fatalf("p-1 is %s with %d debits; want posted with 1", st, n)
	}
	clean(t, p)
}

// TestRailSubmittedTwiceIsNeverResolved: when the rail holds two
// submissions under the payout's reference, rail-proxy answers
// RAIL_SUBMITTED_TWICE and the payout stays in doubt (a person decides).
func TestRailSubmittedTwiceIsNeverResolved(t *testing.T) {
	p, ev := setup(t)
	submitInDoubt(t, p, ev, railstub.FaultHang)
	age(t, p, ev.PayoutID, false)
	// A second submission of p-1 reaches the rail behind rail-proxy's back.
	b, _ := json.Marshal(rail.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency, Reference: ev.PayoutID})
	resp, err := http.Post(p.RailURL+rail.PathSubmit, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, h := holder(t, p, ev, "reconciler-x")
	if _, err := p.Rail.Reconcile(t.Context(), h, ev.PayoutID); !errors.Is(err, railclient.ErrRailSubmittedTwice) {
		t.Fatalf("reconciliation with two submissions at the rail: %v; want RAIL_SUBMITTED_TWICE", err)
	}
	atts, err := p.Rail.Attempts(t.Context(), ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].State != railapi.StateAmbiguous {
		t.Fatalf("attempts after the refused reconciliation: %+v; want one, still ambiguous", atts)
	}
}

// TestReconciliationNeedsTheLeaseProof: rail-proxy refuses a
// reconciliation whose token lock-server did not grant on the payout's
// lock (403 UNVERIFIED_TOKEN), and payment-resource a resolution whose
// receipt is not rail-proxy's (422 INVALID_RECEIPT); nothing changes.
func TestReconciliationNeedsTheLeaseProof(t *testing.T) {
	p, ev := setup(t)
	submitInDoubt(t, p, ev, railstub.FaultError)
	age(t, p, ev.PayoutID, false)
	_, h := holder(t, p, ev, "reconciler-x")
	if _, err := p.Rail.Reconcile(t.Context(), fencewire.Holder{Token: h.Token, Owner: "x"}, ev.PayoutID); !errors.Is(err, railclient.ErrUnverifiedToken) {
		t.Fatalf("reconciliation without a proof: %v; want UNVERIFIED_TOKEN", err)
	}
	_, err := p.Pay.Resolve(t.Context(), ev.PayoutID, h, api.ResolutionRequest{Outcome: api.OutcomeNone, RailToken: h.Token - 1, Receipt: "forged"})
	if !errors.Is(err, payclient.ErrInvalidReceipt) {
		t.Fatalf("resolution with a forged receipt: %v; want INVALID_RECEIPT", err)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateAmbiguous) || n != 0 {
		t.Fatalf("p-1 is %s with %d debits; want still ambiguous", st, n)
	}
}

// TestLateAnswerRecordedDuringTheLookUpIsNotOverwritten: the original
// forward records the rail's answer while rail-proxy's reconciliation is
// reading the rail's record (which, read a moment earlier, held nothing).
// The reconciliation's write is guarded by the state it read, so the late
// answer stands and is what it answers.
func TestLateAnswerRecordedDuringTheLookUpIsNotOverwritten(t *testing.T) {
	var (
		p    *pipelinetest.Pipeline
		late sync.Once
	)
	p = pipelinetest.Start(t, pipelinetest.Options{RailTimeout: railTimeout, RailHandler: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == rail.PathStops {
				late.Do(func() {
					if _, err := p.RailDB.Exec(r.Context(), `UPDATE rail_attempt SET state = 'declined', rail_ref = 'rail-late', finished_at = now()
WHERE payout_id = 'p-1' AND state IN ('forwarding', 'ambiguous')`); err != nil {
						t.Error(err)
					}
				})
			}
			next.ServeHTTP(w, r)
		})
	}})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	submitInDoubt(t, p, ev, railstub.FaultError)
	age(t, p, ev.PayoutID, true)
	_, h := holder(t, p, ev, "reconciler-x")
	rec, err := p.Rail.Reconcile(t.Context(), h, ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != railapi.RailDecline || rec.RailRef != "rail-late" || rec.Resolved {
		t.Fatalf("reconciliation: %s %q resolved=%v; want the late DECLINE rail-late, not resolved by it", rec.Outcome, rec.RailRef, rec.Resolved)
	}
	atts, err := p.Rail.Attempts(t.Context(), ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].State != railapi.StateDeclined || atts[0].RailRef != "rail-late" {
		t.Fatalf("attempts: %+v; want the late answer kept", atts)
	}
}

// TestPassReadsEveryPage: with a page of one payout, a pass still settles
// every payout in doubt.
func TestPassReadsEveryPage(t *testing.T) {
	p, ev := setup(t)
	ev2 := payoutevent.Event{PayoutID: "p-2", AccountID: "acct-2", AmountMinor: 300, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev2); err != nil {
		t.Fatal(err)
	}
	for _, e := range []payoutevent.Event{ev, ev2} {
		submitInDoubt(t, p, e, railstub.FaultError)
		age(t, p, e.PayoutID, false)
	}
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.PageSize = p.LockURL, p.PayURL, p.ProxyURL, 1
	r, err := reconciler.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Listed != 2 || rep.Results[reconciler.ResultFailed] != 2 {
		t.Fatalf("pass with pages of 1: %+v; want both payouts failed", rep)
	}
	clean(t, p)
}

// Settle settles one named payout as a pass would, and leaves a payout in
// no doubt alone.
func TestSettleOnePayout(t *testing.T) {
	p, ev := setup(t)
	r := newReconciler(t, p, "reconciler-1")
	if res, err := r.Settle(t.Context(), ev.PayoutID); err != nil || res != reconciler.ResultNotInDoubt {
		t.Fatalf("Settle of a pending payout: %v, %v; want %s", res, err, reconciler.ResultNotInDoubt)
	}
	if _, err := r.Settle(t.Context(), "p-unknown"); !errors.Is(err, payclient.ErrPayoutNotFound) {
		t.Fatalf("Settle of an unknown payout: %v; want ErrPayoutNotFound", err)
	}
	submitInDoubt(t, p, ev, railstub.FaultHang)
	age(t, p, ev.PayoutID, false)
	if res, err := r.Settle(t.Context(), ev.PayoutID); err != nil || res != reconciler.ResultPosted {
		t.Fatalf("Settle of an ambiguous payout the rail paid: %v, %v; want %s", res, err, reconciler.ResultPosted)
	}
	if state, debits := ledger(t, p, ev.PayoutID); state != string(api.StatePosted) || debits != 1 {
		t.Fatalf("after Settle: %s with %d debits; want posted with 1", state, debits)
	}
	clean(t, p)
}

// TestAnAttemptLeftForwardingUnderAPostedPayoutIsSettled (found by the
// crash soak, harness/README.md): rail-proxy (or raildb) died after the rail answered and before
// the answer was recorded; the executor still got the signed answer and
// the payout is posted with its one debit. No state pass visits it, so
// the attempt stayed forwarding and the audit listed it unreconciled for
// good. The pass now lists rail-proxy's unsettled attempts and settles
// each with the stop-order reconciliation: the attempt ends acked, the
// payout is untouched, the audit is clean.
func TestAnAttemptLeftForwardingUnderAPostedPayoutIsSettled(t *testing.T) {
	p, ev := setup(t)
	lease, h := holder(t, p, ev, "worker-a")
	claimed, err := p.Pay.Claim(t.Context(), ev.PayoutID, h, api.ClaimRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ans, err := p.Rail.Submit(t.Context(), h, railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency,
		TermsSignature: claimed.TermsSignature})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pay.PostResult(t.Context(), ev.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeAck, RailRef: ans.RailRef, Receipt: ans.Receipt}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	age(t, p, ev.PayoutID, true) // the answer was never recorded
	r := newReconciler(t, p, "reconciler-1")
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[reconciler.ResultAttemptSettled] != 1 {
		t.Fatalf("pass %+v; want the attempt settled", rep)
	}
	atts, err := p.Rail.Attempts(t.Context(), ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].State != railapi.StateAcked || atts[0].RailRef != ans.RailRef {
		t.Fatalf("attempts %+v; want the one attempt acked with %s", atts, ans.RailRef)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StatePosted) || n != 1 {
		t.Fatalf("p-1 is %s with %d debits; want posted with 1", st, n)
	}
	if got := len(p.Stub.Submissions(ev.PayoutID)); got != 1 {
		t.Fatalf("the rail has %d submissions of p-1; want 1", got)
	}
	clean(t, p)
	// Settled for good: the next pass finds nothing.
	if rep, err := r.Pass(t.Context()); err != nil || rep.Listed != 0 {
		t.Fatalf("second pass %+v, %v; want nothing listed", rep, err)
	}
}

// TestAnAmbiguousPayoutNeverForwardedIsClosedAndFailed (probe 13): a
// payout marked ambiguous that never reached rail-proxy used to stay
// not_forwarded for good. The reconciler now sends the payout's facts:
// rail-proxy records a closing attempt as the payout's forward (so it
// refuses every later submission itself), stops the reference at the
// rail, and answers NONE; the payout is failed, with no debit, and a late
// submission of it reaches nothing.
func TestAnAmbiguousPayoutNeverForwardedIsClosedAndFailed(t *testing.T) {
	p, ev := setup(t)
	lease, h := holder(t, p, ev, "worker-a")
	if _, err := p.Pay.Claim(t.Context(), ev.PayoutID, h, api.ClaimRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pay.PostResult(t.Context(), ev.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeAmbiguous}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := newReconciler(t, p, "reconciler-1")
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[reconciler.ResultFailed] != 1 {
		t.Fatalf("pass %+v; want p-1 failed", rep)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateFailed) || n != 0 {
		t.Fatalf("p-1 is %s with %d debits; want failed with none", st, n)
	}
	atts, err := p.Rail.Attempts(t.Context(), ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].State != railapi.StateNotAtRail || atts[0].OwnerID != "reconciler-1" {
		t.Fatalf("attempts %+v; want the reconciler's closing attempt, not_at_rail", atts)
	}
	// A late submission (a stale worker's, or a newer one's) is refused
	// by rail-proxy itself and reaches nothing.
	_, h2 := holder(t, p, ev, "worker-b")
	po, err := p.Pay.Payout(t.Context(), ev.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Rail.Submit(t.Context(), h2, railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency,
		TermsSignature: po.TermsSignature})
	if !errors.Is(err, railclient.ErrAlreadySubmitted) {
		t.Fatalf("late submission: %v; want PAYOUT_ALREADY_SUBMITTED", err)
	}
	if got := len(p.Stub.Submissions(ev.PayoutID)); got != 0 {
		t.Fatalf("the rail has %d submissions of p-1; want 0", got)
	}
	clean(t, p)
}

// ambiguousNeverForwarded leaves ev's payout ambiguous without any
// submission to rail-proxy: the closing path's case.
func ambiguousNeverForwarded(t *testing.T, p *pipelinetest.Pipeline, ev payoutevent.Event) {
	t.Helper()
	lease, h := holder(t, p, ev, "worker-a")
	if _, err := p.Pay.Claim(t.Context(), ev.PayoutID, h, api.ClaimRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pay.PostResult(t.Context(), ev.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeAmbiguous}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// alterReconciliations sends requests through http.DefaultClient, raising
// the amount of every reconciliation that carries a payout's facts (its
// terms signature, in the header, left as payment-resource made it).
type alterReconciliations struct{}

func (alterReconciliations) Do(r *http.Request) (*http.Response, error) {
	if r.URL.Path == railapi.PathReconciliations && r.Body != nil {
		var req railapi.ReconcileRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			return nil, err
		}
		if req.HasPayout() {
			req.AmountMinor *= 100
		}
		b, _ := json.Marshal(req)
		r = r.Clone(r.Context())
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	}
	return http.DefaultClient.Do(r)
}

// The closing path classifies the terms refusals once, as the executor
// does: facts payment-resource did not sign (INVALID_TERMS) are left to a
// person under their own result, terms_refused, at ERROR, and rail-proxy
// records nothing and stops nothing.
func TestClosingWithAlteredTermsIsLeftToAPerson(t *testing.T) {
	p, ev := setup(t)
	ambiguousNeverForwarded(t, p, ev)
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, "reconciler-1"
	var logs logtest.Buffer
	r, err := reconciler.New(cfg, slog.New(slog.NewJSONHandler(&logs, nil)), reconciler.WithHTTPClient(alterReconciliations{}))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[reconciler.ResultTermsRefused] != 1 || rep.Results[reconciler.ResultError] != 0 {
		t.Fatalf("pass %+v; want p-1 %s", rep, reconciler.ResultTermsRefused)
	}
	lines := logs.Events(t, reconciler.EventPayoutSkipped)
	if len(lines) != 1 || lines[0]["level"] != "ERROR" || lines[0]["result"] != string(reconciler.ResultTermsRefused) {
		t.Fatalf("%s lines %v; want one at ERROR, result %s", reconciler.EventPayoutSkipped, lines, reconciler.ResultTermsRefused)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateAmbiguous) || n != 0 {
		t.Fatalf("p-1 is %s with %d debits; want still ambiguous, none", st, n)
	}
	// The closing attempt is recorded before the stop order is sent: no
	// attempt, no stop order.
	if atts, err := p.Rail.Attempts(t.Context(), ev.PayoutID); err != nil || len(atts) != 0 {
		t.Fatalf("attempts %+v, %v; want none: nothing recorded", atts, err)
	}
	if got := len(p.Stub.Submissions("")); got != 0 {
		t.Fatalf("the rail holds %d submissions; want none", got)
	}
}

// A key rail-proxy does not hold yet (TERMS_KEY_UNKNOWN) is a deployment
// fault: the pass counts it as an error and tries again next pass, which
// closes and fails the payout once rail-proxy has the key.
func TestClosingWithAnUnknownTermsKeySucceedsOnceTheKeyIsAdded(t *testing.T) {
	next, err := fenceproof.GenerateSigningKey("pay-next", strings.NewReader(strings.Repeat("n", 64)))
	if err != nil {
		t.Fatal(err)
	}
	p := pipelinetest.Start(t, pipelinetest.Options{RailTimeout: railTimeout, TermsSigningKey: next})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	ambiguousNeverForwarded(t, p, ev)
	r := newReconciler(t, p, "reconciler-1")
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[reconciler.ResultError] != 1 || rep.Results[reconciler.ResultTermsRefused] != 0 {
		t.Fatalf("pass with the key unknown %+v; want p-1 %s (next pass)", rep, reconciler.ResultError)
	}
	p.ReplaceProxy(t, func(c *railproxy.Config) {
		ring, err := fenceproof.NewKeyring(fencingtest.TermsSigningKey().VerifyKey(), next.VerifyKey())
		if err != nil {
			t.Fatal(err)
		}
		c.TermsKeys = ring
	})
	if rep, err = r.Pass(t.Context()); err != nil || rep.Results[reconciler.ResultFailed] != 1 {
		t.Fatalf("pass with the key added: %+v, %v; want p-1 failed", rep, err)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateFailed) || n != 0 {
		t.Fatalf("p-1 is %s with %d debits; want failed with none", st, n)
	}
}

// newerHolderFirst sends requests through http.DefaultClient; before the
// first reconciliation it sends, it runs first once: a newer holder at
// work while the pass's request is on its way.
type newerHolderFirst struct {
	once  sync.Once
	first func()
}

func (d *newerHolderFirst) Do(r *http.Request) (*http.Response, error) {
	if r.URL.Path == railapi.PathReconciliations {
		d.once.Do(d.first)
	}
	return http.DefaultClient.Do(r)
}

// A newcomer probe: a closing reconciliation
// refused FENCED_OUT (the pass's lease ended, and a newer holder of the
// account's lock submitted meanwhile, raising the high-water mark) was
// counted as an error, logged at WARN and tried again every pass. It is
// the fence doing its work: the newer holder is at work on the account.
// Now it is its own result, fenced_out, logged at INFO, and nothing is
// recorded for the payout.
func TestAFencedCloseIsLeftToTheNewerHolder(t *testing.T) {
	p, ev := setup(t)
	ambiguousNeverForwarded(t, p, ev)
	ev2 := payoutevent.Event{PayoutID: "p-2", AccountID: ev.AccountID, AmountMinor: 100, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev2); err != nil {
		t.Fatal(err)
	}
	ops, err := client.New(p.LockURL, client.WithOwner("operator"))
	if err != nil {
		t.Fatal(err)
	}
	newer := &newerHolderFirst{first: func() {
		// The pass's lease is revoked (as if it had paused past its TTL)
		// and worker-b, granted a newer token, submits p-2 of the account.
		if _, err := ops.Revoke(t.Context(), ev.LockKey(), 0, "test: the reconciler paused"); err != nil {
			t.Fatal(err)
		}
		_, h := holder(t, p, ev2, "worker-b")
		po, err := p.Pay.Payout(t.Context(), ev2.PayoutID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Rail.Submit(t.Context(), h, railapi.SubmitRequest{PayoutID: ev2.PayoutID, AccountID: ev2.AccountID,
			AmountMinor: ev2.AmountMinor, Currency: ev2.Currency, TermsSignature: po.TermsSignature}); err != nil {
			t.Fatal(err)
		}
	}}
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, "reconciler-1"
	var logs logtest.Buffer
	r, err := reconciler.New(cfg, slog.New(slog.NewJSONHandler(&logs, nil)), reconciler.WithHTTPClient(newer))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[reconciler.ResultFencedOut] != 1 || rep.Results[reconciler.ResultError] != 0 {
		t.Fatalf("pass %+v; want p-1 %s", rep, reconciler.ResultFencedOut)
	}
	lines := logs.Events(t, reconciler.EventPayoutSkipped)
	if len(lines) != 1 || lines[0]["level"] != "INFO" || lines[0]["result"] != string(reconciler.ResultFencedOut) {
		t.Fatalf("%s lines %v; want one at INFO, result %s", reconciler.EventPayoutSkipped, lines, reconciler.ResultFencedOut)
	}
	if st, n := ledger(t, p, ev.PayoutID); st != string(api.StateAmbiguous) || n != 0 {
		t.Fatalf("p-1 is %s with %d debits; want still ambiguous, none", st, n)
	}
	if got := len(p.Stub.Submissions(ev.PayoutID)); got != 0 {
		t.Fatalf("the rail holds %d submissions of p-1; want none", got)
	}
}
