package pipelinetest_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
)

// The cardinality rule (SC-11) for every function's metrics, the
// game day's included (payout_completion_seconds, the rail's
// submission counts, the paydb ages): payouts of ever more accounts
// through the whole pipeline, and no label value is a payout id, an account id, a lock key, an owner or
// a token, and the number of series does not grow with the payouts.
// The request metrics of the four functions (package httpmetrics) are
// among them, and each function must have counted its requests by
// registered pattern. (lock-server's metrics have their own test in
// package lockserver.)
func TestFunctionMetricsCarryNoIdsOrTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, cs := range [][]prometheus.Collector{paymentresource.Collectors(), railproxy.Collectors(), railstub.Collectors(),
		executor.Collectors(), payoutbus.Collectors(), reconciler.Collectors(), httpmetrics.Collectors()} {
		for _, c := range cs {
			// The fence points' collectors (fencing.Collectors) are in
			// both payment-resource's and rail-proxy's: one registration
			// of each is enough. Another collector of the same name
			// still fails.
			var dup prometheus.AlreadyRegisteredError
			if err := reg.Register(c); err != nil && !(errors.As(err, &dup) && dup.ExistingCollector == c) {
				t.Fatal(err)
			}
		}
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
			// The same event again, as a Pub/Sub push to the executor's
			// HTTP endpoint (a redelivery: already posted).
			body, err := payoutevent.Encode(ev, "m-"+ev.PayoutID, ev.AccountID, 2)
			if err != nil {
				t.Fatal(err)
			}
			w := httptest.NewRecorder()
			x.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body)))
			if w.Code != http.StatusOK {
				t.Fatalf("push of %s: %d %s", ev.PayoutID, w.Code, w.Body)
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
		"payouts_ambiguous_oldest_age_seconds", "payment_outbox_oldest_unpublished_age_seconds", "fence_refusals_total", railproxy.MetricForwards, "executor_deliveries_total", executor.MetricAttentionUnrecorded} {
		if !names[want] {
			t.Errorf("metric %s is not served", want)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Every function's requests are counted (package httpmetrics), by a
	// route that is a registered pattern, never a path.
	routes := map[string]map[string]bool{}
	for _, f := range fams {
		if f.GetName() != httpmetrics.NameRequests {
			continue
		}
		for _, m := range f.GetMetric() {
			var fn, route string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case httpmetrics.LabelFunction:
					fn = l.GetValue()
				case httpmetrics.LabelRoute:
					route = l.GetValue()
				}
			}
			for v, what := range secret {
				if what != "token" && strings.Contains(route, v) {
					t.Errorf("%s{%s=%q} carries a %s", httpmetrics.NameRequests, httpmetrics.LabelRoute, route, what)
				}
			}
			if routes[fn] == nil {
				routes[fn] = map[string]bool{}
			}
			routes[fn][route] = true
		}
	}
	for fn, want := range map[string]string{
		paymentresource.MetricsFunction: payapi.PathClaim,
		railproxy.MetricsFunction:       railapi.PathSubmissions,
		railstub.MetricsFunction:        rail.PathSubmit,
		executor.MetricsFunction:        executor.MetricsRoute,
	} {
		if !routes[fn][want] {
			t.Errorf("%s{%s=%q} has no %s=%q series (routes seen: %v)", httpmetrics.NameRequests, httpmetrics.LabelFunction, fn, httpmetrics.LabelRoute, want, routes[fn])
		}
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
