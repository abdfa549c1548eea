package benche2e_test

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/benche2e"
)

// TestCostRecomputesTheMillionPayoutsFromMeasuredFigures: the cost model
// of a real run (testdata/cost-measured.json, the "after" postgres spread
// run of docs/benchmarks.md) is recomputed here by hand, line by line,
// from the run's CPU and requests per payout and the list prices.
func TestCostRecomputesTheMillionPayoutsFromMeasuredFigures(t *testing.T) {
	b, err := os.ReadFile("testdata/cost-measured.json")
	if err != nil {
		t.Fatal(err)
	}
	var m benche2e.Measurement
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	p, s := benche2e.DefaultPrices(), benche2e.DefaultShape()
	lines := benche2e.Cost(m, "postgres", s, p)
	got := map[string]benche2e.CostLine{}
	for _, l := range lines {
		got[l.Part] = l
	}

	reqs := func(svc string) float64 {
		var n float64
		for k, v := range m.RequestsPerPayout {
			if strings.HasPrefix(k, svc+" ") {
				n += v
			}
		}
		return n
	}
	// Cloud Run: CPU ms per payout / 1000 * 10^6 payouts / 0.6 busy =
	// billed vCPU-seconds, each with 0.5 GiB; plus the requests.
	run := func(ms, requests float64) float64 {
		billed := ms / 1000 * 1e6 / 0.6
		return billed*0.000024 + billed*0.5*0.0000025 + requests*1e6/1e6*0.40
	}
	executors := m.CPUPerPayoutMs["executor-A"] + m.CPUPerPayoutMs["executor-B"]
	want := map[string]float64{
		"Cloud Run payment-resource": run(m.CPUPerPayoutMs["payment-resource"], reqs("payment-resource")),
		"Cloud Run rail-proxy":       run(m.CPUPerPayoutMs["rail-proxy"], reqs("rail-proxy")),
		"Cloud Run executor":         run(executors, reqs("executor")),
		"Cloud Run reconciler":       run(m.CPUPerPayoutMs["reconciler"], 0),
		"Pub/Sub":                    2 * 1000 * 1e6 / (1 << 40) * 40,
	}
	// The pipeline saturates at its slowest part: one vCPU of paydb's
	// instance, three Cloud Run instances at 60%, or lock-server's two
	// pods of 0.35 vCPU.
	rate := math.Inf(1)
	for _, r := range []float64{
		1000 / m.CPUPerPayoutMs["postgres-paydb"], 1000 / m.CPUPerPayoutMs["postgres-lockdb"],
		3 * 0.6 * 1000 / m.CPUPerPayoutMs["payment-resource"], 3 * 0.6 * 1000 / m.CPUPerPayoutMs["rail-proxy"],
		3 * 0.6 * 1000 / executors, 3 * 0.6 * 1000 / m.CPUPerPayoutMs["reconciler"],
		2 * 0.35 * 1000 / m.CPUPerPayoutMs["lock-server"],
	} {
		rate = math.Min(rate, r)
	}
	hours := 1e6 / rate / 3600
	want["Cloud SQL paydb and raildb"] = hours * (0.0413 + 3.75*0.007)
	want["Cloud SQL lockdb"] = hours * (0.0413 + 3.75*0.007)
	want["GKE Autopilot lock-server"] = hours * 2 * (0.35*0.0445 + 0.375*0.0049225)
	var total float64
	for part, usd := range want {
		total += usd
		l, ok := got[part]
		if !ok {
			t.Errorf("no line for %s", part)
			continue
		}
		if math.Abs(l.USD-usd) > 1e-9 {
			t.Errorf("%s: %.6f USD; want %.6f", part, l.USD, usd)
		}
	}
	if _, ok := got["GKE Autopilot etcd"]; ok {
		t.Errorf("the postgres backend priced etcd pods")
	}
	if len(got) != len(want)+1 {
		t.Errorf("%d lines %v; want %d and the total", len(got), lines, len(want))
	}
	if tot := got["total"]; math.Abs(tot.USD-total) > 1e-9 || math.Abs(tot.SaturatesAt-rate) > 1e-9 {
		t.Errorf("total %.6f USD at %.2f payouts/s; want %.6f at %.2f", tot.USD, tot.SaturatesAt, total, rate)
	}
}
