package explore_test

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/explore"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	full    = flag.Bool("explore.full", false, "explore every schedule of two holders with one fault on the lease, and -explore.samples of each sampled test (make explore)")
	samples = flag.Int("explore.samples", 3_000, "schedules sampled by each sampled test with -explore.full")
	seed    = flag.Uint64("explore.seed", 20261201, "seed of the sampled schedules")
	report  = flag.String("explore.report", "", "append every schedule run, with its verdict, to this file (one line each, Result.String)")
)

// regressions are the orderings that once paid twice or let a revoked
// holder through, one named schedule each, on
// today's executor (a check of the local deadline before the claim, a
// confirmation with lock-server before the submission, the release after
// the push's answer). Each must pass every check.
var regressions = []struct {
	name    string
	holders int
	text    string
	// payouts of the account (1 when 0), whether the reconciler runs, and
	// the states the payouts must end in.
	payouts    int
	reconciler bool
	ended      []string
}{
	// Failure 1: A's submission reaches rail-proxy after B has claimed,
	// before B's own: rail-proxy lets A's through (nothing greater seen
	// yet) and must refuse B's as the payout's second.
	{"stale-submission-arrives-first", 2,
		"A:acquire A:claim A:confirm expire B:acquire B:claim B:confirm A:submit A:rail B:submit B:report B:release A:report A:release", 1, false, nil},
	// Failure 2: an operator's revoke, acknowledged before A's last
	// confirmation, stops A before the rail.
	{"revoke-before-the-last-confirmation", 1,
		"A:acquire A:claim revoke A:confirm A:release", 1, false, nil},
	// Failure 3: the grant ends under its holder (an etcd lease revoked by
	// id looks the same to the pipeline) and a new holder proceeds while
	// the old one's submission is in flight.
	{"grant-ended-under-its-holder", 2,
		"A:acquire A:claim A:confirm revoke B:acquire B:claim B:confirm A:submit A:rail B:submit B:report B:release A:report A:release", 1, false, nil},
	// Failure 4: lockdb's clock steps forward: the lease ends early on the
	// server while A's local deadline says it holds; A claims (its local
	// check cannot see it), B claims over it with its newer token, and
	// A's confirmation learns it before the rail.
	{"lease-ends-early-on-the-servers-clock", 2,
		"A:acquire expire A:claim B:acquire B:claim A:confirm A:release B:confirm B:submit B:rail B:report B:release", 1, false, nil},
	// Failure 5 (the newcomer's, found on a running stack): A's lease ends
	// between its grant and its claim of p-1 while B, on the same
	// account's lock, posts p-2 and debits the account. A's claim must
	// meet the account fence (the payout's own fence has never seen a
	// token): without that clause the fences check fails.
	{"stale-claim-after-the-accounts-debit", 2,
		"A:acquire expire B:acquire B:claim B:confirm B:submit B:rail B:report B:release A:claim A:confirm A:release",
		2, false, []string{"posted", "posted"}},
	// No confirmation before the claim. A revoke acknowledged
	// right after the grant does not stop A's claim (fenced, and taken
	// over by the next holder's); it stops A's submission at the
	// confirmation before it. The last delivery then claims over A's claim
	// and posts the payout once.
	{"revoke-after-the-grant-stops-the-submission-not-the-claim", 1,
		"A:acquire revoke A:claim A:confirm A:release", 1, false, []string{"posted"}},
	// A answers its push before it releases. Between A's report
	// and its release its lease ends and B, delivering the account's
	// next payout, is granted; A's late release, conditional on its
	// token, is refused and leaves B's lease alone; both payouts posted
	// once.
	{"late-release-after-the-next-grant", 2,
		"A:acquire A:claim A:confirm A:submit A:rail A:report expire B:acquire B:claim A:release B:confirm B:submit B:rail B:report B:release",
		2, false, []string{"posted", "posted"}},
	// The rail pays and its answer is lost: rail-proxy records the attempt
	// ambiguous, so does payment-resource; once the attempt is older than
	// the abandon threshold the reconciler finds the rail's payment and
	// posts the payout with its one debit.
	{"answer-lost-then-settled-by-the-reconciler", 1,
		"A:acquire A:claim A:confirm A:submit A:lost A:report A:release age R:read R:acquire R:reconcile R:resolve R:release",
		1, true, []string{"posted"}},
	// The call never reaches the rail; rail-proxy cannot tell that from a
	// lost answer. The rail's record has nothing: the reconciler ends the
	// payout failed, with no debit.
	{"never-reached-the-rail-ends-failed", 1,
		"A:acquire A:claim A:confirm A:submit A:down A:report A:release age R:read R:acquire R:reconcile R:resolve R:release",
		1, true, []string{"failed"}},
	// A dies after the rail paid and before it reported. Its lease ends by
	// its TTL; B's submission learns from rail-proxy that the payout went
	// to the rail and reports that attempt's answer instead of paying
	// again.
	{"crash-after-the-rail-answered", 2,
		"A:acquire A:claim A:confirm A:submit A:rail A:crash expire B:acquire B:claim B:confirm B:submit B:report B:release",
		1, false, []string{"posted"}},
	// Failure 6: A gives up on its submission while rail-proxy's call to
	// the rail is still on its way; time passes beyond the abandon
	// threshold; B's delivery finds the attempt abandoned and marks the
	// payout ambiguous; the reconciler finds nothing at the rail and ends
	// the payout failed; then the old call reaches the rail. With a
	// look-up the rail paid it: money out, no debit, payout failed. With
	// rail-proxy's stop order the rail refuses it.
	{"late-rail-call-after-the-reconciler-found-nothing", 2,
		"A:acquire A:claim A:confirm A:submit A:giveup A:release age B:acquire B:claim B:confirm B:submit B:report B:release R:read R:acquire R:reconcile R:resolve R:release P:rail",
		1, true, []string{"failed"}},
	// The reconciler's lease ends between its acquire and its
	// reconciliation, and a duplicate delivery B takes a newer grant. B
	// writes nothing: its claim meets the payout in doubt and is answered
	// before the fence. So the reconciler's late resolution, the rail's
	// own record, is accepted with its older token (a fence refuses only a
	// token below one it has seen) and the payout is posted with one
	// debit; the reconciler's release is refused STALE_TOKEN.
	{"reconciler-lease-ends-mid-settle", 2,
		"A:acquire A:claim A:confirm A:submit A:lost A:report A:release age R:read R:acquire expire B:acquire B:claim B:release R:reconcile R:resolve R:release",
		1, true, []string{"posted"}},
	// explore7's exhaustive adversary run (session 7): A's own resend,
	// past the abandon threshold, marked A's forward, still at the rail,
	// ambiguous; the rail then paid and answered ACK, rail-proxy passed it
	// on with its receipt and A posted the payout, but the answer could
	// not be recorded (finish updated only a forwarding attempt), so
	// raildb kept the paid attempt ambiguous without its reference.
	{"late-answer-of-an-abandoned-forward-is-recorded", 1,
		"A:acquire A:claim A:confirm A:submit age R:read A:resend A:rail A:report A:release",
		1, true, nil},
}

