package explore_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/explore"
)

// adversaryFaults are the faults of the adversarial configurations: the
// lease ended, the rail's answer lost, the rail refusing a call it
// recorded nothing of, a caller giving up, forged terms, a resend and a
// refusal for good.
var adversaryFaults = []string{explore.FaultExpire, explore.FaultRailLost, explore.FaultRailRefused, explore.FaultGiveUp,
	explore.FaultForge, explore.FaultResend, explore.FaultReject}

// allPaths are the rail-proxy outcomes the adversarial sample must reach.
var allPaths = []string{explore.PathForwarded, explore.PathFencedOut, explore.PathAlreadySubmitted, explore.PathAmbiguous,
	explore.PathNotSentReleased, explore.PathNotSentKept, explore.PathResendAfterNotSent, explore.PathStaleResendFenced,
	explore.PathInvalidTerms, explore.PathClosed, explore.PathLateAfterClose, explore.PathStopped, explore.PathReconciled}

// adversarial are named schedules of the three behaviours the explorer
// did not model before (signed terms, the not_sent release, the close of
// a never-forwarded payout), each with the rail-proxy outcomes it must
// reach and the states its payouts must end in. Every check must hold.
var adversarial = []struct {
	name       string
	holders    int
	reconciler bool
	text       string
	paths      []string
	ended      []string
}{
	// A holder with a real lease sends its payout with altered terms
	// (four ways, see FaultForge), then its genuine submission: the
	// forgeries are refused 403 INVALID_TERMS with nothing recorded, the
	// genuine one is paid once.
	{"forged-terms-then-the-genuine-submission", 1, true,
		"A:acquire A:claim A:confirm A:forge A:submit A:rail A:report A:release R:read",
		[]string{explore.PathInvalidTerms, explore.PathForwarded}, []string{"posted"}},
	// The rail refuses A's call and recorded nothing: rail-proxy records
	// it not_sent and releases the forward; A's own resend, same token,
	// goes to the rail again and is paid; B's delivery finds that forward.
	{"own-resend-after-not-sent", 2, false,
		"A:acquire A:claim A:confirm A:submit A:refused A:release A:resend P:rail B:acquire B:claim B:confirm B:submit B:report B:release",
		[]string{explore.PathNotSentReleased, explore.PathResendAfterNotSent, explore.PathAlreadySubmitted}, []string{"posted"}},
	// B, the newer holder, is refused by the rail too and its forward
	// released; A's stale resend arrives then, and B's token, the
	// high-water mark, fences it out although no forward is held.
	{"stale-resend-after-the-newer-holders-release", 2, false,
		"A:acquire A:claim A:confirm A:submit A:refused A:release B:acquire B:claim B:confirm B:submit B:refused A:resend B:release",
		[]string{explore.PathNotSentReleased, explore.PathStaleResendFenced}, []string{"posted"}},
	// A gives up while its rail call is held; past the abandon threshold
	// B's submission marks A's attempt ambiguous and B reports it; then
	// the rail refuses the old call: the release must not happen (the
	// attempt is no longer forwarding), and the reconciler settles the
	// attempt B was told about.
	{"not-sent-release-after-the-abandonment", 2, true,
		"A:acquire A:claim A:confirm A:submit A:giveup A:release age B:acquire B:claim B:confirm B:submit B:report B:release P:refused R:read R:acquire R:reconcile R:resolve R:release",
		[]string{explore.PathNotSentKept, explore.PathReconciled, explore.PathAlreadySubmitted}, []string{"failed"}},
	// The same, with the reconciler's stop and record between B's report
	// and the rail's refusal of the old call.
	{"not-sent-release-after-the-reconciliation", 2, true,
		"A:acquire A:claim A:confirm A:submit A:giveup A:release age B:acquire B:claim B:confirm B:submit B:report B:release R:read R:acquire R:reconcile P:refused R:resolve R:release",
		[]string{explore.PathNotSentKept, explore.PathReconciled}, []string{"failed"}},
	// A's submission is refused for good before rail-proxy, A confirms
	// its lease (a refusal is judged only by the current holder) and marks
	// the payout needs_attention, the reconciler closes it at rail-proxy
	// (never forwarded) and fails it; B, whose lease ended before A's
	// grant, submits late and is refused FENCED_OUT: the close passed the
	// account's fence with the reconciler's newer token (session 7; before,
	// the refusal was PAYOUT_ALREADY_SUBMITTED with the closing attempt,
	// and B then marked the payout needs_attention). B confirms, learns
	// its lease is gone, and stops.
	{"late-submission-after-the-close", 2, true,
		"B:acquire B:claim B:confirm expire A:acquire A:claim A:confirm A:reject A:confirm A:attention A:release R:read R:acquire R:reconcile R:resolve R:release B:submit B:confirm B:release",
		[]string{explore.PathClosed, explore.PathLateAfterClose}, []string{"failed"}},
	// The late rail call of a caller that gave up reaches the rail after
	// the reconciler's stop order: PAYOUT_STOPPED, nothing paid.
	{"late-rail-call-after-the-stop-order", 2, true,
		"A:acquire A:claim A:confirm A:submit A:giveup A:release age B:acquire B:claim B:confirm B:submit B:report B:release R:read R:acquire R:reconcile R:resolve R:release P:rail",
		[]string{explore.PathStopped, explore.PathReconciled}, []string{"failed"}},
}

