package explore_test

import (
	"flag"
	"maps"
	"slices"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/explore"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	full    = flag.Bool("explore.full", false, "explore every schedule of two holders with one fault of each kind, and -explore.samples of three (make explore)")
	samples = flag.Int("explore.samples", 10_000, "schedules of three holders sampled with -explore.full")
	seed    = flag.Uint64("explore.seed", 20261201, "seed of the sampled schedules")
)

// regressions are the orderings that once paid twice or let a revoked
// holder through, one named schedule each, on
// today's executor (a confirmation with lock-server before the claim and
// before the submission). Each must pass every check.
var regressions = []struct {
	name    string
	holders int
	text    string
}{
	// Failure 1: A's submission reaches rail-proxy after B has claimed,
	// before B's own: rail-proxy lets A's through (nothing greater seen
	// yet) and must refuse B's as the payout's second.
	{"stale-submission-arrives-first", 2,
		"A:acquire A:confirm A:claim A:confirm expire B:acquire B:confirm B:claim B:confirm A:submit A:rail B:submit B:report B:release A:report A:release"},
	// Failure 2: an operator's revoke, acknowledged before A's last
	// confirmation, stops A before the rail.
	{"revoke-before-the-last-confirmation", 1,
		"A:acquire A:confirm A:claim revoke A:confirm A:release"},
	// Failure 3: the grant ends under its holder (an etcd lease revoked by
	// id looks the same to the pipeline) and a new holder proceeds while
	// the old one's submission is in flight.
	{"grant-ended-under-its-holder", 2,
		"A:acquire A:confirm A:claim A:confirm revoke B:acquire B:confirm B:claim B:confirm A:submit A:rail B:submit B:report B:release A:report A:release"},
	// Failure 4: lockdb's clock steps forward: the lease ends early on the
	// server while A's local deadline says it holds; A's confirmation
	// learns it before the rail.
	{"lease-ends-early-on-the-servers-clock", 2,
		"A:acquire A:confirm expire A:claim B:acquire B:confirm B:claim A:confirm A:release B:confirm B:submit B:rail B:report B:release"},
}

func TestRegressionSchedules(t *testing.T) {
	x := explore.New(t, pipelinetest.Options{})
	for _, c := range regressions {
		t.Run(c.name, func(t *testing.T) {
			s, err := explore.ParseSchedule(c.text)
			if err != nil {
				t.Fatal(err)
			}
			res, err := x.Replay(t.Context(), explore.Config{Holders: c.holders, MaxFaults: 1, Faults: []string{explore.FaultExpire, explore.FaultRevoke}}, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range res.Violations {
				t.Error(v)
			}
		})
	}
}

// The checks can fail: with rail-proxy's fence point switched off, the
// first regression schedule pays twice and the audit sees it in the rail's
// journal although paydb balances.
func TestExplorerSeesTheDoublePaymentWithRailFencingOff(t *testing.T) {
	x := explore.New(t, pipelinetest.Options{RailFencingOff: true})
	s, err := explore.ParseSchedule(regressions[0].text)
	if err != nil {
		t.Fatal(err)
	}
	// With the fence off B's submission is forwarded too: one more step.
	s = slices.Insert(s, slices.Index(s, explore.Choice{Holder: "B", Step: explore.StepSubmit})+1, explore.Choice{Holder: "B", Step: explore.StepRail})
	// And A's report of its own submission is refused FENCED_OUT by the
	// payout's fence (B posted first): A asks lock-server whether its
	// lease is still the current one before it gives up (a stale holder
	// is redelivered; only the current one would mark the payout
	// needs_attention). One more step before A's release.
	s = slices.Insert(s, slices.Index(s, explore.Choice{Holder: "A", Step: explore.StepRelease}), explore.Choice{Holder: "A", Step: explore.StepConfirm})
	res, err := x.Replay(t.Context(), explore.Config{Holders: 2, MaxFaults: 1, Faults: []string{explore.FaultExpire}}, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Checks, explore.CheckRailOnce) || !slices.Contains(res.Checks, explore.CheckAudit) {
		t.Fatalf("checks broken %v (%v); want %s and %s", res.Checks, res.Violations, explore.CheckRailOnce, explore.CheckAudit)
	}
	t.Logf("as expected: %v", res.Violations)
}

// explored runs schedules and fails the test on any violation, reporting
// the first schedule that broke each check.
func explored(t *testing.T, run func(visit func(explore.Result) bool) (int, error)) {
	t.Helper()
	failures := map[string]int{}
	seen := 0
	n, err := run(func(r explore.Result) bool {
		seen++
		for _, c := range r.Checks {
			if failures[c] == 0 {
				t.Errorf("first schedule breaking %s (schedule %d of the run): %s\n  %v", c, seen, r.Schedule, r.Violations)
			}
			failures[c]++
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d schedules explored; failures by check: %v", n, failures)
	if len(failures) > 0 {
		t.Errorf("failing checks: %v", slices.Sorted(maps.Keys(failures)))
	}
}

// Every schedule of two holders with at most one fault. In make test
// only revokes are injected (about half the schedules); make explore adds
// expiries.
func TestExhaustiveTwoHolders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	cfg := explore.Config{Holders: 2, MaxFaults: 1, Faults: []string{explore.FaultRevoke}}
	if *full {
		cfg.Faults = []string{explore.FaultExpire, explore.FaultRevoke}
	}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) { return x.Exhaustive(t.Context(), cfg, visit) })
}

// A seeded sample of schedules of three holders with up to two faults.
func TestSampledThreeHolders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	n := 100
	if *full {
		n = *samples
	}
	t.Logf("seed %d (-explore.seed), %d schedules", *seed, n)
	cfg := explore.Config{Holders: 3, MaxFaults: 2, Faults: []string{explore.FaultExpire, explore.FaultRevoke}}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) { return x.Sample(t.Context(), cfg, *seed, n, visit) })
}