// allFaults are every fault the explorer injects.
var allFaults = []string{explore.FaultExpire, explore.FaultRevoke, explore.FaultRailLost, explore.FaultRailDown, explore.FaultCrash, explore.FaultGiveUp}

func TestRegressionSchedules(t *testing.T) {
	x := explore.New(t, pipelinetest.Options{})
	for _, c := range regressions {
		t.Run(c.name, func(t *testing.T) {
			s, err := explore.ParseSchedule(c.text)
			if err != nil {
				t.Fatal(err)
			}
			cfg := explore.Config{Holders: c.holders, Payouts: c.payouts, Reconciler: c.reconciler, MaxFaults: 2,
				Faults: append(slices.Clone(allFaults), explore.FaultRailRefused, explore.FaultResend, explore.FaultForge, explore.FaultReject)}
			res, err := x.Replay(t.Context(), cfg, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range res.Violations {
				t.Error(v)
			}
			if c.ended != nil && !slices.Equal(res.Ended, c.ended) {
				t.Errorf("payouts ended %v; want %v", res.Ended, c.ended)
			}
		})
	}
}

// TestRailThatRecordedNothingIsRetriedNotFailed (found by the
// crash soak, harness/README.md): the
// rail refuses A's call and says it recorded nothing. rail-proxy answers
// RAIL_NOT_REACHED and releases the payout's forward; A's delivery is
// redelivered (no report, so the payout stays claimed, never ambiguous),
// and the redelivery B sends the payout to the rail, which pays it once.
// Before, the same schedule recorded the payout ambiguous and the
// reconciler failed a payout a retry would have paid.
func TestRailThatRecordedNothingIsRetriedNotFailed(t *testing.T) {
	x := explore.New(t, pipelinetest.Options{})
	s, err := explore.ParseSchedule("A:acquire A:claim A:confirm A:submit A:refused A:release " +
		"B:acquire B:claim B:confirm B:submit B:rail B:report B:release")
	if err != nil {
		t.Fatal(err)
	}
	cfg := explore.Config{Holders: 2, Payouts: 1, MaxFaults: 2, Faults: append(slices.Clone(allFaults), explore.FaultRailRefused)}
	res, err := x.Replay(t.Context(), cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Error(v)
	}
	if want := []string{"posted"}; !slices.Equal(res.Ended, want) {
		t.Errorf("payouts ended %v; want %v", res.Ended, want)
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
	w := reportFile(t)
	n, err := run(func(r explore.Result) bool {
		seen++
		if w != nil {
			fmt.Fprintf(w, "%s\t%d\t%s\n", t.Name(), seen, r)
		}
		if seen%1000 == 0 {
			t.Logf("%d schedules so far; failures by check: %v", seen, failures)
		}
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

// reportFile opens -explore.report for appending (nil when unset) and
// closes it when t ends.
func reportFile(t *testing.T) *os.File {
	t.Helper()
	if *report == "" {
		return nil
	}
	f, err := os.OpenFile(*report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// Every schedule of two holders with at most one fault on the lease
// (expire or revoke): make explore. About 4,000 schedules, too many for
// make test, which samples them instead (TestSampledTwoHolders).
func TestExhaustiveTwoHolders(t *testing.T) {
	if !*full {
		t.Skip("make explore (-explore.full) runs every schedule; make test samples them")
	}
	cfg := explore.Config{Holders: 2, MaxFaults: 1, Faults: []string{explore.FaultExpire, explore.FaultRevoke}}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) { return x.Exhaustive(t.Context(), cfg, visit) })
}

// Every schedule of one executor and the reconciler with up to two
// faults of every kind: make explore.
func TestExhaustiveWithTheReconciler(t *testing.T) {
	if !*full {
		t.Skip("make explore (-explore.full) runs every schedule; make test samples them")
	}
	cfg := explore.Config{Holders: 1, Reconciler: true, MaxFaults: 2, Faults: allFaults}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) { return x.Exhaustive(t.Context(), cfg, visit) })
}

// sampled runs n schedules of cfg (-explore.samples with -explore.full)
// from -explore.seed, and fails on any violation. make test's n are
// small: the samples there check that every check holds on a few dozen
// orderings and that the coverage each test insists on is reached; the
// thousands of schedules are make explore's. It returns how often
// each choice was made (by step, any executor counted as "X", the
// reconciler as "R" and rail-proxy as "P") and how the
// payouts ended, so that a test can insist the sample reached what it
// is for.
func sampled(t *testing.T, cfg explore.Config, n int) (choices, ended map[string]int) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	if *full {
		n = *samples
	}
	t.Logf("seed %d (-explore.seed), %d schedules", *seed, n)
	choices, ended = map[string]int{}, map[string]int{}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) {
		return x.Sample(t.Context(), cfg, *seed, n, func(r explore.Result) bool {
			for _, c := range r.Schedule {
				who := c.Holder
				if who != "" && who != explore.Reconciler && who != explore.RailProxy {
					who = "X"
				}
				choices[who+":"+c.Step]++
			}
			for _, s := range r.Ended {
				ended[s]++
			}
			return visit(r)
		})
	})
	t.Logf("choices made: %v; payouts ended: %v", choices, ended)
	return choices, ended
}

