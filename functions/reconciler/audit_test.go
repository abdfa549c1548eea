package reconciler_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// doerFunc is an HTTP client made of a function.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// payOut plays an executor that finishes ev: it claims the payout,
// submits it through rail-proxy (the rail records and acknowledges it)
// and posts the ACK (one debit).
func payOut(t *testing.T, p *pipelinetest.Pipeline, ev payoutevent.Event) {
	t.Helper()
	lease, h := holder(t, p, ev, "worker-live")
	claimed, err := p.Pay.Claim(t.Context(), ev.PayoutID, h, api.ClaimRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ans, err := p.Rail.Submit(t.Context(), h, railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID,
		AmountMinor: ev.AmountMinor, Currency: ev.Currency, TermsSignature: claimed.TermsSignature})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pay.PostResult(t.Context(), ev.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeAck, RailRef: ans.RailRef,
		RailToken: ans.Token, Receipt: ans.Receipt}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// liveAuditor returns the reconciler's DBAuditor on p (a settle of 1 ms)
// whose first read of the rail's journal (GET /submissions) runs before
// (when not nil) just before the request is sent, and after just after
// the journal was answered, before the audit sees the answer.
func liveAuditor(t *testing.T, p *pipelinetest.Pipeline, before, after func()) reconciler.Auditor {
	t.Helper()
	var once sync.Once
	d := doerFunc(func(req *http.Request) (*http.Response, error) {
		if !strings.HasSuffix(req.URL.Path, rail.PathJournal) {
			return http.DefaultClient.Do(req)
		}
		first := false
		once.Do(func() { first = true })
		if first && before != nil {
			before()
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || !first || after == nil {
			return resp, err
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		after()
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		return resp, nil
	})
	audit, closeAudit, err := reconciler.DBAuditor(t.Context(), p.PayDB.Config().ConnString(), p.RailDB.Config().ConnString(),
		p.RailURL, time.Millisecond, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAudit)
	return audit
}

// TestAuditBesideLiveTrafficReportsNoPayoutInFlight is the game day's
// false "debit without rail payment" (docs/gameday.md, gd-load-480),
// replayed with hooks instead of timing: a payout is paid by the rail and
// posted by paydb while the reconciler's audit reads the records, once
// right after its read of the rail's journal and once right before it.
// Neither is a discrepancy: the pass reports no mismatch.
func TestAuditBesideLiveTrafficReportsNoPayoutInFlight(t *testing.T) {
	for _, tc := range []struct {
		name         string
		afterJournal bool
	}{
		{"paid and posted right after the audit read the rail's journal", true},
		{"paid and posted right before the audit read the rail's journal", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ev := setup(t)
			before, after := func() { payOut(t, p, ev) }, func() {}
			if tc.afterJournal {
				before, after = nil, before
			}
			cfg := reconciler.DefaultConfig()
			cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, "reconciler-live"
			r, err := reconciler.New(cfg, slog.New(slog.DiscardHandler), reconciler.WithAuditor(liveAuditor(t, p, before, after)))
			if err != nil {
				t.Fatal(err)
			}
			rep, err := r.Pass(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if st, n := ledger(t, p, ev.PayoutID); st != string(api.StatePosted) || n != 1 {
				t.Fatalf("%s is %s with %d debits; want posted with 1 (the hook did not run)", ev.PayoutID, st, n)
			}
			if len(rep.RailPaidNoDebit) != 0 || len(rep.DebitNoRailPayment) != 0 {
				t.Fatalf("pass reports rail paid no debit %v, debit no rail payment %v; want none (the payout was in flight)",
					rep.RailPaidNoDebit, rep.DebitNoRailPayment)
			}
			auditListsShown(t, rep) // the audit ran and found none
			clean(t, p)
		})
	}
}

// TestAuditBesideLiveTrafficStillReportsARealDiscrepancy: a payment the
// rail holds that never gets a debit (sent to the rail-stub directly,
// past rail-proxy) and a debit with no rail payment (an ACK posted with a
// rail reference the rail never issued, under a receipt signed with
// rail-proxy's key, as a faulty rail-proxy would) are still reported by
// the pass, after the audit's second look, beside a payout posted right
// after the journal was read.
func TestAuditBesideLiveTrafficStillReportsARealDiscrepancy(t *testing.T) {
	p, ev := setup(t)
	unbooked := payoutevent.Event{PayoutID: "p-2", AccountID: "acct-2", AmountMinor: 2500, Currency: "EUR"}
	unpaid := payoutevent.Event{PayoutID: "p-3", AccountID: "acct-3", AmountMinor: 2500, Currency: "EUR"}
	for _, e := range []payoutevent.Event{unbooked, unpaid} {
		if err := p.CreatePayout(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	payAtRail(t, p, rail.SubmitRequest{PayoutID: unbooked.PayoutID, AccountID: unbooked.AccountID,
		AmountMinor: unbooked.AmountMinor, Currency: unbooked.Currency, Reference: unbooked.PayoutID})
	lease, h := holder(t, p, unpaid, "worker-forger")
	if _, err := p.Pay.Claim(t.Context(), unpaid.PayoutID, h, api.ClaimRequest{}); err != nil {
		t.Fatal(err)
	}
	const ref = "rail-999999"
	receipt := fencingtest.Receipt(fencewire.RailReceipt{PayoutID: unpaid.PayoutID, AccountID: unpaid.AccountID, AmountMinor: unpaid.AmountMinor,
		Currency: unpaid.Currency, Outcome: string(api.OutcomeAck), RailRef: ref, RailToken: h.Token})
	if _, err := p.Pay.PostResult(t.Context(), unpaid.PayoutID, h, api.ResultRequest{Outcome: api.OutcomeAck, RailRef: ref, Receipt: receipt}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, "reconciler-live"
	r, err := reconciler.New(cfg, slog.New(slog.DiscardHandler), reconciler.WithAuditor(liveAuditor(t, p, nil, func() { payOut(t, p, ev) })))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Pass(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.RailPaidNoDebit, []string{unbooked.PayoutID}) || !slices.Equal(rep.DebitNoRailPayment, []string{unpaid.PayoutID}) {
		t.Fatalf("pass reports rail paid no debit %v, debit no rail payment %v; want [%s], [%s]",
			rep.RailPaidNoDebit, rep.DebitNoRailPayment, unbooked.PayoutID, unpaid.PayoutID)
	}
}

// The audit's settle is a positive number of milliseconds: LoadConfig
// reads it (default payoutaudit.DefaultSettle) and refuses 0 naming the
// variable, and DBAuditor refuses a settle that is not positive.
func TestAuditSettleIsConfiguredAndValidated(t *testing.T) {
	env := map[string]string{lockapi.EnvServerURL: "http://127.0.0.1:1", reconciler.EnvPaymentResourceURL: "http://127.0.0.1:2",
		reconciler.EnvRailProxyURL: "http://127.0.0.1:3"}
	cfg, err := reconciler.LoadConfig(func(k string) string { return env[k] })
	if err != nil || cfg.AuditSettle != payoutaudit.DefaultSettle {
		t.Fatalf("LoadConfig: settle %v, %v; want %v", cfg.AuditSettle, err, payoutaudit.DefaultSettle)
	}
	env[reconciler.EnvAuditSettleMs] = "1500"
	if cfg, err = reconciler.LoadConfig(func(k string) string { return env[k] }); err != nil || cfg.AuditSettle != 1500*time.Millisecond {
		t.Fatalf("LoadConfig with %s=1500: settle %v, %v; want 1.5s", reconciler.EnvAuditSettleMs, cfg.AuditSettle, err)
	}
	env[reconciler.EnvAuditSettleMs] = "0"
	if _, err = reconciler.LoadConfig(func(k string) string { return env[k] }); !errors.Is(err, reconciler.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), reconciler.EnvAuditSettleMs) {
		t.Fatalf("LoadConfig with %s=0: %v; want ErrInvalidConfig naming it", reconciler.EnvAuditSettleMs, err)
	}
	_, _, err = reconciler.DBAuditor(t.Context(), "postgres://127.0.0.1:1/paydb", "postgres://127.0.0.1:1/raildb", "http://127.0.0.1:4", 0, http.DefaultClient)
	if !errors.Is(err, reconciler.ErrInvalidConfig) {
		t.Fatalf("DBAuditor with settle 0: %v; want ErrInvalidConfig", err)
	}
}

// mismatchGauge reads reconciler_audit_mismatches{kind} from the
// reconciler's collectors.
func mismatchGauge(t *testing.T, kind string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(reconciler.Collectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "reconciler_audit_mismatches" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series reconciler_audit_mismatches{kind=%q}", kind)
	return 0
}

// TestAuditFindingsAreCountedForThePage: what the audit finds wrong is
// counted in reconciler_audit_mismatches{kind}, which PayoutAuditMismatch
// pages on, listed in the run's answer and logged. An unbalanced account
// (its balance moved by hand in paydb) is a violation, which the two
// payout kinds do not see; the next audit after the repair sets every
// kind to 0 (the page ends); a rail payment paydb never booked is a rail
// payment without a debit, and its broken rules are violations too.
func TestAuditFindingsAreCountedForThePage(t *testing.T) {
	p, ev := setup(t)
	var logs logtest.Buffer
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL, cfg.Owner = p.LockURL, p.PayURL, p.ProxyURL, "reconciler-page"
	r, err := reconciler.New(cfg, slog.New(slog.NewJSONHandler(&logs, nil)), reconciler.WithAuditor(liveAuditor(t, p, nil, nil)))
	if err != nil {
		t.Fatal(err)
	}
	pass := func() reconciler.PassReport {
		t.Helper()
		rep, err := r.Pass(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		auditShown(t, rep)
		return rep
	}
	want := func(step string, rail, debit, violation float64) {
		t.Helper()
		for kind, w := range map[string]float64{reconciler.KindRailPaidNoDebit: rail, reconciler.KindDebitNoRailPayment: debit, reconciler.KindViolation: violation} {
			if got := mismatchGauge(t, kind); got != w {
				t.Errorf("%s: reconciler_audit_mismatches{kind=%q} = %v; want %v", step, kind, got, w)
			}
		}
	}
	moveBalance := func(by int64) {
		t.Helper()
		if _, err := p.PayDB.Exec(t.Context(), `UPDATE account SET balance_minor = balance_minor + $2 WHERE account_id = $1`, ev.AccountID, by); err != nil {
			t.Fatal(err)
		}
	}

	moveBalance(-1)
	rep := pass()
	if len(rep.Violations) != 1 || rep.Violations[0].Check != api.CheckAccountBalance || rep.Violations[0].Subject != ev.AccountID {
		t.Fatalf("unbalanced %s: violations %+v; want one %s of it", ev.AccountID, rep.Violations, api.CheckAccountBalance)
	}
	want("unbalanced account", 0, 0, 1)
	lines := logs.Events(t, reconciler.EventAuditViolation)
	if len(lines) != 1 || lines[0]["level"] != "ERROR" || lines[0]["check"] != api.CheckAccountBalance || lines[0]["subject"] != ev.AccountID {
		t.Errorf("%s lines %v; want one at ERROR naming %s of %s", reconciler.EventAuditViolation, lines, api.CheckAccountBalance, ev.AccountID)
	}

	moveBalance(1)
	if rep := pass(); len(rep.Violations) != 0 {
		t.Fatalf("after the repair: violations %+v; want none", rep.Violations)
	}
	want("after the repair", 0, 0, 0)

	const unbooked = "p-unbooked"
	payAtRail(t, p, rail.SubmitRequest{PayoutID: unbooked, AccountID: "acct-9", AmountMinor: 100, Currency: "EUR", Reference: unbooked})
	rep = pass()
	if !slices.Equal(rep.RailPaidNoDebit, []string{unbooked}) || len(rep.Violations) == 0 {
		t.Fatalf("a rail payment paydb never booked: rail paid no debit %v, violations %+v; want [%s] and its broken rules",
			rep.RailPaidNoDebit, rep.Violations, unbooked)
	}
	want("a rail payment without a debit", 1, 0, float64(len(rep.Violations)))
}

// auditShown fails unless rep, as the run answers it, carries the three
// audit lists (docs/payout-api.md), [] or not.
func auditShown(t *testing.T, rep reconciler.PassReport) {
	t.Helper()
	b, lists := auditLists(t, rep)
	for k, v := range lists {
		if len(v) == 0 || v[0] != '[' {
			t.Errorf("run answer %s: %s = %q; want a list", b, k, v)
		}
	}
}

// payAtRail submits req straight to p's rail-stub, past rail-proxy and
// both fence points (a payment the books never booked), and wants 200.
func payAtRail(t *testing.T, p *pipelinetest.Pipeline, req rail.SubmitRequest) {
	t.Helper()
	b, _ := json.Marshal(req)
	resp, err := http.Post(p.RailURL+rail.PathSubmit, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("rail-stub: %d", resp.StatusCode)
	}
}
