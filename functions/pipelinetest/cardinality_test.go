package pipelinetest_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
)

// The cardinality rule (SC-11) for every function's metrics, the ones
// issue #9 added included (payout_completion_seconds, the rail's
// submission counts, the paydb ages): payouts of ever more accounts
// through the whole pipeline, and no label value is a payout id, an account id, a lock key, an owner or
// a token, and the number of series does not grow with the payouts.
// (lock-server's metrics have their own test in package lockserver.)
func TestFunctionMetricsCarryNoIdsOrTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, cs := range [][]prometheus.Collector{paymentresource.Collectors(), railstub.Collectors(), executor.Collectors(),
		payoutbus.Collectors(), reconciler.Collectors()} {
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := fencing.Register(reg); err != nil {
		t.Fatal(err)
	}
	series := func() (int, map[string]bool) {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n, names := 0, map[string]bool{}
		for _, f := range fams {
			names[f.GetName()] = true
			n += len(f.GetMetric())
		}
		return n, names
	}

	p := pipelinetest.Start(t, pipelinetest.Options{})
	x := newExecutor(t, p, "worker-a", nil)
	secret := map[string]string{"worker-a": "owner"}
	round := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			ev := payoutevent.Event{PayoutID: fmt.Sprintf("p-%s-%d", prefix, i), AccountID: fmt.Sprintf("acct-%s-%d", prefix, i), AmountMinor: 100 + int64(i), Currency: "EUR"}
			secret[ev.PayoutID], secret[ev.AccountID], secret[ev.LockKey()] = "payout id", "account id", "lock key"
			if err := p.CreatePayout(t.Context(), ev); err != nil {
				t.Fatal(err)
			}
			if out, _, err := deliver(t, x, ev, 3); err != nil || out != executor.OutcomePosted {
				t.Fatalf("%s: %q, %v; want posted", ev.PayoutID, out, err)
			}
			st, err := p.Locks.Inspect(t.Context(), ev.LockKey())
			if err != nil {
				t.Fatal(err)
			}
			secret[strconv.FormatInt(st.LastToken, 10)] = "token"
		}
	}
	round("a", 3)
	small, names := series()
	round("b", 10)
	big, _ := series()
	if big != small {
		t.Errorf("%d series after 3 payouts, %d after 13: series grow with payouts", small, big)
	}
	for _, want := range []string{"payout_completion_seconds", "rail_submissions_total", "rail_duplicate_submissions_total",
		"payouts_ambiguous_oldest_age_seconds", "payment_outbox_oldest_unpublished_age_seconds", "fence_refusals_total", "executor_deliveries_total"} {
		if !names[want] {
			t.Errorf("metric %s is not served", want)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if what, ok := secret[l.GetValue()]; ok {
					t.Errorf("%s{%s=%q} carries a %s", f.GetName(), l.GetName(), l.GetValue(), what)
				}
			}
		}
	}
}