// A seeded sample of schedules of two holders with one fault on the
// lease: make test's short version of TestExhaustiveTwoHolders.
func TestSampledTwoHolders(t *testing.T) {
	sampled(t, explore.Config{Holders: 2, MaxFaults: 1, Faults: []string{explore.FaultExpire, explore.FaultRevoke}}, 30)
}

// A seeded sample of schedules of three holders with up to two faults on
// the lease.
func TestSampledThreeHolders(t *testing.T) {
	sampled(t, explore.Config{Holders: 3, MaxFaults: 2, Faults: []string{explore.FaultExpire, explore.FaultRevoke}}, 20)
}

// A seeded sample with everything at once: two payouts of one account
// (one lock, one account fence), three executors (A and C deliver the
// first payout, B the second), the reconciler, and up to two faults of
// every kind (a lease ended, the rail's answer lost, the rail down, a
// process crashed, a caller that gave up on rail-proxy). The sample must
// reach each of those, the reconciler's resolution and both final
// outcomes, or it proves little.
func TestSampledWithTheReconciler(t *testing.T) {
	choices, ended := sampled(t, explore.Config{Holders: 3, Payouts: 2, Reconciler: true, MaxFaults: 2, Faults: allFaults}, 30)
	for _, c := range []string{"R:" + explore.StepResolve, "X:" + explore.FaultRailLost, "X:" + explore.FaultRailDown, "X:" + explore.FaultCrash,
		"X:" + explore.FaultGiveUp, "P:" + explore.StepRail, ":" + explore.FaultAge} {
		if choices[c] == 0 {
			t.Errorf("no schedule of the sample made the choice %s", c)
		}
	}
	for _, s := range []string{"posted", "failed"} {
		if ended[s] == 0 {
			t.Errorf("no payout of the sample ended %s", s)
		}
	}
}
