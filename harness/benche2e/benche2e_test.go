package benche2e_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/benche2e"
)

func TestPercentilesNearestRank(t *testing.T) {
	xs := make([]float64, 0, 100)
	for i := 100; i >= 1; i-- {
		xs = append(xs, float64(i))
	}
	got := benche2e.Percentiles(xs)
	want := map[string]float64{"p50": 50, "p95": 95, "p99": 99, "max": 100}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	if got := benche2e.Percentiles(nil); got["p99"] != 0 {
		t.Errorf("Percentiles(nil) = %v; want zeros", got)
	}
}

func TestValidateReportsEveryInvalidField(t *testing.T) {
	cfg := benche2e.DefaultConfig()
	cfg.Backends, cfg.Modes, cfg.Runs = []string{"redis"}, []string{"sideways"}, 0
	err := cfg.Validate()
	for _, s := range []string{"redis", "sideways", "Runs", "BinDir"} {
		if !errors.Is(err, benche2e.ErrInvalidConfig) || !strings.Contains(err.Error(), s) {
			t.Errorf("Validate = %v; want ErrInvalidConfig naming %s", err, s)
		}
	}
	cfg = benche2e.DefaultConfig()
	cfg.Dir, cfg.BinDir = "d", "b"
	if err := cfg.Validate(); err != nil {
		t.Errorf("DefaultConfig with folders: %v", err)
	}
}

// The table shows a run that broke a check: a bench with a double-paid
// record must not read as clean.
func TestMarkdownCountsBrokenChecks(t *testing.T) {
	res := &benche2e.Result{Runs: []benche2e.RunResult{
		{Backend: "postgres", Mode: "spread", Variant: "after", Round: 1, Failures: []string{},
			Measurement: benche2e.Measurement{PayoutsPerSecond: 100, Deliveries: map[string]int{"A": 60, "B": 40},
				CPUPerPayoutMs: map[string]float64{"total": 5, "lock-server": 1}}},
		{Backend: "postgres", Mode: "spread", Variant: "after", Round: 2, Failures: []string{"no payout reached the rail twice: payout soak-1 reached the rail 2 times"},
			Measurement: benche2e.Measurement{PayoutsPerSecond: 120, Deliveries: map[string]int{"A": 50, "B": 50},
				CPUPerPayoutMs: map[string]float64{"total": 7, "lock-server": 2}}},
	}}
	var b bytes.Buffer
	if err := benche2e.WriteMarkdown(&b, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| postgres | spread | after | 2 | 110.0 (100.0, 120.0) |", "| 0/0 | 6.00 |", "A 110, B 90", "| 1 |\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, b.String())
		}
	}
}

// TestCreatorsSeriesTakesTheMedianAndSkipsBrokenRuns: the chart's points
// are the median run per backend, mode, variant and creators, runs that
// broke a check are left out, and the SVG names every series.
func TestCreatorsSeriesTakesTheMedianAndSkipsBrokenRuns(t *testing.T) {
	run := func(backend, variant string, creators int, perSecond float64, failures ...string) benche2e.RunResult {
		r := benche2e.RunResult{Backend: backend, Mode: "spread", Variant: variant, Creators: creators, Failures: failures}
		r.Payouts, r.PayoutsPerSecond = 100, perSecond
		return r
	}
	a := &benche2e.Result{Runs: []benche2e.RunResult{
		run("postgres", "after", 4, 30), run("postgres", "after", 4, 50), run("postgres", "after", 4, 40),
		run("postgres", "after", 4, 900, "no payout reached the rail twice"),
		run("postgres", "before", 4, 20),
	}}
	b := &benche2e.Result{Runs: []benche2e.RunResult{run("postgres", "after", 16, 70), run("etcd", "after", 16, 60)}}
	got := benche2e.CreatorsSeries(a, b)
	want := []benche2e.Series{
		{Name: "etcd spread after", Points: []benche2e.Point{{Creators: 16, PayoutsPerSecond: 60, Min: 60, Max: 60, Runs: 1}}},
		{Name: "postgres spread after", Points: []benche2e.Point{
			{Creators: 4, PayoutsPerSecond: 40, Min: 30, Max: 50, Runs: 3},
			{Creators: 16, PayoutsPerSecond: 70, Min: 70, Max: 70, Runs: 1}}},
		{Name: "postgres spread before", Points: []benche2e.Point{{Creators: 4, PayoutsPerSecond: 20, Min: 20, Max: 20, Runs: 1}}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("CreatorsSeries = %+v\nwant %+v", got, want)
	}
	var svg bytes.Buffer
	if err := benche2e.WriteCreatorsSVG(&svg, "test", got, 500); err != nil {
		t.Fatal(err)
	}
	for _, s := range want {
		if !strings.Contains(svg.String(), s.Name) {
			t.Errorf("the SVG does not name series %q", s.Name)
		}
	}
}