// TestAdversaryCoverage runs the adversarial schedules and a seeded
// sample of two executors on one payout and the reconciler with up to
// three faults among the adversarial ones (-explore.samples of it with
// -explore.full). Every check must hold, and the run must reach every
// rail-proxy outcome of allPaths: a change that keeps the explorer from
// one of them fails here. It logs how many schedules reached each.
func TestAdversaryCoverage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	x := explore.New(t, pipelinetest.Options{})
	paths := map[string]int{}
	for _, c := range adversarial {
		t.Run(c.name, func(t *testing.T) {
			s, err := explore.ParseSchedule(c.text)
			if err != nil {
				t.Fatal(err)
			}
			res, err := x.Replay(t.Context(), explore.Config{Holders: c.holders, Reconciler: c.reconciler, MaxFaults: 3, Faults: adversaryFaults}, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range res.Violations {
				t.Error(v)
			}
			for _, p := range c.paths {
				if !slices.Contains(res.Paths, p) {
					t.Errorf("paths %v; want %s among them", res.Paths, p)
				}
			}
			if !slices.Equal(res.Ended, c.ended) {
				t.Errorf("payouts ended %v; want %v", res.Ended, c.ended)
			}
			for _, p := range res.Paths {
				paths[p]++
			}
		})
	}
	n := 10
	if *full {
		n = *samples
	}
	cfg := explore.Config{Holders: 2, Reconciler: true, MaxFaults: 3, Faults: adversaryFaults}
	t.Logf("seed %d (-explore.seed), %d sampled schedules", *seed, n)
	sampledPaths := map[string]int{}
	explored(t, func(visit func(explore.Result) bool) (int, error) {
		return x.Sample(t.Context(), cfg, *seed, n, func(r explore.Result) bool {
			for _, p := range r.Paths {
				paths[p]++
				sampledPaths[p]++
			}
			return visit(r)
		})
	})
	t.Logf("schedules reaching each path: sample %v; named and sample %v", sampledPaths, paths)
	for _, p := range allPaths {
		if paths[p] == 0 {
			t.Errorf("no schedule of the run reached %s", p)
		}
	}
	if extra := slices.DeleteFunc(slices.Sorted(maps.Keys(paths)), func(p string) bool { return slices.Contains(allPaths, p) }); len(extra) > 0 {
		t.Errorf("paths %v are not in allPaths", extra)
	}
}

// Every schedule of one executor and the reconciler with up to two
// faults among the rail's refusal, a caller giving up, forged terms, a
// resend, a refusal for good and a lost answer: make explore.
func TestExhaustiveAdversaryWithTheReconciler(t *testing.T) {
	if !*full {
		t.Skip("make explore (-explore.full) runs every schedule; make test samples them")
	}
	cfg := explore.Config{Holders: 1, Reconciler: true, MaxFaults: 2, Faults: []string{explore.FaultRailRefused, explore.FaultGiveUp,
		explore.FaultForge, explore.FaultResend, explore.FaultReject, explore.FaultRailLost}}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) { return x.Exhaustive(t.Context(), cfg, visit) })
}

// Every schedule of two executors with up to two faults among an
// expiry, the rail's refusal and a resend (the own and the stale resend
// after a not_sent release, in every order with the newer holder): make
// explore.
func TestExhaustiveResendsOfTwoHolders(t *testing.T) {
	if !*full {
		t.Skip("make explore (-explore.full) runs every schedule; make test samples them")
	}
	cfg := explore.Config{Holders: 2, MaxFaults: 2, Faults: []string{explore.FaultExpire, explore.FaultRailRefused, explore.FaultResend}}
	x := explore.New(t, pipelinetest.Options{})
	explored(t, func(visit func(explore.Result) bool) (int, error) { return x.Exhaustive(t.Context(), cfg, visit) })
}
