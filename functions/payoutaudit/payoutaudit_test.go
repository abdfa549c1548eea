package payoutaudit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// call sends a JSON request with a fencing token (none when 0) and
// returns the status and the decoded body.
func call(t *testing.T, method, url, account string, token int64, body any) (int, map[string]any) {
	t.Helper()
	var rd *bytes.Reader
	if body == nil {
		rd = bytes.NewReader(nil)
	} else {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if sub, ok := body.(railapi.SubmitRequest); ok && sub.TermsSignature != "" {
		req.Header.Set(railapi.HeaderTermsSignature, sub.TermsSignature) // as the executor sends it
	}
	if token > 0 {
		req.Header.Set(fencewire.HeaderToken, strconv.FormatInt(token, 10))
		req.Header.Set(fencewire.HeaderProof, fencingtest.Proof(account, token)) // as if lock-server granted it
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

type world struct {
	t *testing.T
	p *pipelinetest.Pipeline
}

func (w world) payout(id string) payoutevent.Event {
	e := payoutevent.Event{PayoutID: id, AccountID: "acct-" + id, AmountMinor: 2500, Currency: "EUR"}
	if err := w.p.CreatePayout(w.t.Context(), e); err != nil {
		w.t.Fatal(err)
	}
	return e
}

func (w world) claim(e payoutevent.Event, token int64) {
	if code, body := call(w.t, "POST", w.p.PayURL+api.ClaimPath(e.PayoutID), e.AccountID, token, nil); code != http.StatusOK {
		w.t.Fatalf("claim %s with %d: %d %v", e.PayoutID, token, code, body)
	}
}

// submit sends e to the rail through rail-proxy and returns the rail's
// reference.
func (w world) submit(e payoutevent.Event, token int64) string {
	code, body := call(w.t, "POST", w.p.ProxyURL+railapi.PathSubmissions, e.AccountID, token,
		railapi.SubmitRequest{PayoutID: e.PayoutID, AccountID: e.AccountID, AmountMinor: e.AmountMinor, Currency: e.Currency,
			TermsSignature: fencingtest.Terms(fencewire.PayoutTerms(e))}) // as payment-resource signs the payout
	if code != http.StatusOK {
		w.t.Fatalf("submit %s with %d: %d %v", e.PayoutID, token, code, body)
	}
	return body["railRef"].(string)
}

func (w world) report(e payoutevent.Event, token int64, ref string, railToken int64) {
	body := map[string]any{"outcome": "ACK", "railRef": ref}
	signed := token
	if railToken > 0 {
		body["railToken"] = railToken
		signed = railToken
	}
	// A receipt over exactly what is reported, as a faulty rail-proxy
	// would sign it: these tests are about what the audit finds when
	// the books were written wrong anyway.
	body["receipt"] = fencingtest.Receipt(fencewire.RailReceipt{PayoutID: e.PayoutID, AccountID: e.AccountID,
		AmountMinor: e.AmountMinor, Currency: e.Currency, Outcome: "ACK", RailRef: ref, RailToken: signed})
	if code, ans := call(w.t, "POST", w.p.PayURL+api.ResultPath(e.PayoutID), e.AccountID, token, body); code != http.StatusOK {
		w.t.Fatalf("result %s with %d: %d %v", e.PayoutID, token, code, ans)
	}
}

func (w world) audit(ids ...string) payoutaudit.Report {
	w.t.Helper()
	rep, err := w.p.Audit(w.t.Context(), ids...)
	if err != nil {
		w.t.Fatal(err)
	}
	return rep
}

func checks(rep payoutaudit.Report) []string {
	var out []string
	for _, v := range rep.Violations {
		if !slices.Contains(out, v.Check) {
			out = append(out, v.Check)
		}
	}
	slices.Sort(out)
	return out
}

func TestAPayoutPaidOnceBalances(t *testing.T) {
	w := world{t, pipelinetest.Start(t, pipelinetest.Options{})}
	e := w.payout("p-1")
	w.claim(e, 5)
	w.report(e, 5, w.submit(e, 5), 0)
	rep := w.audit()
	if !rep.Balanced || rep.RailSubmissions != 1 || rep.RailAcks != 1 || rep.Debits != 1 || len(rep.Unreconciled) != 0 || rep.Ledger == nil {
		t.Fatalf("report %+v; want balanced, 1 submission, 1 ack, 1 debit, the ledger audited", rep)
	}
}

// A second payment that paydb never recorded: the ledger's own audit
// balances, the rail's journal does not agree.
func TestDoublePaymentIsFoundWhilePaydbBalances(t *testing.T) {
	w := world{t, pipelinetest.Start(t, pipelinetest.Options{RailFencingOff: true})}
	e := w.payout("p-1")
	w.claim(e, 6)
	ref := w.submit(e, 6)
	w.submit(e, 5) // a stale holder's submission, let through with the fence off
	w.report(e, 6, ref, 0)
	rep := w.audit()
	if rep.Ledger == nil || !rep.Ledger.Balanced {
		t.Fatalf("paydb's own audit %+v; want balanced (that is the point)", rep.Ledger)
	}
	want := []string{payoutaudit.CheckRailMatchesLedger, payoutaudit.CheckRailOnce}
	if got := checks(rep); rep.Balanced || !slices.Equal(got, want) {
		t.Fatalf("checks broken %v (%v); want %v", got, rep.Violations, want)
	}
}

// Money that went to the rail without rail-proxy.
func TestASubmissionThatBypassedRailProxyIsFound(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	w := world{t, p}
	e := w.payout("p-1")
	rec := httptest.NewRecorder()
	b, _ := json.Marshal(rail.SubmitRequest{PayoutID: e.PayoutID, AccountID: e.AccountID, AmountMinor: e.AmountMinor, Currency: e.Currency, Reference: e.PayoutID})
	req := httptest.NewRequest("POST", rail.PathSubmit, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	p.Stub.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("rail-stub: %d %s", rec.Code, rec.Body)
	}
	rep := w.audit(e.PayoutID)
	if got := checks(rep); !slices.Contains(got, payoutaudit.CheckRailThroughProxy) {
		t.Fatalf("checks broken %v; want %s", got, payoutaudit.CheckRailThroughProxy)
	}
	// The rail acknowledged a payout nobody reported: unreconciled money.
	if !slices.Equal(rep.Unreconciled, []string{e.PayoutID}) {
		t.Fatalf("unreconciled %v; want [%s]", rep.Unreconciled, e.PayoutID)
	}
}

// The payout must record the token its submission reached the rail with.
func TestAWrongRailTokenIsFound(t *testing.T) {
	w := world{t, pipelinetest.Start(t, pipelinetest.Options{})}
	e := w.payout("p-1")
	w.claim(e, 5)
	w.report(e, 5, w.submit(e, 5), 4)
	if got := checks(w.audit(e.PayoutID)); !slices.Equal(got, []string{payoutaudit.CheckRailToken}) {
		t.Fatalf("checks broken %v; want %s", got, payoutaudit.CheckRailToken)
	}
}

// railReader reads p's rail-stub journal, as the reconciler reads GET
// /submissions; before each read it runs the next of hooks, if any (what
// happened in the pipeline just before the audit read the rail).
func railReader(p *pipelinetest.Pipeline, hooks ...func()) payoutaudit.RailReader {
	calls := 0
	return func(context.Context) ([]rail.Submission, error) {
		if calls < len(hooks) && hooks[calls] != nil {
			hooks[calls]()
		}
		calls++
		return p.Stub.Submissions(""), nil
	}
}

// A payout the rail pays after the audit read the books and that is
// posted before the second look is in flight, not a rail payment without
// a debit: the game day's interleaving, the other way round.
func TestLiveAuditGivesAPaymentAheadOfItsDebitASecondLook(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	w := world{t, p}
	e := w.payout("p-1")
	var ref string
	paid := func() { w.claim(e, 5); ref = w.submit(e, 5) } // the rail records and ACKs; no post yet
	looks := 0
	settled := func(context.Context) error { looks++; w.report(e, 5, ref, 0); return nil } // the executor's post lands
	rep, err := payoutaudit.Live(t.Context(), p.PayDB, p.RailDB, railReader(p, paid), nil, payoutaudit.LiveConfig{Settled: settled})
	if err != nil {
		t.Fatal(err)
	}
	if looks != 1 {
		t.Fatalf("second looks %d; want 1 (the first look must flag the payout)", looks)
	}
	if !rep.Balanced || len(rep.RailPaidNoDebit) != 0 || len(rep.DebitNoRailPayment) != 0 || !slices.Equal(rep.InFlight, []string{e.PayoutID}) {
		t.Fatalf("report %+v; want balanced, no mismatch, %s in flight", rep, e.PayoutID)
	}
}

// Real discrepancies persist through the second look and are reported: a
// payment the rail holds that never gets a debit (sent to the rail
// directly, past rail-proxy) and a debit with no rail payment (a post
// with a rail reference the rail never issued).
func TestLiveAuditStillReportsRealDiscrepancies(t *testing.T) {
	p := pipelinetest.Start(t, pipelinetest.Options{})
	w := world{t, p}
	ok := w.payout("p-1")
	w.claim(ok, 5)
	w.report(ok, 5, w.submit(ok, 5), 0)
	unbooked := w.payout("p-2")
	rec := httptest.NewRecorder()
	b, _ := json.Marshal(rail.SubmitRequest{PayoutID: unbooked.PayoutID, AccountID: unbooked.AccountID, AmountMinor: unbooked.AmountMinor,
		Currency: unbooked.Currency, Reference: unbooked.PayoutID})
	req := httptest.NewRequest("POST", rail.PathSubmit, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	p.Stub.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("rail-stub: %d %s", rec.Code, rec.Body)
	}
	unpaid := w.payout("p-3")
	w.claim(unpaid, 5)
	w.report(unpaid, 5, "rail-999999", 0)

	looks := 0
	rep, err := payoutaudit.Live(t.Context(), p.PayDB, p.RailDB, railReader(p), nil,
		payoutaudit.LiveConfig{Settled: func(context.Context) error { looks++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if looks != 1 {
		t.Fatalf("second looks %d; want 1", looks)
	}
	if !slices.Equal(rep.RailPaidNoDebit, []string{unbooked.PayoutID}) || !slices.Equal(rep.DebitNoRailPayment, []string{unpaid.PayoutID}) || len(rep.InFlight) != 0 {
		t.Fatalf("rail paid no debit %v, debit no rail payment %v, in flight %v; want [%s], [%s], []",
			rep.RailPaidNoDebit, rep.DebitNoRailPayment, rep.InFlight, unbooked.PayoutID, unpaid.PayoutID)
	}
	found := func(check, id string) bool {
		return slices.ContainsFunc(rep.Violations, func(v payoutaudit.Violation) bool { return v.Check == check && v.Subject == id })
	}
	if rep.Balanced || !found(payoutaudit.CheckRailThroughProxy, unbooked.PayoutID) || !found(payoutaudit.CheckRailMatchesLedger, unpaid.PayoutID) {
		t.Fatalf("violations %v; want %s for %s and %s for %s", rep.Violations,
			payoutaudit.CheckRailThroughProxy, unbooked.PayoutID, payoutaudit.CheckRailMatchesLedger, unpaid.PayoutID)
	}
	if !slices.Contains(rep.Unreconciled, unbooked.PayoutID) {
		t.Fatalf("unreconciled %v; want %s (money moved, no outcome)", rep.Unreconciled, unbooked.PayoutID)
	}
}
